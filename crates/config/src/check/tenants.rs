//! `[[tenants]]`: names as the store takes them, their keys, and the models and pool they name.

use std::collections::HashSet;

use super::{check_env_name, Problems};
use crate::raw::{RawKey, RawTenant};
use crate::{KeySource, ModelConfig, TenantConfig};

pub(super) fn check_tenants(
    raw: Vec<RawTenant>,
    models: &[ModelConfig],
    p: &mut Problems,
) -> Vec<TenantConfig> {
    let mut seen = HashSet::new();
    raw.into_iter()
        .enumerate()
        .map(|(i, t)| {
            let at = format!("tenants[{i}] ({:?})", t.name);
            if let Some(why) = tenant_name_problem(&t.name) {
                p.add(format!("{at}.name"), why);
            } else if !seen.insert(t.name.clone()) {
                p.add(format!("{at}.name"), "tenant is declared twice");
            }
            let keys = t
                .keys
                .into_iter()
                .enumerate()
                .filter_map(|(j, k)| check_key(k, &format!("{at}.keys[{j}]"), p))
                .collect();
            if let Some(allowed) = &t.models {
                for (j, m) in allowed.iter().enumerate() {
                    if m != "*" && !models.iter().any(|c| &c.name == m) {
                        p.add(format!("{at}.models[{j}]"), format!("unknown model {m:?}"));
                    }
                }
            }
            if let Some(pool) = &t.pool {
                let served = models
                    .iter()
                    .flat_map(|m| &m.backends)
                    .any(|b| b.pool.as_deref() == Some(pool.as_str()));
                if !served {
                    p.add(
                        format!("{at}.pool"),
                        format!("no backend has pool = {pool:?}"),
                    );
                }
            }
            let allowed_models = t.models.filter(|list| !list.iter().any(|m| m == "*"));
            if let Some(model) = &t.default_model {
                if !models.iter().any(|c| &c.name == model) {
                    p.add(
                        format!("{at}.default_model"),
                        format!("unknown model {model:?}"),
                    );
                } else if allowed_models
                    .as_ref()
                    .is_some_and(|list| !list.contains(model))
                {
                    p.add(
                        format!("{at}.default_model"),
                        format!("{model:?} is not among the tenant's models"),
                    );
                }
            }
            let priority = t.priority.map_or(Ok(Default::default()), |r| r.parse().map_err(|_| r));
            let priority = priority.unwrap_or_else(|raw| {
                let why = format!("{raw:?}: expected critical, standard or batch");
                p.add(format!("{at}.priority"), why);
                Default::default()
            });
            for (field, limit) in [
                ("requests_per_min", t.requests_per_min),
                ("tokens_per_min", t.tokens_per_min),
                ("max_concurrency", t.max_concurrency),
            ] {
                if limit == Some(0) {
                    p.add(
                        format!("{at}.{field}"),
                        "must be at least 1: 0 would refuse every request (leave it out for no limit)",
                    );
                }
            }
            TenantConfig {
                name: t.name,
                keys,
                allowed_models,
                requests_per_min: t.requests_per_min,
                tokens_per_min: t.tokens_per_min,
                max_concurrency: t.max_concurrency,
                priority,
                pool: t.pool,
                default_model: t.default_model,
                enabled: t.enabled.unwrap_or(true),
            }
        })
        .collect()
}

/// What is wrong with a tenant's name, by the store's rule (`spillway-store`'s
/// `validate::tenant_name`, which `serve` applies again when it writes the tenant): 1 to 64
/// characters of `A-Z a-z 0-9 . _ -`, and neither `.` nor `..`.
fn tenant_name_problem(name: &str) -> Option<&'static str> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if name.is_empty() {
        Some("must not be empty")
    } else if name.len() > 64 || !name.chars().all(allowed) {
        Some("use 1 to 64 characters of A-Z, a-z, 0-9, '.', '_' and '-'")
    } else if name == "." || name == ".." {
        Some("'.' and '..' are not names (they are path steps in the admin API's URLs)")
    } else {
        None
    }
}

fn check_key(k: RawKey, at: &str, p: &mut Problems) -> Option<KeySource> {
    match (k.sha256, k.env) {
        (Some(hex_digest), None) => {
            let mut digest = [0u8; 32];
            match hex::decode_to_slice(hex_digest.trim(), &mut digest) {
                Ok(()) => Some(KeySource::Sha256(digest)),
                Err(_) => {
                    p.add(
                        format!("{at}.sha256"),
                        "must be 64 hex digits (the SHA-256 of the key)",
                    );
                    None
                }
            }
        }
        (None, Some(var)) => {
            check_env_name(&var, &format!("{at}.env"), p);
            Some(KeySource::Env(var))
        }
        _ => {
            p.add(at, "give exactly one of sha256 or env");
            None
        }
    }
}
