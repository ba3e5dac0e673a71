//! The optional Redis layer shared by gateway instances, between each one's cache and the store.
//!
//! With several instances, a key one of them has just read from the store is in Redis for the
//! others, so a flush or a rolling restart of the fleet costs the store one query per key rather
//! than one per key per instance. Redis is an optimisation and never a dependency: every call
//! here is bounded by `redis_timeout` (or [`WRITE_TIMEOUT`] for background writes), an error or
//! timeout only makes the lookup at hand go on to the store, it is counted and logged at most
//! once per [`LOG_EVERY`], and after a few errors in a row Redis is left alone for a while
//! ([`PauseAfterErrors`], the same rule as the shared rate limits') so that a Redis that hangs
//! does not add its timeout to every lookup. A Redis
//! that is down at start is not an error either: the connection is made in the background and
//! kept by redis's `ConnectionManager`, which reconnects.
//!
//! Values carry the time their store query started, so a reader judges their age itself: an
//! answer never looks younger than it is, however long it sat in Redis.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use serde::{Deserialize, Serialize};
use spillway_policy::PauseAfterErrors;
use spillway_store::{KeyDigest, KeyMatch};
use tokio::time::Instant;
use tracing::warn;

use crate::log_gate::LogGate;
use crate::{metrics, DirectoryError};

/// Keys are `spillway:key:<hex digest>`.
pub const KEY_PREFIX: &str = "spillway:key:";
/// Background writes and deletes give up after this.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// A connection attempt gives up after this; `Directory::new` waits at most this long for it.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Connection attempts are at least this far apart.
pub const RECONNECT_EVERY: Duration = Duration::from_secs(1);
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// The Redis key of a digest.
pub fn key(digest: &KeyDigest) -> String {
    format!("{KEY_PREFIX}{}", hex::encode(digest))
}

/// A stored answer, as JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SharedAnswer {
    /// Unix milliseconds at which the store query that produced it started.
    pub fetched_at_ms: u64,
    /// `None`: the store said there is no such key.
    pub found: Option<KeyMatch>,
}

pub(crate) struct SharedLayer {
    client: redis::Client,
    conn: OnceLock<ConnectionManager>,
    connecting: AtomicBool,
    timeout: Duration,
    health: Mutex<Health>,
    errors: AtomicU64,
    log: LogGate,
}

#[derive(Default)]
struct Health {
    pause: PauseAfterErrors,
    next_connect: Option<Instant>,
}

impl SharedLayer {
    /// Parses the URL (a bad one is a config error) and tries to connect for up to
    /// [`CONNECT_TIMEOUT`]; if that fails, lookups go without Redis until a later attempt works.
    pub async fn start(url: &str, timeout: Duration) -> Result<Arc<Self>, DirectoryError> {
        let client = redis::Client::open(url)
            .map_err(|e| DirectoryError::InvalidConfig(format!("redis URL: {e}")))?;
        let layer = Arc::new(Self {
            client,
            conn: OnceLock::new(),
            connecting: AtomicBool::new(false),
            timeout,
            health: Mutex::new(Health::default()),
            errors: AtomicU64::new(0),
            log: LogGate::new(LOG_EVERY),
        });
        if let Some(attempt) = layer.begin_connect(Instant::now()) {
            // Spawned, so that it goes on in the background if it takes longer than this (a
            // dropped attempt would leave `connecting` set for good).
            let _ = tokio::time::timeout(CONNECT_TIMEOUT, tokio::spawn(attempt)).await;
        }
        Ok(layer)
    }

    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// The answer stored for this digest, if Redis has one and answers in time.
    pub async fn get(self: &Arc<Self>, digest: &KeyDigest) -> Option<SharedAnswer> {
        let mut conn = self.usable_connection(Instant::now())?;
        let cmd = redis::cmd("GET").arg(key(digest)).clone();
        let reply =
            tokio::time::timeout(self.timeout, cmd.query_async::<Option<Vec<u8>>>(&mut conn));
        match reply.await {
            Ok(Ok(None)) => {
                self.went_well();
                None
            }
            Ok(Ok(Some(bytes))) => match serde_json::from_slice(&bytes) {
                Ok(answer) => {
                    self.went_well();
                    Some(answer)
                }
                Err(e) => {
                    self.went_wrong("get", &format!("unreadable value: {e}"));
                    None
                }
            },
            Ok(Err(e)) => {
                self.went_wrong("get", &e.to_string());
                None
            }
            Err(_) => {
                self.went_wrong("get", &format!("no answer within {:?}", self.timeout));
                None
            }
        }
    }

    /// Stores an answer for `expire_after` (whole seconds, at least one), in the background.
    pub fn put(
        self: &Arc<Self>,
        digest: &KeyDigest,
        answer: &SharedAnswer,
        expire_after: Duration,
    ) {
        let Ok(value) = serde_json::to_vec(answer) else {
            return;
        };
        let mut cmd = redis::cmd("SET");
        cmd.arg(key(digest))
            .arg(value)
            .arg("EX")
            .arg(expire_after.as_secs().max(1));
        self.send_in_background("set", cmd);
    }

    /// Deletes the answers of these digests, in the background, best effort.
    pub fn delete(self: &Arc<Self>, digests: &[KeyDigest]) {
        if digests.is_empty() {
            return;
        }
        let mut cmd = redis::cmd("DEL");
        for d in digests {
            cmd.arg(key(d));
        }
        self.send_in_background("del", cmd);
    }

    fn send_in_background(self: &Arc<Self>, op: &'static str, cmd: redis::Cmd) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Some(mut conn) = self.usable_connection(Instant::now()) else {
            return;
        };
        let layer = self.clone();
        runtime.spawn(async move {
            let reply = tokio::time::timeout(WRITE_TIMEOUT, cmd.query_async::<()>(&mut conn));
            match reply.await {
                Ok(Ok(())) => layer.went_well(),
                Ok(Err(e)) => layer.went_wrong(op, &e.to_string()),
                Err(_) => layer.went_wrong(op, &format!("no answer within {WRITE_TIMEOUT:?}")),
            }
        });
    }

    /// The connection, unless Redis is being left alone after errors or is not connected yet
    /// (then a connection attempt is started, if none was started recently).
    fn usable_connection(self: &Arc<Self>, now: Instant) -> Option<ConnectionManager> {
        {
            let health = self.health.lock().unwrap_or_else(|e| e.into_inner());
            if health.pause.is_paused(now.into_std()) {
                return None;
            }
        }
        if let Some(conn) = self.conn.get() {
            return Some(conn.clone());
        }
        if let Some(attempt) = self.begin_connect(now) {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(attempt);
            }
        }
        None
    }

    /// A connection attempt to run, unless one is running or one started less than
    /// [`RECONNECT_EVERY`] ago.
    fn begin_connect(
        self: &Arc<Self>,
        now: Instant,
    ) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        {
            let mut health = self.health.lock().unwrap_or_else(|e| e.into_inner());
            if health.next_connect.is_some_and(|at| now < at) {
                return None;
            }
            if self.connecting.swap(true, Ordering::AcqRel) {
                return None;
            }
            health.next_connect = Some(now + RECONNECT_EVERY);
        }
        let layer = self.clone();
        Some(async move {
            // One try per attempt: the next lookup starts the next attempt, at most once per
            // RECONNECT_EVERY. Our own timeouts bound every command.
            let config = ConnectionManagerConfig::new()
                .set_number_of_retries(0)
                .set_connection_timeout(CONNECT_TIMEOUT);
            let client = layer.client.clone();
            let made = tokio::time::timeout(
                CONNECT_TIMEOUT,
                ConnectionManager::new_with_config(client, config),
            )
            .await;
            match made {
                Ok(Ok(conn)) => {
                    let _ = layer.conn.set(conn);
                    layer.went_well();
                }
                Ok(Err(e)) => layer.went_wrong("connect", &e.to_string()),
                Err(_) => layer.went_wrong("connect", "no connection within 1s"),
            }
            layer.connecting.store(false, Ordering::Release);
        })
    }

    fn went_well(&self) {
        let mut health = self.health.lock().unwrap_or_else(|e| e.into_inner());
        health.pause.succeeded();
    }

    fn went_wrong(&self, op: &'static str, error: &str) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        metrics::redis_error(op);
        let now = Instant::now();
        {
            let mut health = self.health.lock().unwrap_or_else(|e| e.into_inner());
            health.pause.failed(now.into_std());
        }
        if let Some(held_back) = self.log.pass(now.into_std()) {
            warn!(
                op,
                error,
                similar_errors_not_logged = held_back,
                "redis layer skipped: lookups go on to the store"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_namespaced_hex_digests() {
        let mut d = [0u8; 32];
        d[0] = 0xab;
        d[31] = 0x01;
        let k = key(&d);
        assert!(k.starts_with("spillway:key:ab00"));
        assert!(k.ends_with("01"));
        assert_eq!(k.len(), KEY_PREFIX.len() + 64);
    }

    #[tokio::test]
    async fn a_bad_url_is_a_config_error_and_a_closed_port_is_not() {
        let bad = SharedLayer::start("not a url", Duration::from_millis(50)).await;
        assert!(matches!(bad, Err(DirectoryError::InvalidConfig(_))));
        let closed = SharedLayer::start("redis://127.0.0.1:1", Duration::from_millis(50))
            .await
            .unwrap();
        assert!(closed.get(&[7; 32]).await.is_none());
        assert!(closed.errors() >= 1);
    }
}
