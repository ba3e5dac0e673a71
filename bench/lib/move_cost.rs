//! What one move of a 400-byte value costs on this machine when the value was written just
//! before (a struct built field by field and at once moved, as a future or a returned `Result`
//! is on the request path), against the same move of a value written long before
//! (bench/README: "copies of values just written").
//!
//! Run: `rustc -O bench/lib/move_cost.rs -o /tmp/move_cost && /tmp/move_cost`
//! (about two seconds; one thread; each figure is the time per move, back to back, with the
//! writing of the fields included in both).
use std::hint::black_box;
use std::time::Instant;

#[derive(Clone, Copy)]
struct Value {
    words: [u64; 50],
}

/// Writes the value's first fields with plain 8-byte stores, as a constructor does.
#[inline(never)]
fn write_fields(v: &mut Value, seed: u64) {
    for (i, w) in v.words.iter_mut().take(8).enumerate() {
        *w = seed + i as u64;
    }
}

/// Moves `from` into `to` whole: glibc's `memmove` for this size, as rustc moves it.
#[inline(never)]
fn move_value(to: &mut Value, from: &Value) {
    *to = *from;
}

fn main() {
    let n = 20_000_000u64;
    let mut a = Value { words: [1; 50] };
    let mut b = Value { words: [2; 50] };
    let mut other = Value { words: [3; 50] };
    // Fresh: the fields moved were written just before the move.
    let t = Instant::now();
    for i in 0..n {
        write_fields(&mut a, i);
        move_value(&mut b, black_box(&a));
    }
    let fresh = t.elapsed().as_secs_f64() / n as f64;
    // Settled: the same writes, to another value, and the move of one written long before.
    let t = Instant::now();
    for i in 0..n {
        write_fields(&mut other, i);
        move_value(&mut b, black_box(&a));
    }
    let settled = t.elapsed().as_secs_f64() / n as f64;
    println!(
        "400-byte move just after its fields were written {:.2} ns, of one written long before {:.2} ns ({} {} {})",
        fresh * 1e9,
        settled * 1e9,
        b.words[0],
        a.words[7],
        other.words[7]
    );
}
