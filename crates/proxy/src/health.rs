//! What spillway knows about each backend's health: passive outlier detection, the adaptive
//! concurrency limit, and the active health checks that re-admit ejected backends.
//!
//! Every finished attempt reports its class here once. Backend failures (capacity, transient,
//! timeout, server error) count towards ejection; capacity failures and timeouts also cut the
//! backend's concurrency limit, so spillway sends an overloaded backend less before it fails
//! harder. The decisions themselves are the pure ones in `spillway_policy`; this module holds
//! their state behind short locks and runs the probe tasks.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use spillway_policy::concurrency::{Aimd, AimdConfig};
use spillway_policy::outlier::{Health, Outlier, OutlierConfig};
use spillway_policy::{Class, FourXxDetector};

fn millis(epoch: Instant, at: Instant) -> u64 {
    at.saturating_duration_since(epoch).as_millis() as u64
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One backend's health state.
#[derive(Debug)]
pub struct BackendHealth {
    /// The outlier state, the adaptive limit and the share of 4xx answers, behind one lock: a
    /// finished attempt records into all three, and one lock taken costs two locked
    /// instructions where three cost six.
    learned: Mutex<Learned>,
    /// Whether `learned` has an outlier state and an adaptive limit (settings, fixed at start).
    has_outlier: bool,
    has_aimd: bool,
    /// The outlier state was calm ([`Outlier::calm`]) when last recorded into: healthy, not
    /// degraded and admitted until the next outcome or check, so a pick reads that without the
    /// lock (a balancer looks at every backend of the pool, twice a request).
    calm: AtomicBool,
    /// The concurrency limit in force: the adaptive one, or `max_concurrency` without it.
    limit: AtomicU32,
    /// Milliseconds since `epoch` from which the adaptive limit may recover (`u64::MAX`: not
    /// before something else changes it), so that reading the limit takes no lock until then.
    recover_at_ms: AtomicU64,
    epoch: Instant,
}

#[derive(Debug)]
struct Learned {
    outlier: Option<Outlier>,
    aimd: Option<Aimd>,
    /// Its share of 4xx answers against its own baseline (`anomaly.rs`).
    four_xx: FourXxDetector,
}

impl BackendHealth {
    /// `four_xx` judges the backend's 4xx answers (by the `[anomaly]` settings).
    pub fn new(
        max_concurrency: u32,
        outlier: Option<OutlierConfig>,
        adaptive: Option<AimdConfig>,
        four_xx: FourXxDetector,
    ) -> Self {
        let aimd = adaptive.map(Aimd::new);
        let limit = aimd.as_ref().map_or(max_concurrency, Aimd::limit);
        let outlier = outlier.map(Outlier::new);
        Self {
            has_outlier: outlier.is_some(),
            has_aimd: aimd.is_some(),
            learned: Mutex::new(Learned {
                outlier,
                aimd,
                four_xx,
            }),
            calm: AtomicBool::new(true),
            limit: AtomicU32::new(limit),
            recover_at_ms: AtomicU64::new(u64::MAX),
            epoch: crate::clock::now(),
        }
    }

    /// `f` of the backend's 4xx detector.
    pub fn four_xx<T>(&self, f: impl FnOnce(&mut FourXxDetector) -> T) -> T {
        f(&mut self.learned().four_xx)
    }

    fn learned(&self) -> MutexGuard<'_, Learned> {
        lock(&self.learned)
    }

    /// The concurrency limit now. An adaptive limit that was cut recovers while no overload
    /// signal arrives, also while the backend is idle: it is brought up to date here, lazily.
    pub fn limit(&self) -> u32 {
        let due = self.recover_at_ms.load(Ordering::Relaxed);
        if due != u64::MAX {
            let now = crate::clock::now();
            if millis(self.epoch, now) >= due {
                if let Some(aimd) = &mut self.learned().aimd {
                    aimd.tick(now);
                    self.publish(aimd);
                }
            }
        }
        self.limit.load(Ordering::Relaxed)
    }

    /// Stores the adaptive limit and when it may next recover.
    fn publish(&self, aimd: &Aimd) {
        self.limit.store(aimd.limit(), Ordering::Relaxed);
        let due = aimd
            .next_recovery()
            .map_or(u64::MAX, |at| millis(self.epoch, at));
        self.recover_at_ms.store(due, Ordering::Relaxed);
    }

    /// A fresh reading of the engine's own load: it sets the limit's floor (the engine runs that
    /// many at once) and its queue growing past `max_queue` is an overload signal.
    pub fn engine_reading(&self, now: Instant, running: u32, waiting: u32, max_queue: u32) {
        if !self.has_aimd {
            return;
        }
        if let Some(aimd) = &mut self.learned().aimd {
            aimd.on_engine(now, running, waiting, max_queue);
            self.publish(aimd);
        }
    }

    /// Whether the outlier state is not known to be calm, and must be read under the lock.
    fn unsettled(&self) -> bool {
        self.has_outlier && !self.calm.load(Ordering::Relaxed)
    }

    /// Notes whether `outlier`, just recorded into, is calm.
    fn settle(&self, outlier: &Outlier, now: Instant) {
        self.calm.store(outlier.calm(now), Ordering::Relaxed);
    }

    pub fn health(&self, now: Instant) -> Health {
        if !self.unsettled() {
            return Health::Healthy;
        }
        let learned = self.learned();
        learned
            .outlier
            .as_ref()
            .map_or(Health::Healthy, |o| o.health(now))
    }

    /// The health, and whether the backend is degraded (failing while the ejection cap keeps it
    /// in rotation), in one look.
    pub fn state(&self, now: Instant) -> (Health, bool) {
        if !self.unsettled() {
            return (Health::Healthy, false);
        }
        self.learned()
            .outlier
            .as_ref()
            .map_or((Health::Healthy, false), |o| {
                (o.health(now), o.degraded(now))
            })
    }

    /// Whether a request may go to this backend now (one probe at a time once an ejection ends).
    pub fn admit(&self, now: Instant) -> bool {
        !self.unsettled() || self.learned().outlier.as_mut().is_none_or(|o| o.admit(now))
    }

    /// Records an attempt's outcome; `in_flight` is the backend's outstanding requests when it
    /// was sent, `status` its answer's status when it answered. Only explicit capacity answers
    /// and timeouts cut the adaptive limit: how long a response head took is not a signal (an
    /// engine sends it when a slot takes the request). Returns when an ejection it caused ends.
    pub fn record(
        &self,
        now: Instant,
        class: Class,
        in_flight: u32,
        status: Option<u16>,
        may_eject: bool,
    ) -> Option<Instant> {
        // A client error says nothing about the backend's health either way.
        let outlier = self.has_outlier && class != Class::ClientError;
        if !self.has_aimd && !outlier && status.is_none() {
            return None;
        }
        let mut learned = self.learned();
        if let Some(status) = status {
            learned.four_xx.record(now, FourXxDetector::counts(status));
        }
        if let Some(aimd) = &mut learned.aimd {
            if class.is_overload() {
                aimd.on_overload(now);
            } else if class == Class::Success {
                aimd.on_success(now, in_flight);
            }
            self.publish(aimd);
        }
        if !outlier {
            return None;
        }
        let failed = class.is_backend_failure();
        let o = learned.outlier.as_mut()?;
        let ejected = o.record(now, !failed, may_eject);
        self.settle(o, now);
        ejected
    }

    pub(crate) fn health_check(&self, now: Instant, ok: bool, may_eject: bool) -> Option<Instant> {
        if !self.has_outlier {
            return None;
        }
        let mut learned = self.learned();
        let o = learned.outlier.as_mut()?;
        let ejected = o.health_check(now, ok, may_eject);
        self.settle(o, now);
        ejected
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// What the lock-free reads answer is what the outlier state itself answers, through a
    /// failure, the degraded spell the ejection cap holds it in, an ejection and its probe.
    #[test]
    fn the_reads_without_the_lock_answer_as_the_state_does() {
        let config = OutlierConfig {
            consecutive_failures: 2,
            ..OutlierConfig::default()
        };
        let four_xx = FourXxDetector::try_new(
            spillway_policy::AnomalyConfig::default(),
            crate::clock::now(),
        )
        .unwrap();
        let health = BackendHealth::new(8, Some(config.clone()), None, four_xx);
        let mut shadow = Outlier::new(config);
        let t0 = crate::clock::now();
        let agree = |health: &BackendHealth, shadow: &Outlier, at: Instant| {
            let (h, degraded) = health.state(at);
            assert_eq!(
                (h, degraded),
                (shadow.health(at), shadow.degraded(at)),
                "at {at:?}"
            );
            assert_eq!(health.health(at), shadow.health(at));
        };
        agree(&health, &shadow, t0);
        // Two failures the cap keeps from ejecting: degraded, read through the lock.
        for _ in 0..2 {
            health.record(t0, Class::Transient, 1, None, false);
            shadow.record(t0, false, false);
        }
        agree(&health, &shadow, t0);
        assert!(health.state(t0).1, "degraded");
        // A success and the window past: calm again, and read so.
        let later = t0 + Duration::from_secs(11);
        health.record(later, Class::Success, 1, None, true);
        shadow.record(later, true, true);
        agree(&health, &shadow, later);
        assert!(health.calm.load(Ordering::Relaxed));
        // Two failures that may eject: ejected, not admitted, then one probe.
        for _ in 0..2 {
            health.record(later, Class::Transient, 1, None, true);
            shadow.record(later, false, true);
        }
        agree(&health, &shadow, later);
        assert!(!health.admit(later));
        let probing = later + Duration::from_secs(6);
        agree(&health, &shadow, probing);
        assert!(health.admit(probing));
        assert!(!health.admit(probing), "one probe at a time");
    }
}
