//! spillway's request path: the OpenAI-compatible server, authentication, routing across backend
//! pools, the pooled upstream client, the streaming relay and the metrics they report.
//!
//! Decisions (which backend, what counts as capacity) are made by `spillway-policy`; this crate
//! does the I/O around them. Errors on the path are one type, `ApiError`, mapped to HTTP in one
//! place.

// Tests may time real processes and sockets on the system clock (see clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

mod admin;
mod admission;
mod affinity;
mod anomaly;
mod answer;
mod attempt;
pub mod auth;
mod call;
mod changes;
mod clock;
mod connections;
mod counters;
pub mod endpoint;
pub mod engine;
pub mod error;
mod files;
mod gateway;
mod genai;
mod handler;
mod health;
mod histograms;
pub mod homes;
mod json_scan;
mod lines;
mod live;
pub mod metrics;
mod mocks;
mod models;
mod page;
mod per_thread;
pub mod pool;
pub mod preflight;
mod probe;
mod registered;
mod relay;
pub mod reload;
pub mod request;
pub mod rollout;
mod server;
pub mod shared_limits;
mod store_connect;
pub mod tenants;
pub mod top;
mod trace;
mod traffic;
mod upstream;
pub mod usage;

pub use gateway::StartError;
pub use server::BoundGateway;
