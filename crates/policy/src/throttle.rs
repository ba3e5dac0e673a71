//! Adaptive throttling of a model's pool: while its backends fail, attempts are sent to them
//! only in proportion to what they accept, so callers' resends cannot multiply their load.
//!
//! Why a budget on retries is not enough: spillway's own retries are bounded by the retry budget,
//! but a caller that resends every 5xx at once (IL-0248's layers did, up to 48 times) turns each
//! failure into a new request, and each new request is a first attempt the budget lets through.
//! With every backend failing, the backends then received 49 attempts per logical request. So
//! over a short sliding window the pool counts the attempts it sent (`sent`) and those the
//! backends accepted (`accepted`: answered with anything but a backend failure), and a new request
//! goes to a backend only while
//!
//! ```text
//! sent < K x accepted + probes
//! ```
//!
//! and is refused locally otherwise. This is the budget form of the adaptive throttling in the
//! Google SRE book's "Handling Overload" chapter (whose clients refuse with probability
//! `(requests - K x accepts) / (requests + 1)`), and of Finagle's and Envoy's retry budgets
//! applied to every attempt: it holds G1 as stated, attempts reaching the backends stay within
//! `K` times what they accept plus `probes` per window, however callers retry.
//!
//! - Healthy traffic is never refused: while at least `1 / K` of the attempts are accepted (half,
//!   with the default K = 2), `sent <= K x accepted`. Attempts are counted when their outcome is
//!   known, so a burst of requests on an idle pool is not refused for being in flight, and a
//!   refused connection is not counted at all (it put no load on a backend).
//! - With every backend failing, the backends see about `probes` attempts per window, and past
//!   them one probe each `window / probes` (default: 5 a second and one each 200 ms): what shows
//!   that they have healed, soon after they have. At the start of an outage the accepts of the last
//!   window still count, so up to `K` times the traffic of one window (a second by default) gets
//!   through first: the window is short for that reason.
//! - Recovery needs nothing from the callers: what was refused locally is not counted (the
//!   book's clients count it, which holds the throttle shut while callers resend refusals), and
//!   each accepted probe lets `K` more through, so the pool reopens within a round trip or two of
//!   the backends healing.

use std::time::{Duration, Instant};

use crate::window::PairWindow;

/// Settings of adaptive throttling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThrottleConfig {
    /// How many times what the backends accepted may be sent to them (at least 1).
    pub k: f64,
    /// How far back requests and accepts are counted.
    pub window: Duration,
    /// Attempts always allowed per window, whatever was accepted: the probes that show when the
    /// backends heal, and room for a quiet pool's few failures.
    pub probes: u64,
}

impl Default for ThrottleConfig {
    fn default() -> Self {
        ThrottleConfig {
            k: 2.0,
            window: Duration::from_secs(1),
            probes: 5,
        }
    }
}

/// Requests and accepts of one pool over a sliding window.
#[derive(Debug, Clone)]
pub struct Throttle {
    config: ThrottleConfig,
    /// Attempts sent (0) and accepted (1).
    window: PairWindow,
    /// Before this, no probe beyond the window's allowance goes out.
    next_probe: Option<Instant>,
}

impl Throttle {
    /// `k` below 1 is taken as 1 (sending less than is accepted would refuse healthy traffic);
    /// a zero window as 1 ms.
    pub fn new(config: ThrottleConfig, now: Instant) -> Self {
        let config = ThrottleConfig {
            k: if config.k.is_finite() {
                config.k.max(1.0)
            } else {
                1.0
            },
            ..config
        };
        Throttle {
            window: PairWindow::new(config.window, now),
            config,
            next_probe: None,
        }
    }

    pub fn config(&self) -> &ThrottleConfig {
        &self.config
    }

    /// (sent, accepted) in the window ending at `now`.
    pub fn totals(&self, now: Instant) -> (u64, u64) {
        self.window.totals(now)
    }

    /// Whether a new request may be sent to a backend now: while
    /// `sent + pending < K x accepted + probes` over the window, or, past that, as the one probe
    /// of each `window / probes` (so that a probe goes out soon after the backends heal, not only
    /// when a window's probes expire).
    ///
    /// `pending` counts the requests let through whose first attempt has not been recorded yet.
    /// While the window says the backends fail (more than `1 - 1/K` of what was sent), they
    /// count as sent: they are on their way to a failing backend, and a window that counted only
    /// attempts already answered would let any number of concurrent requests through before the
    /// next answer is recorded (most of all on a loaded machine, where answers are slow to be
    /// recorded). While it does not, they are not counted, so a cold start or a healthy burst is
    /// never throttled for being concurrent.
    pub fn admit(&mut self, now: Instant, pending: u64) -> bool {
        let (sent, accepted) = self.totals(now);
        let failing = sent as f64 > self.config.k * accepted as f64;
        let sent = if failing {
            sent.saturating_add(pending)
        } else {
            sent
        };
        if (sent as f64) < self.config.k * accepted as f64 + self.config.probes as f64 {
            return true;
        }
        if self.next_probe.is_some_and(|at| now < at) {
            return false;
        }
        self.next_probe = Some(now + self.config.window / self.config.probes.max(1) as u32);
        true
    }

    /// An attempt was sent to a backend (a first attempt or a retry).
    pub fn sent(&mut self, now: Instant) {
        self.window.add(now, 0);
    }

    /// A backend accepted an attempt: it answered with anything but a backend failure.
    pub fn accepted(&mut self, now: Instant) {
        self.window.add(now, 1);
    }

    /// Whether the backends have recently failed more than `1 - 1/K` of what was sent to them
    /// (with at least `probes` attempts sent): callers' own retries are shed while they have.
    pub fn is_throttling(&self, now: Instant) -> bool {
        let (sent, accepted) = self.totals(now);
        sent >= self.config.probes && sent as f64 > self.config.k * accepted as f64
    }
}

#[cfg(test)]
mod tests;
