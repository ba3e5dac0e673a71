//! The lookup with every protection off, so that `spillway replay cache-flush --naive` can show
//! what they prevent.
//!
//! This is the cache of IL-0136: a fresh answer is served, and anything else (a miss, an answer
//! past its TTL, every answer after a flush) is a store query made by the lookup itself. There
//! is no single flight (ten concurrent lookups of one key are ten queries), no cap on queries in
//! flight (the connection pool is the only bound), no stale answer when the store fails (the
//! lookup fails), and no Redis. Enabled by `CacheConfig::naive`; never for production.

use std::sync::atomic::Ordering;

use spillway_store::KeyDigest;
use tokio::time::Instant;

use crate::flight::Answer;
use crate::freshness::State as Freshness;
use crate::load::served;
use crate::state::State;
use crate::{DirectoryError, Lookup, Outcome};

impl State {
    pub(crate) async fn lookup_naive(&self, digest: &KeyDigest) -> Result<Lookup, DirectoryError> {
        let now = Instant::now();
        let epoch = self.epoch.load(Ordering::SeqCst);
        if let Some(entry) = self.known.get(digest) {
            if self.judge(&entry, now, epoch) == Freshness::Fresh {
                return Ok(served(&entry, Outcome::Fresh));
            }
        } else if self.unknown.get(digest).is_some_and(|u| now < u.until) {
            return Ok(Lookup {
                found: None,
                outcome: Outcome::Negative,
            });
        }
        let seq = self.invalidations.load(Ordering::SeqCst);
        let found = self
            .query_store(digest, None)
            .await
            .map_err(DirectoryError::Unavailable)?;
        let found = match self.adopt_store(digest, found, epoch, seq) {
            Answer::Found(found, _) => Some(found),
            _ => None,
        };
        Ok(Lookup {
            found,
            outcome: Outcome::Miss,
        })
    }
}
