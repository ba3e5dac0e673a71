//! The `[telemetry]` section: where traces go, how many are kept, and how the export is bounded.

use std::time::Duration;

use super::Problems;
use crate::raw::RawTelemetry;
use crate::TelemetryConfig;

/// Spans waiting for export at most (the queue's bound must itself be bounded).
const MAX_EXPORT_QUEUE: u64 = 1_000_000;

pub(super) fn check_telemetry(raw: RawTelemetry, p: &mut Problems) -> TelemetryConfig {
    let otlp_endpoint = raw.otlp_endpoint.filter(|url| {
        let ok = url
            .parse::<http::Uri>()
            .ok()
            .filter(|u| matches!(u.scheme_str(), Some("http" | "https")))
            .is_some_and(|u| u.host().is_some());
        if !ok {
            p.add(
                "telemetry.otlp_endpoint",
                format!("must be an http:// or https:// URL such as http://127.0.0.1:4318/v1/traces, got {url:?}"),
            );
        }
        ok
    });
    let sampling_ratio = raw.sampling_ratio.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&sampling_ratio) {
        p.add(
            "telemetry.sampling_ratio",
            format!("must be between 0 and 1, got {sampling_ratio}"),
        );
    }
    let service_name = raw.service_name.unwrap_or_else(|| "spillway".to_owned());
    if service_name.is_empty() || service_name.len() > 128 {
        p.add("telemetry.service_name", "must be 1 to 128 characters long");
    }
    let export_queue = super::bounded(
        raw.export_queue,
        2048,
        MAX_EXPORT_QUEUE,
        "telemetry.export_queue",
        p,
    );
    let export_batch = super::bounded(
        raw.export_batch,
        512,
        export_queue,
        "telemetry.export_batch",
        p,
    );
    let s = Duration::from_secs;
    TelemetryConfig {
        otlp_endpoint,
        sampling_ratio: sampling_ratio.clamp(0.0, 1.0),
        service_name,
        export_queue: export_queue as usize,
        export_batch: export_batch as usize,
        export_interval: super::positive(raw.export_interval, s(2), "telemetry.export_interval", p),
        export_timeout: super::positive(raw.export_timeout, s(10), "telemetry.export_timeout", p),
    }
}

#[cfg(test)]
mod tests {
    use crate::Config;

    const MODEL: &str = "[[models]]\nname = \"m\"\n[[models.backends]]\nname = \"b\"\nurl = \"http://127.0.0.1:8000/v1\"\n";

    fn problems(section: &str) -> Vec<String> {
        match Config::from_toml(&format!("{section}\n{MODEL}")) {
            Ok(_) => Vec::new(),
            Err(crate::ConfigError::Invalid(ps)) => ps.into_iter().map(|p| p.location).collect(),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn traces_are_off_unless_an_endpoint_is_named() {
        let c = Config::from_toml(MODEL).unwrap();
        assert_eq!(c.telemetry.otlp_endpoint, None);
        assert_eq!(c.telemetry.sampling_ratio, 1.0);
        assert_eq!(c.telemetry.export_queue, 2048);
        let c = Config::from_toml(&format!(
            "[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318/v1/traces\"\nsampling_ratio = 0.25\n{MODEL}"
        ))
        .unwrap();
        assert_eq!(
            c.telemetry.otlp_endpoint.as_deref(),
            Some("http://127.0.0.1:4318/v1/traces")
        );
        assert_eq!(c.telemetry.sampling_ratio, 0.25);
    }

    #[test]
    fn bad_values_are_named() {
        assert_eq!(
            problems("[telemetry]\notlp_endpoint = \"collector:4318\""),
            ["telemetry.otlp_endpoint"]
        );
        assert_eq!(
            problems("[telemetry]\nsampling_ratio = 1.5"),
            ["telemetry.sampling_ratio"]
        );
        assert_eq!(
            problems("[telemetry]\nexport_queue = 0"),
            ["telemetry.export_queue"]
        );
        assert_eq!(
            problems("[telemetry]\nexport_queue = 10\nexport_batch = 20"),
            ["telemetry.export_batch"]
        );
        assert_eq!(
            problems("[telemetry]\nexport_timeout = \"0s\""),
            ["telemetry.export_timeout"]
        );
    }
}
