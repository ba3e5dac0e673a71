//! When a cached answer is fresh, stale or unusable, and how long each answer lives.
//!
//! These are the decisions that make a cache flush or a store outage survivable (G6), so they
//! are pure functions of `now` and a uniform random number `u` in `[0, 1)`, both passed in: the
//! tests drive them with a manual clock and chosen or generated `u`, and never sleep.
//!
//! Every answer gets a [`Window`]. Before `fresh_until` it is served as is; until `stale_until`
//! it is served at once while one background refresh runs (stale-while-revalidate), and it is
//! what a lookup falls back on when the store fails (stale-if-error); after that it is gone.
//! Jitter spreads `fresh_until` so that entries loaded together (a warm-up, a flush at peak) do
//! not fall due together and send their refreshes to the store in one wave.

use std::time::Duration;

use tokio::time::Instant;

/// When an answer stops being fresh, and when it stops being usable at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub fresh_until: Instant,
    pub stale_until: Instant,
}

/// What a lookup does with a cached answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Serve it.
    Fresh,
    /// Serve it at once and refresh it in the background.
    Stale,
    /// It was loaded before a flush: load again and wait, and serve this one only if that load
    /// fails. A flush asks for answers to be re-read, not for lookups to fail when the store
    /// cannot re-read them.
    Revalidate,
    /// Unusable: load and wait, with nothing to fall back on.
    Expired,
}

/// The state of an answer with this window at `now`; `current` is false for answers loaded
/// before the last flush.
pub fn judge(window: Window, now: Instant, current: bool) -> State {
    if now >= window.stale_until {
        State::Expired
    } else if !current {
        State::Revalidate
    } else if now < window.fresh_until {
        State::Fresh
    } else {
        State::Stale
    }
}

/// `ttl * (1 - jitter * u)`: never longer than `ttl`, never shorter than `ttl * (1 - jitter)`.
/// Out-of-range inputs are clamped rather than trusted.
pub fn jittered_ttl(ttl: Duration, jitter: f64, u: f64) -> Duration {
    ttl.mul_f64(1.0 - unit(jitter) * unit(u))
}

/// The window of an answer the store gave `age` ago (zero for a query that just returned):
/// fresh for a jittered `ttl` from then, usable for `stale_for` after that. `None` when it is
/// already past its stale window.
pub fn window_for_age(
    now: Instant,
    age: Duration,
    ttl: Duration,
    jitter: f64,
    stale_for: Duration,
    u: f64,
) -> Option<Window> {
    let fresh_for = jittered_ttl(ttl, jitter, u);
    let usable_for = (fresh_for + stale_for).checked_sub(age)?;
    if usable_for.is_zero() {
        return None;
    }
    Some(Window {
        fresh_until: now + fresh_for.saturating_sub(age),
        stale_until: now + usable_for,
    })
}

/// The window of an answer restored from a snapshot, fetched `age` ago. It is usable at once;
/// its `fresh_until` is spread uniformly over `[now, now + ttl]` (by `u`), so that a restart
/// does not make every refresh fall due in the same second. It stays usable until `ttl +
/// stale_for` after it was fetched (and at least until it stops being fresh); older answers
/// are dropped (`None`).
pub fn restored_window(
    now: Instant,
    age: Duration,
    ttl: Duration,
    stale_for: Duration,
    u: f64,
) -> Option<Window> {
    let left = (ttl + stale_for).checked_sub(age)?;
    if left.is_zero() {
        return None;
    }
    let fresh_until = now + ttl.mul_f64(unit(u));
    Some(Window {
        fresh_until,
        stale_until: (now + left).max(fresh_until),
    })
}

/// When an answer cached before a flush at `flushed_at` must be re-read: `share` (uniform in
/// `[0, 1)`, drawn once per answer) of the way through `spread`. Spreading the re-reads keeps a
/// flush at peak from sending every key to the store in the same second (IL-0136).
pub fn flush_due(flushed_at: Instant, spread: Duration, share: f64) -> Instant {
    flushed_at + spread.mul_f64(unit(share))
}

/// Until when "no such key", answered `age` ago, is believed; `None` once it is too old.
pub fn negative_until(now: Instant, age: Duration, negative_ttl: Duration) -> Option<Instant> {
    let left = negative_ttl.checked_sub(age)?;
    (!left.is_zero()).then(|| now + left)
}

/// The first retry of a failed background refresh waits this long.
pub const REFRESH_RETRY_BASE: Duration = Duration::from_secs(1);
/// Retries of failed refreshes of one entry are never further apart than this.
pub const REFRESH_RETRY_MAX: Duration = Duration::from_secs(30);

/// How long to wait before refreshing an entry again after `failures` refreshes of it failed
/// in a row: doubling from [`REFRESH_RETRY_BASE`] up to [`REFRESH_RETRY_MAX`]. While the store is
/// down, each stale key then costs it a query every half minute at most, not one per request.
pub fn refresh_retry_delay(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    REFRESH_RETRY_BASE
        .saturating_mul(1 << doublings)
        .min(REFRESH_RETRY_MAX)
}

/// How old something fetched at `fetched_ms` is at `now_ms` (both Unix milliseconds); a time in
/// the future (another host's clock ahead of ours) counts as just fetched.
pub fn age_ms(now_ms: u64, fetched_ms: u64) -> Duration {
    Duration::from_millis(now_ms.saturating_sub(fetched_ms))
}

fn unit(x: f64) -> f64 {
    if x.is_finite() {
        x.clamp(0.0, 1.0)
    } else {
        0.0
    }
}

#[cfg(test)]
#[path = "freshness/tests.rs"]
mod tests;
