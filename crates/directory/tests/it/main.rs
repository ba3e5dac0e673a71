//! Black-box tests of the key directory: its public API against a fake store that counts its
//! queries (and can be slow or down), and against the real Redis on 127.0.0.1:6379.
//!
//! The async cache runs on real time with short durations; conditions are awaited by polling
//! with deadlines, and sleeps are used only to let a TTL pass.

mod api;
mod flush;
mod lookups;
mod redis_layer;
mod snapshot;
mod support;
mod warm;
