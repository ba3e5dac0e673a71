//! What the user typed: serde structs that mirror the TOML file one to one.
//!
//! Every struct denies unknown fields, so a misspelt key is an error with its location instead of
//! a silently ignored setting. Nothing here is trusted: `check` turns it into the typed `Config`.

use std::time::Duration;

use serde::Deserialize;

use crate::mock::MockProfile;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub server: RawServer,
    #[serde(default)]
    pub upstream: RawUpstream,
    #[serde(default)]
    pub store: RawStore,
    #[serde(default)]
    pub cache: RawCache,
    #[serde(default)]
    pub admin: RawAdmin,
    #[serde(default)]
    pub admission: RawAdmission,
    #[serde(default)]
    pub retry: RawRetry,
    #[serde(default)]
    pub outlier: RawOutlier,
    #[serde(default)]
    pub health_check: RawHealthCheck,
    #[serde(default)]
    pub adaptive_concurrency: RawAdaptive,
    #[serde(default)]
    pub engine_metrics: RawEngineMetrics,
    #[serde(default)]
    pub reload: RawReload,
    #[serde(default)]
    pub anomaly: RawAnomaly,
    #[serde(default)]
    pub telemetry: RawTelemetry,
    #[serde(default)]
    pub tenants: Vec<RawTenant>,
    #[serde(default)]
    pub models: Vec<RawModel>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    pub max_connections: Option<usize>,
    pub listen: Option<String>,
    pub admin_listen: Option<String>,
    pub home_region: Option<String>,
    pub region_header: Option<String>,
    pub priority_header: Option<String>,
    pub max_body_bytes: Option<u64>,
    pub worker_threads: Option<usize>,
    #[serde(default, with = "humantime_serde")]
    pub shutdown_delay: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub shutdown_grace: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub header_read_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub body_read_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub idle_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub http2_keepalive_interval: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub http2_keepalive_timeout: Option<Duration>,
    pub http2_max_concurrent_streams: Option<u32>,
    pub admin_max_connections: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAnomaly {
    #[serde(default, with = "humantime_serde")]
    pub window: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub baseline: Option<Duration>,
    pub alpha: Option<f64>,
    pub min_events: Option<u64>,
    pub min_ratio: Option<f64>,
    pub floor: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTelemetry {
    pub otlp_endpoint: Option<String>,
    pub sampling_ratio: Option<f64>,
    pub service_name: Option<String>,
    pub export_queue: Option<u64>,
    pub export_batch: Option<u64>,
    #[serde(default, with = "humantime_serde")]
    pub export_interval: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub export_timeout: Option<Duration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawReload {
    pub watch: Option<bool>,
    #[serde(default, with = "humantime_serde")]
    pub watch_interval: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub last_known_good_after: Option<Duration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    #[serde(default, with = "humantime_serde")]
    pub connect_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub response_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub stream_idle_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub pool_idle_timeout: Option<Duration>,
    pub pool_max_idle_per_host: Option<usize>,
    #[serde(default, with = "humantime_serde")]
    pub unreachable_cooldown: Option<Duration>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTenant {
    pub name: String,
    #[serde(default)]
    pub keys: Vec<RawKey>,
    pub models: Option<Vec<String>>,
    pub requests_per_min: Option<u32>,
    pub tokens_per_min: Option<u32>,
    pub max_concurrency: Option<u32>,
    pub priority: Option<String>,
    pub pool: Option<String>,
    pub default_model: Option<String>,
    pub enabled: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStore {
    pub url: Option<String>,
    pub url_env: Option<String>,
    pub max_connections: Option<u32>,
    #[serde(default, with = "humantime_serde")]
    pub acquire_timeout: Option<Duration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCache {
    #[serde(default, with = "humantime_serde")]
    pub ttl: Option<Duration>,
    pub ttl_jitter: Option<f64>,
    #[serde(default, with = "humantime_serde")]
    pub stale_for: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub negative_ttl: Option<Duration>,
    pub max_entries: Option<u64>,
    pub max_negative_entries: Option<u64>,
    pub max_concurrent_loads: Option<u32>,
    #[serde(default, with = "humantime_serde")]
    pub load_wait: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub load_timeout: Option<Duration>,
    pub redis: Option<String>,
    pub redis_env: Option<String>,
    #[serde(default, with = "humantime_serde")]
    pub redis_timeout: Option<Duration>,
    pub snapshot: Option<String>,
    pub warm_batch: Option<u32>,
    pub warm_max_keys: Option<u64>,
    #[serde(default, with = "humantime_serde")]
    pub flush_spread: Option<Duration>,
    pub naive: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmission {
    pub max_in_flight: Option<u64>,
    pub max_buffered_body_bytes: Option<u64>,
    pub max_buffered_body_bytes_per_tenant: Option<u64>,
    pub default_completion_tokens: Option<u64>,
    pub max_queued: Option<u64>,
    pub max_queued_per_tenant: Option<u64>,
    #[serde(default, with = "humantime_serde")]
    pub queue_wait: Option<Duration>,
    pub redis: Option<String>,
    pub redis_env: Option<String>,
    #[serde(default, with = "humantime_serde")]
    pub redis_timeout: Option<Duration>,
    pub instances: Option<u32>,
    pub naive: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmin {
    pub token_env: Option<String>,
}

/// A tenant key: its SHA-256 (hex) or the name of an environment variable holding the key.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKey {
    pub sha256: Option<String>,
    pub env: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawModel {
    pub name: String,
    #[serde(default)]
    pub backends: Vec<RawBackend>,
    pub balance: Option<String>,
    pub affinity_prefix_chars: Option<usize>,
    pub affinity_load_factor: Option<f64>,
    pub session_header: Option<String>,
    pub session_from_user: Option<bool>,
    #[serde(default)]
    pub fallbacks: Vec<RawFallback>,
    pub rollout: Option<RawRollout>,
}

/// `[models.rollout]`: a new version of a model's backends, rolled out in steps.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRollout {
    pub mode: Option<String>,
    pub steps: Option<Vec<f64>>,
    #[serde(default, with = "humantime_serde")]
    pub min_step_duration: Option<Duration>,
    pub min_step_requests: Option<u64>,
    pub alpha: Option<f64>,
    pub min_excess_events: Option<u64>,
    pub min_ratio: Option<f64>,
    pub ttft_quantile: Option<f64>,
    #[serde(default)]
    pub backends: Vec<RawBackend>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFallback {
    pub model: String,
    pub on: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBackend {
    pub name: String,
    pub kind: Option<String>,
    pub url: Option<String>,
    pub region: Option<String>,
    pub weight: Option<u32>,
    pub max_concurrency: Option<u32>,
    pub upstream_model: Option<String>,
    pub api_key_env: Option<String>,
    pub api_version: Option<String>,
    pub deployment: Option<String>,
    pub mock: Option<MockProfile>,
    pub capacity_statuses: Option<Vec<u16>>,
    pub transient_statuses: Option<Vec<u16>>,
    pub retry_500: Option<bool>,
    pub health_path: Option<String>,
    pub pool: Option<String>,
    pub forward_priority: Option<bool>,
    pub engine: Option<String>,
    pub metrics_url: Option<String>,
    pub surfaces: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRetry {
    pub max_attempts: Option<u32>,
    #[serde(default, with = "humantime_serde")]
    pub deadline: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub transient_backoff_base: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub transient_backoff_cap: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub capacity_backoff_base: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub capacity_backoff_cap: Option<Duration>,
    pub budget_ratio: Option<f64>,
    pub budget_min_per_sec: Option<f64>,
    #[serde(default, with = "humantime_serde")]
    pub budget_window: Option<Duration>,
    pub max_retrying_share: Option<f64>,
    pub min_retrying: Option<u32>,
    pub client_retry_headers: Option<Vec<String>>,
    pub shed_client_retries: Option<bool>,
    pub throttle_k: Option<f64>,
    pub throttle_probes: Option<u64>,
    #[serde(default, with = "humantime_serde")]
    pub throttle_window: Option<Duration>,
    pub naive: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOutlier {
    pub enabled: Option<bool>,
    pub consecutive_failures: Option<u32>,
    pub failure_rate: Option<f64>,
    pub min_requests: Option<u32>,
    #[serde(default, with = "humantime_serde")]
    pub window: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub base_ejection: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub max_ejection: Option<Duration>,
    pub max_ejected_share: Option<f64>,
    pub panic_threshold: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHealthCheck {
    pub enabled: Option<bool>,
    #[serde(default, with = "humantime_serde")]
    pub interval: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    pub jitter: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdaptive {
    pub enabled: Option<bool>,
    pub min_limit: Option<u32>,
    pub initial_limit: Option<u32>,
    pub backoff_ratio: Option<f64>,
    pub latency_tolerance: Option<f64>,
    #[serde(default, with = "humantime_serde")]
    pub recovery: Option<Duration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEngineMetrics {
    #[serde(default, with = "humantime_serde")]
    pub interval: Option<Duration>,
    pub jitter: Option<f64>,
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub stale_after: Option<Duration>,
    pub max_body_bytes: Option<u64>,
    pub max_queue: Option<u32>,
    pub max_kv_usage: Option<f64>,
}
