//! The attempt loop over a pool wider than the lists the pool picks from keep in place (eight
//! backends): the states and candidates past the eighth still name the right backends; and a
//! pick that starts again without the backend it first chose.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use spillway_policy::Class;

use super::tests::{chosen, models_from, paused, Scripted};

/// Model `m` with `n` backends `b0`, `b1`, ..., each taking one request at a time.
fn wide(n: usize, balance: &str) -> (crate::pool::Models, super::Retries) {
    let backends: String = (0..n)
        .map(|i| {
            format!(
                "[[models.backends]]\nname = \"b{i}\"\nurl = \"http://127.0.0.1:9/v1\"\n\
                 engine = \"none\"\nmax_concurrency = 1\n"
            )
        })
        .collect();
    models_from(&format!(
        "[[models]]\nname = \"m\"\nbalance = \"{balance}\"\n{backends}"
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

/// A backend that looks the least loaded but refuses at the last moment (its one probe after an
/// ejection is out) is passed over for another in the same pick, which starts afresh without it.
#[test]
fn a_backend_whose_probe_is_out_is_passed_over_for_another() {
    let backends: String = (0..3)
        .map(|i| {
            format!(
                "[[models.backends]]\nname = \"b{i}\"\nurl = \"http://127.0.0.1:9/v1\"\n\
                 engine = \"none\"\nmax_concurrency = 2\n"
            )
        })
        .collect();
    let (models, retries) = models_from(&format!(
        "[outlier]\nconsecutive_failures = 1\nbase_ejection = \"10s\"\npanic_threshold = 0.0\n\
         [[models]]\nname = \"m\"\nbalance = \"least_load\"\n{backends}"
    ));
    let pool = models.get("m").unwrap();
    let upstream = Scripted::new([]);
    paused(async {
        let probing = &pool.backends[0].health;
        probing.record(crate::clock::now(), Class::ServerError, 0, true);
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(probing.admit(crate::clock::now()), "the one probe, taken");
        assert!(!probing.admit(crate::clock::now()), "and out");
        // b0 has the fewest requests in flight: the first pick.
        let held = [1, 2].map(|i| pool.backends[i].try_acquire().expect("room"));
        let chosen = chosen(&models, &retries, &upstream).await;
        assert_eq!(chosen.response.status(), 200);
        drop(held);
    });
    let sent: Vec<_> = upstream.sent().iter().map(|s| s.backend.clone()).collect();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_ne!(&*sent[0], "b0", "sent to the backend whose probe was out");
}
