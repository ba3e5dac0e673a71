//! Rules on the pods themselves: memory limits (against spillway's memory budget for its own
//! containers), termination grace against the config's shutdown, replicas against the shared
//! limits, and how Deployments replace their pods.

use serde_json::Value;
use spillway_config::MemoryBudget;

use crate::pods::{gateways, pods, Gateway};
use crate::quantity;
use crate::{AuditError, Hit, Sources};

type Found = Result<Vec<Hit>, AuditError>;

/// Extra seconds of grace past the config's shutdown: the key-cache snapshot is written after
/// the in-flight requests end, and SIGTERM reaches the process a moment after the kubelet sends it.
const GRACE_MARGIN_SECS: u64 = 5;

fn at_pod(g: &Gateway<'_>, key: String, message: String) -> Hit {
    Hit {
        file: g.pod.object.file.clone(),
        object: Some(g.pod.object.label()),
        key,
        message,
    }
}

/// A container's memory limit in bytes, if it has one.
fn memory_limit(file: &str, key: &str, c: &Value) -> Result<Option<u64>, AuditError> {
    match c.pointer("/resources/limits/memory") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64().map(|b| b.max(0.0) as u64)),
        Some(Value::String(q)) => quantity::bytes(q)
            .map(Some)
            .map_err(|e| AuditError::new(file, format!("{key}.resources.limits.memory: {e}"))),
        Some(other) => Err(AuditError::new(
            file,
            format!("{key}.resources.limits.memory: {other} is not a quantity"),
        )),
    }
}

pub(super) fn memory_limit_missing(sources: &Sources) -> Found {
    let mut found = Vec::new();
    for pod in pods(sources) {
        for c in pod.containers() {
            if memory_limit(&pod.object.file, &c.key, c.value)?.is_none() {
                let name = c.value.get("name").and_then(Value::as_str).unwrap_or("?");
                found.push(Hit {
                    file: pod.object.file.clone(),
                    object: Some(pod.object.label()),
                    key: format!("{}.resources.limits.memory", c.key),
                    message: format!("container {name:?} has no memory limit"),
                });
            }
        }
    }
    Ok(found)
}

pub(super) fn memory_limit_below_budget(sources: &Sources) -> Found {
    let mut found = Vec::new();
    for g in gateways(sources) {
        let Some(config) = g.config else { continue };
        let key = &g.container.key;
        let Some(limit) = memory_limit(&g.pod.object.file, key, g.container.value)? else {
            continue;
        };
        let budget = MemoryBudget::of(&config.config).total();
        if limit < budget {
            found.push(at_pod(
                &g,
                format!("{key}.resources.limits.memory"),
                format!(
                    "the limit ({}) is below the memory budget of its config, {} ({budget} bytes, from {}): lower its caps or raise the limit",
                    quantity::show(limit),
                    quantity::show(budget),
                    config.object.as_deref().unwrap_or(&config.file),
                ),
            ));
        }
    }
    Ok(found)
}

pub(super) fn config_not_found(sources: &Sources) -> Found {
    Ok(gateways(sources)
        .iter()
        .filter(|g| g.config.is_none())
        .map(|g| {
            at_pod(
                g,
                g.container.key.clone(),
                "no config for this spillway container (no ConfigMap of the manifests holds its spillway.toml, and no --config was given): its memory limit and probes were not checked against one".to_owned(),
            )
        })
        .collect())
}

pub(super) fn termination_grace_short(sources: &Sources) -> Found {
    let mut found = Vec::new();
    for g in gateways(sources) {
        let Some(config) = g.config else { continue };
        let server = &config.config.server;
        let needed = (server.shutdown_delay + server.shutdown_grace)
            .as_secs_f64()
            .ceil() as u64
            + GRACE_MARGIN_SECS;
        let grace = g
            .pod
            .spec
            .get("terminationGracePeriodSeconds")
            .and_then(Value::as_u64)
            .unwrap_or(30);
        if grace < needed {
            found.push(at_pod(
                &g,
                format!("{}.terminationGracePeriodSeconds", g.pod.path),
                format!(
                    "{grace} s is shorter than server.shutdown_delay + server.shutdown_grace ({} + {}) + {GRACE_MARGIN_SECS} s: requests still running would be killed; set at least {needed}",
                    humantime_secs(server.shutdown_delay),
                    humantime_secs(server.shutdown_grace),
                ),
            ));
        }
    }
    Ok(found)
}

fn humantime_secs(d: std::time::Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

fn has_shared_limits(c: &spillway_config::Config) -> bool {
    c.admission.redis.is_some() || c.admission.redis_env.is_some()
}

/// The config's hit, for a rule about how the config fits its pods.
fn at_config(g: &Gateway<'_>, key: &str, message: String) -> Option<Hit> {
    let c = g.config?;
    Some(Hit {
        file: c.file.clone(),
        object: c.object.clone(),
        key: key.to_owned(),
        message,
    })
}

pub(super) fn shared_limits_undercounted(sources: &Sources) -> Found {
    let mut found = Vec::new();
    for g in gateways(sources) {
        let (Some(config), Some(most)) = (g.config, g.pod.max_replicas(sources)) else {
            continue;
        };
        let instances = u64::from(config.config.admission.instances);
        if has_shared_limits(&config.config) && instances < most {
            found.extend(at_config(&g, "admission.instances", format!(
                "{instances}, but {} may run {most} replicas: while Redis is away each enforces 1/{instances} of every limit, so the fleet allows up to {most}/{instances} of it; set it to {most}",
                g.pod.object.label()
            )));
        }
    }
    Ok(found)
}

pub(super) fn limits_not_shared(sources: &Sources) -> Found {
    let mut found = Vec::new();
    for g in gateways(sources) {
        let (Some(config), Some(most)) = (g.config, g.pod.max_replicas(sources)) else {
            continue;
        };
        let limited = config.config.tenants.iter().any(|t| {
            t.requests_per_min.is_some()
                || t.tokens_per_min.is_some()
                || t.max_concurrency.is_some()
        });
        if most > 1 && limited && !has_shared_limits(&config.config) {
            found.extend(at_config(&g, "admission.redis", format!(
                "none, and {} may run {most} replicas: each enforces every tenant's whole limit, so the fleet allows {most} times it; share them through Redis (admission.redis_env)",
                g.pod.object.label()
            )));
        }
    }
    Ok(found)
}

pub(super) fn rollout_all_at_once(sources: &Sources) -> Found {
    let mut found = Vec::new();
    for o in sources.objects.iter().filter(|o| o.kind == "Deployment") {
        let hit = |key: &str, message: String| Hit {
            file: o.file.clone(),
            object: Some(o.label()),
            key: key.to_owned(),
            message,
        };
        let strategy = o.value.pointer("/spec/strategy");
        let kind = strategy.and_then(|s| s.get("type")).and_then(Value::as_str);
        if kind == Some("Recreate") {
            found.push(hit("spec.strategy.type", "Recreate replaces every pod at once: a bad version reaches all of them before any can show it; use RollingUpdate".to_owned()));
            continue;
        }
        let replicas = o
            .value
            .pointer("/spec/replicas")
            .and_then(Value::as_u64)
            .unwrap_or(1);
        let all = match strategy.and_then(|s| s.pointer("/rollingUpdate/maxUnavailable")) {
            Some(Value::Number(n)) => n.as_u64().is_some_and(|n| replicas > 1 && n >= replicas),
            Some(Value::String(p)) => p
                .strip_suffix('%')
                .and_then(|p| p.trim().parse::<f64>().ok())
                .is_some_and(|p| p >= 100.0),
            _ => false,
        };
        if all {
            found.push(hit("spec.strategy.rollingUpdate.maxUnavailable", format!(
                "lets every one of the {replicas} pods be replaced at once: a bad version reaches all of them before any can show it"
            )));
        }
    }
    Ok(found)
}
