use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::time::Duration;

fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

const FAR: Duration = Duration::from_secs(3600);

fn queue(seats: usize, total: usize, per_tenant: usize) -> FairQueue<&'static str, u32> {
    FairQueue::new(seats, QueueBounds { total, per_tenant })
}

fn ticket<K, T: std::fmt::Debug>(offer: Offer<K, T>) -> Ticket {
    match offer {
        Offer::Queued { ticket, .. } => ticket,
        Offer::Admit(item) => panic!("admitted {item:?}"),
        Offer::Rejected(item, why) => panic!("rejected {item:?}: {why:?}"),
    }
}

/// Releases one seat at a time until nothing is dispatched, returning the order.
fn drain<K, T>(q: &mut FairQueue<K, T>, now: Instant) -> Vec<(K, T)>
where
    K: Clone + Eq + Hash,
{
    let mut order = Vec::new();
    loop {
        let released = q.release(now);
        if released.dispatched.is_empty() {
            return order;
        }
        order.extend(released.dispatched.into_iter().map(|w| (w.tenant, w.item)));
    }
}

#[test]
fn priorities_are_spelt_as_in_the_config_and_the_store() {
    for p in Priority::ALL {
        assert_eq!(p.as_str().parse::<Priority>(), Ok(p));
    }
    assert_eq!(
        Priority::ALL.map(Priority::as_str),
        ["critical", "standard", "batch"]
    );
    assert_eq!(Priority::default(), Priority::Standard);
    assert!("Critical".parse::<Priority>().is_err());
}

#[test]
fn a_free_seat_admits_at_once_and_a_full_pool_queues() {
    let t0 = Instant::now();
    let mut q = queue(1, 10, 10);
    assert!(matches!(
        q.offer(t0, Priority::Batch, "a", 1, t0 + FAR),
        Offer::Admit(1)
    ));
    let t = ticket(q.offer(t0, Priority::Batch, "a", 2, t0 + FAR));
    assert_eq!((q.in_use(), q.queued_total()), (1, 1));
    let released = q.release(t0 + ms(5));
    let w = &released.dispatched[0];
    assert_eq!((w.ticket, w.item, w.enqueued), (t, 2, t0));
    assert_eq!((q.in_use(), q.queued_total()), (1, 0));
    assert!(q.release(t0).dispatched.is_empty());
    assert_eq!(q.in_use(), 0);
    // A release with no seat in use frees nothing and does not panic.
    assert!(q.release(t0).dispatched.is_empty());
    assert_eq!(q.in_use(), 0);
}

#[test]
fn try_admit_takes_a_free_seat_and_never_one_a_waiter_is_owed() {
    let t0 = Instant::now();
    let mut q = queue(2, 10, 10);
    assert!(q.try_admit());
    assert!(q.try_admit());
    assert!(!q.try_admit(), "both seats are taken");
    assert_eq!(q.in_use(), 2);
    let t = ticket(q.offer(t0, Priority::Standard, "a", 1, t0 + FAR));
    // The seat freed goes to the waiter, not to the next request that tries.
    let released = q.release(t0);
    assert_eq!(released.dispatched[0].ticket, t);
    assert!(!q.try_admit());
    q.release(t0);
    assert!(q.try_admit());
    assert_eq!(q.in_use(), 2);
}

#[test]
fn a_flooding_tenant_gets_one_dispatch_per_turn_like_any_other() {
    let t0 = Instant::now();
    let mut q = queue(1, 100, 100);
    assert!(matches!(
        q.offer(t0, Priority::Standard, "a", 0, t0 + FAR),
        Offer::Admit(_)
    ));
    for i in 1..=50 {
        ticket(q.offer(t0, Priority::Standard, "a", i, t0 + FAR));
    }
    for i in 101..=103 {
        ticket(q.offer(t0, Priority::Standard, "b", i, t0 + FAR));
    }
    let order: Vec<_> = drain(&mut q, t0).into_iter().take(7).collect();
    assert_eq!(
        order,
        [
            ("a", 1),
            ("b", 101),
            ("a", 2),
            ("b", 102),
            ("a", 3),
            ("b", 103),
            ("a", 4)
        ]
    );
}

#[test]
fn classes_are_strict_and_batch_waits_while_critical_waits() {
    let t0 = Instant::now();
    let mut q = queue(1, 10, 10);
    assert!(matches!(
        q.offer(t0, Priority::Batch, "x", 0, t0 + FAR),
        Offer::Admit(_)
    ));
    ticket(q.offer(t0, Priority::Batch, "b", 1, t0 + FAR));
    ticket(q.offer(t0, Priority::Standard, "s", 2, t0 + FAR));
    ticket(q.offer(t0, Priority::Critical, "c", 3, t0 + FAR));
    ticket(q.offer(t0, Priority::Critical, "c", 4, t0 + FAR));
    assert_eq!(q.queued(Priority::Critical), 2);
    let items: Vec<u32> = drain(&mut q, t0).into_iter().map(|(_, i)| i).collect();
    assert_eq!(items, [3, 4, 2, 1]);
}

#[test]
fn bounds_reject_per_tenant_then_in_total() {
    let t0 = Instant::now();
    let mut q = queue(0, 3, 2);
    ticket(q.offer(t0, Priority::Standard, "a", 1, t0 + FAR));
    ticket(q.offer(t0, Priority::Standard, "a", 2, t0 + FAR));
    assert!(matches!(
        q.offer(t0, Priority::Critical, "a", 3, t0 + FAR),
        Offer::Rejected(3, Rejection::TenantQueueFull)
    ));
    ticket(q.offer(t0, Priority::Standard, "b", 4, t0 + FAR));
    assert!(matches!(
        q.offer(t0, Priority::Standard, "c", 5, t0 + FAR),
        Offer::Rejected(5, Rejection::QueueFull)
    ));
    assert!(matches!(
        q.offer(t0, Priority::Standard, "c", 6, t0),
        Offer::Rejected(6, Rejection::DeadlinePassed)
    ));
    assert_eq!((q.queued_for(&"a"), q.queued_for(&"c")), (2, 0));
}

#[test]
fn a_full_queue_sheds_the_newest_waiter_of_the_lowest_class() {
    let t0 = Instant::now();
    let mut q = queue(0, 3, 3);
    ticket(q.offer(t0, Priority::Batch, "a", 1, t0 + FAR));
    ticket(q.offer(t0, Priority::Batch, "b", 2, t0 + FAR));
    ticket(q.offer(t0, Priority::Standard, "c", 3, t0 + FAR));
    match q.offer(t0, Priority::Standard, "d", 4, t0 + FAR) {
        Offer::Queued {
            evicted: Some(w), ..
        } => assert_eq!((w.tenant, w.item, w.priority), ("b", 2, Priority::Batch)),
        other => panic!("{other:?}"),
    }
    match q.offer(t0, Priority::Critical, "e", 5, t0 + FAR) {
        Offer::Queued {
            evicted: Some(w), ..
        } => assert_eq!((w.tenant, w.item), ("a", 1)),
        other => panic!("{other:?}"),
    }
    // Standard does not displace standard.
    assert!(matches!(
        q.offer(t0, Priority::Standard, "f", 6, t0 + FAR),
        Offer::Rejected(6, Rejection::QueueFull)
    ));
    assert_eq!(
        Priority::ALL.map(|p| q.queued(p)),
        [1, 2, 0],
        "critical, standard, batch"
    );
}

#[test]
fn expire_removes_exactly_the_overdue_and_release_skips_them() {
    let t0 = Instant::now();
    let mut q = queue(1, 10, 10);
    assert!(matches!(
        q.offer(t0, Priority::Standard, "a", 0, t0 + FAR),
        Offer::Admit(_)
    ));
    ticket(q.offer(t0, Priority::Standard, "a", 1, t0 + ms(10)));
    ticket(q.offer(t0, Priority::Standard, "b", 2, t0 + ms(20)));
    ticket(q.offer(t0, Priority::Standard, "c", 3, t0 + ms(30)));
    let expired: Vec<u32> = q.expire(t0 + ms(10)).into_iter().map(|w| w.item).collect();
    assert_eq!(expired, [1]);
    let released = q.release(t0 + ms(25));
    assert_eq!(released.expired.len(), 1);
    assert_eq!(released.expired[0].item, 2);
    assert_eq!(released.dispatched[0].item, 3);
}

#[test]
fn cancel_removes_a_waiter_once() {
    let t0 = Instant::now();
    let mut q = queue(0, 10, 10);
    let t = ticket(q.offer(t0, Priority::Standard, "a", 1, t0 + FAR));
    ticket(q.offer(t0, Priority::Standard, "b", 2, t0 + FAR));
    assert_eq!(q.cancel(t).map(|w| w.item), Some(1));
    assert!(q.cancel(t).is_none());
    assert_eq!(q.queued_for(&"a"), 0);
    let released = q.set_seats(t0, 2);
    let items: Vec<u32> = released.dispatched.into_iter().map(|w| w.item).collect();
    assert_eq!(items, [2]);
    assert_eq!((q.seats(), q.in_use()), (2, 1));
}

#[test]
fn fewer_seats_take_effect_as_seats_are_released() {
    let t0 = Instant::now();
    let mut q = queue(3, 10, 10);
    for i in 0..3 {
        assert!(matches!(
            q.offer(t0, Priority::Standard, "a", i, t0 + FAR),
            Offer::Admit(_)
        ));
    }
    ticket(q.offer(t0, Priority::Standard, "a", 3, t0 + FAR));
    assert!(q.set_seats(t0, 1).dispatched.is_empty());
    assert!(q.release(t0).dispatched.is_empty());
    assert!(q.release(t0).dispatched.is_empty());
    assert_eq!(q.in_use(), 1);
    assert_eq!(q.release(t0).dispatched.len(), 1);
}

/// Takes the free seat with an item that is never dispatched, so that later offers queue.
fn take_seat(q: &mut FairQueue<u8, u32>, now: Instant) -> bool {
    let offer = q.offer(now, Priority::Standard, 0, u32::MAX, now + FAR);
    matches!(offer, Offer::Admit(_))
}

#[derive(Debug, Clone)]
enum Op {
    Offer {
        tenant: u8,
        class: usize,
        wait_ms: u64,
    },
    Release,
    Expire,
    Cancel(usize),
    SetSeats(usize),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0u8..4, 0usize..3, 0u64..400)
            .prop_map(|(tenant, class, wait_ms)| Op::Offer { tenant, class, wait_ms }),
        4 => Just(Op::Release),
        1 => Just(Op::Expire),
        1 => any::<usize>().prop_map(Op::Cancel),
        1 => (0usize..5).prop_map(Op::SetSeats),
        2 => (0u64..200).prop_map(Op::Advance),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Queued,
    Admitted,
    Dispatched,
    Rejected,
    Evicted,
    Expired,
    Cancelled,
}

/// The queue's model: each offered id's fate, and what the queue was told about it.
#[derive(Default)]
struct Model {
    fate: Vec<Fate>,
    /// id -> (tenant, priority, enqueued, deadline, ticket), while queued.
    queued: BTreeMap<u32, (u8, Priority, Instant, Instant, Ticket)>,
}

impl Model {
    fn leave(&mut self, w: &Waiter<u8, u32>, fate: Fate) -> Result<(), TestCaseError> {
        let (tenant, priority, enqueued, deadline, ticket) = self
            .queued
            .remove(&w.item)
            .ok_or_else(|| TestCaseError::fail(format!("{} left twice", w.item)))?;
        prop_assert_eq!(
            (w.tenant, w.priority, w.enqueued, w.deadline, w.ticket),
            (tenant, priority, enqueued, deadline, ticket)
        );
        prop_assert_eq!(self.fate[w.item as usize], Fate::Queued);
        self.fate[w.item as usize] = fate;
        Ok(())
    }

    fn expired(&mut self, now: Instant, out: &[Waiter<u8, u32>]) -> Result<(), TestCaseError> {
        let overdue: BTreeSet<u32> = self
            .queued
            .iter()
            .filter(|(_, q)| q.3 <= now)
            .map(|(id, _)| *id)
            .collect();
        let got: BTreeSet<u32> = out.iter().map(|w| w.item).collect();
        prop_assert_eq!(got.len(), out.len());
        prop_assert_eq!(&got, &overdue);
        out.iter().try_for_each(|w| self.leave(w, Fate::Expired))
    }

    fn dispatched(&mut self, out: &[Waiter<u8, u32>]) -> Result<(), TestCaseError> {
        for w in out {
            // Strict priority: nothing of a higher class is waiting.
            let higher = self.queued.values().any(|q| q.1.rank() < w.priority.rank());
            prop_assert!(!higher, "{:?} dispatched over a higher class", w.priority);
            self.leave(w, Fate::Dispatched)?;
        }
        Ok(())
    }
}

proptest! {
    /// Every offered item ends exactly once as admitted, dispatched, rejected, evicted, expired
    /// or cancelled; seats and queue bounds hold after every step; dispatch is strictly by class;
    /// expiry removes exactly the overdue; eviction takes the newest of the lowest class.
    #[test]
    fn every_item_has_exactly_one_fate_and_bounds_hold(
        seats in 0usize..4,
        total in 0usize..8,
        per_tenant in 0usize..5,
        ops in proptest::collection::vec(op(), 1..300),
    ) {
        let t0 = Instant::now();
        let mut now = t0;
        let mut q: FairQueue<u8, u32> = FairQueue::new(seats, QueueBounds { total, per_tenant });
        let mut m = Model::default();
        let mut held = 0usize;
        for op in ops {
            let before = q.in_use();
            match op {
                Op::Offer { tenant, class, wait_ms } => {
                    let id = m.fate.len() as u32;
                    m.fate.push(Fate::Queued);
                    let priority = Priority::ALL[class];
                    let deadline = now + ms(wait_ms);
                    match q.offer(now, priority, tenant, id, deadline) {
                        Offer::Admit(i) => {
                            prop_assert_eq!(i, id);
                            m.fate[id as usize] = Fate::Admitted;
                            held += 1;
                        }
                        Offer::Rejected(i, why) => {
                            prop_assert_eq!(i, id);
                            m.fate[id as usize] = Fate::Rejected;
                            let full = match why {
                                Rejection::TenantQueueFull => q.queued_for(&tenant) >= per_tenant,
                                Rejection::QueueFull => q.queued_total() >= total,
                                Rejection::DeadlinePassed => deadline <= now,
                            };
                            prop_assert!(full, "{:?}", why);
                        }
                        Offer::Queued { ticket, evicted } => {
                            if let Some(w) = evicted {
                                prop_assert!(w.priority.rank() > priority.rank());
                                let lowest = m.queued.iter()
                                    .filter(|(_, q)| q.1.rank() >= w.priority.rank())
                                    .map(|(id, _)| *id)
                                    .max();
                                prop_assert_eq!(lowest, Some(w.item), "not the newest lowest");
                                m.leave(&w, Fate::Evicted)?;
                            }
                            m.queued.insert(id, (tenant, priority, now, deadline, ticket));
                        }
                    }
                }
                Op::Release => {
                    if held > 0 {
                        held -= 1;
                        let r = q.release(now);
                        prop_assert!(r.dispatched.len() <= 1);
                        m.expired(now, &r.expired)?;
                        m.dispatched(&r.dispatched)?;
                        held += r.dispatched.len();
                    }
                }
                Op::Expire => {
                    let out = q.expire(now);
                    m.expired(now, &out)?;
                }
                Op::Cancel(pick) => {
                    let fates = m.fate.len().max(1);
                    let id = (pick % fates) as u32;
                    let ticket = m.queued.get(&id).map(|q| q.4);
                    if let Some(t) = ticket {
                        let w = q.cancel(t);
                        prop_assert!(w.is_some());
                        if let Some(w) = w {
                            m.leave(&w, Fate::Cancelled)?;
                        }
                        prop_assert!(q.cancel(t).is_none());
                    }
                }
                Op::SetSeats(n) => {
                    let r = q.set_seats(now, n);
                    m.expired(now, &r.expired)?;
                    m.dispatched(&r.dispatched)?;
                    held += r.dispatched.len();
                }
                Op::Advance(step) => now += ms(step),
            }
            // (a) seats: only an explicit shrink leaves more in use than seats, and then
            // nothing more is taken.
            prop_assert_eq!(q.in_use(), held);
            if q.in_use() > before {
                prop_assert!(q.in_use() <= q.seats());
            }
            // Work conserving: nothing waits while a seat is free.
            prop_assert!(q.queued_total() == 0 || q.in_use() >= q.seats());
            // (b) queue bounds, and the counters agree with the model.
            prop_assert!(q.queued_total() <= total);
            prop_assert_eq!(q.queued_total(), m.queued.len());
            for tenant in 0u8..4 {
                let n = m.queued.values().filter(|q| q.0 == tenant).count();
                prop_assert_eq!(q.queued_for(&tenant), n);
                prop_assert!(n <= per_tenant);
            }
            for p in Priority::ALL {
                let n = m.queued.values().filter(|q| q.1 == p).count();
                prop_assert_eq!(q.queued(p), n);
            }
        }
        // Whatever still waits expires at the end of time; then every item has met its fate.
        let out = q.expire(now + FAR);
        m.expired(now + FAR, &out)?;
        prop_assert!(m.queued.is_empty());
        prop_assert!(m.fate.iter().all(|f| *f != Fate::Queued));
    }

    /// Fairness, exact: between an item's arrival and its dispatch, each other tenant of its
    /// class is dispatched at most m + 1 times, m being its own tenant's items of that class
    /// queued ahead of it; hence at most (tenants - 1) x (m + 1) other dispatches in all.
    #[test]
    fn each_other_tenant_gets_at_most_one_dispatch_per_turn(
        tenants in 2u8..5,
        ops in proptest::collection::vec((0u8..12, 0usize..100), 1..400),
    ) {
        let t0 = Instant::now();
        let mut q: FairQueue<u8, u32> =
            FairQueue::new(1, QueueBounds { total: usize::MAX, per_tenant: usize::MAX });
        // The one seat stays taken, so every later offer queues.
        prop_assert!(take_seat(&mut q, t0));
        let mut arrivals: Vec<(u8, usize, Ticket)> = Vec::new();
        // Per tenant, how many dispatches it had when each item arrived.
        let mut counts_at_arrival: Vec<Vec<usize>> = Vec::new();
        let mut dispatches = vec![0usize; usize::from(tenants)];
        for (choice, pick) in ops {
            match choice {
                // Tenant 0 floods: half of all operations offer for it.
                0..=8 => {
                    let tenant = if choice <= 5 { 0 } else { 1 + (choice - 6) % (tenants - 1) };
                    let ahead = q.queued_for(&tenant);
                    let id = arrivals.len() as u32;
                    let t = ticket(q.offer(t0, Priority::Standard, tenant, id, t0 + FAR));
                    arrivals.push((tenant, ahead, t));
                    counts_at_arrival.push(dispatches.clone());
                }
                9 => {
                    if let Some(&(_, _, t)) = arrivals.get(pick % arrivals.len().max(1)) {
                        q.cancel(t);
                    }
                }
                _ => {
                    let r = q.release(t0);
                    for w in r.dispatched {
                        let (tenant, ahead, _) = arrivals[w.item as usize];
                        let before = &counts_at_arrival[w.item as usize];
                        let mut others = 0;
                        for other in 0..tenants {
                            if other == tenant { continue; }
                            let n = dispatches[usize::from(other)] - before[usize::from(other)];
                            prop_assert!(n <= ahead + 1, "{} had {} turns", other, n);
                            others += n;
                        }
                        prop_assert!(others <= usize::from(tenants - 1) * (ahead + 1));
                        dispatches[usize::from(tenant)] += 1;
                    }
                    // The seat is taken again by the dispatched item, or stays free when
                    // nothing waited: re-take it so the next offers queue.
                    if q.in_use() == 0 {
                        prop_assert!(take_seat(&mut q, t0));
                    }
                }
            }
        }
    }
}
