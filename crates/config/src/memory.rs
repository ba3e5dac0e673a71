//! The memory budget of docs/admission.md, computed from a configuration's caps: what the
//! request path may hold at most, plus allowances for the idle process and the key cache.
//!
//! One formula for everything that needs it: the `spillway_memory_budget_bytes` gauge the
//! memory alert compares the process's RSS against, `spillway audit`'s check of a container's
//! memory limit, and the limit the shipped Kubernetes manifests set.

use crate::{BackendConfig, BackendKind, Config};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// The most a connection to a backend buffers of what it reads (the request path's own HTTP/1.1
/// client, and hyper-util's `max_buf_size` for health checks): a backend's response head must
/// fit in it, and each frame of a relayed body is at most this large.
pub const UPSTREAM_READ_BYTES: u64 = 16 * KIB;
/// What the gateway holds per HTTP/1 client connection at most: its head and read buffer.
pub const HTTP1_CONNECTION_BYTES: u64 = 64 * KIB;
/// Per HTTP/2 client connection, on top of [`HTTP1_CONNECTION_BYTES`]: its receive window.
pub const HTTP2_WINDOW_BYTES: u64 = 256 * KIB;
/// Per stream an HTTP/2 client may open: its request head and task before admission answers.
pub const HTTP2_STREAM_BYTES: u64 = 8 * KIB;
/// Per request in flight, for clients that never read an answer larger than all of these: the
/// write buffer to the client (16 KiB of small frames gathered, or one larger frame), a frame in
/// the relay, the upstream connection's read buffer (each [`UPSTREAM_READ_BYTES`]), the 4 KiB
/// usage scan, the request's tasks and sockets, and what the allocator keeps around them.
/// Measured at most 41 KiB a request with its client connection
/// (`crates/spillway/tests/memory_responses.rs`).
pub const REQUEST_BYTES: u64 = 192 * KIB;
/// Per upstream connection kept idle for the next request: its read buffer, its socket and its
/// deadline timer.
pub const KEPT_CONNECTION_BYTES: u64 = UPSTREAM_READ_BYTES + 8 * KIB;
/// Per connection to an `https` backend, on top: rustls's buffers (a 16 KiB record read, its
/// plaintext, and what is written), an allowance not yet measured.
pub const TLS_CONNECTION_BYTES: u64 = 48 * KIB;
/// The idle process: runtime, recorder, listeners, config. Measured at 24.9 MiB RSS for a
/// release build on the quickstart (bench/README.md); this leaves room for a larger config.
/// Histograms hold no samples: a value is counted in its bucket as it is recorded.
pub const IDLE_BYTES: u64 = 48 * MIB;
/// An allowance per key-cache entry (known or unknown key): the key's digest, the tenant's
/// shared record and the cache's own bookkeeping.
pub const KEY_CACHE_ENTRY_BYTES: u64 = 512;

/// The budget's parts, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryBudget {
    /// Request bodies: twice `admission.max_buffered_body_bytes` (the bodies held, and what the
    /// allocator keeps of freed ones).
    pub bodies: u64,
    /// Client connections: `server.max_connections` of them, each as an HTTP/2 connection with
    /// every stream it may open, since a client chooses its protocol.
    pub connections: u64,
    /// Requests in flight: `admission.max_in_flight` of them, each with its upstream connection.
    pub in_flight: u64,
    /// Upstream connections kept idle: per backend, `upstream.pool_max_idle_per_host` of them
    /// (no more than requests can be in flight at once), and one for its health checks and
    /// engine page.
    pub kept_connections: u64,
    /// The key cache at `cache.max_entries` plus `cache.max_negative_entries`.
    pub key_cache: u64,
    /// The idle process.
    pub idle: u64,
}

impl MemoryBudget {
    /// The budget of `config`.
    pub fn of(config: &Config) -> Self {
        let server = &config.server;
        let per_connection = HTTP1_CONNECTION_BYTES
            + HTTP2_WINDOW_BYTES
            + u64::from(server.http2_max_concurrent_streams) * HTTP2_STREAM_BYTES;
        let in_flight = config.admission.max_in_flight as u64;
        let backends = config.models.iter().flat_map(|m| &m.backends);
        let tls = |b: &BackendConfig| match &b.kind {
            BackendKind::OpenAi { url } | BackendKind::Azure { url, .. }
                if url.scheme() == Some(&http::uri::Scheme::HTTPS) =>
            {
                TLS_CONNECTION_BYTES
            }
            _ => 0,
        };
        let kept = (config.upstream.pool_max_idle_per_host as u64).min(in_flight) + 1;
        Self {
            bodies: 2 * config.admission.max_buffered_body_bytes,
            connections: server.max_connections as u64 * per_connection,
            in_flight: in_flight * (REQUEST_BYTES + backends.clone().map(tls).max().unwrap_or(0)),
            kept_connections: backends
                .map(|b| kept * (KEPT_CONNECTION_BYTES + tls(b)))
                .sum(),
            key_cache: (config.cache.max_entries + config.cache.max_negative_entries)
                * KEY_CACHE_ENTRY_BYTES,
            idle: IDLE_BYTES,
        }
    }

    /// What the request path may hold: bodies, connections, requests in flight and the upstream
    /// connections kept for the next ones.
    pub fn request_path(&self) -> u64 {
        self.bodies + self.connections + self.in_flight + self.kept_connections
    }

    /// The whole process: the request path, the key cache and the idle process. A container's
    /// memory limit below this can be reached by load the caps allow.
    pub fn total(&self) -> u64 {
        self.request_path() + self.key_cache + self.idle
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `settings` with the one model a config needs.
    fn config(settings: &str) -> Config {
        let model = "[[models]]\nname = \"m\"\n[[models.backends]]\nname = \"b\"\nurl = \"http://127.0.0.1:8000/v1\"\n";
        crate::Config::from_toml(&format!("{settings}\n{model}")).expect("valid config")
    }

    #[test]
    fn the_budget_follows_the_caps_as_docs_admission_states_it() {
        let config = config(
            r#"
            [server]
            max_connections = 100
            http2_max_concurrent_streams = 10
            max_body_bytes = 1048576
            [admission]
            max_buffered_body_bytes = 1048576
            max_in_flight = 50
            [cache]
            max_entries = 1000
            max_negative_entries = 1000
            "#,
        );
        let budget = MemoryBudget::of(&config);
        assert_eq!(budget.bodies, 2 * MIB);
        assert_eq!(budget.connections, 100 * (64 + 256 + 10 * 8) * KIB);
        assert_eq!(budget.in_flight, 50 * 192 * KIB);
        // One backend keeping up to 50 connections (no more than can be in flight) and one for
        // its health checks, each with a 16 KiB read buffer.
        assert_eq!(budget.kept_connections, 51 * 24 * KIB);
        assert_eq!(budget.key_cache, 2000 * 512);
        assert_eq!(
            budget.total(),
            2 * MIB + 100 * 400 * KIB + 50 * 192 * KIB + 51 * 24 * KIB + 2000 * 512 + IDLE_BYTES
        );
    }

    #[test]
    fn kept_connections_are_counted_per_backend_and_tls_on_top() {
        let model = "[[models]]\nname = \"m\"\n\
            [[models.backends]]\nname = \"a\"\nurl = \"http://127.0.0.1:8000/v1\"\n\
            [[models.backends]]\nname = \"b\"\nurl = \"https://example.com/v1\"\n";
        let config = crate::Config::from_toml(&format!(
            "[upstream]\npool_max_idle_per_host = 8\n[admission]\nmax_in_flight = 100\n{model}"
        ))
        .expect("valid config");
        let budget = MemoryBudget::of(&config);
        assert_eq!(budget.kept_connections, 9 * 24 * KIB + 9 * (24 + 48) * KIB);
        // Any request may go to the https backend.
        assert_eq!(budget.in_flight, 100 * (192 + 48) * KIB);
    }

    #[test]
    fn the_defaults_give_a_bound_a_container_limit_must_cover() {
        let budget = MemoryBudget::of(&config(""));
        // 10,000 connections of 100 streams dominate: lower them for a small container.
        assert_eq!(budget.connections, 10_000 * (64 + 256 + 100 * 8) * KIB);
        assert!(budget.total() > budget.request_path());
    }
}
