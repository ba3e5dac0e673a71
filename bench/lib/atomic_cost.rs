//! What one uncontended locked read-modify-write costs on this machine, against the plain load
//! and store that replaces it where one thread writes alone (bench/README: "locked operations").
//!
//! Run: `rustc -O bench/lib/atomic_cost.rs -o /tmp/atomic_cost && /tmp/atomic_cost`
//! (about two seconds; one thread; each figure is the time per operation, back to back).
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
fn main() {
    let n = 200_000_000u64;
    let a = AtomicU64::new(0);
    let t = Instant::now();
    for _ in 0..n { a.fetch_add(1, Ordering::Relaxed); }
    let locked = t.elapsed().as_secs_f64() / n as f64;
    let b = AtomicU64::new(0);
    let t = Instant::now();
    for _ in 0..n { b.store(std::hint::black_box(b.load(Ordering::Relaxed)) + 1, Ordering::Relaxed); }
    let plain = t.elapsed().as_secs_f64() / n as f64;
    println!("locked add {:.2} ns, load+store {:.2} ns ({} {})", locked*1e9, plain*1e9, a.load(Ordering::Relaxed), b.load(Ordering::Relaxed));
}
