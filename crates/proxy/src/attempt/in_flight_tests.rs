//! The model's count of calls in flight, as the retry budget reads it: with every backend
//! failing and every call wanting a retry at once, only `max_retrying_share` of the calls in
//! flight retry together.

use std::time::Duration;

use super::tests::{attempt_once, paused, pool_with, Scripted, Step};

/// Twenty calls in flight at once, each failed by its backend (503) at the same moment: the budget
/// grants a retry while fewer than half of the calls in flight are retrying (the rate allows
/// them all), so ten retry and the rest are refused. It reads the calls in flight from the
/// model's count: one that missed the calls (0) would let one retry, one that never let a call
/// go would let later calls retry past the share.
#[test]
fn with_every_call_failing_at_once_only_the_share_of_those_in_flight_retries() {
    let (models, retries) = pool_with(
        "max_retrying_share = 0.5\nmin_retrying = 1\n[outlier]\nenabled = false",
        "",
    );
    let calls = 20;
    let failing = (0..calls).map(|_| Step::Status(503, Duration::from_millis(10)));
    // Each retry is answered, after the others have had their turn at the budget.
    let answered = (0..calls).map(|_| Step::Status(200, Duration::from_millis(100)));
    let upstream = Scripted::new(failing.chain(answered));
    let m = models.get("m").unwrap().clone();
    let answers = paused(async {
        let runs = (0..calls).map(|_| attempt_once(&models, &retries, &upstream));
        let attempted = futures_util::future::join_all(runs).await;
        attempted
            .into_iter()
            .map(|a| a.result.is_ok_and(|c| c.response.status() == 200))
            .collect::<Vec<_>>()
    });
    assert_eq!(upstream.sent().len(), calls + calls / 2, "ten retries");
    assert_eq!(answers.iter().filter(|ok| **ok).count(), calls / 2);
    assert_eq!(m.in_flight.now(), 0, "every call left the count");

    // The refused ten are answered with the budget's refusal (the others' retries were
    // answered 200). Once they have all left, a lone failing call may retry again.
    let upstream = Scripted::new([Step::Status(503, Duration::ZERO)]);
    let lone = paused(attempt_once(&models, &retries, &upstream));
    assert_eq!(upstream.sent().len(), 2);
    assert!(lone.result.is_ok_and(|c| c.response.status() == 200));
}
