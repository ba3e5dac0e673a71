//! Which injected failure, if any, a request meets.
//!
//! The draw is separate from the I/O that carries it out so it can be tested with a seeded RNG,
//! and so the rates mean exactly what the profile says: each fault is drawn independently, a
//! stall delays whatever follows it, and a reset wins over an error when both are drawn (a reset
//! connection cannot also carry an error body).
//!
//! One fault is not drawn: `reject_field` refuses exactly the requests whose body uses a field,
//! as an engine version without a feature does, so it is decided by the body
//! ([`rejected_field`]) once the body has been read as a JSON object.

use std::time::Duration;

use rand::Rng;
use serde_json::{Map, Value};
use spillway_config::MockFault;

/// The faults one request meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Draw {
    /// Hang this long before anything else happens.
    pub(crate) stall: Option<Duration>,
    pub(crate) outcome: Injected,
}

/// How the request ends if a fault decides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Injected {
    /// No fault: serve normally.
    #[default]
    None,
    /// Answer the profile's error status.
    Error,
    /// Reset the connection without a response byte.
    Reset,
}

/// Draws the faults for one request. A zero rate draws nothing, so a healthy profile costs no
/// random numbers.
pub(crate) fn draw(fault: &MockFault, rng: &mut impl Rng) -> Draw {
    let mut hit = |rate: f64| rate > 0.0 && rng.random::<f64>() < rate;
    let stall = hit(fault.stall_rate).then_some(fault.stall);
    let outcome = if hit(fault.reset_rate) {
        Injected::Reset
    } else if hit(fault.error_rate) {
        Injected::Error
    } else {
        Injected::None
    };
    Draw { stall, outcome }
}

/// The field the profile's `reject_field` names, if this request body uses it: present at the
/// top level with a value other than `null`, since clients send unset options as `null`.
pub(crate) fn rejected_field<'a>(
    fault: &'a MockFault,
    body: &Map<String, Value>,
) -> Option<&'a str> {
    let field = fault.reject_field.as_deref()?;
    body.get(field)
        .is_some_and(|v| !v.is_null())
        .then_some(field)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;
    use serde_json::json;

    fn fault(error: f64, stall: f64, reset: f64) -> MockFault {
        MockFault {
            error_rate: error,
            stall_rate: stall,
            reset_rate: reset,
            ..MockFault::default()
        }
    }

    #[test]
    fn healthy_profile_never_injects() {
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..1000 {
            assert_eq!(draw(&MockFault::default(), &mut rng), Draw::default());
        }
    }

    #[test]
    fn certain_faults_always_happen_and_reset_wins_over_error() {
        let mut rng = StdRng::seed_from_u64(2);
        let d = draw(&fault(1.0, 1.0, 1.0), &mut rng);
        assert_eq!(d.outcome, Injected::Reset);
        assert_eq!(d.stall, Some(MockFault::default().stall));
        assert_eq!(
            draw(&fault(1.0, 0.0, 0.0), &mut rng).outcome,
            Injected::Error
        );
    }

    #[test]
    fn rates_are_honoured_roughly() {
        let mut rng = StdRng::seed_from_u64(3);
        let f = fault(0.3, 0.0, 0.0);
        let errors = (0..10_000)
            .filter(|_| draw(&f, &mut rng).outcome == Injected::Error)
            .count();
        assert!((2_700..3_300).contains(&errors), "{errors}");
    }

    #[test]
    fn nonsense_rates_do_not_panic() {
        let mut rng = StdRng::seed_from_u64(4);
        let d = draw(&fault(f64::NAN, -1.0, 7.0), &mut rng);
        assert_eq!(d.outcome, Injected::Reset);
        assert_eq!(d.stall, None);
    }

    #[test]
    fn reject_field_matches_a_top_level_field_with_a_value() {
        let rejecting = |field: Option<&str>| MockFault {
            reject_field: field.map(str::to_owned),
            ..MockFault::default()
        };
        let body = |v: Value| v.as_object().unwrap().clone();
        let tools = rejecting(Some("tools"));
        for used in [
            json!({"tools": [{"type": "function"}]}),
            json!({"tools": []}),
            json!({"tools": false}),
            json!({"tools": ""}),
        ] {
            assert_eq!(
                rejected_field(&tools, &body(used.clone())),
                Some("tools"),
                "{used}"
            );
        }
        for unused in [
            json!({}),
            json!({"tools": null}),
            json!({"tool_choice": "auto"}),
            json!({"Tools": [1]}),
            json!({"messages": [{"tools": [1]}]}),
        ] {
            assert_eq!(
                rejected_field(&tools, &body(unused.clone())),
                None,
                "{unused}"
            );
        }
        assert_eq!(
            rejected_field(&rejecting(None), &body(json!({"tools": [1]}))),
            None
        );
    }
}
