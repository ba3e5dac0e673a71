//! Black-box tests of the key directory: its public API against a fake store that counts its
//! queries (and can be slow or down), and against the tests' Redis (`spillway_testkit::redis_url`).
//!
//! Tests that wait out a TTL, a stale window, a flush's spread or a slow store run on paused
//! time (`start_paused`): the directory reads tokio's clock, so a sleep through a TTL takes no
//! time at all and what a test measures is that clock, not the machine's speed. Tests of
//! concurrency and of the real Redis run on real time. Either way, conditions are awaited by
//! polling with deadlines.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod api;
mod flush;
mod front;
mod lookups;
mod redis_layer;
mod snapshot;
mod support;
mod warm;
