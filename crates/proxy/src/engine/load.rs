//! The latest reading of one engine, written by its scrape task and read on every pick.
//!
//! Readers never wait for the writer: the fields are atomics behind a sequence number (a
//! seqlock with one writer), so a reader that overlaps a store simply reads again, and no
//! reader ever sees the running count of one scrape with the queue of another.

use std::collections::HashMap;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderName, HeaderValue, Uri};
use metrics::CounterFn;
use spillway_config::{default_metrics_url, BackendConfig, Engine};

use super::parse::Sample;
use crate::counters::Tally;

/// `kv_bits` when the engine exports no KV-cache usage (a NaN no reading can hold).
const NO_KV: u64 = u64::MAX;

/// One engine's load as last read from its `/metrics`, shared by every backend that points at
/// it (one server serving two models is one engine).
#[derive(Debug)]
pub struct EngineLoad {
    uri: Uri,
    engine: Engine,
    auth_header: Option<(HeaderName, HeaderValue)>,
    stale_after: Duration,
    epoch: Instant,
    /// Even when no store is under way; 0 before the first.
    seq: AtomicU64,
    running: AtomicU32,
    waiting: AtomicU32,
    kv_bits: AtomicU64,
    /// When the reading was taken, in milliseconds since `epoch`.
    read_at_ms: AtomicU64,
    detected: AtomicU8,
    /// Attempts spillway sent, per writing thread (counted with no locked instruction), and
    /// their total when the reading was stored: the difference is load the engine could not
    /// report yet.
    sent: Tally,
    sent_at_reading: AtomicU64,
}

/// One consistent view of an engine's load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    pub running: u32,
    pub waiting: u32,
    pub kv_usage: Option<f64>,
    /// Attempts spillway sent to the engine since the reading was taken.
    pub sent_since: u32,
    pub age: Duration,
    /// Older than `engine_metrics.stale_after`: the engine may be wedged or unreachable, so a
    /// reader must treat it as saturated, never as idle.
    pub stale: bool,
    /// The engine the page was read as (for `auto`, the one detected).
    pub engine: Engine,
}

impl EngineLoad {
    /// The state of the engine whose page is `uri`, read as `engine` (not [`Engine::None`])
    /// with `auth_header` sent along; readings go stale after `stale_after`.
    pub fn new(
        uri: Uri,
        engine: Engine,
        auth_header: Option<(HeaderName, HeaderValue)>,
        stale_after: Duration,
    ) -> Self {
        Self {
            uri,
            engine,
            auth_header,
            stale_after,
            epoch: crate::clock::now(),
            seq: AtomicU64::new(0),
            running: AtomicU32::new(0),
            waiting: AtomicU32::new(0),
            kv_bits: AtomicU64::new(NO_KV),
            read_at_ms: AtomicU64::new(0),
            detected: AtomicU8::new(0),
            sent: Tally::new(),
            sent_at_reading: AtomicU64::new(0),
        }
    }

    /// Attempts sent since the reading was stored (those sent while it was taken are not).
    fn sent_since(&self) -> u32 {
        let since = self
            .sent
            .total()
            .saturating_sub(self.sent_at_reading.load(Ordering::Relaxed));
        u32::try_from(since).unwrap_or(u32::MAX)
    }

    /// The metrics page this state is read from.
    pub fn uri(&self) -> &Uri {
        &self.uri
    }

    /// How old a reading may be before it is stale.
    pub fn stale_after(&self) -> Duration {
        self.stale_after
    }

    /// The engine as configured (possibly [`Engine::Auto`]).
    pub fn engine(&self) -> Engine {
        self.engine
    }

    pub fn auth_header(&self) -> Option<&(HeaderName, HeaderValue)> {
        self.auth_header.as_ref()
    }

    /// Counts one attempt sent to this engine since its last reading.
    pub fn note_sent(&self) {
        self.sent.increment(1);
    }

    /// Stores a reading taken at `at` (by the one scrape task of this engine). Attempts sent
    /// while the scrape was under way may or may not be in it; they are forgotten either way.
    pub fn store(&self, engine: Engine, sample: &Sample, at: Instant) {
        let count = |v: f64| v.round().min(f64::from(u32::MAX)) as u32;
        let at_ms = at.saturating_duration_since(self.epoch).as_millis() as u64;
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        self.running.store(count(sample.running), Ordering::Relaxed);
        self.waiting.store(count(sample.waiting), Ordering::Relaxed);
        self.kv_bits.store(
            sample.kv_usage.map_or(NO_KV, f64::to_bits),
            Ordering::Relaxed,
        );
        self.read_at_ms.store(at_ms, Ordering::Relaxed);
        self.detected.store(code(engine), Ordering::Relaxed);
        self.seq.store(seq + 2, Ordering::Release);
        self.sent_at_reading
            .store(self.sent.total(), Ordering::Relaxed);
    }

    /// The latest reading as of `now`; `None` before the first successful scrape.
    pub fn reading(&self, now: Instant) -> Option<Reading> {
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before == 0 {
                return None;
            }
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let running = self.running.load(Ordering::Relaxed);
            let waiting = self.waiting.load(Ordering::Relaxed);
            let kv_bits = self.kv_bits.load(Ordering::Relaxed);
            let read_at_ms = self.read_at_ms.load(Ordering::Relaxed);
            let detected = self.detected.load(Ordering::Relaxed);
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) != before {
                continue;
            }
            let taken = self.epoch + Duration::from_millis(read_at_ms);
            let age = now.saturating_duration_since(taken);
            return Some(Reading {
                running,
                waiting,
                kv_usage: (kv_bits != NO_KV).then(|| f64::from_bits(kv_bits)),
                sent_since: self.sent_since(),
                age,
                stale: age > self.stale_after,
                engine: Engine::CHOICES[usize::from(detected)],
            });
        }
    }
}

fn code(engine: Engine) -> u8 {
    Engine::CHOICES
        .iter()
        .position(|e| *e == engine)
        .map_or(0, |i| i as u8)
}

/// The engine states of a gateway, one per distinct metrics URL, handed to backends as their
/// pools are built.
#[derive(Debug)]
pub(crate) struct EngineLoads {
    stale_after: Duration,
    by_uri: HashMap<Uri, Arc<EngineLoad>>,
}

impl EngineLoads {
    pub(crate) fn new(stale_after: Duration) -> Self {
        Self {
            stale_after,
            by_uri: Default::default(),
        }
    }

    /// Shares `load` with the backends built from now on that read the same page, when it was
    /// made with the same staleness: so a reload keeps an engine's reading.
    pub(crate) fn keep(&mut self, load: &Arc<EngineLoad>) {
        if load.stale_after() == self.stale_after {
            self.by_uri
                .entry(load.uri().clone())
                .or_insert_with(|| load.clone());
        }
    }

    /// The engine state of a backend whose base URL is `base`, shared with every backend
    /// already given the same metrics URL (the engine and key of the first are the ones used to
    /// read it); `None` when its engine is not read.
    pub(crate) fn for_backend(
        &mut self,
        cfg: &BackendConfig,
        base: &Uri,
        auth_header: Option<&(HeaderName, HeaderValue)>,
    ) -> Result<Option<Arc<EngineLoad>>, String> {
        if cfg.engine == Engine::None {
            return Ok(None);
        }
        // The config resolves every default it can; a mock's address is known only now.
        let uri = cfg
            .metrics_url
            .clone()
            .or_else(|| default_metrics_url(base))
            .ok_or_else(|| format!("backend {:?}: no metrics URL from {base}", cfg.name))?;
        let stale_after = self.stale_after;
        let load = self.by_uri.entry(uri).or_insert_with_key(|uri| {
            Arc::new(EngineLoad::new(
                uri.clone(),
                cfg.engine,
                auth_header.cloned(),
                stale_after,
            ))
        });
        Ok(Some(load.clone()))
    }
}

#[cfg(test)]
mod tests;
