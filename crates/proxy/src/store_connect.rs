//! Connecting the gateway to its store: at start, and in the background when the store cannot
//! be reached then.
//!
//! Why (IL-0136): a gateway that exits because its database is down is restarted, exits again,
//! and serves nothing for as long as the database is away; every request fails because no key
//! can be checked. A gateway with a key-cache snapshot does not need its database to check the
//! keys it knew, so it starts without it: requests go through a [`DeferredStore`], which
//! answers `Unavailable` at once (known keys are served from the snapshot, unknown ones get
//! `503 store_unavailable`, the admin API 503), while a background task connects with capped,
//! jittered backoff. When the store answers, the task applies its migrations and the config's
//! tenants, and only then hands it to the handle: from then on the gateway serves from the
//! store exactly as one that found it at start.
//!
//! What is never waited out at start: a store that refuses the configuration (a bad URL, a
//! role or database it does not know, migrations from a newer spillway: `Invalid`), and a store
//! that is down when there is no snapshot to serve from. A gateway that can authenticate nobody is
//! better reported at once, in one line, than started to answer every request with a 503 (the
//! reasons are in docs/tenants.md).

use std::sync::{Arc, Weak};
use std::time::Duration;

use spillway_directory::log_gate::LogGate;
use spillway_policy::Backoff;
use spillway_store::{DeferredStore, PoolOptions, Store, StoreError};
use tracing::{error, info, warn};

use crate::tenants::Bootstrap;

/// Background attempts to connect wait `rand(0, min(cap, base * 2^n))` before the n-th.
pub const RECONNECT: Backoff = Backoff {
    base: Duration::from_secs(1),
    cap: Duration::from_secs(30),
};
/// A failing background attempt is logged at most this often.
pub const LOG_EVERY: Duration = Duration::from_secs(30);

/// What a start does when its first attempt to open the store failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// Start, serve from the snapshot, connect in the background.
    WithoutStore,
    /// Do not start: the reason, in one line.
    Refuse(String),
}

/// The start's decision, given why the store could not be opened and how many keys the
/// snapshot restored.
pub fn on_first_failure(err: &StoreError, snapshot_keys: u64) -> Start {
    match err {
        StoreError::Unavailable(_) if snapshot_keys > 0 => Start::WithoutStore,
        StoreError::Unavailable(_) => Start::Refuse(format!(
            "{err}; no key-cache snapshot to serve from while it is away (cache.snapshot)"
        )),
        other => Start::Refuse(other.to_string()),
    }
}

/// How to open the store and what to write to it before it serves.
pub struct StoreOpening {
    url: String,
    options: PoolOptions,
    bootstrap: Bootstrap,
}

impl StoreOpening {
    pub fn new(url: String, options: PoolOptions, bootstrap: Bootstrap) -> StoreOpening {
        StoreOpening {
            url,
            options,
            bootstrap,
        }
    }

    /// One attempt: opens the store (applying its migrations) and applies the config's tenants.
    pub async fn attempt(&self) -> Result<Arc<dyn Store>, StoreError> {
        let store = spillway_store::open(&self.url, &self.options).await?;
        self.bootstrap.apply(store.as_ref()).await?;
        Ok(store)
    }

    /// Tries again until an attempt succeeds, then connects `handle` to the store. Stops when
    /// the handle is gone (the gateway shut down). An `Invalid` answer is logged as an error and
    /// tried again on the same schedule: the operator may fix the database while this gateway
    /// keeps serving from its snapshot.
    pub async fn keep_trying(self, handle: Weak<DeferredStore>) {
        let gate = LogGate::new(LOG_EVERY);
        let mut failures = 0u32;
        loop {
            let delay = RECONNECT.delay(failures, &mut rand::rng());
            tokio::time::sleep(delay).await;
            if handle.strong_count() == 0 {
                return;
            }
            let result = self.attempt().await;
            let Some(handle) = handle.upgrade() else {
                return;
            };
            match result {
                Ok(store) => {
                    handle.connect(store);
                    info!(
                        failed_attempts = failures + 1,
                        "store connected: migrations and config tenants applied; serving from the store"
                    );
                    return;
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    if let Some(held_back) = gate.pass(crate::clock::now()) {
                        match e {
                            StoreError::Unavailable(_) => warn!(
                                failed_attempts = failures,
                                held_back, "store still unreachable, trying again: {e}"
                            ),
                            _ => error!(
                                failed_attempts = failures,
                                held_back, "store refused the gateway, trying again: {e}"
                            ),
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreachable_store_is_waited_out_only_with_a_snapshot_to_serve_from() {
        let down = StoreError::Unavailable("opening postgres: pool timed out".into());
        assert_eq!(on_first_failure(&down, 3), Start::WithoutStore);
        let Start::Refuse(why) = on_first_failure(&down, 0) else {
            panic!("started with nothing to serve");
        };
        assert!(
            why.contains("cache.snapshot") && !why.contains('\n'),
            "{why}"
        );
    }

    #[test]
    fn a_store_that_refuses_the_configuration_is_never_waited_out() {
        let refused = StoreError::Invalid("opening postgres: role does not exist".into());
        assert!(matches!(on_first_failure(&refused, 3), Start::Refuse(_)));
        assert!(matches!(on_first_failure(&refused, 0), Start::Refuse(_)));
    }

    #[test]
    fn reconnects_back_off_to_a_cap() {
        assert_eq!(RECONNECT.ceiling(0), Duration::from_secs(1));
        assert_eq!(RECONNECT.ceiling(3), Duration::from_secs(8));
        assert_eq!(RECONNECT.ceiling(40), Duration::from_secs(30));
    }
}
