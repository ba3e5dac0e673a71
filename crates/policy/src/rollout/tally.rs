//! What one version of a model's backends answered during a rollout step, counted in the classes
//! the rollout compares, in constant memory.
//!
//! Why 4xx are counted per status: IL-0235's model update made the engine refuse a feature with
//! 400s that the old version never returned. Lumped with every other 4xx (a client's malformed
//! JSON, a context too long, a 404 for a model name mistyped), a new 400 in 2 % of requests hides
//! under the clients' own background of mistakes; compared status by status, it is a rate of 2 %
//! against one of 0, which the test sees within a few hundred requests.
//!
//! Why TTFT is a histogram of fixed log buckets (1 ms to 600 s, each 5 % wider than the last):
//! the slowness test needs the old version's quantile and the number of the new version's
//! requests above it, both exact to a bucket, and both sides must be cut at the same edges so
//! that their counts above a threshold compare like with like. 275 counters do that for any
//! traffic.

use std::time::Duration;

/// One of the two versions a rollout compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// The version being replaced: the reference.
    Old,
    /// The version being rolled out.
    New,
}

/// How a request to a backend ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// A response with this status arrived, and its body (or stream) ended as it should.
    Status(u16),
    /// No response head within the response timeout.
    TimedOut,
    /// The response began (its status was a success) but its stream broke before the end.
    BrokenStream,
}

/// One request's outcome as the rollout counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    pub ending: Ending,
    /// Time to the first token (for a response that is not streamed, to the response head);
    /// `None` when there was none.
    pub ttft: Option<Duration>,
}

/// A class of outcome compared between the versions. Every outcome is in at most one count
/// class (successes in none); [`Signal::SlowFirstToken`] is judged on TTFT, separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum Signal {
    /// A 4xx other than 429, with its status: compared status by status.
    ClientError(u16),
    /// 429 or 503: the version says it is full.
    Capacity,
    /// Any other 5xx (and any status above 599).
    ServerError,
    /// No response head in time.
    Timeout,
    /// A stream that broke after it began.
    BrokenStream,
    /// A first token slower than the old version's slowness quantile.
    SlowFirstToken,
}

impl Signal {
    /// The count class of a request's ending, `None` for a success (below 400).
    pub fn of(ending: Ending) -> Option<Signal> {
        match ending {
            Ending::TimedOut => Some(Signal::Timeout),
            Ending::BrokenStream => Some(Signal::BrokenStream),
            Ending::Status(429 | 503) => Some(Signal::Capacity),
            Ending::Status(status @ 400..=499) => Some(Signal::ClientError(status)),
            Ending::Status(500..) => Some(Signal::ServerError),
            Ending::Status(_) => None,
        }
    }

    /// A short stable name, for metrics labels and logs. A client error's status is a label of
    /// its own ([`Signal::status`]), so the names stay a fixed set.
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::ClientError(_) => "client_error",
            Signal::Capacity => "capacity",
            Signal::ServerError => "server_error",
            Signal::Timeout => "timeout",
            Signal::BrokenStream => "broken_stream",
            Signal::SlowFirstToken => "slow_first_token",
        }
    }

    /// The status of a client error.
    pub fn status(self) -> Option<u16> {
        match self {
            Signal::ClientError(status) => Some(status),
            _ => None,
        }
    }
}

/// Buckets of the TTFT histogram: below 1 ms, then 273 buckets each 5 % wider than the one
/// before up to about 609 s, then everything slower.
const TTFT_BUCKETS: usize = 275;
/// The growth of a bucket's upper edge from one bucket to the next.
const TTFT_GROWTH: f64 = 1.05;

/// The bucket of a TTFT: 0 below 1 ms, `i` for `[1.05^(i-1), 1.05^i)` ms, the last one above.
fn ttft_bucket(ttft: Duration) -> usize {
    let ms = ttft.as_secs_f64() * 1000.0;
    if ms < 1.0 {
        return 0;
    }
    (1 + (ms.ln() / TTFT_GROWTH.ln()) as usize).min(TTFT_BUCKETS - 1)
}

/// The upper edge of a TTFT bucket (for the last one, its lower edge: nothing is known above).
pub(crate) fn ttft_bucket_edge(bucket: usize) -> Duration {
    let exponent = bucket.min(TTFT_BUCKETS - 2) as i32;
    Duration::from_secs_f64(TTFT_GROWTH.powi(exponent) / 1000.0)
}

/// Statuses 400 to 499, one counter each (429's is never used: it is a capacity answer).
const CLIENT_STATUSES: usize = 100;

/// One version's outcomes over a rollout step's window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tally {
    requests: u64,
    /// Indexed by status - 400.
    client_errors: [u64; CLIENT_STATUSES],
    capacity: u64,
    server_errors: u64,
    timeouts: u64,
    broken_streams: u64,
    /// Requests with a TTFT, and their histogram.
    ttft_requests: u64,
    ttft: [u64; TTFT_BUCKETS],
}

impl Default for Tally {
    fn default() -> Self {
        Tally {
            requests: 0,
            client_errors: [0; CLIENT_STATUSES],
            capacity: 0,
            server_errors: 0,
            timeouts: 0,
            broken_streams: 0,
            ttft_requests: 0,
            ttft: [0; TTFT_BUCKETS],
        }
    }
}

impl Tally {
    /// Counts one request.
    pub fn record(&mut self, observation: Observation) {
        self.requests += 1;
        match Signal::of(observation.ending) {
            Some(Signal::ClientError(status)) => self.client_errors[usize::from(status - 400)] += 1,
            Some(Signal::Capacity) => self.capacity += 1,
            Some(Signal::ServerError) => self.server_errors += 1,
            Some(Signal::Timeout) => self.timeouts += 1,
            Some(Signal::BrokenStream) => self.broken_streams += 1,
            Some(Signal::SlowFirstToken) | None => {}
        }
        if let Some(ttft) = observation.ttft {
            self.ttft_requests += 1;
            self.ttft[ttft_bucket(ttft)] += 1;
        }
    }

    /// Requests counted.
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// Requests of a count class; `None` for [`Signal::SlowFirstToken`], which is counted against
    /// a threshold (see [`Tally::ttft_quantile`]).
    pub fn count(&self, signal: Signal) -> Option<u64> {
        Some(match signal {
            Signal::ClientError(status @ 400..=499) => {
                self.client_errors[usize::from(status - 400)]
            }
            Signal::ClientError(_) => 0,
            Signal::Capacity => self.capacity,
            Signal::ServerError => self.server_errors,
            Signal::Timeout => self.timeouts,
            Signal::BrokenStream => self.broken_streams,
            Signal::SlowFirstToken => return None,
        })
    }

    /// The client errors counted, by status, in increasing status order.
    pub(crate) fn client_errors(&self) -> impl Iterator<Item = (u16, u64)> + '_ {
        (400u16..)
            .zip(self.client_errors.iter().copied())
            .filter(|&(_, n)| n > 0)
    }

    /// Requests that reported a TTFT.
    pub fn ttft_requests(&self) -> u64 {
        self.ttft_requests
    }

    /// The `q` quantile of TTFT, to a bucket's upper edge (at most 5 % above the true value);
    /// `None` without any TTFT.
    pub fn ttft_quantile(&self, q: f64) -> Option<Duration> {
        self.ttft_quantile_bucket(q).map(ttft_bucket_edge)
    }

    /// The first bucket at which at least `q` of the TTFTs are counted.
    pub(crate) fn ttft_quantile_bucket(&self, q: f64) -> Option<usize> {
        if self.ttft_requests == 0 {
            return None;
        }
        let wanted = (q.clamp(0.0, 1.0) * self.ttft_requests as f64).ceil() as u64;
        let mut seen = 0;
        self.ttft.iter().position(|&n| {
            seen += n;
            seen >= wanted.max(1)
        })
    }

    /// Requests whose TTFT fell in a bucket above `bucket`.
    pub(crate) fn ttft_above(&self, bucket: usize) -> u64 {
        self.ttft
            .get(bucket + 1..)
            .map_or(0, |above| above.iter().sum())
    }
}

#[cfg(test)]
mod tests;
