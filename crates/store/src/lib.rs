//! Tenants and API keys: the metadata every request is admitted by, kept in a database.
//!
//! One trait, [`Store`], with two implementations: SQLite (the embedded default, a file created
//! on first run) and PostgreSQL (for several gateway instances sharing one store). Both carry
//! their own migrations and apply them at open. The request path never calls a store directly:
//! it goes through the lookup cache, which bounds how many queries reach the database however
//! the cache is flushed (IL-0136). A gateway that starts while its database is down serves
//! through a [`DeferredStore`], which answers `Unavailable` until the database is connected.
//!
//! Keys are random, high-entropy and carry a recognisable prefix (`sk-spw-`). A key's secret is
//! returned once, when it is created; the store keeps only its SHA-256 digest and a short
//! display prefix, so nothing read from the store can authenticate as anyone.
//!
//! Times are Unix seconds (UTC), the same in both databases.

// Tests may time real processes and sockets on the system clock (see clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};

mod connect;
mod counted_pool;
mod db_error;
mod deferred;
mod keys;
mod pooled;
mod postgres;
mod queries;
mod rows;
mod sql_store;
mod sqlite;
mod validate;

pub use connect::open;
pub use counted_pool::POOL_ACQUIRE_SECONDS;
pub use deferred::{DeferredStore, NOT_CONNECTED};
pub use keys::{digest_secret, SECRET_PREFIX};
pub use pooled::PoolOptions;
pub use sql_store::MAX_PAGE_KEYS;
pub use sqlite::BUSY_TIMEOUT as SQLITE_BUSY_TIMEOUT;
pub use validate::ANY_MODEL;
pub use validate::{MAX_DESCRIPTION_CHARS, MAX_TENANT_NAME_CHARS};

/// Scheduling class of a tenant's requests, as the policy crate defines it.
pub use spillway_policy::Priority;

/// The SHA-256 of an API key.
pub type KeyDigest = [u8; 32];

/// What defines a tenant (everything but its timestamps). "Internal" callers are tenants like
/// any other: there is no flag that skips lookup or limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantSpec {
    pub name: String,
    /// `None`: no limit of that kind. A limit is at least 1: the store refuses 0.
    pub requests_per_min: Option<u32>,
    pub tokens_per_min: Option<u32>,
    pub max_concurrency: Option<u32>,
    #[serde(default)]
    pub priority: Priority,
    /// `None`: every configured model. A list that names `"*"` ([`ANY_MODEL`]) means the same
    /// and is stored as `None`.
    pub allowed_models: Option<Vec<String>>,
    /// A dedicated backend pool, if the tenant has one.
    pub pool: Option<String>,
    /// The model a request that names none goes to, where its API allows leaving the model out
    /// (a Responses API create).
    #[serde(default)]
    pub default_model: Option<String>,
    pub enabled: bool,
}

impl TenantSpec {
    /// Whether the store would take this tenant as it is, without asking a database: for
    /// checking a configuration before anything is opened.
    pub fn check(&self) -> Result<(), StoreError> {
        rows::TenantRecord::try_from_spec(self).map(drop)
    }
}

/// A stored tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tenant {
    #[serde(flatten)]
    pub spec: TenantSpec,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A partial change of a tenant: `None` leaves a field as it is. For the optional fields,
/// `Some(None)` clears the value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantUpdate {
    pub requests_per_min: Option<Option<u32>>,
    pub tokens_per_min: Option<Option<u32>>,
    pub max_concurrency: Option<Option<u32>>,
    pub priority: Option<Priority>,
    pub allowed_models: Option<Option<Vec<String>>>,
    pub pool: Option<Option<String>>,
    #[serde(default)]
    pub default_model: Option<Option<String>>,
    pub enabled: Option<bool>,
}

/// A stored API key: never its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKey {
    /// Public identifier (`key_` and 16 hex digits), for listing and revoking.
    pub id: String,
    pub tenant: String,
    /// The first characters of the secret (e.g. `sk-spw-AbCd`), so an operator can tell keys
    /// apart; too short to guess the rest from.
    pub prefix: String,
    pub description: Option<String>,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub revoked_at: Option<i64>,
}

impl ApiKey {
    /// Whether the key authenticates at `now` (Unix seconds); the tenant's `enabled` is checked
    /// apart.
    pub fn is_valid_at(&self, now: i64) -> bool {
        self.is_valid_then(|| now)
    }

    /// [`ApiKey::is_valid_at`], with the time read only for a key that expires.
    pub fn is_valid_then(&self, now: impl FnOnce() -> i64) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|at| now() < at)
    }
}

/// A key as created: its secret is in this value only, once.
#[derive(Debug, Clone)]
pub struct IssuedKey {
    pub secret: String,
    pub key: ApiKey,
}

/// What a key digest resolves to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyMatch {
    pub key: ApiKey,
    pub tenant: Tenant,
}

/// Connection-pool figures, for metrics and logs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PoolStats {
    pub max_size: u32,
    pub size: u32,
    pub idle: u32,
    /// Tasks waiting for a connection now.
    pub waiters: u64,
    /// Acquisitions that gave up at the acquire timeout, since start.
    pub acquire_timeouts: u64,
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0} already exists")]
    Conflict(String),
    #[error("invalid: {0}")]
    Invalid(String),
    /// The database could not be reached or answered in time (pool exhausted, connection
    /// refused, timeout). The lookup cache serves stale entries on this one.
    #[error("store unavailable: {0}")]
    Unavailable(String),
}

pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Tenants and keys. Every method is one short transaction.
pub trait Store: Send + Sync + 'static {
    /// The key with this digest and its tenant, whatever their state (revoked, expired,
    /// disabled): the caller decides, so a cached answer can be re-judged as time passes.
    fn lookup(&self, digest: &KeyDigest) -> StoreFuture<'_, Option<KeyMatch>>;
    fn create_tenant(&self, spec: &TenantSpec) -> StoreFuture<'_, Tenant>;
    /// Creates the tenant or makes it match `spec` (declarative bootstrap from the config).
    fn upsert_tenant(&self, spec: &TenantSpec) -> StoreFuture<'_, Tenant>;
    fn get_tenant(&self, name: &str) -> StoreFuture<'_, Option<Tenant>>;
    fn list_tenants(&self) -> StoreFuture<'_, Vec<Tenant>>;
    fn update_tenant(&self, name: &str, update: &TenantUpdate) -> StoreFuture<'_, Tenant>;
    /// Creates a random key for `tenant`; the secret is in the result only.
    fn create_key(
        &self,
        tenant: &str,
        description: Option<&str>,
        expires_at: Option<i64>,
    ) -> StoreFuture<'_, IssuedKey>;
    /// Registers a key known only by its digest (a key declared in the config file); does
    /// nothing if that digest is already stored for this tenant.
    fn ensure_key_digest(
        &self,
        tenant: &str,
        digest: &KeyDigest,
        description: &str,
    ) -> StoreFuture<'_, ApiKey>;
    fn list_keys(&self, tenant: &str) -> StoreFuture<'_, Vec<ApiKey>>;
    fn revoke_key(&self, id: &str) -> StoreFuture<'_, ApiKey>;
    /// Up to `limit` keys with their tenants, in digest order after `after`: for warming the
    /// cache in bounded batches.
    fn page_keys(
        &self,
        after: Option<KeyDigest>,
        limit: u32,
    ) -> StoreFuture<'_, Vec<(KeyDigest, KeyMatch)>>;
    /// One cheap query, for `/healthz/deps` (never for liveness or readiness).
    fn ping(&self) -> StoreFuture<'_, ()>;
    fn pool_stats(&self) -> PoolStats;
}

#[cfg(test)]
mod tests {
    use super::Priority;

    #[test]
    fn priorities_are_written_and_read_in_their_lowercase_spelling() {
        for p in Priority::ALL {
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(json, format!("\"{}\"", p.as_str()));
            assert_eq!(serde_json::from_str::<Priority>(&json).unwrap(), p);
            assert_eq!(p.as_str().parse::<Priority>(), Ok(p));
        }
        assert!(serde_json::from_str::<Priority>("\"Batch\"").is_err());
        assert_eq!(
            "urgent".parse::<Priority>(),
            Err("unknown priority \"urgent\": expected critical, standard or batch".to_owned())
        );
    }
}
