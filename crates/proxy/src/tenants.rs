//! Tenants from the store, through the lookup cache: the one way every request is authenticated.
//!
//! Tenants declared in the config file are written to the store at start, or when a gateway
//! that started without its store first reaches it (declarative bootstrap, [`Bootstrap`]), and
//! then looked up like any other: there is no second path that skips the store,
//! the cache or, later, the limits (G3). A cached lookup is judged again on every request
//! (revocation, expiry, a disabled tenant), so a cached answer never outlives what it says.

use foldhash::HashMap;
use std::cell::RefCell;
use std::sync::{Arc, RwLock, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use http::StatusCode;
use spillway_config::{KeySource, TenantConfig};
use spillway_directory::Directory;
use spillway_store::{KeyMatch, Store, StoreError, TenantSpec};
use tracing::{info, warn};

use crate::auth::{
    KeyDigest, Looked, LookupError, LookupFuture, Tenant, TenantDirectory, TenantLimits,
};
use crate::per_thread::{address, at_hand};

/// A config file's tenant as the store holds it.
pub fn spec(t: &TenantConfig) -> TenantSpec {
    TenantSpec {
        name: t.name.clone(),
        requests_per_min: t.requests_per_min,
        tokens_per_min: t.tokens_per_min,
        max_concurrency: t.max_concurrency,
        priority: t.priority,
        allowed_models: t.allowed_models.clone(),
        pool: t.pool.clone(),
        default_model: t.default_model.clone(),
        enabled: t.enabled,
    }
}

/// The config file's tenants as they are written to the store: each spec with the digests of
/// its keys. Resolved once at start, before the store is reached, so a key's environment
/// variable that is not set fails the start at once even while the store is down. (No `Debug`:
/// the digests are not for logs.)
pub struct Bootstrap {
    tenants: Vec<(TenantSpec, Vec<spillway_store::KeyDigest>)>,
}

impl Bootstrap {
    /// Reads each tenant's keys (digests, or environment variables that hold keys).
    pub fn resolve(tenants: &[TenantConfig]) -> Result<Bootstrap, String> {
        let mut resolved = Vec::with_capacity(tenants.len());
        for t in tenants {
            let spec = spec(t);
            let mut digests = Vec::with_capacity(t.keys.len());
            for key in &t.keys {
                digests.push(match key {
                    KeySource::Sha256(d) => *d,
                    KeySource::Env(var) => {
                        let key = std::env::var(var)
                            .ok()
                            .filter(|k| !k.is_empty())
                            .ok_or_else(|| {
                                format!(
                                    "tenant {:?}: environment variable {var} is not set",
                                    t.name
                                )
                            })?;
                        spillway_config::key_digest(&key)
                    }
                });
            }
            resolved.push((spec, digests));
        }
        Ok(Bootstrap { tenants: resolved })
    }

    /// Writes the tenants and keys to the store (creating or updating them). An error names the
    /// tenant; its kind says whether trying again may help (`Unavailable`) or not.
    pub async fn apply(&self, store: &dyn Store) -> Result<(), StoreError> {
        let named = |name: &str, e: StoreError| match e {
            StoreError::Unavailable(why) => {
                StoreError::Unavailable(format!("tenant {name:?}: {why}"))
            }
            StoreError::Invalid(why) => StoreError::Invalid(format!("tenant {name:?}: {why}")),
            other => StoreError::Invalid(format!("tenant {name:?}: {other}")),
        };
        for (spec, digests) in &self.tenants {
            store
                .upsert_tenant(spec)
                .await
                .map_err(|e| named(&spec.name, e))?;
            for (i, digest) in digests.iter().enumerate() {
                store
                    .ensure_key_digest(&spec.name, digest, &format!("config file, key {i}"))
                    .await
                    .map_err(|e| named(&spec.name, e))?;
            }
        }
        if !self.tenants.is_empty() {
            info!(
                tenants = self.tenants.len(),
                "config tenants applied to the store"
            );
        }
        Ok(())
    }
}

/// Directory answers and their tenants, by the answer's address. The answer is held weakly:
/// its allocation stays (so no other answer can come to lie where it did), not what it holds.
type Recent = HashMap<usize, (Weak<KeyMatch>, Arc<Tenant>)>;

thread_local! {
    /// The tenants of the directory answers this thread has authenticated with
    /// ([`crate::per_thread::at_hand`]). An answer is never changed (a changed key or tenant is a
    /// new answer), so its tenant is its tenant for as long as it lives.
    static RECENT: RefCell<Recent> = RefCell::default();
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// The store-backed tenant directory.
pub struct StoreDirectory {
    store: Arc<dyn Store>,
    cache: Directory,
    /// Request-path tenants by name, with the record they were made from, so a lookup
    /// allocates nothing once its tenant is known.
    interned: RwLock<HashMap<String, (TenantSpec, Arc<Tenant>)>>,
}

impl StoreDirectory {
    pub fn new(store: Arc<dyn Store>, cache: Directory) -> Self {
        Self {
            store,
            cache,
            interned: RwLock::new(HashMap::default()),
        }
    }

    pub fn cache(&self) -> &Directory {
        &self.cache
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The request path's tenant of a directory answer: none for a key past its validity (the
    /// clock read only for a key that expires).
    fn answer(&self, found: Option<&Arc<KeyMatch>>) -> Option<Arc<Tenant>> {
        found
            .filter(|m| m.key.is_valid_then(unix_now))
            .map(|m| self.tenant_of_answer(m))
    }

    /// [`StoreDirectory::tenant_of`], found first among this thread's recent answers by the
    /// answer itself (its address): the directory hands out one shared answer per cached key
    /// until it changes, so the common case is one hash of a number, no lock and no spec
    /// compared.
    fn tenant_of_answer(&self, found: &Arc<KeyMatch>) -> Arc<Tenant> {
        RECENT.with_borrow_mut(|recent| {
            let (_, tenant) = at_hand(recent, address(found), || {
                (Arc::downgrade(found), self.tenant_of(found))
            });
            Arc::clone(tenant)
        })
    }

    fn tenant_of(&self, found: &KeyMatch) -> Arc<Tenant> {
        let spec = &found.tenant.spec;
        if let Some((known_spec, tenant)) = self
            .interned
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&spec.name)
        {
            // Timestamps have one-second resolution: compare what the request path uses.
            if known_spec == spec {
                return tenant.clone();
            }
        }
        let tenant = Arc::new(Tenant {
            name: Arc::from(spec.name.as_str()),
            allowed_models: spec.allowed_models.clone(),
            enabled: spec.enabled,
            pool: spec.pool.as_deref().map(Arc::from),
            default_model: spec.default_model.as_deref().map(Arc::from),
            limits: TenantLimits {
                requests_per_min: spec.requests_per_min,
                tokens_per_min: spec.tokens_per_min,
                max_concurrency: spec.max_concurrency,
                priority: spec.priority,
            },
        });
        self.interned
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(spec.name.clone(), (spec.clone(), tenant.clone()));
        tenant
    }

    /// A key was revoked through the admin API: forget it here at once (other gateway
    /// instances see it within the cache TTL).
    pub fn key_revoked(&self, id: &str) {
        let id = id.to_owned();
        self.cache.invalidate_if(move |m| m.key.id == id);
    }

    /// A tenant changed (limits, models, disabled): forget its keys' cached answers.
    pub fn tenant_changed(&self, name: &str) {
        let name = name.to_owned();
        self.cache
            .invalidate_if(move |m| m.tenant.spec.name == name);
    }

    /// Drops every cached lookup (the flush of IL-0136; the cache's protections keep the
    /// store's load bounded afterwards).
    pub fn flush(&self) {
        warn!("key cache flushed on request");
        self.cache.invalidate_all();
    }

    /// Dependency health for `/healthz/deps`.
    pub async fn deps(&self) -> (StatusCode, serde_json::Value) {
        let ping = tokio::time::timeout(std::time::Duration::from_secs(2), self.store.ping()).await;
        let store = match ping {
            Ok(Ok(())) => serde_json::json!({ "status": "ok" }),
            Ok(Err(e)) => serde_json::json!({ "status": "error", "error": e.to_string() }),
            Err(_) => serde_json::json!({ "status": "error", "error": "no answer within 2s" }),
        };
        let healthy = store["status"] == "ok";
        let body = serde_json::json!({
            "note": "for dashboards and humans; not a liveness or readiness signal",
            "store": store,
            "store_pool": self.store.pool_stats(),
            "key_cache": self.cache.stats(),
        });
        let status = if healthy {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        (status, body)
    }
}

impl TenantDirectory for StoreDirectory {
    fn lookup<'a>(&'a self, digest: &'a KeyDigest) -> LookupFuture<'a> {
        Box::pin(async move {
            let found = self.cache.lookup(digest).await.map_err(|e| {
                LookupError(match e {
                    spillway_directory::DirectoryError::Unavailable(why) => why,
                    other => other.to_string(),
                })
            })?;
            Ok(self.answer(found.found.as_ref()))
        })
    }

    fn cached(&self, digest: &KeyDigest) -> Option<Looked> {
        let now = tokio::time::Instant::from_std(crate::clock::now());
        // The cached answer is lent: its tenant is found without a reference count taken.
        self.cache
            .cached_as(digest, now, |found, _| Ok(self.answer(found)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(tenant: &str, requests_per_min: Option<u32>) -> Arc<KeyMatch> {
        let mut found = spillway_testkit::key_match(0, tenant);
        found.tenant.spec.requests_per_min = requests_per_min;
        Arc::new(found)
    }

    #[tokio::test]
    async fn an_answer_keeps_its_tenant_and_a_changed_tenant_is_a_new_one() {
        let store: Arc<dyn Store> = Arc::new(spillway_store::DeferredStore::new(1));
        let cache = Directory::new(store.clone(), Default::default())
            .await
            .unwrap();
        let directory = StoreDirectory::new(store, cache);
        let first = answer("team", Some(10));
        let tenant = directory.tenant_of_answer(&first);
        assert_eq!(tenant.limits.requests_per_min, Some(10));
        // The same answer again: the same tenant, found among this thread's answers.
        assert!(Arc::ptr_eq(&tenant, &directory.tenant_of_answer(&first)));
        // Another key's answer with the same tenant as it is: the same tenant.
        let other = answer("team", Some(10));
        assert!(Arc::ptr_eq(&tenant, &directory.tenant_of_answer(&other)));
        // The tenant changed: its next answer is a tenant of its own, with the new limits.
        let changed = directory.tenant_of_answer(&answer("team", Some(20)));
        assert!(!Arc::ptr_eq(&tenant, &changed));
        assert_eq!(changed.limits.requests_per_min, Some(20));
        // On another thread the first answer is still the first tenant.
        let again = std::thread::scope(|s| {
            s.spawn(|| directory.tenant_of_answer(&first))
                .join()
                .unwrap()
        });
        assert_eq!(again.limits.requests_per_min, Some(10));
    }

    /// docs/admission.md: an answer kept at hand after the key cache let it go holds its
    /// allocation only, about 300 bytes.
    #[test]
    fn an_answer_let_go_keeps_about_300_bytes_at_hand() {
        let allocation = std::mem::size_of::<KeyMatch>() + 2 * std::mem::size_of::<usize>();
        assert!(allocation <= 300, "{allocation} bytes");
        let found = answer("team", None);
        let kept = Arc::downgrade(&found);
        drop(found);
        // What the answer held is gone; the weak reference keeps only its place.
        assert!(kept.upgrade().is_none());
    }
}
