//! spillway's configuration: parsed once from TOML, checked once, then handed out in slices.
//!
//! `raw` mirrors the file and denies unknown keys; `check` validates everything it can without
//! touching the network and collects every problem with its location, so `spillway check-config`
//! can print them all at once. The typed [`Config`] it produces holds only checked values:
//! components receive the part they need and never re-validate.

// Tests may time real processes and sockets on the system clock (see clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

mod cache;
mod check;
pub mod memory;
mod mock;
mod parse;
mod raw;
mod surface;

pub use spillway_policy::rollout::Side;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

pub use cache::CacheConfig;
pub use check::{Problem, DEFAULT_STORE_URL, REDIS_URL_SCHEMES, STORE_URL_SCHEMES};
pub use memory::MemoryBudget;
pub use mock::{MockFault, MockProfile};
pub use spillway_policy::{
    BudgetConfig, Fallback, OutlierConfig, Priority, RetryPolicy, Rules, ThrottleConfig, Trigger,
};
pub use surface::{Surface, Surfaces};

/// The quickstart configuration `spillway serve` runs when no file is given: two in-process mock
/// backends for `mock-small` in two regions and one demo tenant. Also shipped as
/// `examples/quickstart.toml`.
pub const QUICKSTART_TOML: &str = include_str!("../../../examples/quickstart.toml");

/// The demo tenant's key in the quickstart. It is public by design; the quickstart listens on
/// loopback only.
pub const QUICKSTART_KEY: &str = "sk-spillway-quickstart";
/// The most names `retry.client_retry_headers` may list: each is looked for in every request.
pub const MAX_CLIENT_RETRY_HEADERS: usize = 16;

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    /// TOML that does not parse or does not fit the schema: each message with its line, as
    /// many as could be found ([`parse`](crate) explains why not always all).
    #[error("{}", .0.join("\n"))]
    Parse(Vec<String>),
    #[error("{} problem(s) in the configuration", .0.len())]
    Invalid(Vec<Problem>),
}

/// A checked configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub server: ServerConfig,
    pub upstream: UpstreamConfig,
    pub store: StoreConfig,
    pub cache: CacheConfig,
    pub admin: AdminConfig,
    pub admission: AdmissionConfig,
    pub retry: RetryConfig,
    pub outlier: OutlierSettings,
    pub health_check: HealthCheckConfig,
    pub adaptive_concurrency: AdaptiveConfig,
    pub engine_metrics: EngineMetricsConfig,
    pub reload: ReloadConfig,
    /// `[anomaly]`: when a backend's share of 4xx answers counts as a jump.
    pub anomaly: spillway_policy::AnomalyConfig,
    pub telemetry: TelemetryConfig,
    pub tenants: Vec<TenantConfig>,
    pub models: Vec<ModelConfig>,
}

/// The listeners and the limits of the client-facing side.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    /// Region whose backends are tried first when the caller names none.
    pub home_region: Option<String>,
    /// Request header through which a caller may name its preferred region.
    pub region_header: http::HeaderName,
    /// Request header through which a caller may lower its request's priority class.
    pub priority_header: http::HeaderName,
    pub max_body_bytes: usize,
    /// Open client connections on the API listener at most; past it, a new one gets 503 and is closed.
    pub max_connections: usize,
    /// Threads that run the request path; `None` means one per CPU the process may use.
    pub worker_threads: Option<usize>,
    /// After SIGTERM: how long `/readyz` answers 503 while the listener still accepts, so load
    /// balancers stop sending before connections are refused.
    pub shutdown_delay: Duration,
    /// After the listener closes: how long in-flight requests may run.
    pub shutdown_grace: Duration,
    /// From the first byte of a request's head to its last, at most.
    pub header_read_timeout: Duration,
    /// From a request's head to the last byte of its body, at most.
    pub body_read_timeout: Duration,
    /// How long a client connection with no request in flight stays open.
    pub idle_timeout: Duration,
    /// HTTP/2: how often an otherwise silent client is pinged, and how long its answer may take.
    pub http2_keepalive_interval: Duration,
    pub http2_keepalive_timeout: Duration,
    /// HTTP/2: requests open at once on one connection.
    pub http2_max_concurrent_streams: u32,
    /// Open connections on the admin listener at most.
    pub admin_max_connections: usize,
}

/// `[telemetry]`: OpenTelemetry traces, exported over OTLP (HTTP, protobuf). Off by default.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    /// Where spans are sent, `http(s)://HOST:PORT/v1/traces`; `None`: no traces.
    pub otlp_endpoint: Option<String>,
    /// The share of traces that start here which are recorded, in `[0, 1]`. A caller's
    /// `traceparent` decides for the traces it continues (sampled or not).
    pub sampling_ratio: f64,
    /// `service.name` of the spans.
    pub service_name: String,
    /// Ended spans waiting to be exported, at most; beyond it a span is dropped and counted
    /// (`spillway_trace_spans_dropped_total`), so a slow or absent collector costs no memory.
    pub export_queue: usize,
    /// Spans in one export request, at most.
    pub export_batch: usize,
    /// How long an ended span waits for its batch to fill before it is sent anyway.
    pub export_interval: Duration,
    /// One export request's longest time; it is not retried.
    pub export_timeout: Duration,
}

/// `[reload]`: changing the configuration of a running gateway.
#[derive(Debug, Clone, PartialEq)]
pub struct ReloadConfig {
    /// Reload when the file's content changes (polled, so a replaced file or a Kubernetes
    /// ConfigMap's swapped symlink is seen like an edit).
    pub watch: bool,
    /// How often a watched file is looked at.
    pub watch_interval: Duration,
    /// A configuration that has served this long without an anomaly is saved as the
    /// last-known-good one.
    pub last_known_good_after: Duration,
}

/// How spillway talks to backends.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamConfig {
    pub connect_timeout: Duration,
    /// Time allowed from sending a request to receiving the response head.
    pub response_timeout: Duration,
    /// Longest silence allowed between two chunks of a response body.
    pub stream_idle_timeout: Duration,
    pub pool_idle_timeout: Duration,
    pub pool_max_idle_per_host: usize,
    /// How long a backend that refused a connection or timed out is skipped.
    pub unreachable_cooldown: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TenantConfig {
    pub name: String,
    pub keys: Vec<KeySource>,
    /// `None`: every configured model.
    pub allowed_models: Option<Vec<String>>,
    pub requests_per_min: Option<u32>,
    pub tokens_per_min: Option<u32>,
    pub max_concurrency: Option<u32>,
    pub priority: spillway_policy::Priority,
    pub pool: Option<String>,
    /// The model a Responses API create that names none (and continues no stored response)
    /// goes to; `None`: such a create is refused.
    pub default_model: Option<String>,
    pub enabled: bool,
}

/// `[store]`: where tenants and keys live.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreConfig {
    /// `sqlite://PATH` or `postgres://...`. Empty while `url_env` names where it comes from and
    /// the environment has not been read yet (the proxy's preflight fills it in at start).
    pub url: String,
    /// The environment variable holding `url`, for a URL with a password in it.
    pub url_env: Option<String>,
    pub max_connections: u32,
    pub acquire_timeout: Duration,
}

/// `[admission]`: the caps every request passes, whatever its tenant.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionConfig {
    /// Requests being served at once, all tenants together; beyond it: 503 at once.
    pub max_in_flight: usize,
    /// Request bodies being read or held at once, in bytes; beyond it: 503 at once.
    pub max_buffered_body_bytes: u64,
    /// The share of `max_buffered_body_bytes` one tenant's bodies may hold; beyond it: 429.
    pub max_buffered_body_bytes_per_tenant: u64,
    /// Completion tokens assumed for a request that sets no `max_tokens`, when reserving
    /// tokens against a tokens-per-minute limit.
    pub default_completion_tokens: u64,
    /// Requests waiting for a seat, in each model's queue, at most.
    pub max_queued: usize,
    /// Requests of one tenant waiting in a model's queue, at most.
    pub max_queued_per_tenant: usize,
    /// The longest a request waits for a seat; past it: 503.
    pub queue_wait: Duration,
    /// `redis://...`: tenant limits shared by every instance using it.
    pub redis: Option<String>,
    /// The environment variable holding `redis`, for a URL with a password in it; `redis` is
    /// `None` until the environment is read.
    pub redis_env: Option<String>,
    pub redis_timeout: Duration,
    /// Instances sharing the limits: each enforces `1 / instances` of a limit while Redis is
    /// unreachable.
    pub instances: u32,
    /// No tenant limits, one first-come-first-served queue without bounds, no global caps:
    /// what a gateway without admission does, for `spillway replay noisy-neighbor --naive`.
    pub naive: bool,
}

/// `[admin]`: the admin API's protection.
#[derive(Debug, Clone, PartialEq)]
pub struct AdminConfig {
    /// Environment variable holding the admin token; without it the admin API is off.
    pub token_env: String,
}

/// Where a tenant's API key comes from. Keys are never written in the file in clear.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    Sha256([u8; 32]),
    Env(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub name: String,
    pub backends: Vec<BackendConfig>,
    pub balance: BalanceConfig,
    /// Other models a request goes to, in order, when this one cannot answer it.
    pub fallbacks: Vec<Fallback<String>>,
    /// A new version of its backends being rolled out (`[models.rollout]`): those backends are
    /// in `backends` with `side` [`Side::New`].
    pub rollout: Option<RolloutPlan>,
}

/// How a model's new backends take over from its current ones.
#[derive(Debug, Clone, PartialEq)]
pub struct RolloutPlan {
    pub mode: RolloutMode,
    /// The steps and the comparator (for [`RolloutMode::Staged`]).
    pub policy: spillway_policy::RolloutConfig,
}

/// Whether a rollout goes step by step or all at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RolloutMode {
    /// A growing share, each step compared with the current version and halted on an excess.
    Staged,
    /// The new version takes every request at once, unwatched: what a deployment without
    /// stages does, for `spillway replay bad-rollout`.
    Replace,
}

/// How a model's requests are spread over its backends (`[[models]]` `balance` and the
/// affinity keys). Affinity only chooses among the backends health, ejection, region spillover
/// and admission already allow.
#[derive(Debug, Clone, PartialEq)]
pub struct BalanceConfig {
    pub strategy: Balance,
    /// Characters of the prompt's start (system prompt and first turns) hashed for
    /// `prefix_affinity`.
    pub prefix_chars: usize,
    /// No backend takes more than this times the average load for affinity's sake (>= 1).
    pub load_factor: f64,
    /// The request header keyed on by `session_affinity`.
    pub session_header: http::HeaderName,
    /// `session_affinity` also keys on the OpenAI `user` field when the header is absent.
    pub session_from_user: bool,
}

/// The balancing strategy of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Balance {
    /// Power of two choices on the engines' load (or outstanding requests without metrics).
    LeastLoad,
    /// Requests sharing a prompt prefix go to the backend likely to have it cached.
    PrefixAffinity,
    /// Requests of one session (a header, or the `user` field) go to one backend.
    SessionAffinity,
    /// Each eligible backend in turn: for comparisons, not for production.
    RoundRobin,
}

impl Balance {
    pub fn as_str(self) -> &'static str {
        match self {
            Balance::LeastLoad => "least_load",
            Balance::PrefixAffinity => "prefix_affinity",
            Balance::SessionAffinity => "session_affinity",
            Balance::RoundRobin => "round_robin",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct BackendConfig {
    pub name: String,
    pub kind: BackendKind,
    pub region: String,
    pub weight: u32,
    pub max_concurrency: u32,
    /// The model name sent upstream; the client's model name when not set.
    pub upstream_model: String,
    /// Environment variable holding the upstream API key.
    pub api_key_env: Option<String>,
    /// Which upstream statuses mean capacity, transient failure or a retry-safe 500.
    pub rules: Rules,
    /// Path (after the backend's base URL) of the active health check; `None`: no active check.
    pub health_path: Option<String>,
    /// The dedicated pool this backend belongs to: only tenants with this `pool` use it, and
    /// they use nothing else. `None`: the shared pool.
    pub pool: Option<String>,
    /// Send the request's priority class to the engine as the body field `priority` (vLLM's
    /// priority scheduling: lower runs first).
    pub forward_priority: bool,
    /// The inference engine behind the backend, whose own load signals spillway reads.
    pub engine: Engine,
    /// The engine's Prometheus page. `None` when `engine` is `None`, and for a mock backend,
    /// whose address is known only once it listens (then [`default_metrics_url`] of its base).
    pub metrics_url: Option<http::Uri>,
    /// The API surfaces it serves: only requests on these are routed to it.
    pub surfaces: Surfaces,
    /// The version it belongs to: the model's current one, or the one its rollout brings.
    pub side: Side,
}

/// The inference engine serving a backend: which names its `/metrics` page uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Engine {
    Vllm,
    Sglang,
    Llamacpp,
    Tgi,
    /// Told by the names on the page.
    Auto,
    /// Not scraped: spillway judges the backend by its own count of outstanding requests.
    None,
}

impl Engine {
    pub const CHOICES: [Engine; 6] = [
        Engine::Vllm,
        Engine::Sglang,
        Engine::Llamacpp,
        Engine::Tgi,
        Engine::Auto,
        Engine::None,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Sglang => "sglang",
            Engine::Llamacpp => "llamacpp",
            Engine::Tgi => "tgi",
            Engine::Auto => "auto",
            Engine::None => "none",
        }
    }
}

/// The engine's metrics page when none is configured: the scheme and authority of the backend's
/// base URL and `/metrics` (`http://h:8000/v1` gives `http://h:8000/metrics`), where vLLM, SGLang,
/// llama.cpp's server and TGI all serve it.
pub fn default_metrics_url(base: &http::Uri) -> Option<http::Uri> {
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(base.scheme()?.clone());
    parts.authority = Some(base.authority()?.clone());
    parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/metrics"));
    http::Uri::from_parts(parts).ok()
}

/// `[retry]`: how many attempts, how far apart, and the shared budget they draw from.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryConfig {
    pub policy: RetryPolicy,
    pub budget: BudgetConfig,
    /// No attempt of a request starts after this long since it arrived.
    pub deadline: Duration,
    /// Request headers that mark a caller's retry (a value other than `0` means a retry).
    pub client_retry_headers: Vec<http::HeaderName>,
    /// Refuse callers' retries first while a pool is failing or the retry budget is spent.
    pub shed_client_retries: bool,
    /// Adaptive throttling of each pool while its backends fail (`None`: off).
    pub throttle: Option<ThrottleConfig>,
    /// Relayed 5xx answers carry `x-should-retry: false`: spillway has retried already.
    pub discourage_caller_retries: bool,
}

/// `[outlier]`: passive ejection of failing backends.
#[derive(Debug, Clone, PartialEq)]
pub struct OutlierSettings {
    pub enabled: bool,
    pub detector: OutlierConfig,
    /// At most this share of a pool's backends is ejected at once.
    pub max_ejected_share: f64,
    /// Below this share of healthy backends the pool ignores health and spreads over all.
    pub panic_threshold: f64,
}

/// `[health_check]`: active probes of each backend.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthCheckConfig {
    pub enabled: bool,
    pub interval: Duration,
    pub timeout: Duration,
    /// Each interval is randomly shortened or lengthened by up to this share.
    pub jitter: f64,
}

/// `[adaptive_concurrency]`: the AIMD limit under each backend's `max_concurrency`.
#[derive(Debug, Clone, PartialEq)]
pub struct AdaptiveConfig {
    pub enabled: bool,
    pub min_limit: u32,
    /// Starting limit; `None`: the backend's `max_concurrency`.
    pub initial_limit: Option<u32>,
    pub backoff_ratio: f64,
    /// Each period this long without an overload signal moves a cut limit halfway back up.
    pub recovery: Duration,
}

/// `[engine_metrics]`: how often each engine's own `/metrics` is read, and what counts as full.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineMetricsConfig {
    pub interval: Duration,
    /// Each interval is randomly shortened or lengthened by up to this share.
    pub jitter: f64,
    /// One scrape, request and body, at most this long.
    pub timeout: Duration,
    /// A reading older than this is stale, and a stale engine counts as saturated.
    pub stale_after: Duration,
    /// Larger pages are refused (vLLM's, with its histograms, runs to hundreds of KiB).
    pub max_body_bytes: usize,
    /// An engine with more requests waiting than this counts as saturated.
    pub max_queue: u32,
    /// An engine whose KV cache is fuller than this share counts as saturated.
    pub max_kv_usage: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum BackendKind {
    /// Any OpenAI-compatible server; `url` is its base including `/v1`.
    OpenAi { url: http::Uri },
    /// Azure OpenAI: `url` is the resource endpoint, requests go to
    /// `/openai/deployments/{deployment}/...?api-version=...` with an `api-key` header.
    Azure {
        url: http::Uri,
        api_version: String,
        deployment: String,
    },
    /// A simulated server started inside the gateway process.
    Mock(MockProfile),
}

impl BackendKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            BackendKind::OpenAi { .. } => "openai",
            BackendKind::Azure { .. } => "azure",
            BackendKind::Mock(_) => "mock",
        }
    }
}

impl Config {
    /// Reads and checks a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Config::from_toml(&text)
    }

    /// Parses and checks a configuration held in memory.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let raw = parse::raw(text).map_err(ConfigError::Parse)?;
        check::check(raw).map_err(ConfigError::Invalid)
    }

    /// The embedded quickstart configuration.
    pub fn quickstart() -> Config {
        Config::from_toml(QUICKSTART_TOML).expect("the embedded quickstart config is valid")
    }

    pub fn model(&self, name: &str) -> Option<&ModelConfig> {
        self.models.iter().find(|m| m.name == name)
    }
}

/// The SHA-256 of a key, as stored in configs and compared at authentication.
pub fn key_digest(key: &str) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(key.as_bytes()).into()
}

#[cfg(test)]
mod tests;
