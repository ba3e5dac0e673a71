//! The attempt loop over a pool wider than the lists the pool picks from keep in place (eight
//! backends): the states and candidates past the eighth still name the right backends; and a
//! pick that starts again without the backend it first chose, up to one look at each.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use spillway_policy::Class;

use super::tests::{attempt_once, chosen, models_from, paused, Scripted};
use crate::pool::tests::backends;

/// Model `m` with `n` backends `b0`, `b1`, ..., each taking one request at a time.
fn wide(n: usize, balance: &str) -> (crate::pool::Models, super::Retries) {
    models_from(&format!(
        "[[models]]\nname = \"m\"\nbalance = \"{balance}\"\n{}",
        backends(n, 1)
    ))
}

/// With every backend of twelve full but one, the call goes to that one, wherever it lies, by
/// either strategy.
#[test]
fn the_one_backend_with_room_of_twelve_takes_the_call() {
    for (free, balance) in [0, 7, 8, 11]
        .into_iter()
        .flat_map(|free| ["least_load", "round_robin"].map(|balance| (free, balance)))
    {
        let (models, retries) = wide(12, balance);
        let pool = models.get("m").unwrap();
        let held: Vec<_> = (pool.backends.iter().enumerate())
            .filter(|&(i, _)| i != free)
            .map(|(_, b)| b.try_acquire().expect("an idle backend has room"))
            .collect();
        let upstream = Scripted::new([]);
        paused(async {
            let chosen = chosen(&models, &retries, &upstream).await;
            assert_eq!(chosen.response.status(), 200);
        });
        let sent: Vec<_> = upstream.sent().iter().map(|s| s.backend.clone()).collect();
        assert_eq!(
            sent,
            [Arc::from(format!("b{free}"))],
            "b{free} was the one free"
        );
        drop(held);
    }
}

/// Taken in turn, every one of twelve backends is reached, the last four too.
#[test]
fn every_backend_of_twelve_is_reached_in_turn() {
    let (models, retries) = wide(12, "round_robin");
    let upstream = Scripted::new([]);
    paused(async {
        for _ in 0..24 {
            chosen(&models, &retries, &upstream).await;
        }
    });
    let reached: BTreeSet<_> = upstream.sent().iter().map(|s| s.backend.clone()).collect();
    assert_eq!(reached.len(), 12, "reached {reached:?}");
}

/// Three backends of two requests each, by least load, whose first `probes_out` have had
/// their one probe after an ejection taken (each looks the least loaded and refuses at the
/// last moment), and the others one request in flight. Returns where the call was sent and
/// whether it was answered.
fn pick_with_probes_out(probes_out: usize) -> (Vec<Arc<str>>, bool) {
    let (models, retries) = models_from(&format!(
        "[outlier]\nconsecutive_failures = 1\nbase_ejection = \"10s\"\npanic_threshold = 0.0\n\
         [[models]]\nname = \"m\"\nbalance = \"least_load\"\n{}",
        backends(3, 2)
    ));
    let pool = models.get("m").unwrap();
    let upstream = Scripted::new([]);
    let answered = paused(async {
        let (probing, healthy) = pool.backends.split_at(probes_out);
        for backend in probing {
            backend
                .health
                .record(crate::clock::now(), Class::ServerError, 0, None, true);
        }
        tokio::time::advance(Duration::from_secs(11)).await;
        for backend in probing {
            assert!(
                backend.health.admit(crate::clock::now()),
                "the one probe, taken"
            );
            assert!(!backend.health.admit(crate::clock::now()), "and out");
        }
        let _held: Vec<_> = healthy
            .iter()
            .map(|b| b.try_acquire().expect("room"))
            .collect();
        let attempted = attempt_once(&models, &retries, &upstream).await;
        attempted.result.is_ok()
    });
    let sent = upstream.sent().iter().map(|s| s.backend.clone()).collect();
    (sent, answered)
}

/// A backend that looks the least loaded but refuses at the last moment (its one probe after an
/// ejection is out) is passed over for another in the same pick, which starts afresh without it.
#[test]
fn a_backend_whose_probe_is_out_is_passed_over_for_another() {
    let (sent, answered) = pick_with_probes_out(1);
    assert!(answered);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_ne!(&*sent[0], "b0", "sent to the backend whose probe was out");
}

/// With every backend refusing at the last moment, the pick gives up after one look at each:
/// nothing is sent and the call is refused, with no loop and no panic.
#[test]
fn with_every_probe_out_nothing_is_sent_and_the_call_is_refused() {
    let (sent, answered) = pick_with_probes_out(3);
    assert!(!answered);
    assert!(sent.is_empty(), "{sent:?}");
}
