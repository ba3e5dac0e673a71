//! What the mock server saw and did, for tests and replays to assert on (`GET /stats`).
//!
//! A gateway test proves behaviour at the backend: that a request never arrived, that the
//! upstream key was injected, that a client's disconnect reached the backend as a cancellation.
//! Counters are relaxed atomics so recording costs next to nothing; the last request and the
//! per-path map sit behind one short lock.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A snapshot of the server's counters. Counters cover inference requests (chat,
/// completions, embeddings, on `/v1` or Azure paths; Responses creates and compactions;
/// Anthropic messages and `count_tokens`), the Responses API's stored-response routes (get,
/// delete, cancel, input items) and the stored chat completions' routes (list, get, update,
/// delete, messages), never `/models`, `/stats`, `/control`, `/health` or
/// `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MockStats {
    /// Inference requests that reached the server, whatever became of them.
    pub received: u64,
    /// Requests answered completely and successfully (a stream through its last event: `[DONE]`,
    /// `response.completed` or `message_stop`).
    pub served: u64,
    /// Requests answered with a 4xx before generation: bad JSON, unknown model, missing key,
    /// unknown stored response.
    pub rejected_invalid: u64,
    /// Requests refused with 429 because every slot and the queue were taken.
    pub rejected_queue_full: u64,
    /// Requests refused with 400 `unsupported_parameter` because their body used the profile's
    /// `fault.reject_field` (counted here only, not under `rejected_invalid`).
    pub rejected_field: u64,
    /// Requests answered with the profile's injected error status.
    pub errors_injected: u64,
    /// Connections reset by the profile before any response byte.
    pub resets_injected: u64,
    /// Requests held back by the profile's stall before being served.
    pub stalls_injected: u64,
    /// Streams broken off by `break_stream_after`.
    pub streams_broken: u64,
    /// Requests whose client went away before the response was complete.
    pub cancelled: u64,
    /// Requests that found the start of their prompt in the prefix cache.
    pub prefix_cache_hits: u64,
    /// Requests that looked their prompt up in the prefix cache and found none of it.
    pub prefix_cache_misses: u64,
    /// Prompt tokens looked up in the prefix cache (none while it is off).
    pub prefix_cache_query_tokens: u64,
    /// Prompt tokens found in the prefix cache, and so not prefilled.
    pub prefix_cache_hit_tokens: u64,
    /// Requests holding a generation slot right now.
    pub in_flight: u64,
    /// Requests waiting for a generation slot right now.
    pub queued: u64,
    /// Requests received per URL path; the routes of stored responses and chat completions count
    /// under their route, with `{id}` for the id (`/v1/responses/{id}/cancel`), so every id does
    /// not take a key.
    pub by_path: BTreeMap<String, u64>,
    /// The most recent counted request, as received.
    pub last_request: Option<LastRequest>,
}

/// What the last inference request carried, so a test can check what the gateway forwarded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LastRequest {
    pub path: String,
    pub query: Option<String>,
    /// The model asked for: the body's `model`, or the Azure deployment name.
    pub model: Option<String>,
    /// The `x-request-id` header.
    pub request_id: Option<String>,
    /// The `Host` header.
    #[serde(default)]
    pub host: Option<String>,
    /// How a key was presented: `"bearer"`, `"api-key"`, `"x-api-key"` or `"none"` (the first
    /// of these headers the request carried).
    pub auth: String,
    /// The `anthropic-version` header.
    #[serde(default)]
    pub anthropic_version: Option<String>,
    /// The `anthropic-beta` header (several such headers joined with commas).
    #[serde(default)]
    pub anthropic_beta: Option<String>,
    /// The names of every header it carried, in lower case, sorted, each once.
    #[serde(default)]
    pub header_names: Vec<String>,
    /// The JSON body as parsed (`null` when it was not JSON, or the route reads no body).
    pub body: Value,
}

/// Distinct paths kept in `by_path`; Azure deployment names come from the client, so the map is
/// bounded and further paths are counted together.
const MAX_PATHS: usize = 256;
const OTHER_PATHS: &str = "(other)";

/// The live counters behind [`MockStats`].
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    received: AtomicU64,
    served: AtomicU64,
    rejected_invalid: AtomicU64,
    rejected_queue_full: AtomicU64,
    rejected_field: AtomicU64,
    errors_injected: AtomicU64,
    resets_injected: AtomicU64,
    stalls_injected: AtomicU64,
    streams_broken: AtomicU64,
    cancelled: AtomicU64,
    prefix_hits: AtomicU64,
    prefix_misses: AtomicU64,
    prefix_query_tokens: AtomicU64,
    prefix_hit_tokens: AtomicU64,
    seen: Mutex<Seen>,
}

/// The counters `/metrics` exposes, read without the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EngineCounters {
    pub(crate) served: u64,
    pub(crate) prefix_query_tokens: u64,
    pub(crate) prefix_hit_tokens: u64,
}

#[derive(Debug, Default)]
struct Seen {
    by_path: BTreeMap<String, u64>,
    last: Option<Remembered>,
}

/// The last request as stored: the body is shared with the request rather than copied, so
/// remembering it costs a reference count, and it becomes a [`LastRequest`] only when asked for.
#[derive(Debug, Clone)]
pub(crate) struct Remembered {
    pub(crate) path: String,
    pub(crate) query: Option<String>,
    pub(crate) model: Option<String>,
    pub(crate) request_id: Option<String>,
    pub(crate) host: Option<String>,
    pub(crate) auth: &'static str,
    pub(crate) anthropic_version: Option<String>,
    pub(crate) anthropic_beta: Option<String>,
    /// Its headers, kept as they came (a reference count per value) until asked for.
    pub(crate) headers: http::HeaderMap,
    pub(crate) body: Arc<Value>,
}

impl From<&Remembered> for LastRequest {
    fn from(r: &Remembered) -> Self {
        LastRequest {
            path: r.path.clone(),
            query: r.query.clone(),
            model: r.model.clone(),
            request_id: r.request_id.clone(),
            host: r.host.clone(),
            auth: r.auth.to_owned(),
            anthropic_version: r.anthropic_version.clone(),
            anthropic_beta: r.anthropic_beta.clone(),
            header_names: r
                .headers
                .keys()
                .map(|name| name.as_str().to_owned())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect(),
            body: Value::clone(&r.body),
        }
    }
}

/// The counters an outcome may land in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    Served,
    RejectedInvalid,
    RejectedQueueFull,
    FieldRejected,
    ErrorInjected,
    ResetInjected,
    StallInjected,
    StreamBroken,
    Cancelled,
}

impl Recorder {
    /// Counts an arriving request under `path` (its URL path, or the route of a path that
    /// carries an id) and starts tracking its outcome.
    pub(crate) fn arrive(self: &Arc<Self>, path: &str) -> Outcome {
        self.received.fetch_add(1, Ordering::Relaxed);
        let mut seen = self.lock();
        let key = if seen.by_path.len() < MAX_PATHS || seen.by_path.contains_key(path) {
            path
        } else {
            OTHER_PATHS
        };
        match seen.by_path.get_mut(key) {
            Some(n) => *n += 1,
            None => {
                seen.by_path.insert(key.to_owned(), 1);
            }
        }
        Outcome {
            recorder: Arc::clone(self),
            settled: false,
        }
    }

    pub(crate) fn remember(&self, last: Remembered) {
        self.lock().last = Some(last);
    }

    pub(crate) fn count(&self, event: Event) {
        let counter = match event {
            Event::Served => &self.served,
            Event::RejectedInvalid => &self.rejected_invalid,
            Event::RejectedQueueFull => &self.rejected_queue_full,
            Event::FieldRejected => &self.rejected_field,
            Event::ErrorInjected => &self.errors_injected,
            Event::ResetInjected => &self.resets_injected,
            Event::StallInjected => &self.stalls_injected,
            Event::StreamBroken => &self.streams_broken,
            Event::Cancelled => &self.cancelled,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one prefix-cache lookup of `queried` prompt tokens, `hit` of them cached.
    pub(crate) fn prefix_lookup(&self, queried: u32, hit: u32) {
        let requests = if hit > 0 {
            &self.prefix_hits
        } else {
            &self.prefix_misses
        };
        requests.fetch_add(1, Ordering::Relaxed);
        self.prefix_query_tokens
            .fetch_add(queried.into(), Ordering::Relaxed);
        self.prefix_hit_tokens
            .fetch_add(hit.into(), Ordering::Relaxed);
    }

    pub(crate) fn engine_counters(&self) -> EngineCounters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        EngineCounters {
            served: get(&self.served),
            prefix_query_tokens: get(&self.prefix_query_tokens),
            prefix_hit_tokens: get(&self.prefix_hit_tokens),
        }
    }

    /// The counters now, with the slot occupancy the caller read from the gate.
    pub(crate) fn snapshot(&self, in_flight: u32, queued: u32) -> MockStats {
        let seen = self.lock();
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MockStats {
            received: get(&self.received),
            served: get(&self.served),
            rejected_invalid: get(&self.rejected_invalid),
            rejected_queue_full: get(&self.rejected_queue_full),
            rejected_field: get(&self.rejected_field),
            errors_injected: get(&self.errors_injected),
            resets_injected: get(&self.resets_injected),
            stalls_injected: get(&self.stalls_injected),
            streams_broken: get(&self.streams_broken),
            cancelled: get(&self.cancelled),
            prefix_cache_hits: get(&self.prefix_hits),
            prefix_cache_misses: get(&self.prefix_misses),
            prefix_cache_query_tokens: get(&self.prefix_query_tokens),
            prefix_cache_hit_tokens: get(&self.prefix_hit_tokens),
            in_flight: in_flight.into(),
            queued: queued.into(),
            by_path: seen.by_path.clone(),
            last_request: seen.last.as_ref().map(LastRequest::from),
        }
    }

    /// Zeroes the counters and forgets the last request; requests in flight stay in flight.
    pub(crate) fn reset(&self) {
        let mut seen = self.lock();
        for c in [
            &self.received,
            &self.served,
            &self.rejected_invalid,
            &self.rejected_queue_full,
            &self.rejected_field,
            &self.errors_injected,
            &self.resets_injected,
            &self.stalls_injected,
            &self.streams_broken,
            &self.cancelled,
            &self.prefix_hits,
            &self.prefix_misses,
            &self.prefix_query_tokens,
            &self.prefix_hit_tokens,
        ] {
            c.store(0, Ordering::Relaxed);
        }
        *seen = Seen::default();
    }

    fn lock(&self) -> MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// How one request ended. Dropped without being settled means the client went away first (the
/// handler future or the stream body was dropped), which counts as cancelled.
#[derive(Debug)]
pub(crate) struct Outcome {
    recorder: Arc<Recorder>,
    settled: bool,
}

impl Outcome {
    /// Records the request's final outcome; later calls and the drop then count nothing.
    pub(crate) fn settle(&mut self, event: Option<Event>) {
        if !self.settled {
            self.settled = true;
            if let Some(event) = event {
                self.recorder.count(event);
            }
        }
    }

    /// Counts something that happened on the way without ending the request (a stall).
    pub(crate) fn note(&self, event: Event) {
        self.recorder.count(event);
    }
}

impl Drop for Outcome {
    fn drop(&mut self) {
        if !self.settled {
            self.recorder.count(Event::Cancelled);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsettled_outcome_counts_as_cancelled_once() {
        let r = Arc::new(Recorder::default());
        drop(r.arrive("/v1/chat/completions"));
        let mut served = r.arrive("/v1/chat/completions");
        served.settle(Some(Event::Served));
        served.settle(Some(Event::Served));
        drop(served);
        r.prefix_lookup(10, 0);
        r.prefix_lookup(10, 8);
        let s = r.snapshot(0, 0);
        assert_eq!((s.received, s.served, s.cancelled), (2, 1, 1));
        assert_eq!((s.prefix_cache_hits, s.prefix_cache_misses), (1, 1));
        assert_eq!(
            (s.prefix_cache_query_tokens, s.prefix_cache_hit_tokens),
            (20, 8)
        );
        assert_eq!(s.by_path["/v1/chat/completions"], 2);
        r.reset();
        assert_eq!(r.snapshot(0, 0), MockStats::default());
    }

    #[test]
    fn by_path_stays_bounded() {
        let r = Arc::new(Recorder::default());
        for i in 0..MAX_PATHS + 10 {
            r.arrive(&format!("/openai/deployments/d{i}/embeddings"))
                .settle(None);
        }
        let s = r.snapshot(0, 0);
        assert_eq!(s.by_path.len(), MAX_PATHS + 1);
        assert_eq!(s.by_path[OTHER_PATHS], 10);
    }
}
