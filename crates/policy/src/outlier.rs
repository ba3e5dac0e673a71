//! Outlier ejection: taking a failing backend out of rotation for a while, then letting a single
//! probe decide whether it comes back, in the style of Envoy's outlier detection.
//!
//! Why eject and not only retry elsewhere: a backend that fails every request (a crashed worker,
//! a wrong model loaded, a GPU fault, a queue that never drains) still receives its share from the
//! balancer. Each of those requests costs the caller a failed attempt, a retry from the budget and
//! added latency. Passive detection reads the outcomes of real requests, so it reacts within a
//! handful of them, well before an active health check's next period.
//!
//! Two triggers, because failures come in two shapes: `consecutive_failures` in a row catches a
//! backend that is plainly down; a `failure_rate` over a sliding `window` (with at least
//! `min_requests` outcomes, so two failures out of three do not count) catches one that fails
//! often but not always. The window is ten time buckets, so memory is constant however busy the
//! backend is, and an outcome leaves the window between 0.9 and 1 window after it was recorded.
//!
//! Why the ejection time doubles: a backend that fails again right after it comes back is
//! flapping, and letting it back at a fixed rate would spend a batch of requests on it every
//! time. The n-th ejection in a row lasts `base_ejection x 2^(n-1)`, capped at `max_ejection`.
//! The multiplier steps back down by one for each `max_ejection` the backend then stays in
//! rotation (Envoy's rule), so an old incident stops counting against it, while a backend that
//! flaps on a shorter period keeps its long ejections.
//!
//! Why one probe: when an ejection ends the backend is `Probing`, and exactly one request is let
//! through. Its success re-admits the backend; its failure ejects it again for the next, longer
//! interval. Sending it a full share at once would fail a whole batch if it is still broken. A
//! probe whose outcome is never recorded (a lost task, a bug in the caller) must not wedge the
//! backend: once it is older than `base_ejection` it counts as a failed probe, as of that moment.
//!
//! Why a passing active health check ends an ejection early, but only into probing: ejections
//! grow while a backend is down (each failed probe doubles the next), so a backend back after a
//! 20 s outage could sit out another 13 to 16 s although it answered `/health` within 2 to 3 s
//! of its restart. The check is the earliest sign that it is back, so it ends the ejection at
//! once. It does not re-admit the backend outright, because `/health` passing does not prove
//! that inference works (a model still loading, a broken GPU): one real request decides, exactly
//! as after an ejection that ran its course. A failing check during an ejection extends nothing,
//! since the ejection already holds the backend out.
//!
//! Why the pool caps ejections ([`may_eject`]) and has a panic mode ([`panic_mode`]): detection
//! is per backend, but when many backends fail together the cause is usually shared (a load
//! spike, the gateway's own network). Ejecting them all would crush the few left, or leave
//! nothing; so the caller asks the pool before each ejection, and when too few backends are
//! healthy the balancer ignores health altogether and spreads over every backend.

use std::time::{Duration, Instant};

/// Default for the share of a pool that [`may_eject`] lets be out of rotation at once.
pub const DEFAULT_MAX_EJECTED_SHARE: f64 = 0.5;
/// Default for the healthy share below which [`panic_mode`] switches on.
pub const DEFAULT_PANIC_THRESHOLD: f64 = 0.5;

/// Steps the failure-rate window slides in.
const BUCKETS: usize = 10;
/// Durations in the settings are capped here, so that `now + duration` can never overflow.
const LONGEST: Duration = Duration::from_secs(365 * 24 * 3600);
/// The shortest ejection: an ejection of zero would let probes through back to back.
const SHORTEST_EJECTION: Duration = Duration::from_millis(1);

/// Settings of outlier detection for one backend.
#[derive(Debug, Clone, PartialEq)]
pub struct OutlierConfig {
    /// Eject after this many counted failures in a row (at least 1).
    pub consecutive_failures: u32,
    /// Or eject when the failure share over `window` exceeds this...
    pub failure_rate: f64,
    /// ...and at least this many outcomes were seen in `window`.
    pub min_requests: u32,
    /// How far back the failure rate looks.
    pub window: Duration,
    /// The first ejection lasts this long (at least 1 ms); also how long a probe may go unanswered.
    pub base_ejection: Duration,
    /// The longest ejection (raised to `base_ejection` if lower).
    pub max_ejection: Duration,
}

impl Default for OutlierConfig {
    fn default() -> Self {
        OutlierConfig {
            consecutive_failures: 5,
            failure_rate: 0.5,
            min_requests: 20,
            window: Duration::from_secs(10),
            base_ejection: Duration::from_secs(5),
            max_ejection: Duration::from_secs(300),
        }
    }
}

/// A backend's state as the balancer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// In rotation.
    Healthy,
    /// Out of rotation until `until`.
    Ejected { until: Instant },
    /// The ejection is over (its time ran out, or an active health check passed): one probe
    /// request at a time may be sent.
    Probing,
}

/// Outlier detection state of one backend.
#[derive(Debug, Clone)]
pub struct Outlier {
    config: OutlierConfig,
    /// Counted failures in a row while healthy.
    consecutive: u32,
    /// When the last counted failure happened.
    last_failure: Option<Instant>,
    window: Window,
    state: State,
    /// Ejections in the current run, before decay: the next ejection lasts
    /// `base x 2^streak` (capped).
    streak: u32,
    /// When the backend last came back into rotation (for the multiplier's decay).
    readmitted_at: Option<Instant>,
    ejections: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Healthy,
    /// Out of rotation until `until`; from then on probing, with `probe` the time the one request
    /// let through was admitted.
    Ejected {
        until: Instant,
        probe: Option<Instant>,
    },
}

impl Outlier {
    /// Starts healthy. Settings out of range are brought into it, as documented on
    /// [`OutlierConfig`]'s fields; durations above a year are taken as a year.
    pub fn new(config: OutlierConfig) -> Self {
        let base_ejection = config.base_ejection.clamp(SHORTEST_EJECTION, LONGEST);
        let config = OutlierConfig {
            consecutive_failures: config.consecutive_failures.max(1),
            window: config.window.min(LONGEST),
            base_ejection,
            max_ejection: config.max_ejection.clamp(base_ejection, LONGEST),
            ..config
        };
        Outlier {
            window: Window::new(config.window),
            config,
            consecutive: 0,
            last_failure: None,
            state: State::Healthy,
            streak: 0,
            readmitted_at: None,
            ejections: 0,
        }
    }

    pub fn config(&self) -> &OutlierConfig {
        &self.config
    }

    /// Records the outcome of one request (`ok = false` for the failures that count: capacity,
    /// transient, timeout). Returns `Some(until)` when this outcome ejects the backend.
    ///
    /// `may_eject` is the pool's answer ([`may_eject`]) to whether one more backend may be
    /// ejected now; when false the backend stays in rotation and the failure is still counted,
    /// so the next failure asks again. While ejected, outcomes are ignored: they come from
    /// requests sent before the ejection. While probing, a success re-admits the backend and a
    /// failure, when a probe is out, is taken as the probe's and ejects it again (whatever
    /// `may_eject` says: a probing backend already counts as ejected in the pool).
    pub fn record(&mut self, now: Instant, ok: bool, may_eject: bool) -> Option<Instant> {
        self.expire_probe(now);
        match self.state {
            State::Healthy => self.count(now, ok, may_eject),
            State::Ejected { until, probe } if now >= until => {
                if ok {
                    self.readmit(now);
                    None
                } else if probe.is_some() {
                    Some(self.eject(now))
                } else {
                    None
                }
            }
            State::Ejected { .. } => None,
        }
    }

    /// Current state. After `until` passes an ejected backend is `Probing`. A probe left
    /// unanswered past `base_ejection` shows here as the ejection it has earned.
    pub fn health(&self, now: Instant) -> Health {
        let state = match self.probe_expiry(now) {
            Some(at) => State::Ejected {
                until: at + self.ejection_time(self.next_streak(at)),
                probe: None,
            },
            None => self.state,
        };
        match state {
            State::Healthy => Health::Healthy,
            State::Ejected { until, .. } if now < until => Health::Ejected { until },
            State::Ejected { .. } => Health::Probing,
        }
    }

    /// Whether a request may be sent now: always while healthy, never while ejected, and while
    /// probing for one request at a time, until that probe's outcome is recorded (or it expires
    /// after `base_ejection` and counts as failed).
    pub fn admit(&mut self, now: Instant) -> bool {
        self.expire_probe(now);
        match &mut self.state {
            State::Healthy => true,
            State::Ejected { until, probe } => {
                if now < *until || probe.is_some() {
                    false
                } else {
                    *probe = Some(now);
                    true
                }
            }
        }
    }

    /// An active health check's result.
    ///
    /// Success while ejected, before or after `until`, ends the ejection now: the backend is
    /// `Probing`, so one real request decides whether it is re-admitted (a probe already out
    /// stays out and decides). Success never makes it `Healthy` directly, and success while
    /// healthy changes nothing: a passing `/health` does not prove that inference works, so it
    /// must not mask failing requests. Failure while healthy counts like a failed request;
    /// failure while probing ejects again for the next interval; failure while ejected before
    /// `until` extends nothing.
    pub fn health_check(&mut self, now: Instant, ok: bool, may_eject: bool) -> Option<Instant> {
        self.expire_probe(now);
        match &mut self.state {
            State::Healthy if ok => None,
            State::Healthy => self.count(now, false, may_eject),
            State::Ejected { until, .. } if ok => {
                *until = (*until).min(now);
                None
            }
            State::Ejected { until, .. } if now >= *until => Some(self.eject(now)),
            State::Ejected { .. } => None,
        }
    }

    /// Whether the backend is in rotation but failing as an ejected one would: a run of
    /// `consecutive_failures` whose last failure is less than a window old, or a failure rate
    /// over the window above `failure_rate` (with `min_requests`). That happens when the pool's
    /// ejection cap ([`may_eject`]) held an ejection back. The balancer then uses it only when
    /// no healthy backend has room (Envoy's "degraded" hosts), so a region whose every backend
    /// fails stops attracting its callers' traffic even when not all of them may be ejected. It
    /// is degraded no longer once a success arrives or its failures are a window old; then it
    /// gets a request again, which shows how it is doing.
    pub fn degraded(&self, now: Instant) -> bool {
        // Without a failure ever counted neither trigger can hold, and the window (read on every
        // pick of a backend) need not be summed.
        if self.state != State::Healthy || self.last_failure.is_none() {
            return false;
        }
        let recent_run = self.recent_run(now);
        let (total, failures) = self.window.totals(now);
        let by_rate = total >= self.config.min_requests
            && f64::from(failures) > self.config.failure_rate * f64::from(total);
        recent_run || by_rate
    }

    /// Whether the backend is calm: healthy, not degraded and admitted at `now` and at every
    /// later instant until the next outcome or check is recorded. It is so while healthy with
    /// no failure left in the window (none recorded at any time in it, later ones included) and
    /// no run of failures still recent: time alone only takes failures out of the window and
    /// makes a run older, and an outcome while healthy is the only thing that changes the
    /// state. A caller that keeps this answer may read the backend as `Healthy`, not degraded
    /// and admitted without asking again until it records something; a backend that is not
    /// calm is asked each time.
    pub fn calm(&self, now: Instant) -> bool {
        if self.state != State::Healthy {
            return false;
        }
        !self.recent_run(now) && !self.window.failures_from(now)
    }

    /// A run of `consecutive_failures` whose last failure is less than a window old at `now`.
    fn recent_run(&self, now: Instant) -> bool {
        self.consecutive >= self.config.consecutive_failures
            && self
                .last_failure
                .is_some_and(|at| now.saturating_duration_since(at) < self.config.window)
    }

    /// Times ejected so far (for metrics), as of the last call that took `&mut self`.
    pub fn ejections(&self) -> u32 {
        self.ejections
    }

    /// Counts an outcome while healthy and ejects when a trigger fires on a failure.
    fn count(&mut self, now: Instant, ok: bool, may_eject: bool) -> Option<Instant> {
        let (total, failures) = self.window.add(now, ok);
        if ok {
            self.consecutive = 0;
            return None;
        }
        self.consecutive = self.consecutive.saturating_add(1);
        self.last_failure = Some(now);
        let in_a_row = self.consecutive >= self.config.consecutive_failures;
        let by_rate = total >= self.config.min_requests
            && f64::from(failures) > self.config.failure_rate * f64::from(total);
        (may_eject && (in_a_row || by_rate)).then(|| self.eject(now))
    }

    fn eject(&mut self, at: Instant) -> Instant {
        self.streak = self.next_streak(at);
        let until = at + self.ejection_time(self.streak);
        self.state = State::Ejected { until, probe: None };
        self.ejections = self.ejections.saturating_add(1);
        self.readmitted_at = None;
        self.consecutive = 0;
        self.window.clear();
        until
    }

    fn readmit(&mut self, now: Instant) {
        self.state = State::Healthy;
        self.readmitted_at = Some(now);
        self.consecutive = 0;
        self.window.clear();
    }

    /// When the outstanding probe, if any, has gone unanswered for `base_ejection` by `now`.
    fn probe_expiry(&self, now: Instant) -> Option<Instant> {
        match self.state {
            State::Ejected {
                probe: Some(sent), ..
            } => {
                let expiry = sent + self.config.base_ejection;
                (now >= expiry).then_some(expiry)
            }
            _ => None,
        }
    }

    /// Turns an expired probe into the failed probe it stands for.
    fn expire_probe(&mut self, now: Instant) {
        if let Some(at) = self.probe_expiry(now) {
            self.eject(at);
        }
    }

    /// The streak an ejection at `at` starts or continues: decayed by one step per full
    /// `max_ejection` spent in rotation since the last re-admission, then one more, unless the
    /// ejection time already reached the cap.
    fn next_streak(&self, at: Instant) -> u32 {
        let mut streak = self.streak;
        if let Some(since) = self.readmitted_at {
            let healthy = at.saturating_duration_since(since).as_nanos();
            let steps = healthy / self.config.max_ejection.as_nanos();
            streak = streak.saturating_sub(u32::try_from(steps).unwrap_or(u32::MAX));
        }
        if streak > 0 && self.ejection_time(streak) >= self.config.max_ejection {
            streak
        } else {
            streak.saturating_add(1)
        }
    }

    /// How long the `streak`-th ejection in a row lasts (`streak >= 1`).
    fn ejection_time(&self, streak: u32) -> Duration {
        let factor = 1u32
            .checked_shl(streak.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.config
            .base_ejection
            .saturating_mul(factor)
            .min(self.config.max_ejection)
    }
}

/// Whether one more backend of a pool of `pool_size` may be ejected when `ejected` already are.
///
/// At most `floor(pool_size x max_ejected_share)` may be out at once, but at least one when the
/// pool has two or more backends (as in Envoy, so a small pool can still shed a broken backend),
/// and never all of them: a single-backend pool is never ejected, since sending its traffic
/// nowhere is worse than sending it to a struggling backend. Count a backend as ejected from
/// its ejection until it is healthy again (that is, while `Ejected` or `Probing`).
pub fn may_eject(pool_size: usize, ejected: usize, max_ejected_share: f64) -> bool {
    if pool_size < 2 {
        return false;
    }
    let by_share = (pool_size as f64 * max_ejected_share.clamp(0.0, 1.0)).floor() as usize;
    ejected < by_share.clamp(1, pool_size - 1)
}

/// Panic mode (Envoy's panic threshold, default [`DEFAULT_PANIC_THRESHOLD`]): when the share of
/// healthy backends falls below `threshold`, the balancer ignores health and spreads over all
/// backends rather than crushing the few left. A threshold of 0 turns it off; an empty pool is
/// never in panic, having nothing to spread over.
pub fn panic_mode(pool_size: usize, healthy: usize, threshold: f64) -> bool {
    pool_size > 0 && (healthy.min(pool_size) as f64) < threshold * pool_size as f64
}

/// Outcomes over a sliding window, in `BUCKETS` steps: constant memory at any request rate.
#[derive(Debug, Clone)]
struct Window {
    /// Start of step 0, set by the first outcome.
    origin: Option<Instant>,
    step: Duration,
    buckets: [Bucket; BUCKETS],
}

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    /// Which step of time this bucket holds.
    step: u64,
    total: u32,
    failures: u32,
}

impl Window {
    fn new(length: Duration) -> Self {
        Window {
            origin: None,
            step: (length / BUCKETS as u32).max(Duration::from_nanos(1)),
            buckets: [Bucket::default(); BUCKETS],
        }
    }

    /// Adds one outcome and returns (outcomes, failures) in the window ending at `now`.
    fn add(&mut self, now: Instant, ok: bool) -> (u32, u32) {
        self.origin.get_or_insert(now);
        let step = self.step_at(now).unwrap_or(0);
        let bucket = &mut self.buckets[(step % BUCKETS as u64) as usize];
        if bucket.step != step {
            *bucket = Bucket {
                step,
                ..Bucket::default()
            };
        }
        bucket.total = bucket.total.saturating_add(1);
        if !ok {
            bucket.failures = bucket.failures.saturating_add(1);
        }
        self.sum(step)
    }

    /// (outcomes, failures) in the window ending at `now`.
    fn totals(&self, now: Instant) -> (u32, u32) {
        self.step_at(now).map_or((0, 0), |step| self.sum(step))
    }

    /// The step `now` falls in; `None` before the first outcome.
    fn step_at(&self, now: Instant) -> Option<u64> {
        let elapsed = now.saturating_duration_since(self.origin?);
        Some(crate::window::whole_steps(elapsed, self.step))
    }

    /// Whether a failure lies in the window ending at `now` or in any step after it.
    fn failures_from(&self, now: Instant) -> bool {
        let Some(step) = self.step_at(now) else {
            return false;
        };
        self.buckets
            .iter()
            .any(|b| b.failures > 0 && b.step.saturating_add(BUCKETS as u64) > step)
    }

    fn sum(&self, step: u64) -> (u32, u32) {
        self.buckets
            .iter()
            .filter(|b| b.step <= step && step - b.step < BUCKETS as u64)
            .fold((0u32, 0u32), |(t, f), b| {
                (t.saturating_add(b.total), f.saturating_add(b.failures))
            })
    }

    fn clear(&mut self) {
        self.buckets = [Bucket::default(); BUCKETS];
    }
}

#[cfg(test)]
mod tests;
