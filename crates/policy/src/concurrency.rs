//! An adaptive concurrency limit per backend: AIMD (additive increase, multiplicative decrease)
//! on overload signals, in the style of Netflix concurrency-limits' `AimdLimit`.
//!
//! Why a limit that moves: a backend's configured `max_concurrency` is what it can take on a good
//! day. When it slows down (a noisy neighbour on the GPU, long prompts filling its KV cache, a
//! degraded node) it starts queueing or refusing, and a gateway that keeps it full only deepens
//! the queue. The limit backs off when the backend says it is overloaded and creeps back up while
//! it serves well, so the gateway sends the rest elsewhere, or tells the caller there is no room,
//! instead of piling on.
//!
//! Why AIMD on overload signals and time to first byte, not a gradient on latency: gradient
//! limits (Vegas, Gradient2) compare each request's latency with the best seen and shrink the
//! limit as the ratio grows. An LLM response's total latency is set mostly by how many tokens it
//! outputs, not by load: a 2,000-token answer takes twenty times as long as a 100-token one on
//! an idle backend. A gradient on whole responses would read long answers as overload and misfire.
//! Queueing at the backend shows elsewhere: in the time to the first byte of a streamed response
//! (the wait before the first token, which grows with the queue), and in explicit 429/503s,
//! timeouts and refused connections. So only those count: an overload signal, or a streamed
//! response whose head came later than `latency_tolerance` times the baseline, cuts the limit by
//! `backoff_ratio`; a success while the limit is in use counts `1 / limit`, so the limit steps up
//! by one per limit's worth of successes: about one per round trip at full use.
//!
//! The baseline is the smallest time to first byte seen in the last `baseline_window`, kept as
//! the minima of two alternating half windows (constant memory): it covers between half a
//! window and a whole one, so a backend that got faster is judged against its new speed soon,
//! and one that got slower stops being judged against a speed it no longer has.
//!
//! Why a cooldown between cuts: one overload episode fails every request in flight at about the
//! same time; cutting once per failure would take the limit from 100 to 1 on a single burst.
//! After a cut, further overload signals are ignored for one baseline time to first byte (the
//! backend's round trip to the head, the time the cut needs to show), but at least
//! [`MIN_COOLDOWN`] (100 ms), which also applies while there is no baseline (no streamed sample
//! in the window).

use std::time::{Duration, Instant};

/// The shortest time between two cuts of the limit.
pub const MIN_COOLDOWN: Duration = Duration::from_millis(100);

/// Settings of an adaptive limit for one backend.
#[derive(Debug, Clone, PartialEq)]
pub struct AimdConfig {
    /// The limit never goes below this (at least 1: a limit of 0 would send nothing, so no
    /// success could ever raise it again).
    pub min_limit: u32,
    /// The backend's configured `max_concurrency` (raised to `min_limit` if lower).
    pub max_limit: u32,
    /// Where the limit starts (clamped to the range).
    pub initial_limit: u32,
    /// On overload, `limit = max(min_limit, floor(limit x backoff_ratio))`, and at least one
    /// lower.
    pub backoff_ratio: f64,
    /// A time to first byte above `latency_tolerance x baseline` counts as overload.
    pub latency_tolerance: f64,
    /// The baseline is the smallest time to first byte seen over about this long.
    pub baseline_window: Duration,
}

impl AimdConfig {
    /// The defaults for a backend whose configured `max_concurrency` is `max_limit`: minimum 1,
    /// start at `max_limit`, back off by 0.9, tolerate twice the baseline, baseline over 60 s.
    ///
    /// The limit starts at the configured maximum, not below it: the operator's
    /// `max_concurrency` is already a statement of capacity, and since the limit grows by about
    /// one per round trip, and an LLM round trip takes seconds, starting at a quarter would
    /// throttle a healthy backend for minutes after every restart. A backend that is in fact
    /// overloaded says so at once, and the limit falls by 10 % per cooldown.
    pub fn with_max_limit(max_limit: u32) -> Self {
        AimdConfig {
            min_limit: 1,
            max_limit,
            initial_limit: max_limit,
            backoff_ratio: 0.9,
            latency_tolerance: 2.0,
            baseline_window: Duration::from_secs(60),
        }
    }
}

/// The adaptive concurrency limit of one backend.
#[derive(Debug, Clone)]
pub struct Aimd {
    config: AimdConfig,
    /// Always within the range.
    limit: u32,
    /// Successes at full use since the limit last moved: it steps up by one after `limit` of
    /// them (an integer count, so no rounding drifts the step).
    credit: u32,
    last_cut: Option<Instant>,
    baseline: Baseline,
}

impl Aimd {
    /// Settings out of range are brought into it, as documented on [`AimdConfig`]'s fields.
    pub fn new(config: AimdConfig) -> Self {
        let min_limit = config.min_limit.max(1);
        let max_limit = config.max_limit.max(min_limit);
        let config = AimdConfig {
            min_limit,
            max_limit,
            initial_limit: config.initial_limit.clamp(min_limit, max_limit),
            ..config
        };
        Aimd {
            limit: config.initial_limit,
            credit: 0,
            baseline: Baseline::new(config.baseline_window),
            last_cut: None,
            config,
        }
    }

    pub fn config(&self) -> &AimdConfig {
        &self.config
    }

    /// How many requests may be in flight to the backend now.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// A request finished well. `latency` is the time to the response head of a streamed
    /// response, or `None` when the sample must not be judged (a non-streamed response, whose
    /// latency is dominated by its output length). A head later than `latency_tolerance` times
    /// the baseline counts as an overload instead of a success.
    ///
    /// `in_flight` is how many requests were outstanding when this one was sent: the limit grows
    /// only when it was being used (`in_flight x 2 >= limit`), since successes at low use say
    /// nothing about whether more would be served as well.
    pub fn on_success(&mut self, now: Instant, latency: Option<Duration>, in_flight: u32) {
        if let Some(sample) = latency {
            self.baseline.roll(now);
            let slow = self.baseline.min().is_some_and(|best| {
                sample.as_secs_f64() > best.as_secs_f64() * self.config.latency_tolerance
            });
            self.baseline.add(sample);
            if slow {
                self.on_overload(now);
                return;
            }
        }
        if u64::from(in_flight) * 2 >= u64::from(self.limit) {
            self.credit += 1;
            if self.credit >= self.limit {
                self.credit = 0;
                self.limit = (self.limit + 1).min(self.config.max_limit);
            }
        }
    }

    /// The backend said it is overloaded (429/503, timeout, connection refused): multiplicative
    /// decrease, at most once per cooldown (the baseline time to first byte, at least
    /// [`MIN_COOLDOWN`]), so a burst of failures from one overload episode cuts once.
    pub fn on_overload(&mut self, now: Instant) {
        self.baseline.roll(now);
        let cooldown = self
            .baseline
            .min()
            .map_or(MIN_COOLDOWN, |b| b.max(MIN_COOLDOWN));
        if self
            .last_cut
            .is_some_and(|last| now.saturating_duration_since(last) < cooldown)
        {
            return;
        }
        // `as` saturates: a NaN or negative ratio cuts to the minimum.
        let cut = (f64::from(self.limit) * self.config.backoff_ratio).floor() as u32;
        self.limit = cut
            .min(self.limit.saturating_sub(1))
            .max(self.config.min_limit);
        self.credit = 0;
        self.last_cut = Some(now);
    }
}

/// The smallest latency sample over the last half window to whole window, as the minima of two
/// alternating halves.
#[derive(Debug, Clone)]
struct Baseline {
    half: Duration,
    /// Start of the current half, set by the first sample.
    start: Option<Instant>,
    current: Option<Duration>,
    previous: Option<Duration>,
}

impl Baseline {
    fn new(window: Duration) -> Self {
        Baseline {
            half: window / 2,
            start: None,
            current: None,
            previous: None,
        }
    }

    /// Moves to the half window that holds `now`, forgetting samples older than a window.
    fn roll(&mut self, now: Instant) {
        let Some(start) = self.start else {
            self.start = Some(now);
            return;
        };
        let elapsed = now.saturating_duration_since(start);
        if elapsed >= self.half.saturating_mul(2) {
            self.previous = None;
            self.current = None;
            self.start = Some(now);
        } else if elapsed >= self.half {
            self.previous = self.current.take();
            self.start = Some(start + self.half);
        }
    }

    fn add(&mut self, sample: Duration) {
        self.current = Some(self.current.map_or(sample, |m| m.min(sample)));
    }

    fn min(&self) -> Option<Duration> {
        match (self.current, self.previous) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests;
