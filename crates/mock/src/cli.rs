//! `spillway mock-backend`: the flags and the process around a [`MockServer`].
//!
//! The flags are defined here, beside the profile they fill, so the binary only forwards them
//! and a new knob is one edit. Defaults come from [`MockProfile::default`], never restated, and
//! the flags are checked with the same [`MockProfile::problems`] as a config file's mock backend.

use std::future::Future;
use std::io::{self, Write};
use std::net::SocketAddr;

use spillway_config::MockProfile;

use crate::MockServer;

/// Flags of `spillway mock-backend`.
#[derive(Debug, Clone, clap::Args)]
pub struct MockArgs {
    /// Address to listen on (port 0 picks a free port; the chosen address is printed).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    /// Model name to serve; repeat for several.
    #[arg(long = "model", value_name = "NAME", default_values_t = MockProfile::default().models)]
    pub models: Vec<String>,
    /// Requests generated at once.
    #[arg(long, default_value_t = MockProfile::default().capacity)]
    pub capacity: u32,
    /// Requests that may wait for a generation slot; beyond it the server answers 429.
    #[arg(long, default_value_t = MockProfile::default().queue)]
    pub queue: u32,
    /// Time to first token, e.g. 50ms.
    #[arg(long, value_name = "DURATION", default_value_t = MockProfile::default().ttft.into())]
    pub ttft: humantime::Duration,
    /// Output tokens per second after the first (0: no delay between tokens).
    #[arg(long, value_name = "RATE", default_value_t = MockProfile::default().tokens_per_sec)]
    pub tokens_per_sec: f64,
    /// Output tokens when a request asks for none or for more.
    #[arg(long, value_name = "N", default_value_t = MockProfile::default().max_output_tokens)]
    pub max_output_tokens: u32,
    /// Length of embedding vectors.
    #[arg(long, value_name = "N", default_value_t = MockProfile::default().embedding_dim)]
    pub embedding_dim: u32,
    /// Prompt tokens per second prefilled before the first token (0: prefill is free).
    #[arg(long, value_name = "RATE", default_value_t = MockProfile::default().prefill_tokens_per_sec)]
    pub prefill_tokens_per_sec: f64,
    /// KV-cache size in tokens, for the usage `/metrics` reports.
    #[arg(long, value_name = "N", default_value_t = MockProfile::default().kv_cache_tokens)]
    pub kv_cache_tokens: u32,
    /// Prompt blocks the prefix cache remembers (0: no prefix cache).
    #[arg(long, value_name = "N", default_value_t = MockProfile::default().prefix_cache_entries)]
    pub prefix_cache_entries: u32,
    /// Characters per prefix-cache block.
    #[arg(long, value_name = "N", default_value_t = MockProfile::default().prefix_chars)]
    pub prefix_chars: u32,
    /// Share of requests answered with --error-status, from 0 to 1.
    #[arg(long, value_name = "RATE", default_value_t = MockProfile::default().fault.error_rate)]
    pub error_rate: f64,
    /// Status of injected errors.
    #[arg(long, value_name = "STATUS", default_value_t = MockProfile::default().fault.error_status)]
    pub error_status: u16,
    /// `Retry-After` sent with injected errors, e.g. 2s.
    #[arg(long, value_name = "DURATION")]
    pub retry_after: Option<humantime::Duration>,
    /// Share of requests that hang for --stall before being served, from 0 to 1.
    #[arg(long, value_name = "RATE", default_value_t = MockProfile::default().fault.stall_rate)]
    pub stall_rate: f64,
    /// How long a stalled request hangs.
    #[arg(long, value_name = "DURATION", default_value_t = MockProfile::default().fault.stall.into())]
    pub stall: humantime::Duration,
    /// Share of connections reset before any response byte, from 0 to 1.
    #[arg(long, value_name = "RATE", default_value_t = MockProfile::default().fault.reset_rate)]
    pub reset_rate: f64,
    /// Break every stream off after N events of a chat or completions stream, or N tokens of a
    /// Responses or Messages stream (never sending the stream's last event, e.g. `[DONE]`).
    #[arg(long, value_name = "N")]
    pub break_stream_after: Option<u32>,
    /// Answer `/metrics` with this status instead of the metrics.
    #[arg(long, value_name = "STATUS")]
    pub metrics_error_status: Option<u16>,
    /// Hang this long before answering `/metrics`, e.g. 2s.
    #[arg(long, value_name = "DURATION")]
    pub metrics_stall: Option<humantime::Duration>,
    /// Answer 400 unsupported_parameter to inference requests whose body sets this field, e.g. tools.
    #[arg(long, value_name = "NAME")]
    pub reject_field: Option<String>,
    /// Require `Authorization: Bearer KEY`, `api-key: KEY` or `x-api-key: KEY`, with KEY read
    /// from this environment variable (the key itself never appears on the command line).
    #[arg(long, value_name = "VAR")]
    pub require_api_key_env: Option<String>,
}

impl MockArgs {
    /// The profile these flags describe, or every problem with it on one line.
    pub fn profile(&self) -> Result<MockProfile, String> {
        let profile = MockProfile {
            models: self.models.clone(),
            capacity: self.capacity,
            queue: self.queue,
            ttft: self.ttft.into(),
            tokens_per_sec: self.tokens_per_sec,
            max_output_tokens: self.max_output_tokens,
            embedding_dim: self.embedding_dim,
            prefill_tokens_per_sec: self.prefill_tokens_per_sec,
            kv_cache_tokens: self.kv_cache_tokens,
            prefix_cache_entries: self.prefix_cache_entries,
            prefix_chars: self.prefix_chars,
            fault: spillway_config::MockFault {
                error_rate: self.error_rate,
                error_status: self.error_status,
                retry_after: self.retry_after.map(Into::into),
                stall_rate: self.stall_rate,
                stall: self.stall.into(),
                reset_rate: self.reset_rate,
                break_stream_after: self.break_stream_after,
                metrics_error_status: self.metrics_error_status,
                metrics_stall: self.metrics_stall.map(Into::into),
                reject_field: self.reject_field.clone(),
            },
        };
        let problems = profile.problems();
        if problems.is_empty() {
            return Ok(profile);
        }
        let listed: Vec<String> = problems
            .iter()
            .map(|(field, message)| format!("{field} {message}"))
            .collect();
        Err(format!("invalid mock profile: {}", listed.join("; ")))
    }

    /// The key named by `--require-api-key-env`, which must be set and non-empty.
    pub fn required_key(&self) -> Result<Option<String>, String> {
        let Some(var) = &self.require_api_key_env else {
            return Ok(None);
        };
        match std::env::var(var) {
            Ok(key) if !key.is_empty() => Ok(Some(key)),
            _ => Err(format!(
                "--require-api-key-env {var}: the environment variable is not set or empty"
            )),
        }
    }
}

/// Runs `spillway mock-backend`: checks the flags, binds, prints
/// `mock-backend listening on http://ADDR` as the first stdout line, and serves until `shutdown`.
pub async fn run(
    args: MockArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let invalid = |e: String| io::Error::new(io::ErrorKind::InvalidInput, e);
    let profile = args.profile().map_err(invalid)?;
    let key = args.required_key().map_err(invalid)?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {}: {e}", args.listen)))?;
    let addr = listener.local_addr()?;
    {
        // A closed stdout must not stop the server; the line is for whoever is reading.
        let mut out = io::stdout().lock();
        let _ = writeln!(out, "mock-backend listening on http://{addr}");
        let _ = out.flush();
    }
    MockServer::new(profile)
        .with_required_key(key)
        .serve(listener, shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::time::Duration;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        mock: MockArgs,
    }

    fn parse(args: &[&str]) -> MockArgs {
        Cli::try_parse_from(std::iter::once("mock").chain(args.iter().copied()))
            .unwrap()
            .mock
    }

    #[test]
    fn no_flags_give_the_default_profile() {
        assert_eq!(parse(&[]).profile().unwrap(), MockProfile::default());
    }

    #[test]
    fn flags_fill_the_profile() {
        let p = parse(&[
            "--model",
            "a",
            "--model",
            "b",
            "--ttft",
            "50ms",
            "--tokens-per-sec",
            "0",
            "--error-rate",
            "0.5",
            "--error-status",
            "503",
            "--retry-after",
            "1500ms",
            "--break-stream-after",
            "3",
            "--prefill-tokens-per-sec",
            "1000",
            "--prefix-cache-entries",
            "0",
            "--metrics-stall",
            "2s",
            "--reject-field",
            "response_format",
        ])
        .profile()
        .unwrap();
        assert_eq!(p.models, ["a", "b"]);
        assert_eq!(p.ttft, Duration::from_millis(50));
        assert_eq!(p.tokens_per_sec, 0.0);
        assert_eq!(p.fault.error_status, 503);
        assert_eq!(p.fault.retry_after, Some(Duration::from_millis(1500)));
        assert_eq!(p.fault.break_stream_after, Some(3));
        assert_eq!(p.prefill_tokens_per_sec, 1000.0);
        assert_eq!(p.prefix_cache_entries, 0);
        assert_eq!(p.fault.metrics_stall, Some(Duration::from_secs(2)));
        assert_eq!(p.fault.reject_field.as_deref(), Some("response_format"));
    }

    #[test]
    fn invalid_flags_are_reported_together() {
        let e = parse(&["--capacity", "0", "--reset-rate", "2", "--reject-field", ""])
            .profile()
            .unwrap_err();
        assert!(
            e.contains("capacity")
                && e.contains("fault.reset_rate")
                && e.contains("fault.reject_field"),
            "{e}"
        );
    }
}
