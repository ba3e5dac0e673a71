//! Generation slots: at most `capacity` requests generate at once, `queue` more wait, the rest
//! are refused.
//!
//! This is what makes the mock behave like a loaded inference server: latency grows while
//! requests queue, and a full queue answers 429. It is a resizable limit rather than a
//! `tokio::sync::Semaphore` because a test or a replay changes the profile mid-run (`PATCH
//! /control`) and the new capacity must hold for the next request, including requests already
//! waiting when it grows. Waiters are woken together and race for a freed slot, so the queue is
//! bounded but not strictly first-in first-out; for a simulated backend that is close enough.
//!
//! Each slot also holds the KV-cache tokens its request needs, given back with the slot, so the
//! load `/metrics` reports is read in one place and can never outlive the requests behind it.

use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

/// The shared gate. Cheap to use: one uncontended mutex per acquire and release.
#[derive(Debug, Default)]
pub(crate) struct Slots {
    state: Mutex<Occupancy>,
    freed: Notify,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Occupancy {
    capacity: u32,
    queue: u32,
    generating: u32,
    waiting: u32,
    kv_tokens: u64,
}

/// What the requests hold right now.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Load {
    /// Requests holding a generation slot.
    pub(crate) generating: u32,
    /// Requests waiting for one.
    pub(crate) waiting: u32,
    /// KV-cache tokens the generating requests hold.
    pub(crate) kv_tokens: u64,
}

/// The queue was full: the caller should answer 429.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QueueFull {
    pub(crate) capacity: u32,
    pub(crate) queue: u32,
}

/// A held generation slot and its KV-cache tokens, given back when dropped (also when the
/// request is cancelled).
#[derive(Debug)]
pub(crate) struct SlotPermit {
    slots: Arc<Slots>,
    kv_tokens: u64,
}

impl Slots {
    pub(crate) fn new(capacity: u32, queue: u32) -> Self {
        Self {
            state: Mutex::new(Occupancy {
                capacity,
                queue,
                ..Occupancy::default()
            }),
            freed: Notify::new(),
        }
    }

    /// Applies a new capacity and queue length to requests that arrive or wait from now on.
    /// Requests already generating keep their slot even if the capacity shrank below them.
    pub(crate) fn resize(&self, capacity: u32, queue: u32) {
        {
            let mut s = self.lock();
            s.capacity = capacity;
            s.queue = queue;
        }
        self.freed.notify_waiters();
    }

    /// (generating, waiting) right now.
    pub(crate) fn occupancy(&self) -> (u32, u32) {
        let load = self.load();
        (load.generating, load.waiting)
    }

    pub(crate) fn load(&self) -> Load {
        let s = self.lock();
        Load {
            generating: s.generating,
            waiting: s.waiting,
            kv_tokens: s.kv_tokens,
        }
    }

    /// Takes a slot holding `kv_tokens`, waiting in the queue if there is room there, or refuses
    /// at once.
    pub(crate) async fn acquire(self: &Arc<Self>, kv_tokens: u64) -> Result<SlotPermit, QueueFull> {
        {
            let mut s = self.lock();
            if s.generating < s.capacity {
                return Ok(self.admit(&mut s, kv_tokens));
            }
            if s.waiting >= s.queue {
                return Err(QueueFull {
                    capacity: s.capacity,
                    queue: s.queue,
                });
            }
            s.waiting += 1;
        }
        let mut waiting = Waiting {
            slots: self,
            admitted: false,
        };
        loop {
            // Registered before the check so a slot freed in between still wakes us.
            let mut freed = pin!(self.freed.notified());
            freed.as_mut().enable();
            {
                let mut s = self.lock();
                if s.generating < s.capacity {
                    s.waiting -= 1;
                    waiting.admitted = true;
                    return Ok(self.admit(&mut s, kv_tokens));
                }
            }
            freed.await;
        }
    }

    fn admit(self: &Arc<Self>, s: &mut Occupancy, kv_tokens: u64) -> SlotPermit {
        s.generating += 1;
        s.kv_tokens = s.kv_tokens.saturating_add(kv_tokens);
        SlotPermit {
            slots: Arc::clone(self),
            kv_tokens,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Occupancy> {
        // The critical sections only do arithmetic, so a poisoned lock still holds sane counts.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Leaves the queue if the waiting request is cancelled before it gets a slot.
struct Waiting<'a> {
    slots: &'a Slots,
    admitted: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.admitted {
            return;
        }
        let mut s = self.slots.lock();
        s.waiting = s.waiting.saturating_sub(1);
    }
}

impl Drop for SlotPermit {
    fn drop(&mut self) {
        let anyone_waiting = {
            let mut s = self.slots.lock();
            s.generating = s.generating.saturating_sub(1);
            s.kv_tokens = s.kv_tokens.saturating_sub(self.kv_tokens);
            s.waiting > 0
        };
        if anyone_waiting {
            self.slots.freed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn poll_once<F: std::future::Future>(f: std::pin::Pin<&mut F>) -> Option<F::Output> {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match f.poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }

    #[tokio::test]
    async fn full_capacity_queues_then_refuses() {
        let slots = Arc::new(Slots::new(1, 1));
        let held = slots.acquire(1).await.unwrap();
        let mut queued = pin!(slots.acquire(1));
        assert!(poll_once(queued.as_mut()).is_none());
        assert_eq!(slots.occupancy(), (1, 1));
        assert_eq!(
            slots.acquire(1).await.unwrap_err(),
            QueueFull {
                capacity: 1,
                queue: 1
            }
        );
        drop(held);
        let second = poll_once(queued.as_mut()).unwrap().unwrap();
        assert_eq!(slots.occupancy(), (1, 0));
        drop(second);
        assert_eq!(slots.occupancy(), (0, 0));
    }

    #[tokio::test]
    async fn growing_capacity_admits_requests_already_waiting() {
        let slots = Arc::new(Slots::new(1, 4));
        let _held = slots.acquire(1).await.unwrap();
        let mut queued = pin!(slots.acquire(1));
        assert!(poll_once(queued.as_mut()).is_none());
        slots.resize(2, 4);
        let _admitted = poll_once(queued.as_mut()).unwrap().unwrap();
        assert_eq!(slots.occupancy(), (2, 0));
    }

    #[tokio::test]
    async fn cancelled_waiter_leaves_the_queue() {
        let slots = Arc::new(Slots::new(1, 1));
        let _held = slots.acquire(1).await.unwrap();
        {
            let mut queued = pin!(slots.acquire(1));
            assert!(poll_once(queued.as_mut()).is_none());
            assert_eq!(slots.occupancy(), (1, 1));
        }
        assert_eq!(slots.occupancy(), (1, 0));
    }

    #[tokio::test]
    async fn shrinking_capacity_holds_new_requests_until_below_it() {
        let slots = Arc::new(Slots::new(2, 4));
        let a = slots.acquire(1).await.unwrap();
        let _b = slots.acquire(1).await.unwrap();
        slots.resize(1, 4);
        let mut queued = pin!(slots.acquire(1));
        assert!(poll_once(queued.as_mut()).is_none());
        drop(a);
        assert!(poll_once(queued.as_mut()).is_none());
        assert_eq!(slots.occupancy(), (1, 1));
    }

    #[tokio::test]
    async fn kv_tokens_are_held_with_the_slot_and_not_while_waiting() {
        let slots = Arc::new(Slots::new(1, 1));
        let a = slots.acquire(100).await.unwrap();
        let mut queued = pin!(slots.acquire(30));
        assert!(poll_once(queued.as_mut()).is_none());
        let load = slots.load();
        assert_eq!((load.generating, load.waiting, load.kv_tokens), (1, 1, 100));
        drop(a);
        let b = poll_once(queued.as_mut()).unwrap().unwrap();
        assert_eq!(slots.load().kv_tokens, 30);
        drop(b);
        assert_eq!(slots.load(), Load::default());
    }
}
