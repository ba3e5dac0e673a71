//! Rules on probes: what each one reaches, and whether a spillway container's probes can pass
//! at all on the listeners its config opens.
//!
//! What can be told from a manifest: a probe aimed at another host (`httpGet.host`,
//! `tcpSocket.host`, or a URL or `-h HOST` in an exec command), a database client run against a
//! remote host, a probe that runs an inference request (a path like `/v1/chat/completions`,
//! which queues behind real work on a loaded engine and times out exactly when the engine is
//! busiest), and on spillway the path and port against what its config serves. A check of the
//! engine's own process (vLLM's `/health`, `pg_isready` on its own socket) is local and passes.

use serde_json::Value;

use crate::pods::{gateways, pods, Container, Gateway};
use crate::{AuditError, Hit, Sources};

type Found = Result<Vec<Hit>, AuditError>;

const INFERENCE_PATHS: [&str; 8] = [
    "/chat/completions",
    "/completions",
    "/embeddings",
    "/generate",
    "/messages",
    "/responses",
    "/infer",
    "/predict",
];
const DATABASE_CLIENTS: [&str; 9] = [
    "psql",
    "pg_isready",
    "mysql",
    "mysqladmin",
    "redis-cli",
    "mongosh",
    "mongo",
    "cqlsh",
    "sqlcmd",
];
/// What spillway answers on its admin listener without a token; the API listener answers the
/// first two.
const ADMIN_PROBE_PATHS: [&str; 4] = ["/livez", "/readyz", "/healthz/deps", "/metrics"];

fn is_local(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    matches!(host, "" | "localhost" | "127.0.0.1" | "::1" | "0.0.0.0")
}

/// The host of `scheme://[user@]host[:port]/...`.
fn url_host(word: &str) -> Option<&str> {
    let rest = word.split_once("://")?.1;
    let authority = rest.split(['/', '?', '"', '\'']).next()?;
    let host = authority.rsplit('@').next()?;
    Some(match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.split(':').next().unwrap_or(""),
    })
}

/// What `probe` reaches beyond its own container, if anything, said in a few words.
fn reaches(probe: &Value) -> Option<String> {
    for kind in ["httpGet", "tcpSocket"] {
        if let Some(host) = probe
            .pointer(&format!("/{kind}/host"))
            .and_then(Value::as_str)
        {
            if !is_local(host) {
                return Some(format!("it asks another host, {host}"));
            }
        }
    }
    if let Some(path) = probe.pointer("/httpGet/path").and_then(Value::as_str) {
        if INFERENCE_PATHS.iter().any(|p| path.contains(p)) {
            return Some(format!("it runs an inference request ({path})"));
        }
    }
    let words: Vec<&str> = probe
        .pointer("/exec/command")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .flat_map(str::split_whitespace)
        .collect();
    for (i, w) in words.iter().enumerate() {
        if let Some(host) = url_host(w).filter(|h| !is_local(h)) {
            return Some(format!("it calls {host}"));
        }
        if INFERENCE_PATHS.iter().any(|p| w.contains(p)) {
            return Some(format!("it runs an inference request ({w})"));
        }
        let client = w.rsplit('/').next().unwrap_or(w);
        if DATABASE_CLIENTS.contains(&client) {
            let host = words[i + 1..].windows(2).find_map(|pair| match pair[0] {
                "-h" | "--host" => Some(pair[1].to_owned()),
                _ => None,
            });
            let inline = words[i + 1..].iter().find_map(|a| {
                a.strip_prefix("--host=")
                    .or_else(|| a.strip_prefix("-h").filter(|h| !h.is_empty()))
                    .map(str::to_owned)
            });
            if let Some(host) = host.or(inline).filter(|h| !is_local(h)) {
                return Some(format!("it runs {client} against {host}"));
            }
        }
    }
    None
}

/// Each container's probe of `kind`, with its key path.
fn probes<'a>(c: &Container<'a>, kinds: &[&str]) -> Vec<(String, &'a Value)> {
    kinds
        .iter()
        .filter_map(|k| c.value.get(*k).map(|p| (format!("{}.{k}", c.key), p)))
        .collect()
}

fn hit(pod: &crate::pods::Pod<'_>, key: String, message: String) -> Hit {
    Hit {
        file: pod.object.file.clone(),
        object: Some(pod.object.label()),
        key,
        message,
    }
}

fn http_path(probe: &Value) -> Option<&str> {
    probe
        .pointer("/httpGet/path")
        .and_then(Value::as_str)
        .map(|p| p.split('?').next().unwrap_or(p))
}

pub(super) fn liveness_calls_dependency(sources: &Sources) -> Found {
    let mut found = Vec::new();
    for pod in pods(sources) {
        for c in pod.main_containers() {
            let spillway = crate::pods::is_spillway(c.value);
            for (key, probe) in probes(&c, &["livenessProbe"]) {
                let why = reaches(probe).or_else(|| match http_path(probe) {
                    Some("/readyz") if spillway => Some("/readyz answers 503 until the key cache is warm and while shutting down: a store outage at start would restart the gateway in a loop; probe /livez".to_owned()),
                    Some("/healthz/deps") if spillway => Some("/healthz/deps asks the store: a store outage would restart every gateway that serves from its cache; probe /livez".to_owned()),
                    _ => None,
                });
                if let Some(why) = why {
                    found.push(hit(
                        &pod,
                        key,
                        format!("the liveness probe depends on more than its process: {why}"),
                    ));
                }
            }
        }
    }
    Ok(found)
}

pub(super) fn readiness_calls_dependency(sources: &Sources) -> Found {
    let mut found = Vec::new();
    for pod in pods(sources) {
        for c in pod.main_containers() {
            let spillway = crate::pods::is_spillway(c.value);
            for (key, probe) in probes(&c, &["readinessProbe", "startupProbe"]) {
                let why = reaches(probe).or_else(|| {
                    (spillway && http_path(probe) == Some("/healthz/deps")).then(|| {
                        "/healthz/deps follows the store: a store outage would take every gateway out of service although they serve from their caches; probe /readyz".to_owned()
                    })
                });
                if let Some(why) = why {
                    found.push(hit(
                        &pod,
                        key,
                        format!("the probe depends on more than its process: {why}"),
                    ));
                }
            }
        }
    }
    Ok(found)
}

/// A spillway probe's port, resolved through the container's named ports.
fn port(c: &Value, probe: &Value) -> Result<u16, String> {
    match probe.pointer("/httpGet/port") {
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u16::try_from(n).ok())
            .ok_or_else(|| format!("port {n} is not a port")),
        Some(Value::String(name)) => c
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|p| p.get("name").and_then(Value::as_str) == Some(name))
            .and_then(|p| p.get("containerPort").and_then(Value::as_u64))
            .and_then(|n| u16::try_from(n).ok())
            .ok_or_else(|| format!("port {name:?} is not a named port of the container")),
        _ => Err("the probe names no port".to_owned()),
    }
}

/// For each HTTP probe of a spillway container with a known config: why it can never pass,
/// or `None`, and whether it is on the API listener.
fn judge(g: &Gateway<'_>) -> Vec<(String, Option<String>, bool)> {
    let Some(config) = g.config else {
        return Vec::new();
    };
    let (api, admin) = (
        config.config.server.listen,
        config.config.server.admin_listen,
    );
    let mut out = Vec::new();
    for (key, probe) in probes(
        &g.container,
        &["livenessProbe", "readinessProbe", "startupProbe"],
    ) {
        if probe.get("httpGet").is_none() {
            continue;
        }
        let path = http_path(probe).unwrap_or("/");
        let scheme = probe.pointer("/httpGet/scheme").and_then(Value::as_str);
        let verdict = match port(g.container.value, probe) {
            Err(why) => (Some(why), false),
            Ok(_) if scheme.is_some_and(|s| s.eq_ignore_ascii_case("https")) => (
                Some("spillway's listeners speak plain HTTP, not HTTPS".to_owned()),
                false,
            ),
            Ok(p) if p == admin.port() || p == api.port() => {
                let on_api = p != admin.port();
                let (addr, name) = if on_api {
                    (api, "server.listen")
                } else {
                    (admin, "server.admin_listen")
                };
                if addr.ip().is_loopback() {
                    (Some(format!("{name} is {addr}: the kubelet probes the pod's IP, which a loopback listener never answers; listen on 0.0.0.0")), on_api)
                } else if on_api && !matches!(path, "/livez" | "/readyz") {
                    (
                        Some(format!("the API listener does not serve {path}")),
                        on_api,
                    )
                } else if !ADMIN_PROBE_PATHS.contains(&path) {
                    (Some(format!("{path} is not a probe spillway answers without a token (/livez, /readyz)")), on_api)
                } else {
                    (None, on_api)
                }
            }
            Ok(p) => (
                Some(format!(
                    "port {p} is neither server.listen ({api}) nor server.admin_listen ({admin})"
                )),
                false,
            ),
        };
        out.push((key, verdict.0, verdict.1));
    }
    out
}

pub(super) fn probe_cannot_pass(sources: &Sources) -> Found {
    Ok(gateways(sources)
        .iter()
        .flat_map(|g| {
            judge(g).into_iter().filter_map(|(key, why, _)| {
                why.map(|why| hit(&g.pod, key, format!("the probe can never pass: {why}")))
            })
        })
        .collect())
}

pub(super) fn probe_on_api_listener(sources: &Sources) -> Found {
    Ok(gateways(sources)
        .iter()
        .flat_map(|g| {
            judge(g).into_iter().filter_map(|(key, why, on_api)| {
                (why.is_none() && on_api).then(|| {
                    hit(&g.pod, key, "the probe is on the API listener, which refuses connections past server.max_connections: under load the kubelet would restart a busy gateway; probe the admin listener".to_owned())
                })
            })
        })
        .collect())
}
