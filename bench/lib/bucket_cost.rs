//! What finding a histogram value's bucket costs, the two ways `crates/proxy/src/histograms.rs`
//! could: a binary search over the bounds (`partition_point`), and a count of the bounds below
//! the value (bench/README: "a histogram's bucket found by counting").
//!
//! Run: `rustc -O bench/lib/bucket_cost.rs -o /tmp/bucket_cost && /tmp/bucket_cost`
//! (about a second; one thread; 20 M values spread over the buckets, three rounds of each way;
//! each figure is the time per value, the values' counts kept so neither way is optimised out).
use std::hint::black_box;
use std::time::Instant;

/// The request path's latency buckets (`LATENCY_BUCKETS` in crates/proxy/src/metrics.rs).
const BOUNDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
];

#[inline(never)]
fn searched(bounds: &[f64], value: f64) -> usize {
    bounds.partition_point(|&bound| bound < value)
}

#[inline(never)]
fn counted(bounds: &[f64], value: f64) -> usize {
    bounds.iter().map(|&bound| usize::from(bound < value)).sum()
}

fn main() {
    // Values from 0 to 10 s, spread over every bucket below it (xorshift, a fixed seed).
    let mut x: u64 = 88_172_645_463_325_252;
    let values: Vec<f64> = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 1_000_000) as f64 / 1e6 * 0.01 * (1 + (x >> 40) % 1000) as f64
        })
        .collect();
    let rounds = 5000;
    let mut counts = [0u64; 18];
    for round in 1..=3 {
        for (way, find) in [("binary search", searched as fn(&[f64], f64) -> usize), ("count", counted)] {
            let t = Instant::now();
            for _ in 0..rounds {
                for &value in &values {
                    counts[find(black_box(BOUNDS), value)] += 1;
                }
            }
            let ns = t.elapsed().as_secs_f64() * 1e9 / (rounds * values.len()) as f64;
            println!("round {round}: {way} {ns:.2} ns a value");
        }
    }
    let searched_all: Vec<usize> = values.iter().map(|&v| searched(BOUNDS, v)).collect();
    let counted_all: Vec<usize> = values.iter().map(|&v| counted(BOUNDS, v)).collect();
    assert_eq!(searched_all, counted_all, "both ways find the same buckets");
    black_box(counts);
}
