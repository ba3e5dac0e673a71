//! The attempt loop over a pool wider than the lists the pool picks from keep in place (eight
//! backends): the states and candidates past the eighth still name the right backends.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::run;
use super::tests::{call, models_from, paused, Scripted};

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
            let chosen = run(&call(&models, &retries), &retries, &upstream, &models)
                .await
                .result
                .unwrap_or_else(|e| panic!("{}", e.message));
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
            let chosen = run(&call(&models, &retries), &retries, &upstream, &models).await;
            assert!(chosen.result.is_ok());
        }
    });
    let reached: BTreeSet<_> = upstream.sent().iter().map(|s| s.backend.clone()).collect();
    assert_eq!(reached.len(), 12, "reached {reached:?}");
}
