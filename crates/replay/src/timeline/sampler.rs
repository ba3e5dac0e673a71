//! The gateway seen from outside while a mode runs: its `/metrics` page read every bucket
//! width, for the series the load client cannot see.
//!
//! What reached the backends, what the gateway refused itself, its memory and its store
//! queries are the gateway's own figures, so they come from its Prometheus page, read the way
//! an operator's scraper reads it: upstream attempts (`spillway_upstream_attempts_total`), shed
//! requests (`spillway_requests_total` answered 429 or 503 with `backend="none"`: refused before
//! any backend), resident memory (`spillway_process_resident_memory_bytes`) and store queries
//! (`spillway_store_queries_total`), or a scenario's own count of store statements when it has
//! a truer one (the cache-flush link counts them on the wire, across restarts).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use super::buckets::{CounterTrack, Readings};
use crate::http::{uri, HttpClient};

const UPSTREAM_ATTEMPTS: &str = "spillway_upstream_attempts_total";
const REQUESTS: &str = "spillway_requests_total";
const RESIDENT: &str = "spillway_process_resident_memory_bytes";
const STORE_QUERIES: &str = "spillway_store_queries_total";
/// Statuses of a request the gateway refused itself (admission, throttling, shed retries).
const SHED_STATUSES: [&str; 2] = ["status=\"429\"", "status=\"503\""];
/// The longest a reading may take; a gateway too busy to answer in this time leaves a gap.
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// Where a run's store queries are counted.
#[derive(Clone)]
pub(crate) enum StoreCount {
    /// `spillway_store_queries_total` on the gateway's page.
    Gateway,
    /// A cumulative count the scenario keeps itself, read each tick; named for the legend.
    Counted {
        what: &'static str,
        read: Arc<dyn Fn() -> u64 + Send + Sync>,
    },
}

impl StoreCount {
    /// What the series is, for the legend.
    pub(crate) fn what(&self) -> &'static str {
        match self {
            StoreCount::Gateway => "store queries (gateway)",
            StoreCount::Counted { what, .. } => what,
        }
    }
}

/// The figures of one reading of a gateway's page; `None` where the page had no such series.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct PageReading {
    pub(crate) upstream_attempts: Option<f64>,
    pub(crate) shed: Option<f64>,
    pub(crate) resident_bytes: Option<f64>,
    pub(crate) store_queries: Option<f64>,
}

/// Reads the figures off a Prometheus text page: each is the sum of its series.
pub(crate) fn read_page(page: &str) -> PageReading {
    let mut reading = PageReading::default();
    for line in page.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        let field = match name {
            UPSTREAM_ATTEMPTS => &mut reading.upstream_attempts,
            RESIDENT => &mut reading.resident_bytes,
            STORE_QUERIES => &mut reading.store_queries,
            REQUESTS
                if labels.contains("backend=\"none\"")
                    && SHED_STATUSES.iter().any(|s| labels.contains(s)) =>
            {
                &mut reading.shed
            }
            // The requests counter exists as soon as anything was answered: shed is zero then.
            REQUESTS => {
                reading.shed.get_or_insert(0.0);
                continue;
            }
            _ => continue,
        };
        *field = Some(field.unwrap_or(0.0) + value);
    }
    reading
}

/// What the sampler read over a run.
#[derive(Debug, Clone)]
pub(crate) struct Sampled {
    pub(crate) upstream_attempts: CounterTrack,
    pub(crate) shed: CounterTrack,
    pub(crate) store_queries: CounterTrack,
    pub(crate) resident_bytes: Readings,
    /// Readings that got no page.
    pub(crate) missed: u64,
}

impl Sampled {
    pub(crate) fn new(start: Instant, width: Duration) -> Sampled {
        Sampled {
            upstream_attempts: CounterTrack::new(start, width),
            shed: CounterTrack::new(start, width),
            store_queries: CounterTrack::new(start, width),
            resident_bytes: Readings::new(start, width),
            missed: 0,
        }
    }

    /// Records one reading taken at `at`: the page if it answered, and the scenario's store
    /// count if it keeps one.
    pub(crate) fn record(&mut self, at: Instant, page: Option<&PageReading>, store: Option<u64>) {
        if let Some(store) = store {
            self.store_queries.read(at, Some(store as f64));
        }
        let Some(page) = page else {
            self.missed += 1;
            return;
        };
        self.upstream_attempts.read(at, page.upstream_attempts);
        self.shed.read(at, page.shed);
        if store.is_none() {
            self.store_queries.read(at, page.store_queries);
        }
        if let Some(bytes) = page.resident_bytes {
            self.resident_bytes.set(at, bytes);
        }
    }
}

/// A running sampler; [`GatewaySampler::stop`] ends it and returns what it read.
pub(crate) struct GatewaySampler {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Sampled>,
}

impl GatewaySampler {
    /// Reads the page on `admin` now and every `width` from `start`.
    pub(crate) fn start(
        admin: SocketAddr,
        start: Instant,
        width: Duration,
        store: StoreCount,
    ) -> GatewaySampler {
        let (stop, mut stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            let client = HttpClient::new(1);
            let url = uri(admin, "/metrics");
            let mut sampled = Sampled::new(start, width);
            let mut ticks = tokio::time::interval_at(start, width);
            ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = ticks.tick() => {}
                }
                let asked = Instant::now();
                let page = match client.get(url.clone(), READ_TIMEOUT).await {
                    Ok((status, body)) if status.is_success() => {
                        Some(read_page(&String::from_utf8_lossy(&body)))
                    }
                    _ => None,
                };
                // The counters were read somewhere between the question and the answer.
                let at = asked + asked.elapsed() / 2;
                let counted = match &store {
                    StoreCount::Gateway => None,
                    StoreCount::Counted { read, .. } => Some(read()),
                };
                sampled.record(at, page.as_ref(), counted);
            }
            sampled
        });
        GatewaySampler { stop, task }
    }

    pub(crate) async fn stop(self) -> Option<Sampled> {
        let _ = self.stop.send(());
        self.task.await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "\
# TYPE spillway_upstream_attempts_total counter
spillway_upstream_attempts_total{tenant=\"replay\",model=\"m\"} 40
spillway_upstream_attempts_total{tenant=\"other\",model=\"m\"} 2
spillway_requests_total{tenant=\"replay\",model=\"m\",backend=\"a1\",status=\"200\"} 30
spillway_requests_total{tenant=\"replay\",model=\"m\",backend=\"a1\",status=\"503\"} 4
spillway_requests_total{tenant=\"replay\",model=\"m\",backend=\"none\",status=\"503\"} 7
spillway_requests_total{tenant=\"replay\",model=\"m\",backend=\"none\",status=\"429\"} 1
spillway_requests_total{tenant=\"unknown\",model=\"unknown\",backend=\"none\",status=\"401\"} 9
spillway_process_resident_memory_bytes 31457280
spillway_store_queries_total{result=\"ok\"} 12
spillway_store_queries_total{result=\"error\"} 3
spillway_store_query_seconds_bucket{le=\"0.5\"} 15
";

    #[test]
    fn a_page_is_read_into_sums_and_shed_is_what_no_backend_refused() {
        let r = read_page(PAGE);
        assert_eq!(r.upstream_attempts, Some(42.0));
        assert_eq!(r.shed, Some(8.0), "a backend's 503 and a 401 are not shed");
        assert_eq!(r.resident_bytes, Some(31_457_280.0));
        assert_eq!(r.store_queries, Some(15.0));
        let answered = "spillway_requests_total{backend=\"a1\",status=\"200\"} 3\n";
        assert_eq!(read_page(answered).shed, Some(0.0));
        assert_eq!(read_page("garbage\n\n"), PageReading::default());
    }

    #[test]
    fn a_missed_page_leaves_a_gap_and_a_scenario_s_own_store_count_wins() {
        let start = Instant::now();
        let second = Duration::from_secs(1);
        let mut s = Sampled::new(start, second);
        let page = |attempts: f64| PageReading {
            upstream_attempts: Some(attempts),
            store_queries: Some(1_000.0),
            resident_bytes: Some(2.0),
            ..PageReading::default()
        };
        s.record(start, Some(&page(0.0)), Some(10));
        s.record(start + second, None, Some(30));
        s.record(start + second * 2, Some(&page(8.0)), Some(30));
        assert_eq!(s.missed, 1);
        assert_eq!(s.upstream_attempts.rates(2), [Some(4.0), Some(4.0)]);
        assert_eq!(s.store_queries.rates(2), [Some(20.0), Some(0.0)]);
        assert_eq!(s.resident_bytes.values(3), [Some(2.0), None, Some(2.0)]);
        assert!(!s.shed.seen());
    }
}
