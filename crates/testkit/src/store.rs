//! A key's answer from the store, as the key caches hold it.

use spillway_store::{ApiKey, KeyMatch, Tenant, TenantSpec};

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
