//! spillway-testkit: what spillway's tests share, written once.
//!
//! Every crate's tests wait for conditions, start child processes, reach the test PostgreSQL
//! and Redis, and (most of them) speak HTTP. Written again in each test's support module, the
//! copies drifted: poll intervals of 2 to 20 ms, a deadline checked before or after the last
//! try, a service found at a hard-coded address here and through a variable there, and a
//! database that was absent skipping a test in one crate and failing it in another. This crate
//! holds the one version of each, and is only ever a dev-dependency (`publish = false`).
//!
//! - [`eventually`], [`eventually_blocking`]: poll a condition until it holds, or fail naming
//!   it when the deadline passes; never a fixed sleep that hopes the condition is met.
//! - [`wait_exit`]: a child process's exit, within a deadline.
//! - [`postgres_url`], [`redis_url`]: the test services, from `SPILLWAY_TEST_POSTGRES_URL` and
//!   `SPILLWAY_TEST_REDIS_URL`; a service that is not there fails the test, naming its variable.
//! - [`closed_port`]: a port on 127.0.0.1 where nothing listens.
//! - `http` (feature `http`): a client, JSON fetches, the OpenAI error shape, SSE payloads.
//! - `key_match`, `digest`, `FakeStore` (feature `store`): a key's answer from the store, and a
//!   store of such answers that counts its queries, for tests of the key caches.
//!
//! The process RSS reader is not here: the replay reports RSS, so its reader is product code
//! (`spillway_replay::resident_bytes`), and tests that measure RSS use that one rather than a
//! second definition that could read `/proc` differently.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

#[cfg(feature = "http")]
pub mod http;
mod net;
mod poll;
mod services;
#[cfg(feature = "store")]
mod store;

pub use net::closed_port;
pub use poll::{eventually, eventually_blocking, wait_exit, POLL_EVERY};
pub use services::{
    postgres_url, redis_authority, redis_url, DEFAULT_POSTGRES_URL, DEFAULT_REDIS_URL,
    POSTGRES_URL_VAR, REDIS_URL_VAR,
};
#[cfg(feature = "store")]
pub use store::{digest, key_match, FakeStore};
