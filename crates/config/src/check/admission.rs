//! The `[admission]` section: the gateway-wide caps every request passes, how tokens are
//! estimated for tokens-per-minute limits, and the optional Redis that shares tenant limits
//! between instances.

use std::time::Duration;

use super::{bounded, Problems};
use crate::raw::RawAdmission;
use crate::AdmissionConfig;

pub(super) fn check_admission(
    raw: RawAdmission,
    max_body: usize,
    p: &mut Problems,
) -> AdmissionConfig {
    let max_in_flight = bounded(
        raw.max_in_flight,
        2048,
        1_000_000,
        "admission.max_in_flight",
        p,
    );
    let max_buffered = bounded(
        raw.max_buffered_body_bytes,
        256 * 1024 * 1024,
        64 * 1024 * 1024 * 1024,
        "admission.max_buffered_body_bytes",
        p,
    );
    if max_buffered < max_body as u64 {
        p.add(
            "admission.max_buffered_body_bytes",
            format!("must be at least server.max_body_bytes ({max_body}), or no large body could ever be read"),
        );
    }
    // A quarter by default: one slow tenant cannot hold every other tenant's bodies out.
    let max_buffered = max_buffered.max(max_body as u64);
    let per_tenant = raw
        .max_buffered_body_bytes_per_tenant
        .unwrap_or((max_buffered / 4).max(max_body as u64));
    if per_tenant < max_body as u64 || per_tenant > max_buffered {
        p.add(
            "admission.max_buffered_body_bytes_per_tenant",
            format!(
                "must be between server.max_body_bytes ({max_body}) and admission.max_buffered_body_bytes ({max_buffered}), got {per_tenant}"
            ),
        );
    }
    let default_completion_tokens = bounded(
        raw.default_completion_tokens,
        1024,
        10_000_000,
        "admission.default_completion_tokens",
        p,
    );
    let max_queued = bounded(raw.max_queued, 1024, 1_000_000, "admission.max_queued", p);
    let max_queued_per_tenant = bounded(
        raw.max_queued_per_tenant,
        256,
        1_000_000,
        "admission.max_queued_per_tenant",
        p,
    );
    let queue_wait = raw.queue_wait.unwrap_or(Duration::from_secs(5));
    if queue_wait > Duration::from_secs(600) {
        p.add("admission.queue_wait", "must be at most 10m");
    }
    let instances = bounded(
        raw.instances.map(u64::from),
        1,
        10_000,
        "admission.instances",
        p,
    ) as u32;
    if let Some(url) = &raw.redis {
        if !super::metadata::REDIS_URL_SCHEMES
            .iter()
            .any(|k| url.starts_with(k))
        {
            p.add("admission.redis", "must start with redis:// or rediss://");
        }
    }
    if raw.redis.is_some() && raw.redis_env.is_some() {
        p.add(
            "admission.redis",
            "give admission.redis or admission.redis_env, not both",
        );
    }
    if let Some(var) = &raw.redis_env {
        super::check_env_name(var, "admission.redis_env", p);
    }
    let redis_timeout = raw.redis_timeout.unwrap_or(Duration::from_millis(50));
    if redis_timeout.is_zero() {
        p.add("admission.redis_timeout", "must be greater than zero");
    }
    AdmissionConfig {
        max_in_flight: max_in_flight as usize,
        max_buffered_body_bytes: max_buffered,
        max_buffered_body_bytes_per_tenant: per_tenant.clamp(max_body as u64, max_buffered),
        default_completion_tokens,
        max_queued: max_queued as usize,
        max_queued_per_tenant: max_queued_per_tenant.min(max_queued) as usize,
        queue_wait: queue_wait.min(Duration::from_secs(600)),
        redis: raw.redis,
        redis_env: raw.redis_env,
        redis_timeout: redis_timeout.max(Duration::from_millis(1)),
        instances,
        naive: raw.naive.unwrap_or(false),
    }
}
