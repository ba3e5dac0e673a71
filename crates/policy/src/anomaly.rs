//! Detection of a jump in the share of 4xx answers (other than 429) that one backend of a model
//! gives, against that backend's own recent baseline, outside of any rollout.
//!
//! Why (IL-0235): a model update made the engines answer 400 and 429 in seven regions, and the
//! monitoring watched only the errors clients saw on their side, not the service's own 4xx, so
//! the failure was found an hour late. A 4xx is usually the client's fault and says nothing about
//! the backend, which is why outlier detection does not count it against one (401 and 403
//! aside); but a backend whose share of 4xx jumps is refusing what it used to serve. 429 is left out: it is a capacity
//! answer, which the concurrency limit and outlier detection already read.
//!
//! The rule: the share of 4xx over the last `window` (60 s) is compared with the share over the
//! `baseline` (30 min) before it, with the exact conditional test for two rates (the one the
//! staged rollout uses). The window is anomalous when the p-value is below `alpha`, it holds at
//! least `min_events` 4xx, and its share is at least `min_ratio` times the larger of the
//! baseline's share and `floor`. The floor is there for a backend whose baseline has no 4xx at
//! all: any share is an infinite multiple of 0, and with the default floor of 0.1 % a clean
//! backend must reach 0.3 % of 4xx before it counts, however busy it is.
//!
//! [`FourXxDetector::evaluate`] reports only the transitions, from normal to anomalous and back,
//! so the caller logs one line per jump and one per recovery. It leaves the anomalous state only
//! when the evidence falls below the square roots of both thresholds (p at least `sqrt(alpha)`,
//! or a share below `sqrt(min_ratio)` times the baseline's), so that a share hovering at the
//! threshold is reported once, not at every evaluation.
//!
//! The baseline excludes the current window, and also what was recorded while anomalous: the
//! time buckets counted during an anomaly (and those of the window that revealed it) are marked,
//! and the baseline is the unmarked buckets of its span. So a sustained jump stays anomalous
//! against the level before it, rather than raising its own baseline until it looks normal, and
//! a second jump after a recovery is judged against a clean baseline. The trade-off: a jump that
//! is the backend's new normal (a client that now sends many invalid requests, on purpose) is
//! reported as anomalous for as long as the baseline: once it has lasted that long no unmarked
//! bucket is left in the span, the marked ones become the baseline, and the detector reports
//! that it is normal again, at the new level (the change carries both shares, so the log line
//! shows that the share did not fall). A shorter baseline accepts a new normal sooner and is
//! noisier; a longer one holds an anomaly longer.
//!
//! False alarms: the comparison is repeated at every evaluation of a sliding window, so what
//! keeps a steady backend quiet is less `alpha` than the size of the excess asked for. A window
//! that by nature holds many 4xx never reaches `min_ratio` times its share by chance, and one
//! with fewer than `min_events` never counts; between the two, a steady share can. Measured with
//! a steady 1 % share evaluated each second, over 96 simulated hours at each rate: no alarm at 3
//! requests a second nor at 20 and above, and 13, 7 and 3 alarms at 5, 10 and 14 requests a
//! second (windows that expect 3 to 8 4xx), each over within a minute. A `min_ratio` of 4 leaves
//! 5 alarms at 5 requests a second and none above; an `alpha` of 0.0001 leaves 2 at 5 requests
//! a second but 5 and 3 at 10 and 14, where the ratio is what binds.
//!
//! Memory is constant: the current window is `window.rs`'s ten-bucket pair window, and the
//! baseline thirty buckets of `baseline / 30` each (plus those the current window overlaps).

use std::fmt;
use std::time::{Duration, Instant};

use crate::binomial::rate_excess_p;
use crate::window::PairWindow;

/// Settings of 4xx anomaly detection for one backend of a model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AnomalyConfig {
    /// The span of the current share (at least 10 ms).
    pub window: Duration,
    /// The span of the baseline before it (at least twice the window).
    pub baseline: Duration,
    /// Significance level of the comparison, in (0, 1). It is made at every evaluation, so
    /// `alpha` alone would allow a false alarm every few thousand; see the module documentation
    /// for what keeps them rare.
    pub alpha: f64,
    /// 4xx the current window must hold before it can be anomalous (at least 1).
    pub min_events: u64,
    /// The current share must be at least this multiple of the baseline's (at least 1).
    pub min_ratio: f64,
    /// The baseline share assumed when the measured one is lower (a backend without any 4xx),
    /// in [0, 1).
    pub floor: f64,
}

impl Default for AnomalyConfig {
    fn default() -> Self {
        AnomalyConfig {
            window: Duration::from_secs(60),
            baseline: Duration::from_secs(30 * 60),
            alpha: 0.001,
            min_events: 10,
            min_ratio: 3.0,
            floor: 0.001,
        }
    }
}

/// What [`AnomalyConfig::check`] found wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnomalyConfigError {
    /// A window under 10 ms cannot be cut into its ten buckets.
    WindowTooShort,
    /// The baseline must span at least twice the window.
    BaselineTooShort,
    /// `alpha` outside (0, 1).
    AlphaOutOfRange,
    ZeroEvents,
    /// `min_ratio` below 1 or not finite.
    RatioBelowOne,
    /// `floor` outside [0, 1).
    FloorOutOfRange,
}

impl fmt::Display for AnomalyConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AnomalyConfigError::WindowTooShort => "the window must be at least 10 ms",
            AnomalyConfigError::BaselineTooShort => {
                "the baseline must be at least twice the window"
            }
            AnomalyConfigError::AlphaOutOfRange => "alpha must be in (0, 1)",
            AnomalyConfigError::ZeroEvents => "the minimum events must be at least 1",
            AnomalyConfigError::RatioBelowOne => "the minimum ratio must be a number of at least 1",
            AnomalyConfigError::FloorOutOfRange => "the floor must be in [0, 1)",
        })
    }
}

impl std::error::Error for AnomalyConfigError {}

impl AnomalyConfig {
    /// Whether the settings can run a detector; the first problem found otherwise.
    pub fn check(&self) -> Result<(), AnomalyConfigError> {
        if self.window < Duration::from_millis(10) {
            return Err(AnomalyConfigError::WindowTooShort);
        }
        if self.baseline < self.window.saturating_mul(2) {
            return Err(AnomalyConfigError::BaselineTooShort);
        }
        if !(self.alpha > 0.0 && self.alpha < 1.0) {
            return Err(AnomalyConfigError::AlphaOutOfRange);
        }
        if self.min_events == 0 {
            return Err(AnomalyConfigError::ZeroEvents);
        }
        if !(self.min_ratio.is_finite() && self.min_ratio >= 1.0) {
            return Err(AnomalyConfigError::RatioBelowOne);
        }
        if !(self.floor >= 0.0 && self.floor < 1.0) {
            return Err(AnomalyConfigError::FloorOutOfRange);
        }
        Ok(())
    }
}

/// A transition reported by [`FourXxDetector::evaluate`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Change {
    /// The current window's share of 4xx jumped above the baseline's.
    Anomalous {
        share: f64,
        baseline_share: f64,
        p_value: f64,
    },
    /// It is back within the baseline's range (or the baseline has taken the new level).
    Normal { share: f64, baseline_share: f64 },
}

/// Buckets the baseline's span is cut into.
const BASELINE_BUCKETS: u64 = 30;

/// Requests and 4xx over one step of the baseline.
#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    /// Which step of time this bucket holds (time since the epoch divided by the step).
    index: u64,
    requests: u64,
    four_xx: u64,
    /// Counted during an anomaly (or in the window that revealed one): left out of the
    /// baseline while unmarked buckets remain.
    anomalous: bool,
}

/// The share of 4xx answers of one backend, against its own baseline.
#[derive(Debug, Clone)]
pub struct FourXxDetector {
    config: AnomalyConfig,
    /// Requests (0) and 4xx (1) over the current window.
    current: PairWindow,
    epoch: Instant,
    step: Duration,
    /// A ring, bucket `i` in slot `i % len`, long enough for the baseline's span and the
    /// buckets the current window overlaps.
    buckets: Vec<Bucket>,
    anomalous: bool,
}

impl FourXxDetector {
    pub fn try_new(config: AnomalyConfig, now: Instant) -> Result<Self, AnomalyConfigError> {
        config.check()?;
        let step = config.baseline / BASELINE_BUCKETS as u32;
        let overlapped = config.window.as_nanos().div_ceil(step.as_nanos()) as usize;
        Ok(FourXxDetector {
            current: PairWindow::new(config.window, now),
            epoch: now,
            step,
            buckets: vec![Bucket::default(); BASELINE_BUCKETS as usize + overlapped + 2],
            anomalous: false,
            config,
        })
    }

    pub fn config(&self) -> &AnomalyConfig {
        &self.config
    }

    /// Whether 4xx in `status` count: every 4xx but 429, a capacity answer.
    pub fn counts(status: u16) -> bool {
        (400..500).contains(&status) && status != 429
    }

    /// Counts one answer of the backend at `now`; `is_4xx` as [`FourXxDetector::counts`] says.
    pub fn record(&mut self, now: Instant, is_4xx: bool) {
        self.current.add(now, 0);
        if is_4xx {
            self.current.add(now, 1);
        }
        let index = self.index_of(now);
        let len = self.buckets.len() as u64;
        let bucket = &mut self.buckets[(index % len) as usize];
        if bucket.index != index {
            *bucket = Bucket {
                index,
                ..Bucket::default()
            };
        }
        bucket.requests += 1;
        bucket.four_xx += u64::from(is_4xx);
        bucket.anomalous |= self.anomalous;
    }

    /// Whether the last evaluation left the backend anomalous.
    pub fn is_anomalous(&self) -> bool {
        self.anomalous
    }

    /// The share of 4xx over the current window (0 without requests).
    pub fn share(&self, now: Instant) -> f64 {
        let (requests, four_xx) = self.current.totals(now);
        ratio(four_xx, requests)
    }

    /// The share of 4xx over the baseline (0 without requests).
    pub fn baseline_share(&self, now: Instant) -> f64 {
        let (requests, four_xx) = self.baseline(now);
        ratio(four_xx, requests)
    }

    /// Judges the current window at `now`; a change only on a transition. A window without
    /// requests changes nothing: silence is neither a jump nor a recovery.
    pub fn evaluate(&mut self, now: Instant) -> Option<Change> {
        let (requests, four_xx) = self.current.totals(now);
        if requests == 0 {
            return None;
        }
        let (base_requests, base_four_xx) = self.baseline(now);
        let share = ratio(four_xx, requests);
        let baseline_share = ratio(base_four_xx, base_requests);
        let reference = baseline_share.max(self.config.floor);
        let p = || rate_excess_p(four_xx, requests, base_four_xx, base_requests);
        if !self.anomalous {
            if four_xx < self.config.min_events || share < self.config.min_ratio * reference {
                return None;
            }
            let p_value = p();
            if p_value >= self.config.alpha {
                return None;
            }
            self.anomalous = true;
            self.mark_current_window(now);
            return Some(Change::Anomalous {
                share,
                baseline_share,
                p_value,
            });
        }
        let holds =
            share >= self.config.min_ratio.sqrt() * reference && p() < self.config.alpha.sqrt();
        if holds {
            return None;
        }
        self.anomalous = false;
        Some(Change::Normal {
            share,
            baseline_share,
        })
    }

    fn index_of(&self, now: Instant) -> u64 {
        crate::window::whole_steps(now.saturating_duration_since(self.epoch), self.step)
    }

    /// The baseline's buckets: the `BASELINE_BUCKETS` wholly before the current window.
    fn span(&self, now: Instant) -> std::ops::Range<u64> {
        let Some(start) = now
            .saturating_duration_since(self.epoch)
            .checked_sub(self.config.window)
        else {
            return 0..0;
        };
        let first_in_window = crate::window::whole_steps(start, self.step);
        first_in_window.saturating_sub(BASELINE_BUCKETS)..first_in_window
    }

    fn slots(&self, range: std::ops::Range<u64>) -> impl Iterator<Item = &Bucket> {
        let len = self.buckets.len() as u64;
        range.filter_map(move |i| Some(&self.buckets[(i % len) as usize]).filter(|b| b.index == i))
    }

    /// (requests, 4xx) of the baseline: its unmarked buckets, or its marked ones when no
    /// unmarked bucket holds a request (an anomaly that has lasted the whole span: the new
    /// normal).
    fn baseline(&self, now: Instant) -> (u64, u64) {
        let sum = |anomalous: bool| {
            self.slots(self.span(now))
                .filter(|b| b.anomalous == anomalous)
                .fold((0, 0), |(r, x), b| (r + b.requests, x + b.four_xx))
        };
        match sum(false) {
            (0, _) => sum(true),
            normal => normal,
        }
    }

    /// Marks the buckets the current window overlaps: they hold what revealed the anomaly.
    fn mark_current_window(&mut self, now: Instant) {
        let from = self.span(now).end;
        let to = self.index_of(now);
        let len = self.buckets.len() as u64;
        for i in from..=to {
            let bucket = &mut self.buckets[(i % len) as usize];
            if bucket.index == i {
                bucket.anomalous = true;
            }
        }
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

#[cfg(test)]
mod tests;
