//! Priority classes and fair queuing across tenants for a pool's seats, after Kubernetes API
//! Priority and Fairness (APF): a fixed number of seats, bounded queues, a wait deadline, and
//! fair dispatch among tenants.
//!
//! Why: when a pool is full, whoever sends most would otherwise get most of the seats as they
//! free up, and one tenant's flood becomes everyone's outage. Queuing per tenant and dispatching
//! round-robin gives each tenant with waiting work an equal share of the freed seats, however
//! many requests it has queued. The rules apply to every tenant, internal ones too.
//!
//! Classes are strict: a seat goes to a waiting `critical` request before any `standard` one,
//! and to `standard` before `batch`. A lower class can therefore starve while higher ones keep
//! every seat busy; that is the intended contract of `batch` (it uses what is left), and its
//! starvation is bounded by each request's deadline: an overdue request leaves the queue
//! ([`FairQueue::expire`], and on every [`FairQueue::release`]) and is answered with
//! `Retry-After`. When the whole queue is full, a request of a higher class than the lowest one
//! waiting takes the place of the newest waiter of that lowest class: the lowest class is shed
//! first.
//!
//! Fairness, exactly: within a class, tenants with waiting requests form a ring; each dispatch
//! takes the oldest request of the tenant at the front and moves that tenant to the back, and a
//! tenant that starts waiting joins at the back. So between a request's arrival and its dispatch,
//! each other tenant of its class is dispatched at most `m + 1` times, where `m` is the number
//! of its own tenant's requests of that class queued ahead of it; with `n` tenants, at most
//! `(n - 1) x (m + 1)` other dispatches of its class. Tenants have equal weight.
//!
//! Cost: `offer`, `release` and `cancel` are O(log n) in the queued requests plus O(tenants)
//! when a tenant's queue empties by `cancel` or eviction (its place in the ring is searched);
//! `expire` is O(log n) per overdue request, via an index by deadline.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::Hash;
use std::str::FromStr;
use std::time::Instant;

/// A tenant's scheduling class; lower classes are shed first. The one definition for the
/// config, the store, the admin API and the queue, spelt `critical`, `standard` and `batch`
/// everywhere (with serde behind this crate's `serde` feature).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "lowercase")
)]
pub enum Priority {
    Critical,
    #[default]
    Standard,
    Batch,
}

impl Priority {
    /// Highest first.
    pub const ALL: [Priority; 3] = [Priority::Critical, Priority::Standard, Priority::Batch];

    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::Standard => "standard",
            Priority::Batch => "batch",
        }
    }

    /// The lower of the two classes: a request may lower its tenant's class, never raise it.
    pub fn lowered_to(self, asked: Priority) -> Priority {
        if asked.rank() > self.rank() {
            asked
        } else {
            self
        }
    }

    /// The value of the `priority` field of engines that schedule by it (vLLM: lower runs
    /// first, 0 when absent): the standard class is the engine's default.
    pub fn engine_value(self) -> i64 {
        match self {
            Priority::Critical => -10,
            Priority::Standard => 0,
            Priority::Batch => 10,
        }
    }

    /// 0 for the highest class.
    fn rank(self) -> usize {
        self as usize
    }
}

impl FromStr for Priority {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Priority::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| format!("unknown priority {s:?}: expected critical, standard or batch"))
    }
}

/// How many requests may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueBounds {
    /// In the whole queue, all classes.
    pub total: usize,
    /// Per tenant, all classes.
    pub per_tenant: usize,
}

/// Names a queued request, for [`FairQueue::cancel`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ticket(u64);

/// A request that left the queue (dispatched, expired, cancelled or evicted); the caller's wait
/// time is `now - enqueued`.
#[derive(Debug)]
pub struct Waiter<K, T> {
    pub ticket: Ticket,
    pub tenant: K,
    pub priority: Priority,
    pub enqueued: Instant,
    pub deadline: Instant,
    pub item: T,
}

/// Why an offer was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// The tenant already has `per_tenant` requests waiting.
    TenantQueueFull,
    /// The queue holds `total` requests, none of a lower class.
    QueueFull,
    /// No seat is free and the deadline is already here.
    DeadlinePassed,
}

/// The answer of [`FairQueue::offer`].
#[derive(Debug)]
pub enum Offer<K, T> {
    /// A seat was free: the item holds it now.
    Admit(T),
    /// Waiting; `evicted` is the lower-class waiter it displaced, to be answered as shed.
    Queued {
        ticket: Ticket,
        evicted: Option<Waiter<K, T>>,
    },
    Rejected(T, Rejection),
}

/// What freeing seats did: waiters that took a seat, and overdue ones removed first.
#[derive(Debug)]
pub struct Released<K, T> {
    pub dispatched: Vec<Waiter<K, T>>,
    pub expired: Vec<Waiter<K, T>>,
}

/// The seats of one pool and the requests waiting for them.
#[derive(Debug)]
pub struct FairQueue<K, T> {
    seats: usize,
    in_use: usize,
    bounds: QueueBounds,
    next: u64,
    entries: HashMap<u64, Entry<K, T>>,
    classes: [Class<K>; 3],
    by_deadline: BTreeSet<(Instant, u64)>,
    per_tenant: HashMap<K, usize>,
}

#[derive(Debug)]
struct Entry<K, T> {
    tenant: K,
    priority: Priority,
    enqueued: Instant,
    deadline: Instant,
    item: T,
}

/// One class's waiters: per tenant in arrival order, the ring of tenants with waiters, and all
/// of them in arrival order (for eviction of the newest).
#[derive(Debug)]
struct Class<K> {
    queues: HashMap<K, BTreeSet<u64>>,
    ring: VecDeque<K>,
    order: BTreeSet<u64>,
}

impl<K> Default for Class<K> {
    fn default() -> Self {
        Class {
            queues: HashMap::new(),
            ring: VecDeque::new(),
            order: BTreeSet::new(),
        }
    }
}

impl<K: Clone + Eq + Hash, T> FairQueue<K, T> {
    pub fn new(seats: usize, bounds: QueueBounds) -> Self {
        FairQueue {
            seats,
            in_use: 0,
            bounds,
            next: 0,
            entries: HashMap::new(),
            classes: Default::default(),
            by_deadline: BTreeSet::new(),
            per_tenant: HashMap::new(),
        }
    }

    pub fn seats(&self) -> usize {
        self.seats
    }

    /// Seats held by admitted or dispatched requests (above `seats` after a shrink, until enough
    /// are released).
    pub fn in_use(&self) -> usize {
        self.in_use
    }

    pub fn queued(&self, priority: Priority) -> usize {
        self.classes[priority.rank()].order.len()
    }

    pub fn queued_total(&self) -> usize {
        self.entries.len()
    }

    pub fn queued_for(&self, tenant: &K) -> usize {
        self.per_tenant.get(tenant).copied().unwrap_or(0)
    }

    /// Takes a free seat, if there is one, for a request that would not wait for it: what
    /// [`FairQueue::offer`] does first, without the item a waiter needs (a seat is only free
    /// when nothing waits, so no waiter is passed over).
    pub fn try_admit(&mut self) -> bool {
        let free = self.in_use < self.seats;
        self.in_use += usize::from(free);
        free
    }

    /// A request arrives. It takes a free seat at once (a seat is only free when nothing waits),
    /// or waits until `deadline`, or is refused; see [`Offer`].
    pub fn offer(
        &mut self,
        now: Instant,
        priority: Priority,
        tenant: K,
        item: T,
        deadline: Instant,
    ) -> Offer<K, T> {
        if self.in_use < self.seats {
            self.in_use += 1;
            return Offer::Admit(item);
        }
        if deadline <= now {
            return Offer::Rejected(item, Rejection::DeadlinePassed);
        }
        if self.queued_for(&tenant) >= self.bounds.per_tenant {
            return Offer::Rejected(item, Rejection::TenantQueueFull);
        }
        let mut evicted = None;
        if self.entries.len() >= self.bounds.total {
            let lowest = Priority::ALL
                .into_iter()
                .rev()
                .find(|p| !self.classes[p.rank()].order.is_empty());
            match lowest {
                Some(low) if low.rank() > priority.rank() => {
                    let newest = self.classes[low.rank()].order.last().copied();
                    evicted = newest.and_then(|seq| self.remove(seq));
                }
                _ => return Offer::Rejected(item, Rejection::QueueFull),
            }
        }
        let seq = self.next;
        self.next += 1;
        let class = &mut self.classes[priority.rank()];
        let queue = class.queues.entry(tenant.clone()).or_default();
        if queue.is_empty() {
            class.ring.push_back(tenant.clone());
        }
        queue.insert(seq);
        class.order.insert(seq);
        self.by_deadline.insert((deadline, seq));
        *self.per_tenant.entry(tenant.clone()).or_insert(0) += 1;
        self.entries.insert(
            seq,
            Entry {
                tenant,
                priority,
                enqueued: now,
                deadline,
                item,
            },
        );
        Offer::Queued {
            ticket: Ticket(seq),
            evicted,
        }
    }

    /// A seat was freed: overdue waiters are removed, then the next waiter, if any, takes the
    /// seat (highest class first, round-robin among its tenants). Releasing with no seat in use
    /// is a caller's bug and frees nothing.
    pub fn release(&mut self, now: Instant) -> Released<K, T> {
        self.in_use = self.in_use.saturating_sub(1);
        self.fill(now)
    }

    /// The pool's capacity changed: more seats dispatch waiters at once; fewer take effect as
    /// seats are released.
    pub fn set_seats(&mut self, now: Instant, seats: usize) -> Released<K, T> {
        self.seats = seats;
        self.fill(now)
    }

    /// Removes every waiter whose deadline is at or before `now`, earliest deadline first.
    pub fn expire(&mut self, now: Instant) -> Vec<Waiter<K, T>> {
        let mut expired = Vec::new();
        while let Some(&(deadline, seq)) = self.by_deadline.first() {
            if deadline > now {
                break;
            }
            expired.extend(self.remove(seq));
        }
        expired
    }

    /// The caller went away while waiting. `None` when the ticket is no longer queued (already
    /// dispatched, expired, evicted or cancelled).
    pub fn cancel(&mut self, ticket: Ticket) -> Option<Waiter<K, T>> {
        self.remove(ticket.0)
    }

    fn fill(&mut self, now: Instant) -> Released<K, T> {
        let expired = self.expire(now);
        let mut dispatched = Vec::new();
        while self.in_use < self.seats {
            let Some(next) = self.dispatch() else { break };
            self.in_use += 1;
            dispatched.push(next);
        }
        Released {
            dispatched,
            expired,
        }
    }

    /// The oldest waiter of the tenant at the front of the highest non-empty class's ring.
    fn dispatch(&mut self) -> Option<Waiter<K, T>> {
        let class = self.classes.iter().position(|c| !c.ring.is_empty())?;
        let tenant = self.classes[class].ring.front()?.clone();
        let seq = self.classes[class].queues.get(&tenant)?.first().copied()?;
        let waiter = self.remove(seq)?;
        let class = &mut self.classes[class];
        if class.queues.contains_key(&tenant) {
            class.ring.rotate_left(1);
        }
        Some(waiter)
    }

    /// Takes a waiter out of every index.
    fn remove(&mut self, seq: u64) -> Option<Waiter<K, T>> {
        let entry = self.entries.remove(&seq)?;
        let class = &mut self.classes[entry.priority.rank()];
        class.order.remove(&seq);
        if let Some(queue) = class.queues.get_mut(&entry.tenant) {
            queue.remove(&seq);
            if queue.is_empty() {
                class.queues.remove(&entry.tenant);
                if let Some(at) = class.ring.iter().position(|t| *t == entry.tenant) {
                    class.ring.remove(at);
                }
            }
        }
        self.by_deadline.remove(&(entry.deadline, seq));
        if let Some(n) = self.per_tenant.get_mut(&entry.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_tenant.remove(&entry.tenant);
            }
        }
        Some(Waiter {
            ticket: Ticket(seq),
            tenant: entry.tenant,
            priority: entry.priority,
            enqueued: entry.enqueued,
            deadline: entry.deadline,
            item: entry.item,
        })
    }
}

#[cfg(test)]
mod tests;
