//! The part of the gateway that a configuration reload replaces, as one value.
//!
//! Everything the request path reads from the config (the model pools, admission, the retry
//! settings, the relay's and each stage's settings) lives in one `Live`, and the gateway holds
//! the current one behind an atomic pointer. A request takes the current `Live` once, when it
//! arrives, and keeps it to its end, so a request or a stream in flight finishes on the config
//! it started with, and a reload is one pointer swap that no request waits for. What must
//! outlive a config (the key directory, the client connections, the upstream connection pool,
//! the body budget) is the `Gateway`'s; what a config's pools learnt is carried into the next
//! one by `pool/build.rs` and `Admission::reloaded`.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::HeaderName;
use spillway_config::Config;
use tokio::sync::watch;

use crate::admission::Admission;
use crate::attempt::Retries;
use crate::pool::Models;
use crate::upstream::HttpClient;

/// The request path's state for one config.
pub(crate) struct Live {
    pub config: Arc<Config>,
    pub source: Source,
    pub models: Models,
    pub admission: Admission,
    pub retries: Retries,
    /// The region tried first when the caller names none (`server.home_region`).
    pub home_region: Option<Arc<str>>,
    /// Request headers that mark a caller's own retry (`retry.client_retry_headers`).
    pub client_retry_headers: Vec<HeaderName>,
    pub relay: Relay,
    /// Stops this config's background tasks (health checks, engine scrapes) once it is replaced.
    tasks: watch::Sender<bool>,
}

/// Where a running config came from, and when it was put in place.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Source {
    /// The SHA-256 of the file's bytes, in hex (what `sha256sum` prints for the file).
    pub hash: String,
    /// The file's text, to be saved as last-known-good.
    #[serde(skip)]
    pub text: Arc<str>,
    #[serde(with = "unix_seconds")]
    pub loaded_at: SystemTime,
    /// The file it was read from; `None` for the built-in quickstart.
    pub path: Option<String>,
    /// Whether it is the saved last-known-good config rather than the file's.
    pub last_known_good: bool,
}

/// How chosen responses are relayed.
pub(crate) struct Relay {
    /// A stream that sends nothing for this long is broken off (`upstream.stream_idle_timeout`).
    pub stream_idle_timeout: Duration,
    /// Relayed 5xx answers tell callers not to retry (`x-should-retry: false`).
    pub discourage_caller_retries: bool,
}

impl Live {
    pub(crate) fn new(
        config: Config,
        source: Source,
        models: Models,
        admission: Admission,
    ) -> Live {
        Live {
            retries: Retries::new(&config.retry, &config.upstream, admission.queue_wait()),
            home_region: config.server.home_region.as_deref().map(Arc::from),
            client_retry_headers: config.retry.client_retry_headers.clone(),
            relay: Relay {
                stream_idle_timeout: config.upstream.stream_idle_timeout,
                discourage_caller_retries: config.retry.discourage_caller_retries,
            },
            config: Arc::new(config),
            source,
            models,
            admission,
            tasks: watch::channel(false).0,
        }
    }

    /// Starts this config's health checks and engine scrapes, which run until [`Live::retire`].
    pub(crate) fn spawn_tasks(&self, client: &HttpClient) {
        crate::probe::spawn_checks(
            self.models.pools(),
            client.clone(),
            self.config.health_check.clone(),
            self.tasks.subscribe(),
        );
        crate::engine::spawn_scrapes(
            self.models.pools(),
            client.clone(),
            self.config.engine_metrics.clone(),
            self.tasks.subscribe(),
        );
    }

    /// Stops this config's background tasks: the config that replaced it runs its own.
    pub(crate) fn retire(&self) {
        let _ = self.tasks.send(true);
    }
}

mod unix_seconds {
    use std::time::SystemTime;

    pub fn serialize<S: serde::Serializer>(at: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        let secs = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        s.serialize_f64(secs)
    }
}
