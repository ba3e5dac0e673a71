//! What each backend's inference engine says about its own load: requests running, requests
//! waiting, KV-cache usage, read from the engine's Prometheus `/metrics`.
//!
//! Why the engine's signals and not only spillway's count of outstanding requests: that count
//! sees only spillway's own requests. Other gateways, batch jobs and direct clients share the
//! same engine, and an engine that accepts a request has not started it: with continuous
//! batching it queues requests once its batch or its KV cache is full, so ten outstanding
//! requests may be ten running or two running and eight waiting. The queue and the KV cache are
//! what decide whether one more request is served now or waits, and only the engine knows them.
//! `sent_since` covers the gap between scrapes: attempts spillway sent after the reading, which
//! the engine could not report yet.
//!
//! Why a stale reading means saturated, never idle (the rule of llm-d's inference scheduler):
//! an engine whose page stops answering is down, wedged, or so busy that its metrics endpoint
//! answers late. Reading its last numbers as current, or the absence of numbers as "nothing
//! running", would send the most traffic to exactly the engine that cannot take it. So a reading
//! older than `engine_metrics.stale_after` is flagged `stale`, and readers count it as full.
//!
//! Why scrape failures are metrics and not errors: a scrape is advisory and fails no request;
//! its failure only lets the reading age into staleness. A warning per scrape (four a second per
//! engine by default) would bury the log while an engine is down, so a failure is counted in
//! `spillway_engine_scrape_errors_total{reason}` and logged at debug once when scrapes start
//! failing and once when they recover.
//!
//! Why this module parses the text format itself: of the crates for it, `prometheus-parse` 0.2.5
//! reads names with `\w+`, so every `vllm:`/`sglang:`/`llamacpp:` sample is silently dropped (it
//! returned no sample from llama.cpp's real page); `openmetrics-parser` is LGPL-3.0, which a
//! statically linked Apache-2.0 binary cannot take on lightly; `prom_text_format_parser` had one
//! release (0.1.0), pins old majors (winnow 0.5, derive_more 0.99, strum 0.25) and fails the
//! whole page on any one line it does not understand; `prometheus-exposition-format-rs` is built
//! on nom 5. What is needed is narrow, three gauges per engine summed over label sets, so
//! `parse.rs` reads exactly those sample lines strictly and passes over the rest; a property
//! test holds that no input makes it panic.

mod load;
pub mod metrics;
mod parse;
mod scrape;

pub(crate) use load::EngineLoads;
pub use load::{EngineLoad, Reading};
pub use parse::{parse, ParseError, Sample};
pub use scrape::spawn_scrapes;
