//! Validation: turns what the user typed into a [`Config`], or lists every problem with where it is.
//!
//! Checks stop at the edge of the process: an environment variable named for a key is only
//! checked for a valid name here. Whether it is set is `spillway_proxy::preflight`'s question,
//! asked by `serve` and `check-config` (unless `--no-env`, for a file away from its secrets).

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

mod admission;
mod balance;
mod engine;
mod fallbacks;
mod metadata;
mod resilience;
mod rollout;
mod routing;
mod telemetry;
mod tenants;

pub use metadata::{DEFAULT_STORE_URL, REDIS_URL_SCHEMES, STORE_URL_SCHEMES};

use crate::raw::{RawBackend, RawConfig, RawModel, RawServer, RawUpstream};
use crate::{BackendConfig, BackendKind, Config, ModelConfig, ServerConfig, Side, UpstreamConfig};

/// One thing wrong with a configuration and where it is (a TOML key path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub location: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.location, self.message)
    }
}

const MAX_BODY_CAP: u64 = 256 * 1024 * 1024;
const MAX_WORKER_THREADS: usize = 1024;

#[derive(Default)]
struct Problems(Vec<Problem>);

impl Problems {
    fn add(&mut self, location: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem {
            location: location.into(),
            message: message.into(),
        });
    }
}

pub(crate) fn check(raw: RawConfig) -> Result<Config, Vec<Problem>> {
    let mut p = Problems::default();
    let server = check_server(raw.server, &mut p);
    let upstream = check_upstream(raw.upstream, &mut p);
    let store = metadata::check_store(raw.store, &mut p);
    let cache = metadata::check_cache(raw.cache, &mut p);
    let admin = metadata::check_admin(raw.admin, &mut p);
    let admission = admission::check_admission(raw.admission, server.max_body_bytes, &mut p);
    let naive = raw.retry.naive.unwrap_or(false);
    let mut retry = resilience::check_retry(raw.retry, &mut p);
    let mut outlier = resilience::check_outlier(raw.outlier, &mut p);
    let mut health_check = resilience::check_health(raw.health_check, &mut p);
    let mut adaptive_concurrency = resilience::check_adaptive(raw.adaptive_concurrency, &mut p);
    let engine_metrics = engine::check_engine_metrics(raw.engine_metrics, &mut p);
    let reload = metadata::check_reload(raw.reload, &mut p);
    let anomaly = rollout::check_anomaly(raw.anomaly, &mut p);
    let telemetry = telemetry::check_telemetry(raw.telemetry, &mut p);
    let mut models = check_models(raw.models, &mut p);
    if naive {
        resilience::without_protections(
            &mut retry,
            &mut outlier,
            &mut health_check,
            &mut adaptive_concurrency,
            &mut models,
        );
    }
    let tenants = tenants::check_tenants(raw.tenants, &models, &mut p);
    if let Some(home) = &server.home_region {
        let known = models
            .iter()
            .flat_map(|m| &m.backends)
            .any(|b| &b.region == home);
        if !known {
            p.add(
                "server.home_region",
                format!("no backend is in region {home:?}"),
            );
        }
    }
    if server.listen == server.admin_listen && server.listen.port() != 0 {
        p.add(
            "server.admin_listen",
            "must differ from server.listen: the admin API has its own listener",
        );
    }
    if p.0.is_empty() {
        Ok(Config {
            server,
            upstream,
            store,
            cache,
            admin,
            admission,
            retry,
            outlier,
            health_check,
            adaptive_concurrency,
            engine_metrics,
            reload,
            anomaly,
            telemetry,
            tenants,
            models,
        })
    } else {
        Err(p.0)
    }
}

fn parse_addr(value: Option<String>, default: &str, at: &str, p: &mut Problems) -> SocketAddr {
    let text = value.unwrap_or_else(|| default.to_owned());
    text.parse().unwrap_or_else(|_| {
        p.add(at, format!("{text:?} is not an IP:port address"));
        default.parse().expect("defaults are valid addresses")
    })
}

fn check_server(raw: RawServer, p: &mut Problems) -> ServerConfig {
    let listen = parse_addr(raw.listen, "127.0.0.1:8080", "server.listen", p);
    let admin_listen = parse_addr(raw.admin_listen, "127.0.0.1:9090", "server.admin_listen", p);
    let header = raw
        .region_header
        .unwrap_or_else(|| "x-spillway-region".into());
    let region_header = http::HeaderName::try_from(header.as_str()).unwrap_or_else(|_| {
        p.add(
            "server.region_header",
            format!("{header:?} is not a header name"),
        );
        http::HeaderName::from_static("x-spillway-region")
    });
    let header = raw
        .priority_header
        .unwrap_or_else(|| "x-spillway-priority".into());
    let priority_header = http::HeaderName::try_from(header.as_str()).unwrap_or_else(|_| {
        p.add(
            "server.priority_header",
            format!("{header:?} is not a header name"),
        );
        http::HeaderName::from_static("x-spillway-priority")
    });
    let max_connections = raw.max_connections.unwrap_or(10_000);
    if !(1..=1_000_000).contains(&max_connections) {
        p.add(
            "server.max_connections",
            format!("must be between 1 and 1000000, got {max_connections}"),
        );
    }
    let max_connections = max_connections.clamp(1, 1_000_000);
    let max_body = raw.max_body_bytes.unwrap_or(8 * 1024 * 1024);
    if max_body == 0 || max_body > MAX_BODY_CAP {
        p.add(
            "server.max_body_bytes",
            format!("must be between 1 and {MAX_BODY_CAP}, got {max_body}"),
        );
    }
    if let Some(n) = raw.worker_threads {
        if !(1..=MAX_WORKER_THREADS).contains(&n) {
            p.add(
                "server.worker_threads",
                format!("must be between 1 and {MAX_WORKER_THREADS}, got {n}"),
            );
        }
    }
    ServerConfig {
        listen,
        admin_listen,
        home_region: raw.home_region,
        region_header,
        priority_header,
        max_body_bytes: max_body.min(MAX_BODY_CAP) as usize,
        max_connections,
        worker_threads: raw.worker_threads.map(|n| n.clamp(1, MAX_WORKER_THREADS)),
        shutdown_delay: raw.shutdown_delay.unwrap_or(Duration::ZERO),
        shutdown_grace: raw.shutdown_grace.unwrap_or(Duration::from_secs(30)),
        header_read_timeout: client_timeout(
            raw.header_read_timeout,
            Duration::from_secs(30),
            "server.header_read_timeout",
            p,
        ),
        body_read_timeout: client_timeout(
            raw.body_read_timeout,
            Duration::from_secs(60),
            "server.body_read_timeout",
            p,
        ),
        idle_timeout: client_timeout(
            raw.idle_timeout,
            Duration::from_secs(75),
            "server.idle_timeout",
            p,
        ),
        http2_keepalive_interval: client_timeout(
            raw.http2_keepalive_interval,
            Duration::from_secs(20),
            "server.http2_keepalive_interval",
            p,
        ),
        http2_keepalive_timeout: client_timeout(
            raw.http2_keepalive_timeout,
            Duration::from_secs(20),
            "server.http2_keepalive_timeout",
            p,
        ),
        http2_max_concurrent_streams: bounded(
            raw.http2_max_concurrent_streams.map(u64::from),
            100,
            10_000,
            "server.http2_max_concurrent_streams",
            p,
        ) as u32,
        admin_max_connections: bounded(
            raw.admin_max_connections.map(|n| n as u64),
            64,
            100_000,
            "server.admin_max_connections",
            p,
        ) as usize,
    }
}

/// The longest any client timeout may be: a client connection is never held for a day.
const MAX_CLIENT_TIMEOUT: Duration = Duration::from_secs(3600);

fn client_timeout(d: Option<Duration>, default: Duration, at: &str, p: &mut Problems) -> Duration {
    let d = d.unwrap_or(default);
    if d.is_zero() || d > MAX_CLIENT_TIMEOUT {
        p.add(at, "must be greater than zero and at most 1h");
        return default;
    }
    d
}

/// `v` (or `default`) when it is between 1 and `max`; otherwise a problem at `at`, and `default`.
fn bounded(v: Option<u64>, default: u64, max: u64, at: &str, p: &mut Problems) -> u64 {
    let v = v.unwrap_or(default);
    if v == 0 || v > max {
        p.add(at, format!("must be between 1 and {max}, got {v}"));
        return default;
    }
    v
}

fn positive(d: Option<Duration>, default: Duration, at: &str, p: &mut Problems) -> Duration {
    let d = d.unwrap_or(default);
    if d.is_zero() {
        p.add(at, "must be greater than zero");
    }
    d
}

fn check_upstream(raw: RawUpstream, p: &mut Problems) -> UpstreamConfig {
    let s = Duration::from_secs;
    UpstreamConfig {
        connect_timeout: positive(raw.connect_timeout, s(2), "upstream.connect_timeout", p),
        response_timeout: positive(raw.response_timeout, s(300), "upstream.response_timeout", p),
        stream_idle_timeout: positive(
            raw.stream_idle_timeout,
            s(60),
            "upstream.stream_idle_timeout",
            p,
        ),
        pool_idle_timeout: client_timeout(
            raw.pool_idle_timeout,
            s(90),
            "upstream.pool_idle_timeout",
            p,
        ),
        pool_max_idle_per_host: raw.pool_max_idle_per_host.unwrap_or(256),
        unreachable_cooldown: raw.unreachable_cooldown.unwrap_or(s(5)),
    }
}

fn check_models(raw: Vec<RawModel>, p: &mut Problems) -> Vec<ModelConfig> {
    if raw.is_empty() {
        p.add("models", "no models: add at least one [[models]] table");
    }
    let mut seen = HashSet::new();
    let mut models = Vec::with_capacity(raw.len());
    for (i, m) in raw.into_iter().enumerate() {
        let at = format!("models[{i}]");
        if m.name.trim().is_empty() {
            p.add(format!("{at}.name"), "must not be empty");
        } else if !seen.insert(m.name.clone()) {
            p.add(
                format!("{at}.name"),
                format!("model {:?} is declared twice", m.name),
            );
        }
        let at = format!("models[{:?}]", m.name);
        if m.backends.is_empty() {
            p.add(format!("{at}.backends"), "no backends: add at least one");
        }
        let balance = balance::check_balance(&m, &at, p);
        let fallbacks = fallbacks::check_fallbacks(&m, &at, p);
        let (rollout, next) = match m.rollout {
            Some(r) => {
                let (plan, backends) = rollout::check_rollout(r, &at, p);
                (Some(plan), backends)
            }
            None => (None, Vec::new()),
        };
        let mut names = HashSet::new();
        let current = m
            .backends
            .into_iter()
            .enumerate()
            .map(|(j, b)| (Side::Old, format!("{at}.backends[{j}]"), b));
        let coming = next
            .into_iter()
            .enumerate()
            .map(|(j, b)| (Side::New, format!("{at}.rollout.backends[{j}]"), b));
        let backends = current
            .chain(coming)
            .filter_map(|(side, place, b)| {
                if !names.insert(b.name.clone()) {
                    p.add(
                        format!("{place}.name"),
                        format!("backend {:?} is declared twice in this model", b.name),
                    );
                }
                let mut checked = check_backend(b, &m.name, &place, p)?;
                checked.side = side;
                Some(checked)
            })
            .collect();
        models.push(ModelConfig {
            name: m.name,
            backends,
            balance,
            fallbacks,
            rollout,
        });
    }
    fallbacks::check_fallback_models(&models, p);
    models
}

fn check_backend(b: RawBackend, model: &str, at: &str, p: &mut Problems) -> Option<BackendConfig> {
    let at = format!("{at} ({:?})", b.name);
    let errors_before = p.0.len();
    if b.name.trim().is_empty() {
        p.add(format!("{at}.name"), "must not be empty");
    }
    let upstream_model = b.upstream_model.clone().unwrap_or_else(|| model.to_owned());
    let url = |p: &mut Problems| -> Option<http::Uri> {
        let Some(text) = &b.url else {
            p.add(format!("{at}.url"), "is required for this kind");
            return None;
        };
        match text.parse::<http::Uri>() {
            Ok(u) if matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some() => {
                Some(u)
            }
            _ => {
                p.add(
                    format!("{at}.url"),
                    format!("{text:?} is not an http(s) URL"),
                );
                None
            }
        }
    };
    let kind = match b.kind.as_deref().unwrap_or("openai") {
        "openai" => url(p).map(|url| BackendKind::OpenAi { url }),
        "azure" => {
            let url = url(p);
            if b.api_version.is_none() {
                p.add(
                    format!("{at}.api_version"),
                    "is required for kind \"azure\"",
                );
            }
            url.zip(b.api_version.clone())
                .map(|(url, api_version)| BackendKind::Azure {
                    url,
                    api_version,
                    deployment: b
                        .deployment
                        .clone()
                        .unwrap_or_else(|| upstream_model.clone()),
                })
        }
        "mock" => {
            if b.url.is_some() {
                p.add(
                    format!("{at}.url"),
                    "a mock backend runs in-process and takes no url",
                );
            }
            let mut profile = b.mock.clone().unwrap_or_default();
            if b.mock
                .as_ref()
                .is_none_or(|m| m.models == crate::MockProfile::default().models)
            {
                profile.models = vec![upstream_model.clone()];
            }
            for (field, message) in profile.problems() {
                p.add(format!("{at}.mock.{field}"), message);
            }
            Some(BackendKind::Mock(profile))
        }
        other => {
            p.add(
                format!("{at}.kind"),
                format!("unknown kind {other:?}: expected \"openai\", \"azure\" or \"mock\""),
            );
            None
        }
    };
    if b.mock.is_some() && b.kind.as_deref() != Some("mock") {
        p.add(
            format!("{at}.mock"),
            "only a backend of kind \"mock\" takes a mock profile",
        );
    }
    if (b.api_version.is_some() || b.deployment.is_some()) && b.kind.as_deref() != Some("azure") {
        p.add(
            at.clone(),
            "api_version and deployment apply only to kind \"azure\"",
        );
    }
    if let Some(var) = &b.api_key_env {
        check_env_name(var, &format!("{at}.api_key_env"), p);
    }
    let weight = b.weight.unwrap_or(1);
    if !(1..=1000).contains(&weight) {
        p.add(
            format!("{at}.weight"),
            format!("must be between 1 and 1000, got {weight}"),
        );
    }
    let rules = resilience::check_backend_rules(&b, &at, p);
    let (engine, metrics_url) = engine::check_backend_engine(&b, &at, p);
    let surfaces = routing::check_backend_surfaces(&b, &at, p);
    let health_path = match (&b.health_path, b.kind.as_deref()) {
        (Some(path), _) if path.is_empty() => None,
        (Some(path), _) if !path.starts_with('/') => {
            p.add(format!("{at}.health_path"), "must start with /");
            None
        }
        (Some(path), _) => Some(path.clone()),
        // Azure has no cheap per-deployment GET: passive outlier detection only, unless set.
        (None, Some("azure")) => None,
        (None, _) => Some("/models".to_owned()),
    };
    let max_concurrency = b.max_concurrency.unwrap_or(256);
    if max_concurrency == 0 {
        p.add(format!("{at}.max_concurrency"), "must be at least 1");
    }
    let region = b.region.unwrap_or_else(|| "default".to_owned());
    if region.trim().is_empty() {
        p.add(format!("{at}.region"), "must not be empty");
    }
    routing::check_backend_pool(b.pool.as_deref(), &at, p);
    if p.0.len() > errors_before {
        return None;
    }
    Some(BackendConfig {
        name: b.name,
        kind: kind?,
        region,
        weight,
        max_concurrency,
        upstream_model,
        api_key_env: b.api_key_env,
        rules,
        health_path,
        pool: b.pool,
        forward_priority: b.forward_priority.unwrap_or(false),
        engine,
        metrics_url,
        surfaces,
        side: Side::Old,
    })
}

fn check_env_name(var: &str, at: &str, p: &mut Problems) {
    let valid = !var.is_empty()
        && !var.starts_with(|c: char| c.is_ascii_digit())
        && var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        p.add(at, format!("{var:?} is not an environment variable name"));
    }
}
