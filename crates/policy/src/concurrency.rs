//! An adaptive concurrency limit per backend: AIMD (additive increase, multiplicative decrease)
//! on explicit overload signals, in the style of Netflix concurrency-limits' `AimdLimit`, with a
//! floor at what the engine says it runs and recovery while idle.
//!
//! Why a limit that moves: a backend's configured `max_concurrency` is what it can take on a good
//! day. When it slows down (a noisy neighbour on the GPU, long prompts filling its KV cache, a
//! degraded node) it starts queueing or refusing, and a gateway that keeps it full only deepens
//! the queue. The limit backs off when the backend says it is overloaded, so the gateway sends
//! the rest elsewhere, or tells the caller there is no room, instead of piling on. AIMD because
//! it is the simplest rule that converges: a cut by `backoff_ratio` per overload episode, one
//! more request per limit's worth of successes at full use.
//!
//! Why these signals and only these: the backend answering 429 or 503 (it says it is full), a
//! request timing out (it did not answer at all), and the engine's own queue growing past
//! `max_queue` between two readings of its metrics (it is taking work faster than it finishes
//! it). Each says the backend has no room, and none can come from a healthy one. Latency does
//! not qualify. An LLM response's total time follows how many tokens it outputs, not load. Nor
//! does the time to the response head: on a local engine its baseline is milliseconds, so mere
//! jitter read as "twice the baseline" (that cut a healthy llama.cpp's limit from 4 to 1 in 9 s),
//! and llama.cpp sends its head when a slot takes the request, so it measures slot queueing that
//! the limit itself causes. A refused connection is a dead backend, not a full one: outlier
//! detection handles it.
//!
//! Why a floor at what the engine reports it runs: if the engine has been seen running `n`
//! requests at once over the last `floor_window`, it has `n` slots, and a limit below that
//! leaves slots idle while callers are told there is no room. So the limit never falls below
//! `max(min_limit, peak running over the window)`, kept as the maxima of two alternating half
//! windows (constant memory, covering between half a window and a whole one).
//!
//! Why recovery while idle: additive increase needs successes at full use, and a backend whose
//! limit was cut gets little traffic, since the balancer prefers backends with room, so it could
//! stay cut long after the overload ended. So every full `recovery` period without a cut moves
//! the limit halfway back to `max_limit` (at least by one): a backend cut to 1 is back to a
//! limit of 100 in 7 periods. Recovery is computed lazily from the time of the last cut: the
//! caller calls [`Aimd::tick`] before reading the limit (every method that takes the time applies
//! it too), and [`Aimd::next_recovery`] says when that could next change anything.
//!
//! Why a cooldown between cuts: one overload episode fails every request in flight at about the
//! same time; cutting once per failure would take the limit from 100 to 1 on a single burst. After
//! a cut, further overload signals are ignored for [`MIN_COOLDOWN`].

use std::time::{Duration, Instant};

/// The shortest time between two cuts of the limit.
pub const MIN_COOLDOWN: Duration = Duration::from_millis(100);

/// The shortest `recovery` and `floor_window`: a period of zero would divide by zero.
const SHORTEST_PERIOD: Duration = Duration::from_millis(1);
/// The longest `recovery` and `floor_window`, so that `now + period` can never overflow.
const LONGEST_PERIOD: Duration = Duration::from_secs(365 * 24 * 3600);

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
    /// On overload, `limit = max(floor, floor(limit x backoff_ratio))`, and at least one lower
    /// while above the floor.
    pub backoff_ratio: f64,
    /// Each full period of this without a cut moves the limit halfway back to `max_limit`
    /// (between 1 ms and a year).
    pub recovery: Duration,
    /// The floor is the most requests the engine reported running over about this long
    /// (between 1 ms and a year).
    pub floor_window: Duration,
}

impl AimdConfig {
    /// The defaults for a backend whose configured `max_concurrency` is `max_limit`: minimum 1,
    /// start at `max_limit`, back off by 0.9, recover every second, floor over 60 s.
    ///
    /// The limit starts at the configured maximum, not below it: the operator's
    /// `max_concurrency` is already a statement of capacity, and a backend that is in fact
    /// overloaded says so at once.
    pub fn with_max_limit(max_limit: u32) -> Self {
        AimdConfig {
            min_limit: 1,
            max_limit,
            initial_limit: max_limit,
            backoff_ratio: 0.9,
            recovery: Duration::from_secs(1),
            floor_window: Duration::from_secs(60),
        }
    }
}

/// The adaptive concurrency limit of one backend.
#[derive(Debug, Clone)]
pub struct Aimd {
    config: AimdConfig,
    /// Always within `[floor, max_limit]`.
    limit: u32,
    /// Successes at full use since the limit last moved: it steps up by one after `limit` of
    /// them (an integer count, so no rounding drifts the step).
    credit: u32,
    last_cut: Option<Instant>,
    /// Start of the current recovery period: the last cut or recovery step, or the first time
    /// this limit saw.
    recovery_from: Option<Instant>,
    /// Most requests the engine reported running, over the floor window.
    peak: Peak,
    /// The engine's queue at its previous reading.
    last_waiting: Option<u32>,
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
            recovery: config.recovery.clamp(SHORTEST_PERIOD, LONGEST_PERIOD),
            floor_window: config.floor_window.clamp(SHORTEST_PERIOD, LONGEST_PERIOD),
            ..config
        };
        Aimd {
            limit: config.initial_limit,
            credit: 0,
            last_cut: None,
            recovery_from: None,
            peak: Peak::new(config.floor_window),
            last_waiting: None,
            config,
        }
    }

    pub fn config(&self) -> &AimdConfig {
        &self.config
    }

    /// How many requests may be in flight to the backend, as of the last call that took the
    /// time (call [`Aimd::tick`] first for the limit now).
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The lowest the limit may be at `now`: `min_limit`, or the most requests the engine
    /// reported running over the floor window if more, and never above `max_limit`.
    pub fn floor(&self, now: Instant) -> u32 {
        let peak = self.peak.max(now).unwrap_or(0);
        peak.max(self.config.min_limit).min(self.config.max_limit)
    }

    /// A request finished well. `in_flight` is how many requests were outstanding when this one
    /// was sent: the limit grows only when it was being used (`in_flight x 2 >= limit`), since
    /// successes at low use say nothing about whether more would be served as well. A success
    /// never lowers the limit, however long it took.
    pub fn on_success(&mut self, now: Instant, in_flight: u32) {
        self.recover(now);
        if u64::from(in_flight) * 2 >= u64::from(self.limit) {
            self.credit += 1;
            if self.credit >= self.limit {
                self.credit = 0;
                self.limit = (self.limit + 1).min(self.config.max_limit);
            }
        }
    }

    /// The backend said it is full (429, 503, or its own overload status) or a request timed
    /// out: multiplicative decrease, at most once per [`MIN_COOLDOWN`], so a burst of failures
    /// from one overload episode cuts once, and never below the floor.
    pub fn on_overload(&mut self, now: Instant) {
        self.recover(now);
        self.cut(now);
    }

    /// A fresh reading of the engine's metrics: `running` requests running and `waiting` queued;
    /// `max_queue` is the queue beyond which the backend counts as saturated. Call it once per
    /// new reading, not per request: growth is judged against the previous call.
    ///
    /// Raises the floor to `running` if that is the most seen over the window (and the limit to
    /// the floor at once). A queue beyond `max_queue` that grew since the previous reading is an
    /// overload, as [`Aimd::on_overload`]; a long queue that is not growing is not, since the
    /// engine is keeping up with it.
    pub fn on_engine(&mut self, now: Instant, running: u32, waiting: u32, max_queue: u32) {
        self.recover(now);
        self.peak.add(now, running);
        let floor = self.floor(now);
        if self.limit < floor {
            self.limit = floor;
            self.credit = 0;
        }
        let grew = self.last_waiting.is_some_and(|previous| waiting > previous);
        self.last_waiting = Some(waiting);
        if waiting > max_queue && grew {
            self.cut(now);
        }
    }

    /// Applies the recovery due by `now`: for each full `recovery` period since the last cut (or
    /// the last recovery step), the limit moves halfway to `max_limit`, at least by one. Returns
    /// the limit.
    pub fn tick(&mut self, now: Instant) -> u32 {
        self.recover(now);
        self.limit
    }

    /// When [`Aimd::tick`] could next raise the limit: `None` at `max_limit`, and before the
    /// first call that passed a time (there is no period to count from yet). A time in the past
    /// means a step is already due.
    pub fn next_recovery(&self) -> Option<Instant> {
        if self.limit >= self.config.max_limit {
            return None;
        }
        self.recovery_from?.checked_add(self.config.recovery)
    }

    fn recover(&mut self, now: Instant) {
        let Some(from) = self.recovery_from else {
            self.recovery_from = Some(now);
            return;
        };
        if self.limit >= self.config.max_limit {
            return;
        }
        let recovery = self.config.recovery;
        let periods = crate::window::whole_steps(now.saturating_duration_since(from), recovery);
        if periods == 0 {
            return;
        }
        // Each step at least halves the distance to the maximum, so 33 steps reach it from
        // anywhere: a longer wait needs no exact period count.
        let steps = periods.min(33) as u32;
        for _ in 0..steps {
            let gap = self.config.max_limit - self.limit;
            self.limit += gap.div_ceil(2);
        }
        self.credit = 0;
        self.recovery_from = Some(if periods > 33 {
            now
        } else {
            from + recovery * steps
        });
    }

    fn cut(&mut self, now: Instant) {
        if self
            .last_cut
            .is_some_and(|last| now.saturating_duration_since(last) < MIN_COOLDOWN)
        {
            return;
        }
        // `as` saturates: a NaN or negative ratio cuts to the floor.
        let cut = (f64::from(self.limit) * self.config.backoff_ratio).floor() as u32;
        self.limit = cut.min(self.limit.saturating_sub(1)).max(self.floor(now));
        self.credit = 0;
        self.last_cut = Some(now);
        self.recovery_from = Some(now);
    }
}

/// The largest value over the last half window to whole window, as the maxima of two alternating
/// halves.
#[derive(Debug, Clone)]
struct Peak {
    half: Duration,
    /// Start of the current half, set by the first value.
    start: Option<Instant>,
    current: Option<u32>,
    previous: Option<u32>,
}

impl Peak {
    fn new(window: Duration) -> Self {
        Peak {
            half: window / 2,
            start: None,
            current: None,
            previous: None,
        }
    }

    fn add(&mut self, now: Instant, value: u32) {
        self.roll(now);
        self.current = Some(self.current.map_or(value, |m| m.max(value)));
    }

    /// Moves to the half window that holds `now`, forgetting values older than a window.
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

    /// The largest value as of `now`, as [`Peak::roll`] to `now` would leave it.
    fn max(&self, now: Instant) -> Option<u32> {
        let elapsed = now.saturating_duration_since(self.start?);
        if elapsed >= self.half.saturating_mul(2) {
            None
        } else if elapsed >= self.half {
            self.current
        } else {
            self.current.max(self.previous)
        }
    }
}

#[cfg(test)]
mod tests;
