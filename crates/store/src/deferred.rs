//! A [`Store`] whose database is connected later: the handle a gateway serves with while it
//! starts without its store.
//!
//! A gateway restarted while its database is down has two choices: exit, and be restarted again
//! until the database is back (IL-0136's restart loop, every request failing meanwhile), or
//! serve what its key-cache snapshot knows and connect when it can. The second needs a store
//! that exists before the database answers. This is it: until [`DeferredStore::connect`] is
//! given the opened store, every call fails at once with [`StoreError::Unavailable`], the one
//! kind the lookup cache answers by serving what it already has, and the admin API by a 503.
//! Nothing waits on the missing database, so no request or admin call hangs on it. Afterwards
//! every call goes to the opened store; the handle is never disconnected again (a running
//! store's outages are the pool's business, as they are for a store opened at start).

use std::future::ready;
use std::sync::{Arc, OnceLock};

use crate::{
    ApiKey, IssuedKey, KeyDigest, KeyMatch, PoolStats, Store, StoreError, StoreFuture, Tenant,
    TenantSpec, TenantUpdate,
};

/// What every call answers before the store is connected.
pub const NOT_CONNECTED: &str = "not connected since start (connecting in the background)";

/// A store handle that is "not connected yet" until [`DeferredStore::connect`].
pub struct DeferredStore {
    connected: OnceLock<Arc<dyn Store>>,
    /// Reported as the pool's size until connected, so metrics show the configured bound.
    max_connections: u32,
}

impl DeferredStore {
    /// A handle with no store yet; `max_connections` is what the pool will be opened with.
    pub fn new(max_connections: u32) -> DeferredStore {
        DeferredStore {
            connected: OnceLock::new(),
            max_connections,
        }
    }

    /// Makes every later call go to `store`. Returns false (and keeps the first) if a store was
    /// already connected.
    pub fn connect(&self, store: Arc<dyn Store>) -> bool {
        self.connected.set(store).is_ok()
    }

    pub fn is_connected(&self) -> bool {
        self.connected.get().is_some()
    }

    fn store(&self) -> Result<&dyn Store, StoreError> {
        self.connected
            .get()
            .map(|s| s.as_ref())
            .ok_or_else(|| StoreError::Unavailable(NOT_CONNECTED.to_owned()))
    }
}

/// Calls `$method` on the connected store, or fails at once.
macro_rules! delegate {
    ($self:ident . $method:ident ( $($arg:expr),* )) => {
        match $self.store() {
            Ok(store) => store.$method($($arg),*),
            Err(e) => Box::pin(ready(Err(e))),
        }
    };
}

impl Store for DeferredStore {
    fn lookup(&self, digest: &KeyDigest) -> StoreFuture<'_, Option<KeyMatch>> {
        delegate!(self.lookup(digest))
    }

    fn create_tenant(&self, spec: &TenantSpec) -> StoreFuture<'_, Tenant> {
        delegate!(self.create_tenant(spec))
    }

    fn upsert_tenant(&self, spec: &TenantSpec) -> StoreFuture<'_, Tenant> {
        delegate!(self.upsert_tenant(spec))
    }

    fn get_tenant(&self, name: &str) -> StoreFuture<'_, Option<Tenant>> {
        delegate!(self.get_tenant(name))
    }

    fn list_tenants(&self) -> StoreFuture<'_, Vec<Tenant>> {
        delegate!(self.list_tenants())
    }

    fn update_tenant(&self, name: &str, update: &TenantUpdate) -> StoreFuture<'_, Tenant> {
        delegate!(self.update_tenant(name, update))
    }

    fn create_key(
        &self,
        tenant: &str,
        description: Option<&str>,
        expires_at: Option<i64>,
    ) -> StoreFuture<'_, IssuedKey> {
        delegate!(self.create_key(tenant, description, expires_at))
    }

    fn ensure_key_digest(
        &self,
        tenant: &str,
        digest: &KeyDigest,
        description: &str,
    ) -> StoreFuture<'_, ApiKey> {
        delegate!(self.ensure_key_digest(tenant, digest, description))
    }

    fn list_keys(&self, tenant: &str) -> StoreFuture<'_, Vec<ApiKey>> {
        delegate!(self.list_keys(tenant))
    }

    fn revoke_key(&self, id: &str) -> StoreFuture<'_, ApiKey> {
        delegate!(self.revoke_key(id))
    }

    fn page_keys(
        &self,
        after: Option<KeyDigest>,
        limit: u32,
    ) -> StoreFuture<'_, Vec<(KeyDigest, KeyMatch)>> {
        delegate!(self.page_keys(after, limit))
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        delegate!(self.ping())
    }

    fn pool_stats(&self) -> PoolStats {
        match self.connected.get() {
            Some(store) => store.pool_stats(),
            None => PoolStats {
                max_size: self.max_connections,
                ..PoolStats::default()
            },
        }
    }
}
