//! Counters counted per thread (`per_thread.rs`): a request adds to five, which the exporter
//! counted with two locked additions each (its value and a generation for idle series, which
//! the gateway does not expire); here a worker thread adds with a plain load and store.

use std::sync::atomic::AtomicU64;

use metrics::CounterFn;

use crate::per_thread::{add, writer, PerThread};

/// A counter series' total, as copies per writing thread.
#[derive(Debug)]
pub(crate) struct Tally {
    copies: PerThread<AtomicU64>,
}

impl Tally {
    pub(crate) fn new() -> Tally {
        Tally {
            copies: PerThread::new(),
        }
    }

    /// Adds `by` as writer `writer` (see [`writer`]).
    fn add_as(&self, writer: usize, by: u64) {
        let (count, owned) = self.copies.copy(writer, || AtomicU64::new(0));
        add(count, owned, by);
    }

    /// The total: the copies added up.
    pub(crate) fn total(&self) -> u64 {
        self.copies.sum(|count| count)
    }
}

impl CounterFn for Tally {
    fn increment(&self, by: u64) {
        self.add_as(writer(), by);
    }

    /// Raises the total to `value` if it is lower, as the exporter's counters do (`fetch_max`):
    /// the difference is added to the shared copy. A series set only this way reads the highest
    /// value set; an addition made by another thread meanwhile is counted on top.
    fn absolute(&self, value: u64) {
        let total = self.total();
        if value > total {
            self.add_as(crate::per_thread::OWNED, value - total);
        }
    }
}

/// A count of what is under way (a model's calls in flight), kept as a [`Tally`] of its ups and
/// downs per writing thread: entering and leaving take a plain load and store on the thread's
/// own copy, where one shared atomic count took a locked instruction each. A leave adds `-1`
/// as its wrapping `u64`, so the copies add up to the count whichever thread each step ran on.
pub(crate) struct Level(Tally);

impl Level {
    pub(crate) fn new() -> Level {
        Level(Tally::new())
    }

    /// Counts one more until the returned guard is dropped.
    pub(crate) fn enter(&self) -> Present<'_> {
        self.up();
        Present(self)
    }

    /// One more, for a holder that takes it off itself ([`down`](Level::down)) once.
    pub(crate) fn up(&self) {
        self.0.add_as(writer(), 1);
    }

    /// One fewer: the end of an [`up`](Level::up).
    pub(crate) fn down(&self) {
        self.0.add_as(writer(), u64::MAX);
    }

    /// How many are under way. A step under way on another thread may be missed; a leave seen
    /// without the entry it ends (copies read apart) is read as none under way, not as a wrapped
    /// count.
    pub(crate) fn now(&self) -> u64 {
        let total = self.0.total();
        if total > u64::MAX / 2 {
            0
        } else {
            total
        }
    }
}

impl std::fmt::Debug for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Level({})", self.now())
    }
}

/// One entry into a [`Level`], counted until dropped.
pub(crate) struct Present<'a>(&'a Level);

impl Drop for Present<'_> {
    fn drop(&mut self) {
        self.0.down();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::per_thread::OWNED;

    #[test]
    fn the_total_adds_up_every_writer_owned_and_shared_alike() {
        let tally = Tally::new();
        assert_eq!(tally.total(), 0);
        for (writer, by) in [(0, 1), (OWNED, 2), (5, 10), (0, 3), (OWNED, 4)] {
            tally.add_as(writer, by);
        }
        assert_eq!(tally.total(), 20);
        // Only the writers that added have copies.
        let made: Vec<usize> = (0..=OWNED).filter(|&w| tally.copies.has(w)).collect();
        assert_eq!(made, [0, 5, OWNED]);
    }

    #[test]
    fn a_level_counts_what_is_present_whichever_thread_enters_and_leaves() {
        let level = Level::new();
        assert_eq!(level.now(), 0);
        let a = level.enter();
        let b = level.enter();
        assert_eq!(level.now(), 2);
        drop(a);
        assert_eq!(level.now(), 1);
        // Entries made here and left on other threads, and threads past those that own a copy
        // each entering and leaving on their own.
        let here: Vec<Present<'_>> = (0..2 * OWNED).map(|_| level.enter()).collect();
        std::thread::scope(|s| {
            for _ in 0..2 * OWNED {
                s.spawn(|| drop(level.enter()));
            }
        });
        assert_eq!(level.now(), 1 + (2 * OWNED) as u64);
        std::thread::scope(|s| {
            for present in here {
                s.spawn(move || drop(present));
            }
        });
        assert_eq!(level.now(), 1);
        drop(b);
        assert_eq!(level.now(), 0);
    }

    #[test]
    fn a_leave_read_without_its_entry_is_read_as_none_under_way() {
        let level = Level::new();
        level.0.add_as(OWNED, u64::MAX);
        assert_eq!(level.now(), 0);
        level.0.add_as(0, 1);
        assert_eq!(level.now(), 0);
        level.0.add_as(1, 1);
        assert_eq!(level.now(), 1);
    }

    #[test]
    fn an_absolute_value_raises_the_total_and_never_lowers_it() {
        let tally = Tally::new();
        tally.absolute(0);
        assert_eq!(tally.total(), 0);
        tally.absolute(7);
        assert_eq!(tally.total(), 7);
        tally.absolute(5);
        assert_eq!(tally.total(), 7);
        tally.increment(2);
        assert_eq!(tally.total(), 9);
        tally.absolute(12);
        assert_eq!(tally.total(), 12);
    }

    #[test]
    fn threads_past_the_owning_ones_lose_no_addition() {
        let tally = Arc::new(Tally::new());
        let threads = 2 * OWNED + 3;
        let per_thread = 5000;
        let spawned: Vec<_> = (0..threads)
            .map(|_| {
                let tally = Arc::clone(&tally);
                std::thread::spawn(move || {
                    for _ in 0..per_thread {
                        tally.increment(1);
                    }
                })
            })
            .collect();
        for thread in spawned {
            thread.join().expect("a counting thread panicked");
        }
        assert_eq!(tally.total(), (threads * per_thread) as u64);
        assert!(tally.copies.has(OWNED));
    }
}
