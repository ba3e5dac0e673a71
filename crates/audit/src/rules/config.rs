//! Rules on what a spillway config says on its own, wherever it came from (a file, or a
//! ConfigMap of the manifests): the demonstration modes that turn protections off, a loose
//! retry budget, callers' retries let through, tenants without limits, rollouts without stages.

use spillway_config::{BudgetConfig, Priority, RolloutMode, TenantConfig};

use crate::sources::ConfigSource;
use crate::{AuditError, Hit, Sources};

type Found = Result<Vec<Hit>, AuditError>;

/// One hit per config for which `f` names a key and says why.
fn each(sources: &Sources, f: impl Fn(&ConfigSource) -> Vec<(String, String)>) -> Found {
    Ok(sources
        .configs
        .iter()
        .flat_map(|c| {
            f(c).into_iter().map(|(key, message)| Hit {
                file: c.file.clone(),
                object: c.object.clone(),
                key,
                message,
            })
        })
        .collect())
}

/// `retry.naive`, as the checked config shows it: a budget that never refuses.
fn retry_naive(c: &ConfigSource) -> bool {
    c.config.retry.budget == BudgetConfig::unlimited()
}

fn tenant_at(i: usize, t: &TenantConfig) -> String {
    format!("tenants[{i}] ({:?})", t.name)
}

pub(super) fn retry_without_budget(sources: &Sources) -> Found {
    each(sources, |c| {
        retry_naive(c)
            .then(|| {
                (
                    "retry.naive".to_owned(),
                    "retries every 5xx at once on any backend, with no budget, backoff or shedding: for `spillway replay` only".to_owned(),
                )
            })
            .into_iter()
            .collect()
    })
}

pub(super) fn retry_budget_loose(sources: &Sources) -> Found {
    each(sources, |c| {
        let b = &c.config.retry.budget;
        if retry_naive(c) {
            return Vec::new(); // retry.naive: retry-without-budget says it
        }
        let mut found = Vec::new();
        if b.ratio > 0.2 {
            found.push((
                "retry.budget_ratio".to_owned(),
                format!(
                    "{} lets retries add {:.0} % to upstream attempts (the default is 0.1)",
                    b.ratio,
                    b.ratio * 100.0
                ),
            ));
        }
        if b.min_per_sec > 10.0 {
            found.push((
                "retry.budget_min_per_sec".to_owned(),
                format!(
                    "{} retries a second are allowed whatever the traffic (the default is 1)",
                    b.min_per_sec
                ),
            ));
        }
        if b.max_retrying_share > 0.5 {
            found.push((
                "retry.max_retrying_share".to_owned(),
                format!(
                    "{} of a model's requests may be retrying at once (the default is 0.2)",
                    b.max_retrying_share
                ),
            ));
        }
        found
    })
}

pub(super) fn client_retries_not_shed(sources: &Sources) -> Found {
    each(sources, |c| {
        let r = &c.config.retry;
        if retry_naive(c) {
            return Vec::new();
        }
        if !r.shed_client_retries {
            vec![(
                "retry.shed_client_retries".to_owned(),
                "off: callers' retries reach failing backends while the retry budget is spent"
                    .to_owned(),
            )]
        } else if r.client_retry_headers.is_empty() {
            vec![(
                "retry.client_retry_headers".to_owned(),
                "empty: no caller's retry can be recognised, so none is shed (the OpenAI SDKs send x-stainless-retry-count)".to_owned(),
            )]
        } else {
            Vec::new()
        }
    })
}

pub(super) fn throttling_off(sources: &Sources) -> Found {
    each(sources, |c| {
        let r = &c.config.retry;
        (r.throttle.is_none() && !retry_naive(c))
            .then(|| {
                (
                    "retry.throttle_k".to_owned(),
                    "0 turns adaptive throttling off: resends that are not marked as retries reach failing backends one for one".to_owned(),
                )
            })
            .into_iter()
            .collect()
    })
}

pub(super) fn caps_unbounded(sources: &Sources) -> Found {
    each(sources, |c| {
        c.config
            .admission
            .naive
            .then(|| {
                (
                    "admission.naive".to_owned(),
                    "no global caps, no queue bounds and no tenant limits: for `spillway replay` only".to_owned(),
                )
            })
            .into_iter()
            .collect()
    })
}

pub(super) fn cache_unprotected(sources: &Sources) -> Found {
    each(sources, |c| {
        c.config
            .cache
            .naive
            .then(|| {
                (
                    "cache.naive".to_owned(),
                    "no single flight, no load cap and no stale answers in front of the store: for `spillway replay` only".to_owned(),
                )
            })
            .into_iter()
            .collect()
    })
}

pub(super) fn tenant_without_limits(sources: &Sources) -> Found {
    each(sources, |c| {
        c.config
            .tenants
            .iter()
            .enumerate()
            .filter(|(_, t)| {
                t.requests_per_min.is_none()
                    && t.tokens_per_min.is_none()
                    && t.max_concurrency.is_none()
            })
            .map(|(i, t)| {
                (
                    tenant_at(i, t),
                    format!(
                        "tenant {:?} has no requests_per_min, tokens_per_min or max_concurrency: nothing bounds what it sends",
                        t.name
                    ),
                )
            })
            .collect()
    })
}

pub(super) fn critical_tenant_on_shared_pool(sources: &Sources) -> Found {
    each(sources, |c| {
        c.config
            .tenants
            .iter()
            .enumerate()
            .filter(|(_, t)| {
                t.priority == Priority::Critical && t.pool.is_none()
            })
            .map(|(i, t)| {
                (
                    format!("{}.priority", tenant_at(i, t)),
                    format!(
                        "tenant {:?} is critical on the shared pool: give it a dedicated pool (pool = \"...\") or a lower class",
                        t.name
                    ),
                )
            })
            .collect()
    })
}

pub(super) fn rollout_without_stages(sources: &Sources) -> Found {
    each(sources, |c| {
        c.config
            .models
            .iter()
            .filter(|m| m.rollout.as_ref().is_some_and(|r| r.mode == RolloutMode::Replace))
            .map(|m| {
                (
                    format!("models[{:?}].rollout.mode", m.name),
                    "\"replace\" sends every request to the new backends at once and compares nothing: use the staged default".to_owned(),
                )
            })
            .collect()
    })
}
