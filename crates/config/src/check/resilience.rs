//! The `[retry]`, `[outlier]`, `[health_check]` and `[adaptive_concurrency]` sections, and the
//! per-backend failure classification: everything that decides how spillway reacts to failing
//! backends. Defaults and the reasons for them are in docs/config.md and docs/resilience.md.

use std::time::Duration;

use spillway_policy::{Backoff, BudgetConfig, OutlierConfig, RetryPolicy, Rules, ThrottleConfig};

use super::Problems;
use crate::raw::{RawAdaptive, RawBackend, RawHealthCheck, RawOutlier, RawRetry};
use crate::{AdaptiveConfig, HealthCheckConfig, ModelConfig, OutlierSettings, RetryConfig};

pub(super) fn share(value: Option<f64>, default: f64, at: &str, p: &mut Problems) -> f64 {
    let v = value.unwrap_or(default);
    if !(0.0..=1.0).contains(&v) {
        p.add(at, format!("must be between 0 and 1, got {v}"));
        return default;
    }
    v
}

pub(super) fn duration(
    value: Option<Duration>,
    default: Duration,
    at: &str,
    p: &mut Problems,
) -> Duration {
    let d = value.unwrap_or(default);
    if d.is_zero() {
        p.add(at, "must be greater than zero");
        return default;
    }
    d
}

fn backoff(
    base: Option<Duration>,
    cap: Option<Duration>,
    default: Backoff,
    at: &str,
    p: &mut Problems,
) -> Backoff {
    let b = Backoff {
        base: base.unwrap_or(default.base),
        cap: cap.unwrap_or(default.cap),
    };
    if b.cap < b.base {
        p.add(
            format!("{at}_backoff_cap"),
            format!("must not be less than {at}_backoff_base"),
        );
        return default;
    }
    b
}

pub(super) fn check_retry(raw: RawRetry, p: &mut Problems) -> RetryConfig {
    let d = RetryPolicy::default();
    let max_attempts = raw.max_attempts.unwrap_or(d.max_attempts);
    if !(1..=spillway_policy::retry::MAX_ATTEMPTS_CAP).contains(&max_attempts) {
        p.add(
            "retry.max_attempts",
            format!(
                "must be between 1 and {}, got {max_attempts}",
                spillway_policy::retry::MAX_ATTEMPTS_CAP
            ),
        );
    }
    let policy = RetryPolicy {
        max_attempts,
        transient: backoff(
            raw.transient_backoff_base,
            raw.transient_backoff_cap,
            d.transient,
            "retry.transient",
            p,
        ),
        capacity: backoff(
            raw.capacity_backoff_base,
            raw.capacity_backoff_cap,
            d.capacity,
            "retry.capacity",
            p,
        ),
        honour_pushback: true,
    }
    .clamped();
    let b = BudgetConfig::default();
    let min_per_sec = raw.budget_min_per_sec.unwrap_or(b.min_per_sec);
    if !(0.0..=1000.0).contains(&min_per_sec) {
        p.add(
            "retry.budget_min_per_sec",
            format!("must be between 0 and 1000, got {min_per_sec}"),
        );
    }
    let budget = BudgetConfig {
        ratio: share(raw.budget_ratio, b.ratio, "retry.budget_ratio", p),
        min_per_sec: min_per_sec.clamp(0.0, 1000.0),
        window: duration(raw.budget_window, b.window, "retry.budget_window", p),
        max_retrying_share: share(
            raw.max_retrying_share,
            b.max_retrying_share,
            "retry.max_retrying_share",
            p,
        ),
        min_retrying: raw.min_retrying.unwrap_or(b.min_retrying).max(1),
    };
    let throttle = check_throttle(&raw, p);
    let mut client_retry_headers = Vec::new();
    let markers = raw
        .client_retry_headers
        .unwrap_or_else(|| vec!["x-stainless-retry-count".into()]);
    if markers.len() > crate::MAX_CLIENT_RETRY_HEADERS {
        p.add(
            "retry.client_retry_headers",
            format!(
                "at most {} names, got {}",
                crate::MAX_CLIENT_RETRY_HEADERS,
                markers.len()
            ),
        );
    }
    for (i, name) in markers.iter().enumerate() {
        match http::HeaderName::try_from(name.as_str()) {
            Ok(h) => client_retry_headers.push(h),
            Err(_) => p.add(
                format!("retry.client_retry_headers[{i}]"),
                format!("{name:?} is not a header name"),
            ),
        }
    }
    RetryConfig {
        policy,
        budget,
        deadline: duration(raw.deadline, Duration::from_secs(300), "retry.deadline", p),
        client_retry_headers,
        shed_client_retries: raw.shed_client_retries.unwrap_or(true),
        throttle,
        discourage_caller_retries: true,
    }
}

pub(super) fn check_outlier(raw: RawOutlier, p: &mut Problems) -> OutlierSettings {
    let d = OutlierConfig::default();
    let consecutive_failures = raw.consecutive_failures.unwrap_or(d.consecutive_failures);
    if consecutive_failures == 0 {
        p.add("outlier.consecutive_failures", "must be at least 1");
    }
    let base_ejection = duration(
        raw.base_ejection,
        d.base_ejection,
        "outlier.base_ejection",
        p,
    );
    let max_ejection = duration(raw.max_ejection, d.max_ejection, "outlier.max_ejection", p);
    if max_ejection < base_ejection {
        p.add(
            "outlier.max_ejection",
            "must not be less than outlier.base_ejection",
        );
    }
    OutlierSettings {
        enabled: raw.enabled.unwrap_or(true),
        detector: OutlierConfig {
            consecutive_failures: consecutive_failures.max(1),
            failure_rate: share(raw.failure_rate, d.failure_rate, "outlier.failure_rate", p),
            min_requests: raw.min_requests.unwrap_or(d.min_requests),
            window: duration(raw.window, d.window, "outlier.window", p),
            base_ejection,
            max_ejection: max_ejection.max(base_ejection),
        },
        max_ejected_share: share(raw.max_ejected_share, 0.5, "outlier.max_ejected_share", p),
        panic_threshold: share(raw.panic_threshold, 0.5, "outlier.panic_threshold", p),
    }
}

/// `retry.throttle_k` (0 turns throttling off), `retry.throttle_window` and
/// `retry.throttle_probes`.
fn check_throttle(raw: &RawRetry, p: &mut Problems) -> Option<ThrottleConfig> {
    let d = ThrottleConfig::default();
    let k = raw.throttle_k.unwrap_or(d.k);
    if !(k == 0.0 || (1.0..=100.0).contains(&k)) {
        p.add(
            "retry.throttle_k",
            format!("must be 0 (off) or between 1 and 100, got {k}"),
        );
        return None;
    }
    let window = duration(raw.throttle_window, d.window, "retry.throttle_window", p);
    let probes = raw.throttle_probes.unwrap_or(d.probes);
    if probes == 0 {
        p.add(
            "retry.throttle_probes",
            "must be at least 1: without probes a pool whose backends all failed could never learn that they healed",
        );
    }
    (k > 0.0).then_some(ThrottleConfig {
        k,
        window,
        probes: probes.max(1),
    })
}

pub(super) fn check_health(raw: RawHealthCheck, p: &mut Problems) -> HealthCheckConfig {
    let interval = duration(
        raw.interval,
        Duration::from_secs(2),
        "health_check.interval",
        p,
    );
    let timeout = duration(
        raw.timeout,
        Duration::from_secs(1),
        "health_check.timeout",
        p,
    );
    if timeout > interval {
        p.add(
            "health_check.timeout",
            "must not be longer than health_check.interval",
        );
    }
    HealthCheckConfig {
        enabled: raw.enabled.unwrap_or(true),
        interval,
        timeout: timeout.min(interval),
        jitter: share(raw.jitter, 0.2, "health_check.jitter", p),
    }
}

pub(super) fn check_adaptive(raw: RawAdaptive, p: &mut Problems) -> AdaptiveConfig {
    let min_limit = raw.min_limit.unwrap_or(1);
    if min_limit == 0 {
        p.add("adaptive_concurrency.min_limit", "must be at least 1");
    }
    let backoff_ratio = raw.backoff_ratio.unwrap_or(0.9);
    if !(0.1..1.0).contains(&backoff_ratio) {
        p.add(
            "adaptive_concurrency.backoff_ratio",
            format!("must be at least 0.1 and less than 1, got {backoff_ratio}"),
        );
    }
    if raw.latency_tolerance.is_some() {
        p.add(
            "adaptive_concurrency.latency_tolerance",
            "is no longer used: a response head that came later than another's is not an overload signal (see docs/routing.md); remove it",
        );
    }
    let recovery = duration(
        raw.recovery,
        Duration::from_secs(1),
        "adaptive_concurrency.recovery",
        p,
    );
    AdaptiveConfig {
        enabled: raw.enabled.unwrap_or(true),
        min_limit: min_limit.max(1),
        initial_limit: raw.initial_limit,
        backoff_ratio: backoff_ratio.clamp(0.1, 0.99),
        recovery,
    }
}

/// The backend's failure classification and health-check path.
pub(super) fn check_backend_rules(b: &RawBackend, at: &str, p: &mut Problems) -> Rules {
    let d = Rules::default();
    let statuses = |list: &Option<Vec<u16>>, default: &Vec<u16>, key: &str, p: &mut Problems| {
        let list = list.clone().unwrap_or_else(|| default.clone());
        for s in &list {
            if !(400..=599).contains(s) {
                p.add(
                    format!("{at}.{key}"),
                    format!("{s} is not an error status (400-599)"),
                );
            }
        }
        list
    };
    Rules {
        capacity: statuses(&b.capacity_statuses, &d.capacity, "capacity_statuses", p),
        transient: statuses(&b.transient_statuses, &d.transient, "transient_statuses", p),
        retry_500: b.retry_500.unwrap_or(d.retry_500),
        upstream_auth: d.upstream_auth,
    }
}

/// `retry.naive`: the gateway without its protections, as settings rather than as branches on
/// the request path. Every 5xx is retried at once up to `max_attempts`, with no budget, no
/// backoff, no heed to the backend's pushback, no shedding of callers' retries, no throttling,
/// no ejection, no adaptive limit and no health checks: the behaviour of the IL-0248 layers,
/// for `spillway replay` comparisons only.
pub(super) fn without_protections(
    retry: &mut RetryConfig,
    outlier: &mut OutlierSettings,
    health_check: &mut HealthCheckConfig,
    adaptive: &mut AdaptiveConfig,
    models: &mut [ModelConfig],
) {
    retry.policy = RetryPolicy::naive(retry.policy.max_attempts);
    retry.budget = BudgetConfig::unlimited();
    retry.shed_client_retries = false;
    retry.throttle = None;
    retry.discourage_caller_retries = false;
    outlier.enabled = false;
    health_check.enabled = false;
    adaptive.enabled = false;
    for b in models.iter_mut().flat_map(|m| &mut m.backends) {
        b.rules = Rules::naive();
    }
}
