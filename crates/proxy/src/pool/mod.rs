//! Models and their backend pools: the live state the balancer reads.
//!
//! A `Backend` holds what the request path needs at run time: where to send each kind of request,
//! the upstream key header, how many requests it has outstanding, and until when it is skipped
//! after refusing a connection. Outstanding counts are taken with a compare-and-swap against the
//! backend's adaptive limit (at most its `max_concurrency`) and, for affinity, the load bound the
//! pick was made under, so both hold under any number of concurrent pickers.

mod build;
mod host;
pub(crate) mod idle;
mod learn;
mod pass;
mod uris;

pub use build::{Models, Rebuilt};
pub use pass::ThrottlePass;
pub(crate) use uris::origin_form;
use uris::{join, stored_chat_uri, upstream_uri};

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{HeaderName, HeaderValue, Uri};
use spillway_config::{BackendConfig, BackendKind};
use spillway_config::{Balance, Engine, Side, Surface, Surfaces};
use spillway_directory::log_gate::LogGate;
use spillway_policy::balance::affinity::stable_hash;
use spillway_policy::outlier::Health;
use spillway_policy::{
    pick, AffinityOutcome, Candidate, EngineView, Refusal, RetryBudget, Rules, Saturation,
    Strategy, Throttle,
};
use tokio::sync::Notify;

use tracing::info;

use crate::endpoint::Endpoint;
use crate::engine::EngineLoad;
use crate::health::BackendHealth;
use crate::metrics::{BackendMetrics, PoolMetrics};
use crate::request::Changes;

/// How many times one pick starts again from fresh loads because other callers took its backend
/// to the load bound it was chosen under. Each such turn means another pick succeeded, so the
/// pool as a whole makes progress; the cap keeps one caller from spinning through a long burst.
const RACES: u32 = 8;

/// A value per backend of a pool, made per pick: on the stack for pools of up to eight backends.
type PerBackend<T> = smallvec::SmallVec<[T; 8]>;

/// One upstream server for one model.
#[derive(Debug)]
pub struct Backend {
    pub name: Arc<str>,
    /// A stable hash of the name: the backend's identity for affinity.
    pub id: u64,
    pub kind: &'static str,
    pub region: String,
    pub weight: u32,
    pub max_concurrency: u32,
    /// Its dedicated pool (bulkhead), if any: only tenants of that pool use it.
    pub bulkhead: Option<Arc<str>>,
    /// The version of the model's backends it belongs to (new while a rollout brings it).
    pub side: Side,
    /// At most one warning per interval that the backend refuses spillway's credential.
    pub auth_log: LogGate,
    /// Send the request's priority class as the body's `priority` field.
    pub forward_priority: bool,
    /// The model name to put in the body, when it differs from the client's.
    pub rename_to: Option<String>,
    /// The header carrying the upstream key (`authorization` or Azure's `api-key`).
    pub auth_header: Option<(HeaderName, HeaderValue)>,
    /// How this backend's statuses are classified.
    pub rules: Rules,
    /// Where its active health check goes, if it has one.
    pub health_uri: Option<Uri>,
    pub health: BackendHealth,
    pub metrics: BackendMetrics,
    /// Its engine's own view of its load, shared with every backend on the same engine; `None`
    /// when `engine = "none"`.
    pub engine: Option<Arc<EngineLoad>>,
    uris: [Uri; Endpoint::ALL.len()],
    /// The same in origin form (the path and query), as a request line names them.
    targets: [Uri; Endpoint::ALL.len()],
    /// Its kept-alive connections while no request uses them.
    pub(crate) idle: Arc<idle::IdleConns>,
    /// The `Host` header of its requests, the authority its URIs share, made once.
    pub host: Option<HeaderValue>,
    /// The API surfaces it serves: only requests on these are sent to it.
    pub surfaces: Surfaces,
    /// Where its stored chat completions are (`GET /v1/chat/completions` and below).
    pub stored_chat: Uri,
    outstanding: AtomicU32,
    /// Shared by the pool's backends: woken whenever one of them frees a unit of concurrency.
    freed: Arc<Freed>,
    /// Milliseconds since `epoch` before which this backend is skipped; 0 when it is not.
    skip_until_ms: AtomicU64,
    epoch: Instant,
    /// What it was built from, when built from a config: a reload keeps it when unchanged.
    recipe: Option<build::BackendRecipe>,
}

/// Wakes requests waiting for a backend of a pool to free a unit of concurrency. A release
/// touches the notifier only while someone waits, so the common path stays one atomic load.
#[derive(Debug, Default)]
pub struct Freed {
    notify: Notify,
    waiting: AtomicUsize,
}

impl Freed {
    fn wake(&self) {
        if self.waiting.load(Ordering::Acquire) > 0 {
            self.notify.notify_waiters();
        }
    }

    /// Waits for a release, or `at_most`. A release between the caller's failed pick and this
    /// registration is missed; the caller looks again after `at_most` anyway.
    async fn wait(&self, at_most: Duration) {
        let notified = self.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let _ = tokio::time::timeout(at_most, notified).await;
        self.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Backend {
    /// What this backend is sent in place of the caller's body: the model by the name it knows
    /// it by, the call's `priority` for an engine that schedules by it, and, for a completion it
    /// is asked to keep (`stored`, see [`RequestSummary::stores_chat`]), the tenant's tag, whose
    /// listings show only its own (`handler/stored.rs`).
    ///
    /// [`RequestSummary::stores_chat`]: crate::request::RequestSummary::stores_chat
    pub(crate) fn changes<'a>(
        &'a self,
        stored: bool,
        tenant: &'a str,
        priority: spillway_policy::Priority,
    ) -> Changes<'a> {
        Changes {
            model: self.rename_to.as_deref(),
            priority: self.forward_priority.then(|| priority.engine_value()),
            tenant_tag: (stored && self.surfaces.contains(Surface::StoredChat)).then_some(tenant),
        }
    }

    /// Builds a backend; `base` is the resolved base URL (a mock's is known only once it listens).
    pub fn new(
        model: &Arc<str>,
        cfg: &BackendConfig,
        base: &Uri,
        epoch: Instant,
        health: BackendHealth,
        freed: Arc<Freed>,
    ) -> Result<Self, String> {
        let mut uris = Vec::with_capacity(Endpoint::ALL.len());
        for endpoint in Endpoint::ALL {
            uris.push(upstream_uri(&cfg.kind, base, endpoint)?);
        }
        let uris: [Uri; Endpoint::ALL.len()] = uris.try_into().expect("one URI per endpoint");
        debug_assert!(uris.iter().all(|u| u.authority() == uris[0].authority()));
        let host = host::host_header(&uris[0]);
        let targets = uris.clone().map(|uri| origin_form(&uri));
        let stored_chat = stored_chat_uri(&cfg.kind, base)?;
        let auth_header = match &cfg.api_key_env {
            None => None,
            Some(var) => {
                let key = std::env::var(var)
                    .ok()
                    .filter(|k| !k.is_empty())
                    .ok_or_else(|| {
                        format!(
                            "backend {:?}: environment variable {var} is not set",
                            cfg.name
                        )
                    })?;
                let (name, value) = match cfg.kind {
                    BackendKind::Azure { .. } => (HeaderName::from_static("api-key"), key),
                    _ => (http::header::AUTHORIZATION, format!("Bearer {key}")),
                };
                let mut value = HeaderValue::try_from(value).map_err(|_| {
                    format!(
                        "backend {:?}: the key in {var} is not a valid header value",
                        cfg.name
                    )
                })?;
                value.set_sensitive(true);
                Some((name, value))
            }
        };
        let name: Arc<str> = Arc::from(cfg.name.as_str());
        let health_uri = match (&cfg.health_path, &cfg.kind) {
            (Some(path), BackendKind::Azure { url, .. }) => Some(join(url, path)?),
            (Some(path), _) => Some(join(base, path)?),
            (None, _) => None,
        };
        Ok(Self {
            metrics: BackendMetrics::new(model, &name),
            rules: cfg.rules.clone(),
            health_uri,
            health,
            id: stable_hash(name.as_bytes()),
            name,
            kind: cfg.kind.as_str(),
            region: cfg.region.clone(),
            weight: cfg.weight,
            max_concurrency: cfg.max_concurrency,
            bulkhead: cfg.pool.as_deref().map(Arc::from),
            side: cfg.side,
            forward_priority: cfg.forward_priority,
            auth_log: LogGate::new(Duration::from_secs(10)),
            rename_to: (cfg.upstream_model != **model).then(|| cfg.upstream_model.clone()),
            auth_header,
            engine: None,
            uris,
            targets,
            idle: Arc::default(),
            host,
            surfaces: cfg.surfaces,
            stored_chat,
            outstanding: AtomicU32::new(0),
            freed,
            skip_until_ms: AtomicU64::new(0),
            epoch,
            recipe: None,
        })
    }

    pub fn uri(&self, endpoint: Endpoint) -> &Uri {
        &self.uris[endpoint.index()]
    }

    /// [`Backend::uri`] in origin form: what the request line of an HTTP/1 request names.
    pub fn target(&self, endpoint: Endpoint) -> &Uri {
        &self.targets[endpoint.index()]
    }

    /// What the engine last reported about its load, as the balancer reads it: a stale reading
    /// is saturated; so is an engine named in the config that has not been read yet. An engine
    /// left to `auto` that never answered with a metrics page is judged by outstanding requests,
    /// like a backend without metrics.
    pub fn engine_view(&self, now: Instant) -> EngineView {
        let Some(load) = &self.engine else {
            return EngineView::Unknown;
        };
        match load.reading(now) {
            None if load.engine() == Engine::Auto => EngineView::Unknown,
            None => EngineView::Stale,
            Some(r) if r.stale => EngineView::Stale,
            Some(r) => EngineView::Fresh {
                running: r.running,
                waiting: r.waiting,
                sent_since: r.sent_since,
                kv_usage: r.kv_usage,
            },
        }
    }

    pub fn outstanding(&self) -> u32 {
        self.outstanding.load(Ordering::Relaxed)
    }

    /// Takes one unit of this backend's concurrency (its adaptive limit), or returns `None`
    /// when it is full.
    pub fn try_acquire(self: &Arc<Self>) -> Option<InFlight> {
        self.try_acquire_within(None).ok()
    }

    /// Takes one unit while the backend is below its limit and below `load_bound` (a balancer's
    /// bound on its load, [`spillway_policy::Pick::load_bound`]), in one compare-and-swap.
    fn try_acquire_within(self: &Arc<Self>, load_bound: Option<u32>) -> Result<InFlight, Full> {
        let limit = self.health.limit();
        let cap = load_bound.map_or(limit, |b| b.min(limit));
        match self
            .outstanding
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                (n < cap).then_some(n + 1)
            }) {
            Ok(_) => {
                // Each unit taken is one attempt about to be sent.
                if let Some(engine) = &self.engine {
                    engine.note_sent();
                }
                Ok(InFlight(self.clone()))
            }
            Err(n) if n < limit => Err(Full::OverBound),
            Err(_) => Err(Full::AtLimit),
        }
    }

    /// Skips this backend for `cooldown` (it refused a connection or timed out).
    /// Logs and counts an ejection of `for_`, for `why`.
    pub fn ejected(&self, for_: Duration, why: &str) {
        info!(backend = %self.name, seconds = for_.as_secs_f64(), reason = why, "backend ejected");
        self.metrics.ejected();
    }

    /// Leaves this backend out of new picks for `cooldown` from `now`.
    pub fn skip_for(&self, now: Instant, cooldown: Duration) {
        let until = now.saturating_duration_since(self.epoch) + cooldown;
        self.skip_until_ms
            .store(until.as_millis().max(1) as u64, Ordering::Relaxed);
    }

    fn skipped(&self, now: Instant) -> bool {
        let until = self.skip_until_ms.load(Ordering::Relaxed);
        until != 0 && (now.saturating_duration_since(self.epoch).as_millis() as u64) < until
    }
}

/// Why a backend did not take a unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Full {
    /// At its concurrency limit.
    AtLimit,
    /// Below its limit, but at the balancer's load bound (others took it there since the pick).
    OverBound,
}

/// One request's hold on a backend; releases it when dropped (response finished or abandoned).
#[derive(Debug)]
pub struct InFlight(Arc<Backend>);

impl InFlight {
    pub fn backend(&self) -> &Arc<Backend> {
        &self.0
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Ordering::AcqRel);
        self.0.freed.wake();
    }
}

/// A backend taken for one attempt.
#[derive(Debug)]
pub struct Acquired {
    /// Its index in the pool.
    pub index: usize,
    pub hold: InFlight,
    /// Outside the preferred region.
    pub spilled_over: bool,
    /// Whether the request's affinity was honoured, overflowed, or not asked for.
    pub affinity: AffinityOutcome,
}

/// What one pick is asked for, besides health and room.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ask<'a> {
    /// Only backends of this dedicated pool (`None`: the shared backends).
    pub bulkhead: Option<&'a str>,
    pub region: Option<&'a str>,
    /// Avoided while another region has room (after a capacity failure there).
    pub avoid_region: Option<&'a str>,
    /// The request's affinity key, for `prefix_affinity` and `session_affinity`.
    pub affinity_key: Option<u64>,
    /// Only backends that serve this surface.
    pub surface: Surface,
    /// Only this backend, by index.
    pub only: Option<usize>,
    /// Only backends of this version (during a rollout).
    pub side: Option<Side>,
    /// When the new version has no backend with room, the old one (a staged rollout; a replaced
    /// version is gone).
    pub spill_to_old: bool,
}

/// A model's backends, and the retry budget their requests share.
#[derive(Debug)]
pub struct ModelPool {
    pub name: Arc<str>,
    pub backends: Vec<Arc<Backend>>,
    pub budget: Mutex<RetryBudget>,
    /// Adaptive throttling while the pool's backends fail (`retry.throttle_k`; none when off or
    /// naive).
    pub throttle: Option<Mutex<Throttle>>,
    /// Calls let through throttling whose first attempt is not recorded yet.
    pub(crate) throttle_pending: crate::counters::Level,
    /// Client requests of this model in flight, and how many of them are on a retry.
    pub(crate) in_flight: crate::counters::Level,
    pub retrying: AtomicU64,
    pub max_ejected_share: f64,
    pub panic_threshold: f64,
    pub metrics: PoolMetrics,
    /// Its GenAI histograms.
    pub(crate) genai: crate::genai::GenAiSeries,
    /// Woken whenever a backend of this pool frees a unit of concurrency.
    freed: Arc<Freed>,
    pub balance: spillway_config::BalanceConfig,
    /// When an engine's load counts as saturated.
    pub saturation: Saturation,
    /// The models its requests go to, in order, when it cannot answer them.
    pub fallbacks: Vec<spillway_policy::Fallback<String>>,
    /// The next turn of `round_robin`.
    turn: AtomicU64,
    /// Its rollout, when a new version of its backends is being rolled out.
    pub rollout: Option<Arc<crate::rollout::RolloutCell>>,
    /// What it was built from: a reload keeps the pool when unchanged.
    recipe: build::PoolRecipe,
}

impl ModelPool {
    /// Draws one retry of a call of this model from its budget, given how many other calls are
    /// retrying; a refusal is counted.
    pub fn withdraw_retry(&self, now: Instant, others: u64) -> Result<(), Refusal> {
        let granted = self
            .budget
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .try_withdraw(now, self.in_flight.now(), others);
        if let Err(refusal) = granted {
            self.metrics.budget_exhausted(refusal);
        }
        granted
    }

    /// Whether a backend of `bulkhead` (`None`: the shared ones) serves `surface`.
    pub fn serves(&self, surface: Surface, bulkhead: Option<&str>) -> bool {
        self.backends
            .iter()
            .any(|b| b.bulkhead.as_deref() == bulkhead && b.surfaces.contains(surface))
    }

    /// Requests the backends of `bulkhead` can take now: the sum of the concurrency limits of
    /// those a request could be sent to (not ejected unless the pool is in panic, not cooling
    /// down after a refused connection; one for a backend that takes a single probe). These are
    /// the pool's seats in the admission queue: a seat must mean a backend that can take the
    /// request, or the request would be refused for want of one the moment it is seated.
    pub fn seats(&self, bulkhead: Option<&str>, now: Instant) -> usize {
        let mut states = PerBackend::new();
        let panic = self.states(now, &mut states);
        self.backends
            .iter()
            .zip(&states)
            .filter(|(b, _)| b.bulkhead.as_deref() == bulkhead && !b.skipped(now))
            .map(|(b, (health, _))| match health {
                _ if panic => b.health.limit() as usize,
                Health::Healthy => b.health.limit() as usize,
                Health::Probing => 1,
                Health::Ejected { .. } => 0,
            })
            .sum()
    }

    /// Each backend's health and whether it is degraded, into `states`, and whether the pool is
    /// in panic mode: one look at each backend per decision, panic mode derived from the same
    /// look. The caller's list is filled where it lies: a list returned by value would be
    /// copied whole, its inline array with it.
    fn states(&self, now: Instant, states: &mut PerBackend<(Health, bool)>) -> bool {
        states.extend(self.backends.iter().map(|b| b.health.state(now)));
        let healthy = states.iter().filter(|(h, _)| *h == Health::Healthy).count();
        self.panics_with(healthy)
    }

    /// Waits until a backend of this pool frees a unit of concurrency, or `at_most` passes.
    pub async fn freed(&self, at_most: Duration) {
        self.freed.wait(at_most).await;
    }

    /// Picks a backend with room for `ask`, skipping those in `exclude`, cooling down or ejected
    /// (unless the pool is in panic mode), and takes a unit of its concurrency.
    /// A call on its way to a rollout's new version goes to the old one when no new backend has
    /// room.
    pub fn acquire(&self, now: Instant, ask: Ask<'_>, exclude: &[usize]) -> Option<Acquired> {
        if ask.side != Some(Side::New) || !ask.spill_to_old {
            return self.acquire_on(now, ask, exclude);
        }
        self.acquire_on(now, ask, exclude).or_else(|| {
            let old = Ask {
                side: ask.side.map(|_| Side::Old),
                ..ask
            };
            self.acquire_on(now, old, exclude)
        })
    }

    /// [`ModelPool::acquire`] on the side `ask` names, or on both when it names none.
    fn acquire_on(&self, now: Instant, ask: Ask<'_>, exclude: &[usize]) -> Option<Acquired> {
        let mut states = PerBackend::new();
        let panic = self.states(now, &mut states);
        let usable = |i: usize, b: &Backend| {
            ask.side.is_none_or(|s| s == b.side)
                && b.bulkhead.as_deref() == ask.bulkhead
                && b.surfaces.contains(ask.surface)
                && ask.only.is_none_or(|o| o == i)
                && !exclude.contains(&i)
                && !b.skipped(now)
                && (panic || !matches!(states[i].0, Health::Ejected { .. }))
        };
        // Healthy backends first (another region first after a capacity failure); degraded
        // ones only when no healthy backend has room.
        let healthy = |i: usize, b: &Backend| usable(i, b) && (panic || !states[i].1);
        let elsewhere =
            |i: usize, b: &Backend| healthy(i, b) && Some(&*b.region) != ask.avoid_region;
        if ask.avoid_region.is_some() {
            if let Some(found) = self.acquire_among(ask, now, panic, elsewhere) {
                return Some(found);
            }
        }
        self.acquire_among(ask, now, panic, healthy)
            .or_else(|| self.acquire_among(ask, now, panic, usable))
    }

    fn acquire_among(
        &self,
        ask: Ask<'_>,
        now: Instant,
        panic: bool,
        usable: impl Fn(usize, &Backend) -> bool,
    ) -> Option<Acquired> {
        let mut rng = rand::rng();
        let strategy = match (self.balance.strategy, ask.affinity_key) {
            (Balance::RoundRobin, _) => Strategy::RoundRobin {
                turn: self.turn.fetch_add(1, Ordering::Relaxed),
            },
            (Balance::PrefixAffinity | Balance::SessionAffinity, Some(key)) => Strategy::Affinity {
                key,
                load_factor: self.balance.load_factor,
            },
            _ => Strategy::LeastLoad,
        };
        // A backend may fill up between the snapshot and the CAS, or have its one probe out:
        // re-pick without it. The list is allocated only in that rare case.
        let mut full: Vec<usize> = Vec::new();
        // Other callers may also have taken a backend to the load bound it was picked under
        // (affinity's): re-pick from fresh loads, where it may still fit as the tier's load has
        // grown too; after RACES such turns, without it.
        let mut races = 0;
        // Filled in place each round (`collect` would return its inline array by value).
        let mut candidates: PerBackend<Candidate<'_>> = PerBackend::new();
        while full.len() < self.backends.len() {
            candidates.clear();
            candidates.extend(self.backends.iter().enumerate().map(|(i, b)| Candidate {
                region: &b.region,
                weight: b.weight,
                outstanding: b.outstanding(),
                limit: b.health.limit(),
                available: usable(i, b) && !full.contains(&i),
                id: b.id,
                engine: b.engine_view(now),
            }));
            let choice = pick(&candidates, ask.region, strategy, self.saturation, &mut rng)?;
            let backend = &self.backends[choice.index];
            if panic || backend.health.admit(now) {
                match backend.try_acquire_within(choice.load_bound) {
                    Ok(hold) => {
                        return Some(Acquired {
                            index: choice.index,
                            hold,
                            spilled_over: choice.spilled_over,
                            affinity: choice.affinity,
                        })
                    }
                    Err(Full::OverBound) if races < RACES => {
                        races += 1;
                        continue;
                    }
                    Err(_) => {}
                }
            }
            full.push(choice.index);
        }
        None
    }
}

#[cfg(test)]
pub(crate) mod tests;
