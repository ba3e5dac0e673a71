//! Waiting for a seat in a model's pool: priority classes and fair queuing across tenants
//! (the Kubernetes API Priority and Fairness model, in `spillway_policy::fair`).
//!
//! A pool has as many seats as its backends' concurrency limits add up to. A request that finds
//! them all taken waits in its tenant's queue of its class, at most `admission.queue_wait`;
//! seats go to the highest class first and round-robin across the tenants of a class, so a
//! tenant with a thousand requests queued gets one seat in turn like a tenant with one. Queues
//! are bounded per tenant and in total; when the total is full, the newest request of the
//! lowest class queued is shed to make room for a higher class. A waiter that times out, is
//! shed, or whose client goes away leaves no trace: its ticket is cancelled, and a seat handed
//! to it in the meantime is passed on.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use spillway_policy::fair::{FairQueue, Offer, QueueBounds, Rejection, Released, Ticket};
use spillway_policy::Priority;
use tokio::sync::oneshot;

/// One queue per model and bulkhead (`None`: the model's shared backends), found by the names
/// a request borrows: looking one up takes no reference count.
#[derive(Default)]
pub(super) struct Queues(foldhash::HashMap<Arc<str>, Vec<Line>>);

/// A model's queue for one bulkhead.
type Line = (Option<Arc<str>>, Arc<PoolQueue>);

impl Queues {
    pub fn get(&self, model: &str, bulkhead: Option<&str>) -> Option<&Arc<PoolQueue>> {
        let lines = self.0.get(model)?;
        lines
            .iter()
            .find(|(b, _)| b.as_deref() == bulkhead)
            .map(|(_, q)| q)
    }

    /// Adds the queue of `model` and `bulkhead`, made by `make`, unless it is there.
    pub fn add(
        &mut self,
        model: &Arc<str>,
        bulkhead: &Option<Arc<str>>,
        make: impl FnOnce() -> Arc<PoolQueue>,
    ) {
        let lines = self.0.entry(model.clone()).or_default();
        if !lines.iter().any(|(b, _)| b == bulkhead) {
            lines.push((bulkhead.clone(), make()));
        }
    }

    /// Every queue, with its model and bulkhead.
    pub fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &Option<Arc<str>>, &Arc<PoolQueue>)> {
        self.0
            .iter()
            .flat_map(|(model, lines)| lines.iter().map(move |(b, q)| (model, b, q)))
    }
}

/// Why a request got no seat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shed {
    /// Its tenant's queue is full.
    TenantQueueFull,
    /// Every queue is full and nothing of a lower class could be shed for it.
    QueueFull,
    /// It waited `queue_wait` without a seat.
    Timeout,
    /// It was shed for a request of a higher class.
    Evicted,
}

impl Shed {
    /// The refusal it is counted as (`spillway_admissions_total`'s outcome).
    pub(crate) fn refused(self) -> crate::traffic::Refused {
        use crate::traffic::Refused;
        match self {
            Shed::TenantQueueFull => Refused::TenantQueueFull,
            Shed::QueueFull => Refused::QueueFull,
            Shed::Timeout => Refused::QueueTimeout,
            Shed::Evicted => Refused::ShedForHigherClass,
        }
    }
}

type Queue = FairQueue<Arc<str>, oneshot::Sender<()>>;

/// One pool's seats and waiters.
pub(crate) struct PoolQueue {
    queue: Mutex<Queue>,
    bounds: QueueBounds,
    wait: Duration,
}

/// A seat in the pool, given back (to the next waiter) on drop.
pub(crate) struct Seat {
    queue: Arc<PoolQueue>,
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut queue = self.queue.lock();
        let released = queue.release(crate::clock::now());
        hand_out(&mut queue, released);
    }
}

impl PoolQueue {
    pub(crate) fn new(bounds: QueueBounds, wait: Duration) -> Arc<PoolQueue> {
        Arc::new(PoolQueue {
            queue: Mutex::new(FairQueue::new(0, bounds)),
            bounds,
            wait,
        })
    }

    /// Its bounds and longest wait, which a reload compares to decide whether to keep it.
    pub(crate) fn settings(&self) -> (QueueBounds, Duration) {
        (self.bounds, self.wait)
    }

    /// Requests waiting, by class (critical, standard, batch), and seats in use and in all.
    pub(crate) fn figures(&self) -> ([usize; 3], usize, usize) {
        let q = self.lock();
        let queued = Priority::ALL.map(|p| q.queued(p));
        (queued, q.in_use(), q.seats())
    }

    /// A seat at once, when one is free and no one waits for it; `None` otherwise, for
    /// [`PoolQueue::enter`] to queue or refuse the request. `seats` as for `enter`.
    pub(crate) fn try_enter(self: &Arc<Self>, now: Instant, seats: usize) -> Option<Seat> {
        self.with_seats(now, seats).try_admit().then(|| self.seat())
    }

    /// A seat at once, or after waiting at most `queue_wait` in `line`; `seats` is the pool's
    /// capacity at `now` (it follows the backends' adaptive limits). `waiting` is called when
    /// the request must wait, and what it returns is held while it does. Returns the seat and
    /// how long it waited.
    pub(crate) async fn enter<W>(
        self: &Arc<Self>,
        now: Instant,
        seats: usize,
        priority: Priority,
        line: &Arc<str>,
        waiting: impl FnOnce() -> W,
    ) -> Result<(Seat, Duration), Shed> {
        let offered = {
            let mut queue = self.with_seats(now, seats);
            // A free seat is taken without the channel a waiter would be woken through, and
            // without a place in a line.
            (!queue.try_admit()).then(|| {
                let (tx, rx) = oneshot::channel();
                let line = Arc::clone(line);
                (queue.offer(now, priority, line, tx, now + self.wait), rx)
            })
        };
        let Some((offer, rx)) = offered else {
            return Ok((self.seat(), Duration::ZERO));
        };
        let ticket = match offer {
            Offer::Admit(_) => return Ok((self.seat(), Duration::ZERO)),
            Offer::Rejected(_, Rejection::TenantQueueFull) => return Err(Shed::TenantQueueFull),
            Offer::Rejected(_, _) => return Err(Shed::QueueFull),
            Offer::Queued { ticket, evicted } => {
                // Dropping the evicted waiter's sender wakes it to report `Evicted`.
                drop(evicted);
                ticket
            }
        };
        let _waiting = waiting();
        let mut waiting = Waiting {
            queue: self.clone(),
            ticket,
            rx: Some(rx),
        };
        let rx = waiting.rx.as_mut().expect("set above");
        let outcome = tokio::time::timeout(self.wait, rx).await;
        let mut rx = waiting.rx.take().expect("set above");
        match outcome {
            Ok(Ok(())) => Ok((self.seat(), crate::clock::since(now))),
            // The sender went without a seat: shed for a higher class, or expired.
            Ok(Err(_)) if crate::clock::since(now) >= self.wait => Err(Shed::Timeout),
            Ok(Err(_)) => Err(Shed::Evicted),
            Err(_) => {
                if self.lock().cancel(ticket).is_some() {
                    return Err(Shed::Timeout);
                }
                // Handed a seat (under the lock) just as the wait ended: take it.
                match rx.try_recv() {
                    Ok(()) => Ok((self.seat(), crate::clock::since(now))),
                    Err(_) => Err(Shed::Timeout),
                }
            }
        }
    }

    fn seat(self: &Arc<Self>) -> Seat {
        Seat {
            queue: self.clone(),
        }
    }

    /// The queue, locked, with `seats` seats at `now`: the seats that brings are handed out to
    /// those waiting first.
    fn with_seats(&self, now: Instant, seats: usize) -> MutexGuard<'_, Queue> {
        let mut queue = self.lock();
        let released = queue.set_seats(now, seats);
        hand_out(&mut queue, released);
        queue
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Gives each dispatched waiter its seat; a waiter that is gone passes its seat on. Expired
/// waiters' senders are dropped, which wakes them.
fn hand_out(queue: &mut Queue, mut released: Released<Arc<str>, oneshot::Sender<()>>) {
    loop {
        let mut gone = 0;
        for waiter in released.dispatched.drain(..) {
            if waiter.item.send(()).is_err() {
                gone += 1;
            }
        }
        if gone == 0 {
            return;
        }
        let now = crate::clock::now();
        released = Released {
            dispatched: Vec::new(),
            expired: Vec::new(),
        };
        for _ in 0..gone {
            let more = queue.release(now);
            released.dispatched.extend(more.dispatched);
        }
    }
}

/// A waiter in the queue; dropped before it is answered (the client went away), it cancels its
/// ticket, or gives back the seat it was handed meanwhile.
struct Waiting {
    queue: Arc<PoolQueue>,
    ticket: Ticket,
    rx: Option<oneshot::Receiver<()>>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        let mut queue = self.queue.lock();
        if queue.cancel(self.ticket).is_some() {
            return;
        }
        if rx.try_recv().is_ok() {
            let released = queue.release(crate::clock::now());
            hand_out(&mut queue, released);
        }
    }
}
