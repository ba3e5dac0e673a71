//! What each tenant brought and what became of it, as plain atomic counters the gateway reads
//! itself (`GET /admin/top`, `top.rs`), beside the Prometheus series counted at the same places.
//!
//! Why not read the Prometheus page back: the recorder renders text for a scraper, and a view
//! that parses it would depend on its formatting and pay for rendering every series. These
//! counters are a few atomics per tenant and per model, kept in the tenant's admission gate, so
//! they live exactly as long as the tenant's admission state: from its first request until the
//! process ends, across reloads (which share the gates), bounded like the gates by the tenants
//! whose keys authenticate. A tenant removed from the config or the store keeps its counts
//! (counters never go down between two reads of one process); a new one appears with its first
//! request.
//!
//! Each is counted per thread (`per_thread.rs`: a worker thread adds with a plain load and
//! store, no locked addition), and a model's counters are found through a cache of the thread's
//! (no lock, no string hashed). Each counter is counted once, where its metric is: offered and
//! the refusals at the head in `Admission::enter`, the rest of admission's outcomes in
//! `Admission::admit`, upstream attempts where the attempt loop counts
//! `spillway_upstream_attempts_total`. Cumulative, never windowed: a reader takes two reads and
//! divides by the gateway's uptime between them.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use foldhash::HashMap;

use crate::per_thread::{add, address, at_hand, writer, PerThread};

/// Why admission refused a request: the outcomes of `spillway_admissions_total` and the
/// refusals counted in series of their own (a caller's retry shed, adaptive throttling, no
/// backend to seat it on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    GatewayOverloaded,
    ConcurrencyLimited,
    RateLimitedRequests,
    RateLimitedTokens,
    TokensOverLimit,
    ClientRetryShed,
    Throttled,
    NoBackend,
    TenantQueueFull,
    QueueFull,
    QueueTimeout,
    ShedForHigherClass,
}

impl Refused {
    pub(crate) const ALL: [Refused; 12] = [
        Refused::GatewayOverloaded,
        Refused::ConcurrencyLimited,
        Refused::RateLimitedRequests,
        Refused::RateLimitedTokens,
        Refused::TokensOverLimit,
        Refused::ClientRetryShed,
        Refused::Throttled,
        Refused::NoBackend,
        Refused::TenantQueueFull,
        Refused::QueueFull,
        Refused::QueueTimeout,
        Refused::ShedForHigherClass,
    ];

    /// The reason's name: the `outcome` label of `spillway_admissions_total` where it has one.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Refused::GatewayOverloaded => "gateway_overloaded",
            Refused::ConcurrencyLimited => "concurrency_limited",
            Refused::RateLimitedRequests => "rate_limited_requests",
            Refused::RateLimitedTokens => "rate_limited_tokens",
            Refused::TokensOverLimit => "tokens_over_limit",
            Refused::ClientRetryShed => "client_retry_shed",
            Refused::Throttled => "throttled",
            Refused::NoBackend => "no_backend",
            Refused::TenantQueueFull => "tenant_queue_full",
            Refused::QueueFull => "queue_full",
            Refused::QueueTimeout => "queue_timeout",
            Refused::ShedForHigherClass => "shed_for_higher_class",
        }
    }
}

/// One tenant's counters.
#[derive(Debug)]
pub(crate) struct TenantTraffic {
    /// Its number, which no other tenant's counters have had: where a thread finds its models.
    id: u64,
    counts: PerThread<Counts>,
    /// Requests waiting for a seat now.
    queued: AtomicUsize,
    /// Per model (names from the config, so bounded).
    models: RwLock<HashMap<Arc<str>, Arc<ModelTraffic>>>,
}

/// A tenant's counts, as one thread's copy.
#[derive(Debug, Default)]
struct Counts {
    /// Requests its keys authenticated, counted at their head.
    offered: AtomicU64,
    /// Requests that passed every step of admission and took a seat.
    admitted: AtomicU64,
    /// Requests its callers marked as their own retries.
    client_retries: AtomicU64,
    shed: [AtomicU64; Refused::ALL.len()],
}

/// One tenant's counters for one model.
#[derive(Debug, Default)]
pub(crate) struct ModelTraffic {
    counts: PerThread<ModelCopy>,
}

/// A tenant's counts for one model, as one thread's copy.
#[derive(Debug, Default)]
struct ModelCopy {
    /// Requests for the model that reached admission (their body read and their model known).
    offered: AtomicU64,
    /// Attempts sent upstream for them, fallbacks included.
    attempts: AtomicU64,
    /// Attempts after each request's first.
    retries: AtomicU64,
}

/// A tenant's number and the address of a model's name.
type Place = (u64, usize);

/// Model counters by [`Place`], each with the name it was found by.
type Near = HashMap<Place, (Arc<ModelTraffic>, Arc<str>)>;

thread_local! {
    /// The model counters this thread has counted in, by [`Place`]. An entry holds the name, so
    /// while it is here no other string can come to lie where it does: one place is always one
    /// model's counters.
    static NEAR: RefCell<Near> = RefCell::default();
}

/// A tenant's counters as read at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct TenantCounts {
    pub offered: u64,
    pub admitted: u64,
    pub client_retries: u64,
    /// By reason, in the order of [`Refused::ALL`].
    pub shed: [u64; Refused::ALL.len()],
    pub queued: usize,
    pub models: Vec<(Arc<str>, ModelCounts)>,
}

/// A tenant's counters for one model as read at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct ModelCounts {
    pub offered: u64,
    pub attempts: u64,
    pub retries: u64,
}

impl TenantTraffic {
    pub(crate) fn new() -> TenantTraffic {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        TenantTraffic {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            counts: PerThread::default(),
            queued: AtomicUsize::new(0),
            models: RwLock::default(),
        }
    }

    /// Adds one to the count `pick` chooses in this thread's copy.
    fn count(&self, pick: impl FnOnce(&Counts) -> &AtomicU64) {
        let (counts, owned) = self.counts.copy(writer(), Counts::default);
        add(pick(counts), owned, 1);
    }

    pub(crate) fn offered(&self) {
        self.count(|c| &c.offered);
    }

    pub(crate) fn admitted(&self) {
        self.count(|c| &c.admitted);
    }

    pub(crate) fn client_retry(&self) {
        self.count(|c| &c.client_retries);
    }

    pub(crate) fn shed(&self, why: Refused) {
        self.count(|c| &c.shed[why as usize]);
    }

    /// Counts a request as waiting for a seat until the guard drops.
    pub(crate) fn queued(self: &Arc<Self>) -> Queued {
        self.queued.fetch_add(1, Ordering::Relaxed);
        Queued(self.clone())
    }

    /// A request for `model` reached admission.
    pub(crate) fn offered_to(&self, model: &Arc<str>) {
        self.model(model, |m, owned| add(&m.offered, owned, 1));
    }

    /// A request for `model` ended its attempts after `attempts` of them.
    pub(crate) fn attempted(&self, model: &Arc<str>, attempts: u32) {
        self.model(model, |m, owned| {
            add(&m.attempts, owned, u64::from(attempts));
            add(&m.retries, owned, u64::from(attempts.saturating_sub(1)));
        });
    }

    /// Counts in this thread's copy of `model`'s counters with `count`: found in the thread's
    /// cache, else under the read lock once they exist.
    fn model(&self, model: &Arc<str>, count: impl FnOnce(&ModelCopy, bool)) {
        let place = (self.id, address(model));
        NEAR.with_borrow_mut(|near| {
            let (counters, _) = at_hand(near, place, || {
                (self.model_counters(model), Arc::clone(model))
            });
            let (copy, owned) = counters.counts.copy(writer(), ModelCopy::default);
            count(copy, owned);
        });
    }

    /// `model`'s counters, made the first time.
    fn model_counters(&self, model: &Arc<str>) -> Arc<ModelTraffic> {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = models.get(model) {
            return Arc::clone(m);
        }
        drop(models);
        let mut models = self.models.write().unwrap_or_else(|e| e.into_inner());
        Arc::clone(models.entry(model.clone()).or_default())
    }

    /// The counters now, models by name.
    pub(crate) fn read(&self) -> TenantCounts {
        let mut models: Vec<(Arc<str>, ModelCounts)> = self
            .models
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(name, m)| {
                let counts = ModelCounts {
                    offered: m.counts.sum(|c| &c.offered),
                    attempts: m.counts.sum(|c| &c.attempts),
                    retries: m.counts.sum(|c| &c.retries),
                };
                (name.clone(), counts)
            })
            .collect();
        models.sort_by(|a, b| a.0.cmp(&b.0));
        TenantCounts {
            offered: self.counts.sum(|c| &c.offered),
            admitted: self.counts.sum(|c| &c.admitted),
            client_retries: self.counts.sum(|c| &c.client_retries),
            shed: std::array::from_fn(|i| self.counts.sum(|c| &c.shed[i])),
            queued: self.queued.load(Ordering::Relaxed),
            models,
        }
    }
}

/// A request counted as waiting for a seat; uncounted on drop.
pub(crate) struct Queued(Arc<TenantTraffic>);

impl Drop for Queued {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_counter_counts_apart() {
        let t = Arc::new(TenantTraffic::new());
        let m: Arc<str> = Arc::from("m");
        let n: Arc<str> = Arc::from("n");
        t.offered();
        t.offered();
        t.admitted();
        t.client_retry();
        t.shed(Refused::QueueFull);
        t.shed(Refused::QueueFull);
        t.shed(Refused::Throttled);
        t.offered_to(&n);
        t.offered_to(&m);
        t.attempted(&m, 3);
        t.attempted(&m, 1);
        t.attempted(&n, 0);
        let waiting = t.queued();
        let read = t.read();
        assert_eq!(
            (read.offered, read.admitted, read.client_retries),
            (2, 1, 1)
        );
        assert_eq!(read.queued, 1);
        let mut shed = [0; Refused::ALL.len()];
        shed[Refused::QueueFull as usize] = 2;
        shed[Refused::Throttled as usize] = 1;
        assert_eq!(read.shed, shed);
        let models: Vec<(&str, ModelCounts)> =
            read.models.iter().map(|(k, v)| (&**k, *v)).collect();
        let counts = |offered, attempts, retries| ModelCounts {
            offered,
            attempts,
            retries,
        };
        assert_eq!(models, vec![("m", counts(1, 4, 2)), ("n", counts(1, 0, 0))]);
        drop(waiting);
        assert_eq!(t.read().queued, 0);
    }

    #[test]
    fn a_model_is_one_set_of_counters_whatever_string_names_it_and_tenants_stay_apart() {
        let (a, b) = (TenantTraffic::new(), TenantTraffic::new());
        let m: Arc<str> = Arc::from("m");
        // The same name elsewhere, as a reloaded config holds it.
        let again: Arc<str> = Arc::from("m");
        a.offered_to(&m);
        a.offered_to(&again);
        b.offered_to(&m);
        // Counted on another thread too: its copy and its cache are its own.
        std::thread::scope(|s| {
            s.spawn(|| a.attempted(&again, 2));
        });
        a.attempted(&m, 1);
        let models = |t: &TenantTraffic| -> Vec<(String, ModelCounts)> {
            let read = t.read().models.into_iter();
            read.map(|(name, counts)| (name.to_string(), counts))
                .collect()
        };
        let counts = |offered, attempts, retries| ModelCounts {
            offered,
            attempts,
            retries,
        };
        assert_eq!(models(&a), [("m".to_string(), counts(2, 3, 1))]);
        assert_eq!(models(&b), [("m".to_string(), counts(1, 0, 0))]);
    }

    #[test]
    fn shed_reasons_are_indexed_in_order() {
        for (i, s) in Refused::ALL.iter().enumerate() {
            assert_eq!(*s as usize, i, "{}", s.as_str());
        }
    }
}
