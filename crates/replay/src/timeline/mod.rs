//! A mode's run over time, for its picture: what the callers offered, sent and got back, what
//! the gateway sent upstream and shed, its memory and its store queries, in buckets of one
//! width on one time axis from the first phase's start.
//!
//! A table gives one figure per phase, which hides when within the phase things happened: the
//! surge of resends at an outage's first second, a store storm right after a flush, memory that
//! climbs and stays. The series come from two places and meet on one axis: the load client
//! counts its own events into [`ClientCounts`] as they happen (the tally keeps them beside its
//! per-phase counts), and [`sampler`] reads the gateway's `/metrics` every bucket width.
//! [`Recording`] is what a scenario starts beside its schedule, once per mode: the progress
//! display, and the sampler when `--out` asked for pictures (without them the gateway is left
//! to its load alone, as before there were pictures); [`Recording::finish`] turns what they and the tallies saw into a
//! [`Timeline`], which `pictures` draws.

pub(crate) mod buckets;
mod sampler;

use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;

pub(crate) use buckets::width_for;
pub(crate) use buckets::ClientCounts;
use buckets::MAX_BUCKETS;
pub(crate) use sampler::StoreCount;
use sampler::{GatewaySampler, Sampled};

use crate::plan::Mode;
use crate::progress::Progress;
use crate::tally::{Schedule, Tally};

/// One line of a picture: a value per bucket, `None` where it is unknown.
#[derive(Debug, Clone)]
pub(crate) struct Series {
    pub(crate) name: &'static str,
    pub(crate) values: Vec<Option<f64>>,
}

impl Series {
    pub(crate) fn max(&self) -> Option<f64> {
        self.values.iter().flatten().copied().reduce(f64::max)
    }
}

/// A phase on the time axis, in seconds from the run's start.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Span {
    pub(crate) name: &'static str,
    pub(crate) from_s: f64,
    pub(crate) to_s: f64,
}

/// The series of one mode's run, every one with a value per bucket of `width`.
#[derive(Debug, Clone)]
pub(crate) struct Timeline {
    pub(crate) mode: Mode,
    pub(crate) width: Duration,
    /// The phases in order, then the drain (requests in flight finishing), if it took time.
    pub(crate) phases: Vec<Span>,
    /// Per second: offered, client requests, upstream attempts, successes, shed.
    pub(crate) rates: Vec<Series>,
    /// The gateway's resident memory, MiB.
    pub(crate) rss_mib: Series,
    /// Store queries per second; `None` when the run had no store counter at all.
    pub(crate) store: Option<Series>,
    /// What the store series counts.
    pub(crate) store_what: &'static str,
}

impl Timeline {
    /// Where the time axis ends, in seconds.
    pub(crate) fn end_s(&self) -> f64 {
        let buckets = self.rates.first().map_or(0, |s| s.values.len());
        let drawn = buckets as f64 * self.width.as_secs_f64();
        self.phases.last().map_or(drawn, |p| p.to_s.max(drawn))
    }

    /// The time of bucket `i`'s middle, in seconds.
    pub(crate) fn at_s(&self, i: usize) -> f64 {
        (i as f64 + 0.5) * self.width.as_secs_f64()
    }
}

/// The gateway a recording reads, every bucket, for the pictures.
pub(crate) struct GatewayReading {
    /// Its admin listener, where its `/metrics` is.
    pub(crate) admin: SocketAddr,
    pub(crate) store: StoreCount,
}

/// What watches one mode's run from beside its schedule: the progress, and the gateway's page
/// when the pictures were asked for.
pub(crate) struct Recording {
    mode: Mode,
    phases: &'static [&'static str],
    schedule: Schedule,
    width: Duration,
    store: &'static str,
    sampler: Option<GatewaySampler>,
    progress: Progress,
}

impl Recording {
    /// Starts showing the progress of `phases` (named in the schedule's order) and, with
    /// `gateway` (only when `--out` asked for pictures: without them the gateway is left to
    /// its load alone), reading the gateway; call it when the schedule starts.
    pub(crate) fn start(
        mode: Mode,
        phases: &'static [&'static str],
        schedule: Schedule,
        gateway: Option<GatewayReading>,
    ) -> Recording {
        let width = width_for(schedule.end() - schedule.start());
        Recording {
            mode,
            phases,
            schedule,
            width,
            store: gateway.as_ref().map_or("store queries", |g| g.store.what()),
            sampler: gateway
                .map(|g| GatewaySampler::start(g.admin, schedule.start(), width, g.store)),
            progress: Progress::start(mode, phases, schedule),
        }
    }

    /// Stops watching (call it once the load has drained) and makes the run's timeline, the
    /// callers' series summed over `tallies`.
    pub(crate) async fn finish(self, tallies: &[&Tally]) -> Timeline {
        let stopped = Instant::now();
        let Recording {
            mode,
            phases,
            schedule,
            width,
            store,
            sampler,
            progress,
        } = self;
        progress.stop().await;
        let sampled = match sampler {
            Some(sampler) => sampler.stop().await,
            None => None,
        }
        .unwrap_or_else(|| Sampled::new(schedule.start(), width));
        let client = tallies
            .iter()
            .map(|t| t.client_counts())
            .reduce(|a, b| a.merged(&b))
            .unwrap_or_else(|| ClientCounts::new(schedule.start(), schedule.end()));
        let len = client
            .offered
            .index(stopped)
            .saturating_add(1)
            .min(MAX_BUCKETS);
        let run = Run {
            mode,
            phases,
            schedule,
            width,
            store,
        };
        timeline(&run, client, sampled, len, stopped)
    }
}

/// What a timeline is drawn on: the run's mode, phases, schedule and bucket width.
struct Run {
    mode: Mode,
    phases: &'static [&'static str],
    schedule: Schedule,
    width: Duration,
    store: &'static str,
}

fn timeline(
    r: &Run,
    client: ClientCounts,
    sampled: Sampled,
    len: usize,
    stopped: Instant,
) -> Timeline {
    let since = |at: Instant| {
        at.saturating_duration_since(r.schedule.start())
            .as_secs_f64()
    };
    let mut phases: Vec<Span> = r
        .phases
        .iter()
        .enumerate()
        .map(|(i, name)| Span {
            name,
            from_s: if i == 0 {
                0.0
            } else {
                since(r.schedule.end_of(i - 1))
            },
            to_s: since(r.schedule.end_of(i)),
        })
        .collect();
    let end = since(r.schedule.end());
    if since(stopped) > end {
        phases.push(Span {
            name: "drain",
            from_s: end,
            to_s: since(stopped),
        });
    }
    let series = |name, values| Series { name, values };
    let mib = |v: Option<f64>| v.map(|b| b / (1024.0 * 1024.0));
    Timeline {
        mode: r.mode,
        width: r.width,
        phases,
        rates: vec![
            series(OFFERED, client.offered.rates(len, true)),
            series(CLIENT_REQUESTS, client.sent.rates(len, true)),
            series(UPSTREAM, sampled.upstream_attempts.rates(len)),
            series(SUCCEEDED, client.succeeded.rates(len, true)),
            series(SHED, sampled.shed.rates(len)),
        ],
        rss_mib: series(
            RSS,
            sampled
                .resident_bytes
                .values(len)
                .into_iter()
                .map(mib)
                .collect(),
        ),
        store: sampled
            .store_queries
            .seen()
            .then(|| series(r.store, sampled.store_queries.rates(len))),
        store_what: r.store,
    }
}

/// The series' names, as the legend shows them.
pub(crate) const OFFERED: &str = "offered (new requests)";
pub(crate) const CLIENT_REQUESTS: &str = "client requests (resends included)";
pub(crate) const UPSTREAM: &str = "upstream attempts";
pub(crate) const SUCCEEDED: &str = "successes (2xx to callers)";
pub(crate) const SHED: &str = "shed by the gateway";
pub(crate) const RSS: &str = "gateway RSS";

/// A small made-up timeline, for the pictures' tests.
#[cfg(test)]
pub(crate) fn example(mode: Mode, with_store: bool) -> Timeline {
    let n = 40;
    let wave = |scale: f64| -> Vec<Option<f64>> {
        (0..n)
            .map(|i| Some(scale * (1.0 + (i as f64 / 4.0).sin().abs())))
            .collect()
    };
    let mut upstream = wave(300.0);
    upstream[3] = None;
    Timeline {
        mode,
        width: Duration::from_millis(250),
        phases: vec![
            Span {
                name: "steady",
                from_s: 0.0,
                to_s: 4.0,
            },
            Span {
                name: "outage",
                from_s: 4.0,
                to_s: 9.0,
            },
            Span {
                name: "drain",
                from_s: 9.0,
                to_s: 10.0,
            },
        ],
        rates: vec![
            Series {
                name: OFFERED,
                values: wave(100.0),
            },
            Series {
                name: CLIENT_REQUESTS,
                values: wave(200.0),
            },
            Series {
                name: UPSTREAM,
                values: upstream,
            },
            Series {
                name: SUCCEEDED,
                values: wave(90.0),
            },
            Series {
                name: SHED,
                values: vec![Some(0.0); n],
            },
        ],
        rss_mib: Series {
            name: RSS,
            values: wave(20.0),
        },
        store: with_store.then(|| Series {
            name: "store queries (gateway)",
            values: wave(5.0),
        }),
        store_what: "store queries (gateway)",
    }
}
