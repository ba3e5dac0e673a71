//! Picks racing on several threads: the caps that `acquire` promises hold under any interleaving.

use std::sync::Barrier;
use std::thread;

use spillway_config::{BackendKind, Config};

use super::{Ask, ModelPool, Models};

/// `n` backends `b0`, `b1`, ... of a model's table, each taking `room` requests at a time.
pub(crate) fn backends(n: usize, room: u32) -> String {
    (0..n)
        .map(|i| {
            format!(
                "[[models.backends]]\nname = \"b{i}\"\nurl = \"http://127.0.0.1:9/v1\"\n\
                 engine = \"none\"\nmax_concurrency = {room}\n"
            )
        })
        .collect()
}

/// The model pools of `config`, whose backends must all be `openai` ones.
pub(crate) fn models(config: &Config) -> Models {
    Models::new(config, |_, b| match &b.kind {
        BackendKind::OpenAi { url } => Ok(url.clone()),
        other => Err(format!("unexpected {other:?}")),
    })
    .unwrap()
}

/// The backends' loads, each read once, in order.
fn loads(pool: &ModelPool) -> Vec<u32> {
    pool.backends.iter().map(|b| b.outstanding()).collect()
}

/// Every thread takes `each` units for one affinity key and keeps them, checking after each
/// take that no backend is over the bound. Nothing is released, so loads only grow: a backend
/// within `ceil(load_factor x total / n)` when its load was read stays within it for any total
/// read after, and the check cannot fail on a correct pool, whatever the interleaving.
fn race_on_one_key(pool: &ModelPool, threads: usize, each: usize) {
    let load_factor = pool.balance.load_factor;
    let start = Barrier::new(threads);
    let holds: Vec<_> = thread::scope(|s| {
        let racers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let ask = Ask {
                        affinity_key: Some(7),
                        ..Ask::default()
                    };
                    let mut holds = Vec::with_capacity(each);
                    start.wait();
                    for _ in 0..each {
                        let now = crate::clock::now();
                        let got = pool.acquire(now, ask, &[]).expect("a backend has room");
                        holds.push(got.hold);
                        // Each load of a first reading is judged against the total of a
                        // second, taken after it: at least the total when that load was read.
                        let (first, then) = (loads(pool), loads(pool));
                        let total: u32 = then.iter().sum();
                        let bound =
                            (load_factor * f64::from(total) / then.len() as f64).ceil() as u32;
                        assert!(
                            first.iter().all(|&l| l <= bound),
                            "loads {first:?} over the bound {bound} of {total} in flight"
                        );
                    }
                    // Held until every thread has taken its share.
                    holds
                })
            })
            .collect();
        racers.into_iter().map(|r| r.join().unwrap()).collect()
    });
    drop(holds);
}

/// The affinity bound is taken with the unit, not only judged from the loads read before: picks
/// racing on one key never put a backend over `load_factor` times its share.
#[test]
fn racing_picks_on_one_key_keep_every_backend_within_the_load_bound() {
    let toml = format!(
        "[[models]]\nname = \"m\"\nbalance = \"prefix_affinity\"\n{}",
        backends(2, 1_000_000)
    );
    let pool_models = models(&Config::from_toml(&toml).unwrap());
    let pool = pool_models.get("m").unwrap();
    race_on_one_key(pool, 4, 20_000);
    assert_eq!(loads(pool), [0, 0], "every unit is given back");
}
