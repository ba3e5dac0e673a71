//! Single flight: at most one load per key at a time, whoever asks and however often.
//!
//! IL-0136 began with a flushed cache at peak: every request for a key missed at once, and each
//! miss went to the database. Here the first lookup of a missing key becomes the leader of a
//! flight (a spawned task that does the loading), and every lookup of that key that arrives
//! while it is in the air waits for the same answer instead of asking the store again.
//! Background refreshes are flights too, so a key is never loaded and refreshed at once either.
//! Nor one after the other: a flight that starts just after another of its key landed (its
//! lookup looked at the cache before that) takes the answer the other left there.
//!
//! The flight is a spawned task rather than the leader's own future, so that a caller who gives
//! up (a client that disconnects) does not cancel a query the others are waiting for, and the
//! answer still reaches the cache. A flight leaves the map when it lands, through a guard, so
//! even a panicking load cannot leave its key waiting on an answer that never comes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use spillway_store::{KeyDigest, KeyMatch};
use tokio::sync::watch;

use crate::entry::Entry;
use crate::{Lookup, Outcome};

/// What a flight brings back.
#[derive(Debug, Clone)]
pub(crate) enum Answer {
    Found(Arc<KeyMatch>, Source),
    Unknown(Source),
    /// What the cache held when the flight started: another flight of the key had landed
    /// since the lookup that started this one looked.
    Cached(Lookup),
    /// No answer (store error, timeout, no free load slot). `fallback` is a usable older
    /// answer, if the flight had one, for every waiter to serve instead.
    Failed {
        why: String,
        fallback: Option<Arc<Entry>>,
    },
}

/// Where an answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    Store,
    Redis,
}

impl Source {
    pub fn outcome(self) -> Outcome {
        match self {
            Source::Store => Outcome::Miss,
            Source::Redis => Outcome::RedisHit,
        }
    }
}

pub(crate) type Waiter = watch::Receiver<Option<Answer>>;

/// The one who loads; the others hold a [`Waiter`] of its answer.
pub(crate) struct Leader {
    pub id: u64,
    pub answer: watch::Sender<Option<Answer>>,
}

pub(crate) enum Joined {
    /// A flight was in the air: wait for its answer.
    Existing(Waiter),
    /// None was: this lookup leads a new one.
    Started(Leader, Waiter),
}

#[derive(Default)]
pub(crate) struct Flights {
    in_air: Mutex<HashMap<KeyDigest, (u64, Waiter)>>,
    next_id: AtomicU64,
}

impl Flights {
    /// Joins the flight of this key, or starts one.
    pub fn join_or_lead(&self, digest: &KeyDigest) -> Joined {
        let mut in_air = self.in_air.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, waiter)) = in_air.get(digest) {
            return Joined::Existing(waiter.clone());
        }
        let (leader, waiter) = self.new_flight();
        in_air.insert(*digest, (leader.id, waiter.clone()));
        Joined::Started(leader, waiter)
    }

    /// Starts a flight only if none is in the air (a refresh never queues behind a load).
    pub fn lead_if_idle(&self, digest: &KeyDigest) -> Option<Leader> {
        let mut in_air = self.in_air.lock().unwrap_or_else(|e| e.into_inner());
        if in_air.contains_key(digest) {
            return None;
        }
        let (leader, waiter) = self.new_flight();
        in_air.insert(*digest, (leader.id, waiter));
        Some(leader)
    }

    pub fn is_in_air(&self, digest: &KeyDigest) -> bool {
        let in_air = self.in_air.lock().unwrap_or_else(|e| e.into_inner());
        in_air.contains_key(digest)
    }

    /// The flight `id` landed: later lookups no longer join it.
    pub fn land(&self, digest: &KeyDigest, id: u64) {
        let mut in_air = self.in_air.lock().unwrap_or_else(|e| e.into_inner());
        if in_air
            .get(digest)
            .is_some_and(|(current, _)| *current == id)
        {
            in_air.remove(digest);
        }
    }

    /// Later lookups of this key start a new flight: the one in the air may carry an answer
    /// from before an invalidation. Its waiters still get it.
    pub fn detach(&self, digest: &KeyDigest) {
        let mut in_air = self.in_air.lock().unwrap_or_else(|e| e.into_inner());
        in_air.remove(digest);
    }

    pub fn detach_all(&self) {
        let mut in_air = self.in_air.lock().unwrap_or_else(|e| e.into_inner());
        in_air.clear();
    }

    pub fn len(&self) -> usize {
        let in_air = self.in_air.lock().unwrap_or_else(|e| e.into_inner());
        in_air.len()
    }

    fn new_flight(&self) -> (Leader, Waiter) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (answer, waiter) = watch::channel(None);
        (Leader { id, answer }, waiter)
    }
}

/// Lands a flight when dropped, whether its load finished or panicked.
pub(crate) struct Landing {
    pub flights: Arc<Flights>,
    pub digest: KeyDigest,
    pub id: u64,
}

impl Drop for Landing {
    fn drop(&mut self) {
        self.flights.land(&self.digest, self.id);
    }
}

/// Waits for a flight's answer; `None` if the flight ended without one (its task panicked or
/// the runtime is shutting down).
pub(crate) async fn answer_of(mut waiter: Waiter) -> Option<Answer> {
    let answer = waiter.wait_for(Option::is_some).await.ok()?;
    answer.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_second_asker_joins_and_a_refresh_never_queues() {
        let flights = Flights::default();
        let d = [1u8; 32];
        let Joined::Started(leader, _) = flights.join_or_lead(&d) else {
            panic!("first should lead");
        };
        assert!(matches!(flights.join_or_lead(&d), Joined::Existing(_)));
        assert!(flights.lead_if_idle(&d).is_none());
        flights.land(&d, leader.id);
        assert!(!flights.is_in_air(&d));
        assert!(flights.lead_if_idle(&d).is_some());
    }

    #[test]
    fn a_detached_flight_does_not_land_its_successor() {
        let flights = Flights::default();
        let d = [2u8; 32];
        let Joined::Started(old, _) = flights.join_or_lead(&d) else {
            panic!("first should lead");
        };
        flights.detach(&d);
        let Joined::Started(_new, _) = flights.join_or_lead(&d) else {
            panic!("a detached key gets a new flight");
        };
        flights.land(&d, old.id);
        assert!(
            flights.is_in_air(&d),
            "the old flight's landing removed the new one"
        );
    }

    #[tokio::test]
    async fn waiters_see_nothing_when_the_leader_vanishes() {
        let flights = Flights::default();
        let Joined::Started(leader, waiter) = flights.join_or_lead(&[3; 32]) else {
            panic!("first should lead");
        };
        drop(leader);
        assert!(answer_of(waiter).await.is_none());
    }
}
