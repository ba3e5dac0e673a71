//! The `[engine_metrics]` section and each backend's `engine` and `metrics_url`: where spillway
//! reads an inference engine's own load signals, how often, and when an engine counts as full.

use std::time::Duration;

use http::Uri;

use super::resilience::{duration, share};
use super::Problems;
use crate::raw::{RawBackend, RawEngineMetrics};
use crate::{default_metrics_url, Engine, EngineMetricsConfig};

const MAX_PAGE_CAP: u64 = 64 * 1024 * 1024;

pub(super) fn check_engine_metrics(raw: RawEngineMetrics, p: &mut Problems) -> EngineMetricsConfig {
    let at = |key: &str| format!("engine_metrics.{key}");
    let interval = duration(raw.interval, Duration::from_millis(250), &at("interval"), p);
    let timeout = duration(raw.timeout, Duration::from_secs(1), &at("timeout"), p);
    let stale_after = duration(
        raw.stale_after,
        Duration::from_secs(2),
        &at("stale_after"),
        p,
    );
    // A reading must be able to arrive before the last one goes stale, or a healthy engine
    // would flap between fresh and saturated.
    for (other, value) in [("interval", interval), ("timeout", timeout)] {
        if stale_after <= value {
            p.add(
                at("stale_after"),
                format!("must be longer than engine_metrics.{other} ({value:?})"),
            );
        }
    }
    let max_body_bytes = raw.max_body_bytes.unwrap_or(4 * 1024 * 1024);
    if max_body_bytes == 0 || max_body_bytes > MAX_PAGE_CAP {
        p.add(
            at("max_body_bytes"),
            format!("must be between 1 and {MAX_PAGE_CAP}, got {max_body_bytes}"),
        );
    }
    EngineMetricsConfig {
        interval,
        jitter: share(raw.jitter, 0.2, &at("jitter"), p),
        timeout,
        stale_after,
        max_body_bytes: max_body_bytes.clamp(1, MAX_PAGE_CAP) as usize,
        max_queue: raw.max_queue.unwrap_or(2),
        max_kv_usage: share(raw.max_kv_usage, 0.95, &at("max_kv_usage"), p),
    }
}

/// The backend's engine and the page to scrape. The page defaults to the backend URL's scheme
/// and authority with `/metrics`; a mock's is resolved once it listens, so it stays `None` here.
pub(super) fn check_backend_engine(
    b: &RawBackend,
    at: &str,
    p: &mut Problems,
) -> (Engine, Option<Uri>) {
    let kind = b.kind.as_deref().unwrap_or("openai");
    let engine = match b.engine.as_deref() {
        // Azure OpenAI serves no engine metrics.
        None if kind == "azure" => Engine::None,
        None => Engine::Auto,
        Some(text) => Engine::CHOICES
            .into_iter()
            .find(|e| e.as_str() == text)
            .unwrap_or_else(|| {
                p.add(
                    format!("{at}.engine"),
                    format!(
                        "unknown engine {text:?}: expected \"vllm\", \"sglang\", \"llamacpp\", \
                         \"tgi\", \"auto\" or \"none\""
                    ),
                );
                Engine::None
            }),
    };
    let given = b
        .metrics_url
        .as_ref()
        .and_then(|text| match text.parse::<Uri>() {
            Ok(u) if matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some() => {
                Some(u)
            }
            _ => {
                p.add(
                    format!("{at}.metrics_url"),
                    format!("{text:?} is not an http(s) URL"),
                );
                None
            }
        });
    if engine == Engine::None {
        if b.metrics_url.is_some() {
            p.add(
                format!("{at}.metrics_url"),
                "is not scraped when engine is \"none\" (the default for kind \"azure\")",
            );
        }
        return (Engine::None, None);
    }
    let url = given.or_else(|| match kind {
        "mock" => None,
        _ => b
            .url
            .as_ref()
            .and_then(|u| u.parse::<Uri>().ok())
            .and_then(|u| default_metrics_url(&u)),
    });
    (engine, url)
}
