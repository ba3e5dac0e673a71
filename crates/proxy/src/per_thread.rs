//! Values written by each thread into a copy of its own, added up when read: what the gateway's
//! histograms and counters count in (`histograms.rs`).
//!
//! A locked addition costs some 20 cycles here (8 ns back to back, `bench/lib/atomic_cost.rs`)
//! where a load and a store cost one; a request adds to some ten counts. Each of the first
//! [`OWNED`] threads to write a value gets a copy of its own, made when it first writes that value
//! and allocated by it (so two writing threads never share a cache line), which it updates with a
//! plain load and store: one writer, so no update is lost. Later threads share one copy and update
//! it with atomic read-modify-writes. A reader adds the copies up; it may miss an update under
//! way, never lose one.

use std::cell::Cell;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use foldhash::HashMap;

/// Threads that get a copy of their own of each value (the first to write one); every later
/// thread shares one.
pub(crate) const OWNED: usize = 8;

/// The copy this thread writes: its own number below [`OWNED`], or `OWNED` (shared).
pub(crate) fn writer() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static WRITER: Cell<Option<usize>> = const { Cell::new(None) };
    }
    WRITER.with(|writer| {
        writer.get().unwrap_or_else(|| {
            let n = NEXT.fetch_add(1, Ordering::Relaxed).min(OWNED);
            writer.set(Some(n));
            n
        })
    })
}

/// Adds `by` to `count`, one of a copy's counts: with a plain load and store when its writer
/// owns the copy, an atomic addition when it shares it.
pub(crate) fn add(count: &AtomicU64, owned: bool, by: u64) {
    match owned {
        true => count.store(
            count.load(Ordering::Relaxed).wrapping_add(by),
            Ordering::Relaxed,
        ),
        false => {
            count.fetch_add(by, Ordering::Relaxed);
        }
    }
}

/// A value's copies: one per owning writer and the shared one, each made when first written.
pub(crate) struct PerThread<T> {
    copies: [OnceLock<Box<T>>; OWNED + 1],
}

impl<T> Default for PerThread<T> {
    fn default() -> Self {
        PerThread::new()
    }
}

impl<T> std::fmt::Debug for PerThread<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let made = self.copies.iter().filter(|c| c.get().is_some()).count();
        write!(f, "PerThread({made} copies)")
    }
}

impl<T> PerThread<T> {
    pub(crate) fn new() -> PerThread<T> {
        PerThread {
            copies: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    /// The copy of `writer` (see [`writer`]), made by `make` if it is the first write; and
    /// whether the writer owns it (true below [`OWNED`]) or shares it.
    pub(crate) fn copy(&self, writer: usize, make: impl FnOnce() -> T) -> (&T, bool) {
        let copy = self.copies[writer].get_or_init(|| Box::new(make()));
        (copy, writer < OWNED)
    }

    /// The copies made so far.
    pub(crate) fn made(&self) -> impl Iterator<Item = &T> {
        self.copies
            .iter()
            .filter_map(|copy| copy.get().map(|b| &**b))
    }

    /// The sum over the copies made of the count `of` picks in each.
    pub(crate) fn sum(&self, of: impl Fn(&T) -> &AtomicU64) -> u64 {
        let counts = self.made().map(|copy| of(copy).load(Ordering::Relaxed));
        counts.fold(0u64, u64::wrapping_add)
    }

    /// Whether `writer`'s copy has been made.
    #[cfg(test)]
    pub(crate) fn has(&self, writer: usize) -> bool {
        self.copies[writer].get().is_some()
    }
}

/// The most entries a thread's cache at hand ([`at_hand`]) keeps; past it they are let go and
/// found again.
pub(crate) const AT_HAND_MAX: usize = 1024;

/// The value at `key` in a thread's cache at hand, made by `make` when it is not there (a full
/// cache is emptied first). The request path finds what it counts in or authenticates with by
/// where shared strings and answers lie ([`address`]): a hash of numbers, no lock. A value holds
/// what its key's addresses are of, so that while it is here nothing else can come to lie
/// there: one key is always one value.
pub(crate) fn at_hand<K: Hash + Eq, V>(
    near: &mut HashMap<K, V>,
    key: K,
    make: impl FnOnce() -> V,
) -> &V {
    if near.len() >= AT_HAND_MAX && !near.contains_key(&key) {
        near.clear();
    }
    near.entry(key).or_insert_with(make)
}

/// Where `shared`'s value lies, as a number for [`at_hand`]'s keys.
pub(crate) fn address<T: ?Sized>(shared: &Arc<T>) -> usize {
    Arc::as_ptr(shared).cast::<u8>() as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_at_hand_is_made_once_and_a_full_cache_starts_again() {
        let mut near: HashMap<usize, usize> = HashMap::default();
        let mut made = 0;
        for round in 0..2 {
            for key in 0..AT_HAND_MAX {
                let value = *at_hand(&mut near, key, || {
                    made += 1;
                    key * 10
                });
                assert_eq!(value, key * 10);
            }
            assert_eq!(made, AT_HAND_MAX, "round {round} made none again");
        }
        // One more key past the bound: the cache starts again with it alone.
        assert_eq!(*at_hand(&mut near, AT_HAND_MAX, || 7), 7);
        assert_eq!(near.len(), 1);
    }
}
