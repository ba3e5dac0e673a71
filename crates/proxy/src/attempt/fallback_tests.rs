//! Fallbacks in the attempt loop, in-process against the scripted upstream on paused time: each
//! trigger moves the call to its fallback, and a chain of fallbacks stays within the one budget
//! and attempt cap of the call's own model.

use std::time::Duration;

use proptest::prelude::*;
use spillway_policy::Outcome;

use super::run;
use super::tests::{
    attempt_once, call, models_from, paused, pool_with, step, traffic, Scripted, Step,
    BUDGET_MIN_PER_SEC, BUDGET_RATIO, BUDGET_WINDOW_SECS,
};

const ALL: &str = r#"fallbacks = [{ model = "f" }]"#;
const CONTEXT: &str = r#"{"error":{"message":"This model's maximum context length is 8192 tokens","code":"context_length_exceeded"}}"#;

/// The backends the script's attempts went to, in order.
fn backends(upstream: &Scripted) -> Vec<String> {
    upstream
        .sent()
        .iter()
        .map(|s| s.backend.to_string())
        .collect()
}

#[test]
fn capacity_on_every_backend_falls_back_and_the_answer_says_which_model() {
    let (models, retries) = pool_with("", ALL);
    let full = Step::Status(429, Duration::ZERO);
    let upstream = Scripted::new([full.clone(), full.clone(), full]);
    let attempted = paused(attempt_once(&models, &retries, &upstream));
    assert_eq!(attempted.fallback.map(|m| &**m), Some("f"));
    assert_eq!(attempted.result.unwrap().response.status(), 200);
    assert_eq!(backends(&upstream).last().map(String::as_str), Some("x"));
    assert_eq!(upstream.sent().len(), 4);
}

#[test]
fn backends_all_down_fall_back_as_unavailable() {
    let (models, retries) = pool_with("", r#"fallbacks = [{ model = "f", on = ["unavailable"] }]"#);
    let down = Step::Fail(Outcome::ConnectFailed, Duration::ZERO);
    let upstream = Scripted::new([down.clone(), down.clone(), down]);
    let attempted = paused(attempt_once(&models, &retries, &upstream));
    assert_eq!(
        attempted.fallback.map(|m| &**m),
        Some("f"),
        "{:?}",
        backends(&upstream)
    );
    assert!(attempted.result.is_ok());
}

#[test]
fn a_prompt_too_long_falls_back_and_any_other_400_is_relayed() {
    let (models, retries) = pool_with(
        "",
        r#"fallbacks = [{ model = "f", on = ["context_window"] }]"#,
    );
    let upstream = Scripted::new([Step::Body(400, CONTEXT)]);
    let attempted = paused(attempt_once(&models, &retries, &upstream));
    assert_eq!(attempted.fallback.map(|m| &**m), Some("f"));
    assert_eq!(attempted.result.unwrap().response.status(), 200);

    let other = r#"{"error":{"message":"temperature must be at most 2"}}"#;
    let upstream = Scripted::new([Step::Body(400, other)]);
    let attempted = paused(attempt_once(&models, &retries, &upstream));
    assert_eq!(attempted.fallback, None);
    let body = paused(async {
        use http_body_util::BodyExt;
        attempted
            .result
            .unwrap()
            .response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
    });
    // The body read to tell the error apart is relayed whole.
    assert_eq!(body, other.as_bytes());
}

/// A hostile or verbose backend: a 400 far longer than what is read ahead to tell it apart
/// reaches the caller unchanged, and is not taken for a context-window error.
#[test]
fn a_400_longer_than_the_read_ahead_is_relayed_whole() {
    let (models, retries) = pool_with(
        "",
        r#"fallbacks = [{ model = "f", on = ["context_window"] }]"#,
    );
    let long: &'static str = Box::leak(
        format!(
            r#"{{"error":{{"message":"{}"}}}}"#,
            "x".repeat(3 * spillway_policy::fallback::MAX_ERROR_BODY)
        )
        .into_boxed_str(),
    );
    let upstream = Scripted::new([Step::Body(400, long)]);
    let attempted = paused(attempt_once(&models, &retries, &upstream));
    assert_eq!(attempted.fallback, None);
    let body = paused(async {
        use http_body_util::BodyExt;
        attempted
            .result
            .unwrap()
            .response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
    });
    assert_eq!(body, long.as_bytes());
}

#[test]
fn a_trigger_the_fallback_is_not_for_and_a_model_the_caller_may_not_use_end_the_call() {
    let (models, retries) = pool_with(
        "",
        r#"fallbacks = [{ model = "f", on = ["context_window"] }]"#,
    );
    let full = Step::Status(429, Duration::ZERO);
    let upstream = Scripted::new([full.clone(), full.clone(), full]);
    let attempted = paused(attempt_once(&models, &retries, &upstream));
    assert_eq!(attempted.fallback, None);
    assert!(attempted.result.is_err());
    assert!(!backends(&upstream).contains(&"x".to_owned()));

    let (models, retries) = pool_with("", ALL);
    let mut c = call(&models, &retries);
    c.tenant = std::sync::Arc::new(crate::auth::Tenant {
        name: c.tenant.name.clone(),
        allowed_models: Some(vec!["m".to_owned()]),
        enabled: true,
        limits: c.tenant.limits,
        pool: None,
        default_model: None,
    });
    let full = Step::Status(429, Duration::ZERO);
    let upstream = Scripted::new([full.clone(), full.clone(), full]);
    let attempted = paused(run(&c, &traffic(), &retries, &upstream, &models));
    assert_eq!(attempted.fallback, None);
    assert!(!backends(&upstream).contains(&"x".to_owned()));
}

#[test]
fn a_fallback_counts_against_the_attempt_cap() {
    // Three attempts at most: the three backends of `m` use them all, so no fallback is left.
    let (models, retries) = pool_with("", ALL);
    let mut retries = retries;
    retries.policy.max_attempts = 3;
    let full = Step::Status(429, Duration::ZERO);
    let upstream = Scripted::new([full.clone(), full.clone(), full]);
    let attempted = paused(attempt_once(&models, &retries, &upstream));
    assert_eq!(attempted.fallback, None);
    assert_eq!(upstream.sent().len(), 3);
}

/// The worst case: every backend of both models failing, every caller resending. With one
/// backend, each call's own model is done after one attempt and falls back at once; the
/// fallbacks are drawn from the budget, so what reaches the backends stays within its bound.
#[test]
fn with_every_backend_failing_fallbacks_stay_within_the_budget() {
    let (models, retries) = models_from(&format!(
        r#"
[retry]
budget_ratio = {BUDGET_RATIO}
budget_min_per_sec = {BUDGET_MIN_PER_SEC}
budget_window = "{BUDGET_WINDOW_SECS}s"
transient_backoff_base = "0s"
[[models]]
name = "f"
[[models.backends]]
name = "x"
url = "http://127.0.0.1:9/v1"
engine = "none"
[[models]]
name = "m"
{ALL}
[[models.backends]]
name = "a"
url = "http://127.0.0.1:9/v1"
engine = "none"
"#
    ));
    let failing = Step::Status(502, Duration::from_millis(1));
    let upstream = Scripted::new(std::iter::repeat_n(failing, 10_000));
    let requests = 600u64;
    paused(async {
        for _ in 0..requests {
            let _ = attempt_once(&models, &retries, &upstream).await;
        }
    });
    let sent = upstream.sent().len() as f64;
    let bound =
        requests as f64 * (1.0 + BUDGET_RATIO) + BUDGET_MIN_PER_SEC * BUDGET_WINDOW_SECS as f64;
    assert!(
        sent <= bound,
        "{sent} attempts for {requests} requests (bound {bound})"
    );
    assert!(sent > requests as f64, "no fallback happened at all");
}

/// The worst case for the fallback's own draw on the budget: every backend of the call's model
/// says the prompt is too long (so no retry was drawn before the fallback), every caller keeps
/// sending. Fallbacks stop when the budget is spent; the rest get the 400 as it came.
#[test]
fn with_every_prompt_too_long_fallbacks_stay_within_the_budget() {
    let (models, retries) = pool_with(
        "",
        r#"fallbacks = [{ model = "f", on = ["context_window"] }]"#,
    );
    let mut steps = Vec::new();
    let requests = 600u64;
    for _ in 0..requests {
        // The call's model says the prompt is too long; its fallback answers.
        steps.push(Step::Body(400, CONTEXT));
        steps.push(Step::Status(200, Duration::ZERO));
    }
    let upstream = Scripted::new(steps);
    let relayed_400s = paused(async {
        let mut relayed = 0;
        for _ in 0..requests {
            let a = attempt_once(&models, &retries, &upstream).await;
            if a.result.is_ok_and(|c| c.response.status() == 400) {
                relayed += 1;
            }
        }
        relayed
    });
    let sent = upstream.sent().len() as f64;
    let bound =
        requests as f64 * (1.0 + BUDGET_RATIO) + BUDGET_MIN_PER_SEC * BUDGET_WINDOW_SECS as f64;
    assert!(
        sent <= bound,
        "{sent} attempts for {requests} requests (bound {bound})"
    );
    assert!(relayed_400s > 0, "the budget never stopped a fallback");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Whatever the backends answer and however often callers resend, with a fallback for every
    /// trigger: no call makes more than `retry.max_attempts` attempts on all models together,
    /// and the attempts that reach a backend stay within requests x (1 + ratio) + floor of the
    /// call's own model's budget, as without fallbacks.
    #[test]
    fn fallbacks_stay_within_the_attempt_cap_and_the_budget(
        steps in prop::collection::vec(step(), 0..400),
        callers in 1usize..60,
        caller_retries in 0u32..4,
    ) {
        let (models, mut retries) = pool_with(
            "transient_backoff_base = \"0s\"\ncapacity_backoff_base = \"0s\"",
            ALL,
        );
        // As many attempts as `m` has backends: a fallback then has only the cap to stop it.
        retries.policy.max_attempts = 3;
        let upstream = Scripted::new(steps.clone());
        let (requests, most) = paused(async {
            let mut requests = 0u64;
            let mut most = 0usize;
            for _ in 0..callers {
                for _ in 0..=caller_retries {
                    requests += 1;
                    let before = upstream.sent().len();
                    let ok = attempt_once(&models, &retries, &upstream)
                        .await
                        .result
                        .is_ok_and(|c| c.response.status().is_success());
                    most = most.max(upstream.sent().len() - before);
                    if ok {
                        break;
                    }
                }
            }
            (requests, most)
        });
        prop_assert!(most <= retries.policy.max_attempts as usize, "one call made {most} attempts");
        let sent = upstream.sent().len();
        let refused = steps
            .iter()
            .take(sent)
            .filter(|s| matches!(s, Step::Fail(Outcome::ConnectFailed, _)))
            .count();
        let loaded = (sent - refused) as f64;
        let bound = requests as f64 * (1.0 + BUDGET_RATIO)
            + BUDGET_MIN_PER_SEC * BUDGET_WINDOW_SECS as f64;
        prop_assert!(loaded <= bound, "{loaded} attempts reached a backend for {requests} requests (bound {bound})");
    }
}
