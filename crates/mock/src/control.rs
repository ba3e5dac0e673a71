//! `/control`: read or change the running profile over HTTP.
//!
//! This is how a test or a replay switches a healthy backend into a failure mode mid-run
//! without restarting it (and so without losing its connections or counters). `PUT` replaces
//! the profile; `PATCH` applies a JSON merge patch (RFC 7386) to it, so
//! `{"fault":{"error_rate":1.0}}` changes one knob, and `null` puts a field back to its
//! default. Either way the result must pass [`MockProfile::problems`] or nothing changes.

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::Value;
use spillway_config::MockProfile;

use crate::error::ApiError;
use crate::MockServer;

pub(crate) async fn get_profile(State(server): State<MockServer>) -> Json<MockProfile> {
    Json(server.profile())
}

pub(crate) async fn put_profile(State(server): State<MockServer>, body: Bytes) -> Response {
    let replaced =
        parse_json(&body).and_then(|profile| server.try_update_profile(|_| checked(profile)));
    answer(replaced)
}

pub(crate) async fn patch_profile(State(server): State<MockServer>, body: Bytes) -> Response {
    let patched = parse_json(&body)
        .and_then(|patch| server.try_update_profile(|current| patched(current, &patch)));
    answer(patched)
}

/// `profile` with the merge patch `patch` applied and checked.
pub(crate) fn patched(profile: &MockProfile, patch: &Value) -> Result<MockProfile, ApiError> {
    if !patch.is_object() {
        return Err(ApiError::invalid(
            "invalid_profile",
            "a profile patch must be a JSON object",
        ));
    }
    let mut current = serde_json::to_value(profile).map_err(|e| {
        ApiError::invalid(
            "invalid_profile",
            format!("cannot represent the profile: {e}"),
        )
    })?;
    merge(&mut current, patch);
    checked(current)
}

fn answer(result: Result<MockProfile, ApiError>) -> Response {
    match result {
        Ok(profile) => Json(profile).into_response(),
        Err(e) => e.into_response(),
    }
}

fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid("invalid_json", format!("the body is not valid JSON: {e}")))
}

/// A profile from JSON (missing fields take their defaults) that passes its own checks.
fn checked(v: Value) -> Result<MockProfile, ApiError> {
    let profile: MockProfile = serde_json::from_value(v)
        .map_err(|e| ApiError::invalid("invalid_profile", format!("invalid profile: {e}")))?;
    let problems = profile.problems();
    if problems.is_empty() {
        return Ok(profile);
    }
    let listed: Vec<String> = problems
        .iter()
        .map(|(field, message)| format!("{field}: {message}"))
        .collect();
    Err(ApiError::invalid(
        "invalid_profile",
        format!("invalid profile: {}", listed.join("; ")),
    ))
}

/// RFC 7386: objects merge member by member, `null` removes a member, anything else replaces.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(changes) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    if let Value::Object(fields) = target {
        for (key, change) in changes {
            if change.is_null() {
                fields.remove(key);
            } else {
                merge(fields.entry(key.clone()).or_insert(Value::Null), change);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    #[test]
    fn patch_changes_only_the_named_fields() {
        let base = MockProfile {
            models: vec!["a".into(), "b".into()],
            ..MockProfile::default()
        };
        let p = patched(
            &base,
            &json!({"fault": {"error_rate": 1.0, "error_status": 503, "retry_after": "2s"}}),
        )
        .unwrap();
        assert_eq!(p.fault.error_rate, 1.0);
        assert_eq!(p.fault.error_status, 503);
        assert_eq!(p.fault.retry_after, Some(Duration::from_secs(2)));
        assert_eq!(p.models, base.models);
        assert_eq!(p.fault.stall, base.fault.stall);
        assert_eq!(p.ttft, base.ttft);
    }

    #[test]
    fn null_restores_the_default() {
        let base = MockProfile {
            ttft: Duration::from_secs(3),
            fault: spillway_config::MockFault {
                retry_after: Some(Duration::from_secs(1)),
                break_stream_after: Some(2),
                ..Default::default()
            },
            ..MockProfile::default()
        };
        let p = patched(
            &base,
            &json!({"ttft": null, "fault": {"retry_after": null, "break_stream_after": null}}),
        )
        .unwrap();
        assert_eq!(p.ttft, MockProfile::default().ttft);
        assert_eq!(p.fault.retry_after, None);
        assert_eq!(p.fault.break_stream_after, None);
    }

    #[test]
    fn reject_field_is_set_and_cleared_by_a_patch() {
        let set = patched(
            &MockProfile::default(),
            &json!({"fault": {"reject_field": "tools"}}),
        )
        .unwrap();
        assert_eq!(set.fault.reject_field.as_deref(), Some("tools"));
        let cleared = patched(&set, &json!({"fault": {"reject_field": null}})).unwrap();
        assert_eq!(cleared, MockProfile::default());
        let e = patched(&set, &json!({"fault": {"reject_field": ""}})).unwrap_err();
        assert!(format!("{e:?}").contains("fault.reject_field"), "{e:?}");
    }

    #[test]
    fn arrays_are_replaced_not_merged() {
        let p = patched(&MockProfile::default(), &json!({"models": ["x"]})).unwrap();
        assert_eq!(p.models, vec!["x".to_owned()]);
    }

    #[test]
    fn invalid_patches_are_refused_with_the_problem() {
        let base = MockProfile::default();
        for (patch, needle) in [
            (json!({"fault": {"error_rate": 1.5}}), "fault.error_rate"),
            (json!({"capacity": 0}), "capacity"),
            (json!({"capacity": "many"}), "invalid profile"),
            (json!({"no_such_knob": 1}), "no_such_knob"),
            (json!([1]), "JSON object"),
        ] {
            let e = patched(&base, &patch).unwrap_err();
            let body = format!("{e:?}");
            assert!(body.contains(needle), "{patch}: {body}");
        }
    }
}
