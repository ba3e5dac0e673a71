//! The rewrites against the body parsed, set and printed, on bodies made to trip a splice:
//! duplicated and escaped keys, nested look-alikes, spacing.

use proptest::prelude::*;

use super::*;

fn rewritten(body: &str, changes: Changes<'_>) -> String {
    let plan = Plan::new(body.as_bytes(), &changes).unwrap();
    let out = plan.apply(body.as_bytes()).finish_unheld();
    assert_eq!(out.len(), plan.size(), "the planned size is the size made");
    String::from_utf8(out.to_vec()).unwrap()
}

fn model(m: &str) -> Changes<'_> {
    Changes {
        model: Some(m),
        ..Changes::default()
    }
}

fn tag(t: &str) -> Changes<'_> {
    Changes {
        tenant_tag: Some(t),
        ..Changes::default()
    }
}

#[test]
fn only_the_values_set_change_and_every_other_byte_is_kept() {
    assert_eq!(
        rewritten(
            r#"{"z":1, "model" : "public","encoding_format":"base64","input":"x"}"#,
            model("private")
        ),
        r#"{"z":1, "model" : "private","encoding_format":"base64","input":"x"}"#
    );
    let both = Changes {
        model: Some("p\"q"),
        priority: Some(-3),
        tenant_tag: None,
    };
    assert_eq!(
        rewritten(" {\"model\":\"m\"}\n", both),
        " {\"model\":\"p\\\"q\",\"priority\":-3}\n"
    );
    assert_eq!(rewritten("{}", model("m")), r#"{"model":"m"}"#);
}

#[test]
fn the_tenant_tag_joins_the_callers_metadata_and_replaces_a_claimed_one() {
    for (body, metadata) in [
        (
            r#"{"model":"m","metadata":{"a":"1"}}"#,
            r#"{"a":"1","spillway_tenant":"t"}"#,
        ),
        (
            r#"{"model":"m","metadata":null}"#,
            r#"{"spillway_tenant":"t"}"#,
        ),
        (
            r#"{"model":"m","metadata":{ }}"#,
            r#"{ "spillway_tenant":"t"}"#,
        ),
        (r#"{"model":"m"}"#, r#"{"spillway_tenant":"t"}"#),
        (
            r#"{"model":"m","metadata":{"spillway_tenant":"other","a":"1"}}"#,
            r#"{"spillway_tenant":"t","a":"1"}"#,
        ),
        // An escaped key is the same key to the backend.
        (
            r#"{"model":"m","metadata":{"spillway_tenan\u0074":"other"}}"#,
            r#"{"spillway_tenan\u0074":"t"}"#,
        ),
    ] {
        let out = rewritten(body, tag("t"));
        assert!(out.ends_with(&format!("{metadata}}}")), "{body} -> {out}");
    }
    // Not an object: left for the backend to refuse.
    assert_eq!(
        rewritten(r#"{"model":"m","metadata":3}"#, tag("t")),
        r#"{"model":"m","metadata":3}"#
    );
}

#[test]
fn a_body_that_is_not_an_object_is_malformed() {
    for body in ["[]", "3", "nul", "{\"model\":", "\u{0}"] {
        let e = Plan::new(body.as_bytes(), &model("m")).unwrap_err();
        assert_eq!(e.kind, ErrorKind::MalformedRequest, "{body:?}");
    }
    assert!(Plan::new(&[b'"', 0xff, b'"'], &model("m")).is_err());
}

/// What the splice must equal: the body parsed into a map, set, and printed (the map keeps
/// the fields' order; a later duplicate's value takes the first one's place).
fn oracle(body: &str, changes: &Changes<'_>) -> serde_json::Value {
    let mut value: serde_json::Map<String, serde_json::Value> = serde_json::from_str(body).unwrap();
    if let Some(m) = changes.model {
        value.insert("model".into(), m.into());
    }
    if let Some(p) = changes.priority {
        value.insert("priority".into(), p.into());
    }
    if let Some(t) = changes.tenant_tag {
        let metadata = value
            .entry("metadata")
            .or_insert_with(|| serde_json::Value::Object(Default::default()));
        if metadata.is_null() {
            *metadata = serde_json::Value::Object(Default::default());
        }
        if let Some(m) = metadata.as_object_mut() {
            m.insert(TENANT_TAG.into(), t.into());
        }
    }
    serde_json::Value::Object(value)
}

/// An object's text from its fields, each key written plainly or with its first character
/// escaped, with spacing or without.
fn object_text(fields: &[(String, String, bool)], spaced: bool) -> String {
    let sep = if spaced { " , " } else { "," };
    let colon = if spaced { " : " } else { ":" };
    let body: Vec<String> = fields
        .iter()
        .map(|(k, v, escaped)| {
            let key = match (escaped, k.chars().next()) {
                (true, Some(c)) => {
                    let rest = serde_json::Value::from(&k[c.len_utf8()..]).to_string();
                    format!("\"\\u{:04x}{}", c as u32, &rest[1..])
                }
                _ => serde_json::Value::from(k.as_str()).to_string(),
            };
            format!("{key}{colon}{v}")
        })
        .collect();
    format!("{{{}}}", body.join(sep))
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("model".to_owned()),
        Just("priority".to_owned()),
        Just("metadata".to_owned()),
        Just(TENANT_TAG.to_owned()),
        "[a-z\"\\\\é]{0,4}",
    ]
}

fn scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("null".to_owned()),
        any::<i32>().prop_map(|n| n.to_string()),
        "[ -~é\n]{0,8}".prop_map(|s| serde_json::Value::from(s).to_string()),
        Just(r#"[1,{"model":"inner","}":"{"}]"#.to_owned()),
    ]
}

fn inner_object() -> impl Strategy<Value = String> {
    (
        prop::collection::vec((key(), scalar(), any::<bool>()), 0..4),
        any::<bool>(),
    )
        .prop_map(|(fields, spaced)| object_text(&fields, spaced))
}

proptest! {
    #[test]
    fn the_splice_reads_as_the_body_parsed_set_and_printed(
        fields in prop::collection::vec(
            (key(), prop_oneof![scalar(), inner_object()], any::<bool>()), 0..6),
        spaced in any::<bool>(),
        set_model in prop::option::of("[a-z/\"é-]{0,6}"),
        priority in prop::option::of(any::<i64>()),
        tenant in prop::option::of("[a-z\"]{0,5}"),
    ) {
        let body = object_text(&fields, spaced);
        let changes = Changes {
            model: set_model.as_deref(),
            priority,
            tenant_tag: tenant.as_deref(),
        };
        let out = rewritten(&body, changes);
        let read: serde_json::Value = serde_json::from_str(&out).unwrap();
        let expected = oracle(&body, &changes);
        // The printed forms compare the order of the fields too.
        prop_assert_eq!(read.to_string(), expected.to_string(), "{} -> {}", body, out);
    }

    #[test]
    fn random_bytes_are_refused_or_rewritten_never_a_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        let changes = Changes { model: Some("m"), priority: Some(1), tenant_tag: Some("t") };
        if let Ok(plan) = Plan::new(&bytes, &changes) {
            prop_assert_eq!(plan.apply(&bytes).finish_unheld().len(), plan.size());
        }
    }
}
