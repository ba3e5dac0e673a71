//! Adaptive throttling's pass in the attempt loop: taken off its model's count of pending passes
//! once, by the call's first recorded attempt (a fallback's too) or by the call's end.

use std::time::Duration;

use spillway_policy::Outcome;

use super::run;
use super::tests::{call, paused, pool_with, traffic, Scripted, Step};

/// A call's pass through adaptive throttling counts in its model's pending passes until its
/// first attempt is recorded, or until the call ends without one; a fallback's attempt closes
/// the pass of the model that gave it.
#[test]
fn a_throttling_pass_is_taken_off_its_models_count_once_by_its_first_attempt_or_its_end() {
    let (models, retries) = pool_with("throttle_k = 2.0", r#"fallbacks = [{ model = "f" }]"#);
    let m = models.get("m").unwrap().clone();
    let pending = || m.throttle_pending.now();
    let admitted = || {
        let mut call = call(&models, &retries);
        call.throttle_pass = Some(m.throttle_admits(crate::clock::now()).unwrap());
        call
    };

    let unanswered = admitted();
    assert_eq!(pending(), 1);
    drop(unanswered);
    assert_eq!(pending(), 0, "a call ended before any attempt");

    let upstream = Scripted::new([Step::Status(500, Duration::ZERO)]);
    let answered = admitted();
    paused(async {
        let _ = run(&answered, &traffic(), &retries, &upstream, &models).await;
        assert_eq!(
            pending(),
            0,
            "closed by the first attempt, the call still on"
        );
    });
    drop(answered);
    assert_eq!(pending(), 0, "and not taken off again at the end");

    // No backend of `m` can be reached (which records nothing for throttling): the fallback's
    // backend answers, and its attempt closes `m`'s pass.
    let upstream =
        Scripted::new((0..3).map(|_| Step::Fail(Outcome::ConnectFailed, Duration::ZERO)));
    let fell_back = admitted();
    paused(async {
        let _ = run(&fell_back, &traffic(), &retries, &upstream, &models).await;
        let sent = upstream.sent();
        assert_eq!(
            &*sent.last().unwrap().backend,
            "x",
            "answered by the fallback"
        );
        assert_eq!(pending(), 0, "closed by the fallback's attempt");
    });
    drop(fell_back);
    assert_eq!(pending(), 0);
}
