//! A key's answer from the store, as the key caches hold it, and a fake store of such answers
//! that counts its queries and can be made slow or failing.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spillway_store::{
    ApiKey, IssuedKey, KeyDigest, KeyMatch, PoolStats, Store, StoreError, StoreFuture, Tenant,
    TenantSpec, TenantUpdate,
};

/// The answer for key number `i` of `tenant`: an active key (`key_` and `i` in 16 hex digits) of
/// an enabled tenant allowed 60 requests a minute, every other limit unset.
pub fn key_match(i: u64, tenant: &str) -> KeyMatch {
    KeyMatch {
        key: ApiKey {
            id: format!("key_{i:016x}"),
            tenant: tenant.to_owned(),
            prefix: "sk-spw-test".to_owned(),
            description: None,
            created_at: 1_700_000_000,
            expires_at: None,
            revoked_at: None,
        },
        tenant: Tenant {
            spec: TenantSpec {
                name: tenant.to_owned(),
                requests_per_min: Some(60),
                tokens_per_min: None,
                max_concurrency: None,
                priority: Default::default(),
                allowed_models: None,
                pool: None,
                default_model: None,
                enabled: true,
            },
            created_at: 1_700_000_000,
            updated_at: 1_700_000_000,
        },
    }
}

/// Keys and tenants in a map; `lookup` and `page_keys` are real, the rest refuse.
#[derive(Default)]
pub struct FakeStore {
    keys: Mutex<BTreeMap<KeyDigest, KeyMatch>>,
    lookups: AtomicU64,
    pages: AtomicU64,
    in_flight: Arc<AtomicU64>,
    high_water: Arc<AtomicU64>,
    latency_ms: AtomicU64,
    failing: AtomicBool,
}

impl FakeStore {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// With keys `digest(0..n)` of tenant `tenant`.
    pub fn with_keys(n: u64, tenant: &str) -> Arc<Self> {
        let store = Self::new();
        for i in 0..n {
            store.add(digest(i), key_match(i, tenant));
        }
        store
    }

    pub fn add(&self, digest: KeyDigest, found: KeyMatch) {
        self.keys.lock().unwrap().insert(digest, found);
    }

    pub fn set_latency(&self, latency: Duration) {
        self.latency_ms
            .store(latency.as_millis() as u64, Ordering::SeqCst);
    }

    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    /// `lookup` calls so far (answered, failed or cut off by a timeout).
    pub fn lookups(&self) -> u64 {
        self.lookups.load(Ordering::SeqCst)
    }

    pub fn pages(&self) -> u64 {
        self.pages.load(Ordering::SeqCst)
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// The most queries that were ever running at once.
    pub fn high_water(&self) -> u64 {
        self.high_water.load(Ordering::SeqCst)
    }

    /// Counts one query as running until the returned guard is dropped, then waits the latency
    /// and fails if failing.
    async fn query(&self) -> Result<InFlight, StoreError> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.high_water.fetch_max(now, Ordering::SeqCst);
        let guard = InFlight(self.in_flight.clone());
        let latency = self.latency_ms.load(Ordering::SeqCst);
        if latency > 0 {
            tokio::time::sleep(Duration::from_millis(latency)).await;
        }
        if self.failing.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("the fake store is down".into()));
        }
        Ok(guard)
    }
}

struct InFlight(Arc<AtomicU64>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn refused<T>() -> StoreFuture<'static, T> {
    Box::pin(async { Err(StoreError::Invalid("not in the fake store".into())) })
}

impl Store for FakeStore {
    fn lookup(&self, digest: &KeyDigest) -> StoreFuture<'_, Option<KeyMatch>> {
        let digest = *digest;
        Box::pin(async move {
            self.lookups.fetch_add(1, Ordering::SeqCst);
            let _running = self.query().await?;
            Ok(self.keys.lock().unwrap().get(&digest).cloned())
        })
    }

    fn page_keys(
        &self,
        after: Option<KeyDigest>,
        limit: u32,
    ) -> StoreFuture<'_, Vec<(KeyDigest, KeyMatch)>> {
        Box::pin(async move {
            self.pages.fetch_add(1, Ordering::SeqCst);
            let _running = self.query().await?;
            let keys = self.keys.lock().unwrap();
            let page = keys
                .iter()
                .filter(|(d, _)| after.is_none_or(|a| **d > a))
                .take(limit as usize)
                .map(|(d, m)| (*d, m.clone()))
                .collect();
            Ok(page)
        })
    }

    fn create_tenant(&self, _: &TenantSpec) -> StoreFuture<'_, Tenant> {
        refused()
    }
    fn upsert_tenant(&self, _: &TenantSpec) -> StoreFuture<'_, Tenant> {
        refused()
    }
    fn get_tenant(&self, _: &str) -> StoreFuture<'_, Option<Tenant>> {
        refused()
    }
    fn list_tenants(&self) -> StoreFuture<'_, Vec<Tenant>> {
        refused()
    }
    fn update_tenant(&self, _: &str, _: &TenantUpdate) -> StoreFuture<'_, Tenant> {
        refused()
    }
    fn create_key(&self, _: &str, _: Option<&str>, _: Option<i64>) -> StoreFuture<'_, IssuedKey> {
        refused()
    }
    fn ensure_key_digest(&self, _: &str, _: &KeyDigest, _: &str) -> StoreFuture<'_, ApiKey> {
        refused()
    }
    fn list_keys(&self, _: &str) -> StoreFuture<'_, Vec<ApiKey>> {
        refused()
    }
    fn revoke_key(&self, _: &str) -> StoreFuture<'_, ApiKey> {
        refused()
    }
    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
    fn pool_stats(&self) -> PoolStats {
        PoolStats::default()
    }
}

/// A deterministic digest for key number `i`.
pub fn digest(i: u64) -> KeyDigest {
    let mut d = [0u8; 32];
    d[..8].copy_from_slice(&i.to_be_bytes());
    d[31] = 0xd1;
    d
}
