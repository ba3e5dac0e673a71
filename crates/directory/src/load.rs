//! A lookup's path: the in-process cache, then a flight to Redis and the store.
//!
//! Fresh answers are served as they are. Stale ones are served at once, and one background
//! refresh is started if a load slot is free right now (a refresh never waits for one: when the
//! store is busy, refreshes are what gives way). Anything else waits for a flight: Redis first
//! (bounded by `redis_timeout`), then a load slot (bounded by `load_wait`), then the store
//! (bounded by `load_timeout`). When the flight fails, a usable older answer stands in, from
//! this cache or from Redis, and is kept as a stale entry whose refreshes back off, so that a
//! store outage costs each key one failed query now and then rather than one per request.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use spillway_store::{KeyDigest, KeyMatch};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tracing::warn;

use crate::entry::{Entry, Unknown};
use crate::flight::{answer_of, Answer, Joined, Landing, Leader, Source};
use crate::freshness::{self, State as Freshness, Window};
use crate::front;
use crate::shared::SharedAnswer;
use crate::state::State;
use crate::{metrics, unix_ms, DirectoryError, Lookup, Outcome};

/// Why a flight flies.
enum Mode {
    /// A lookup waits for it; `fallback` is what that lookup had (an answer from before a
    /// flush).
    Wait { fallback: Option<Arc<Entry>> },
    /// A background refresh of `stale`, with its load slot already taken.
    Refresh {
        permit: OwnedSemaphorePermit,
        stale: Arc<Entry>,
    },
}

/// What a Redis answer is good for.
enum FromShared {
    Answer(Answer),
    Fallback(Arc<Entry>),
    Nothing,
}

impl State {
    /// The answer for `digest` at `now`, from the cache or a load.
    pub async fn lookup(
        self: &Arc<Self>,
        digest: &KeyDigest,
        now: Instant,
    ) -> Result<Lookup, DirectoryError> {
        match self.cached(digest, now) {
            Ok(answer) => Ok(answer),
            Err(fallback) => self.load(digest, fallback).await,
        }
    }

    /// The answer for `digest` at `now` if the cache has one (fresh, stale with a refresh
    /// started, or remembered as unknown); otherwise what a load may fall back on (an entry
    /// awaiting revalidation after a flush).
    pub fn cached(
        self: &Arc<Self>,
        digest: &KeyDigest,
        now: Instant,
    ) -> Result<Lookup, Option<Arc<Entry>>> {
        self.cached_as(digest, now, Lookup::of)
    }

    /// [`State::cached`], the answer made by `answer` of the cached one, lent: from this
    /// thread's front it is read where it lies, with no reference count taken.
    pub fn cached_as<R>(
        self: &Arc<Self>,
        digest: &KeyDigest,
        now: Instant,
        answer: impl Fn(Option<&Arc<KeyMatch>>, Outcome) -> R,
    ) -> Result<R, Option<Arc<Entry>>> {
        let epoch = self.epoch.load(Ordering::SeqCst);
        let front = self.front_allowed();
        if front {
            let fresh = |entry: &Entry| {
                let fresh = self.judge(entry, now, epoch) == Freshness::Fresh;
                fresh.then(|| answer(Some(&entry.found), Outcome::Fresh))
            };
            if let Some(answer) = front::answer(self.front_owner, digest, fresh) {
                return Ok(answer);
            }
        }
        if let Some(entry) = self.known.get(digest) {
            return match self.judge(&entry, now, epoch) {
                Freshness::Fresh => {
                    if front {
                        front::put(self.front_owner, digest, &entry);
                    }
                    Ok(answer(Some(&entry.found), Outcome::Fresh))
                }
                Freshness::Stale => {
                    self.start_refresh(digest, &entry, now);
                    Ok(answer(Some(&entry.found), Outcome::Stale))
                }
                Freshness::Revalidate => Err(Some(entry)),
                Freshness::Expired => Err(None),
            };
        }
        if self.unknown.get(digest).is_some_and(|u| now < u.until) {
            return Ok(answer(None, Outcome::Negative));
        }
        Err(None)
    }

    async fn load(
        self: &Arc<Self>,
        digest: &KeyDigest,
        fallback: Option<Arc<Entry>>,
    ) -> Result<Lookup, DirectoryError> {
        let waiter = match self.flights.join_or_lead(digest) {
            Joined::Existing(waiter) => waiter,
            Joined::Started(leader, waiter) => {
                let mode = Mode::Wait {
                    fallback: fallback.clone(),
                };
                tokio::spawn(self.clone().fly(*digest, leader, mode));
                waiter
            }
        };
        let (why, their_fallback) = match answer_of(waiter).await {
            Some(Answer::Found(found, source)) => {
                return Ok(Lookup {
                    found: Some(found),
                    outcome: source.outcome(),
                })
            }
            Some(Answer::Unknown(source)) => {
                return Ok(Lookup {
                    found: None,
                    outcome: source.outcome(),
                })
            }
            Some(Answer::Cached(lookup)) => return Ok(lookup),
            Some(Answer::Failed { why, fallback }) => (why, fallback),
            None => ("the load was abandoned".to_owned(), None),
        };
        let now = Instant::now();
        match fallback
            .into_iter()
            .chain(their_fallback)
            .find(|e| e.usable(now))
        {
            Some(entry) => Ok(served(&entry, Outcome::Stale)),
            None => Err(DirectoryError::Unavailable(why)),
        }
    }

    /// Starts one background refresh of a stale entry, unless its last refresh failed
    /// recently, one is in the air, or no load slot is free right now.
    fn start_refresh(self: &Arc<Self>, digest: &KeyDigest, stale: &Arc<Entry>, now: Instant) {
        if !stale.refresh_due(now) || self.flights.is_in_air(digest) {
            return;
        }
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            self.counts
                .refreshes_skipped
                .fetch_add(1, Ordering::Relaxed);
            return;
        };
        let Some(leader) = self.flights.lead_if_idle(digest) else {
            return;
        };
        let mode = Mode::Refresh {
            permit,
            stale: stale.clone(),
        };
        tokio::spawn(self.clone().fly(*digest, leader, mode));
    }

    async fn fly(self: Arc<Self>, digest: KeyDigest, leader: Leader, mode: Mode) {
        let landing = Landing {
            flights: self.flights.clone(),
            digest,
            id: leader.id,
        };
        if let Some(lookup) = self.landed_before(&digest, &mode) {
            drop(landing);
            leader.answer.send_replace(Some(Answer::Cached(lookup)));
            return;
        }
        let epoch = self.epoch.load(Ordering::SeqCst);
        let seq = self.invalidations.load(Ordering::SeqCst);
        let (mine, permit) = match mode {
            Mode::Wait { fallback } => (fallback, None),
            Mode::Refresh { permit, stale } => (Some(stale), Some(permit)),
        };
        let mut answer = self.resolve(&digest, permit, epoch, seq).await;
        if let Answer::Failed { fallback, .. } = &mut answer {
            let now = Instant::now();
            let usable = mine
                .into_iter()
                .chain(fallback.take())
                .find(|e| e.usable(now));
            *fallback = usable.map(|old| self.keep_as_stale(&digest, &old, now, epoch, seq));
        }
        // Land before answering: from here on a lookup finds the cache, not this flight.
        drop(landing);
        leader.answer.send_replace(Some(answer));
    }

    /// The answer another flight of `digest` put in the cache after this flight's lookup looked
    /// there and before this flight started (its thread was preempted in between, say): what
    /// a lookup finds now for a waiting flight; a newer entry than the stale one for a refresh.
    /// Without it a key could be asked for twice in a row.
    fn landed_before(self: &Arc<Self>, digest: &KeyDigest, mode: &Mode) -> Option<Lookup> {
        let now = Instant::now();
        match mode {
            // This flight is in the air, so a stale answer found here starts no refresh.
            Mode::Wait { .. } => self.cached(digest, now).ok(),
            Mode::Refresh { stale, .. } => {
                let entry = self.known.get(digest)?;
                let epoch = self.epoch.load(Ordering::SeqCst);
                let newer = !Arc::ptr_eq(&entry, stale)
                    && self.judge(&entry, now, epoch) == Freshness::Fresh;
                newer.then(|| served(&entry, Outcome::Fresh))
            }
        }
    }

    /// The older answer that stands in for a failed load stays cached as a stale entry of this
    /// epoch, with its refreshes backing off; its window (and so its age limit) is unchanged.
    fn keep_as_stale(
        &self,
        digest: &KeyDigest,
        old: &Arc<Entry>,
        now: Instant,
        epoch: u64,
        seq: u64,
    ) -> Arc<Entry> {
        let kept = if old.epoch == epoch && old.window.fresh_until <= now {
            old.clone()
        } else {
            let window = Window {
                fresh_until: old.window.fresh_until.min(now),
                stale_until: old.window.stale_until,
            };
            Arc::new(Entry::new(
                old.found.clone(),
                window,
                old.fetched_at_ms,
                epoch,
            ))
        };
        kept.refresh_failed(now);
        // Never over an answer that arrived meanwhile (a warm-up page, say).
        let replace = match self.known.get(digest) {
            None => true,
            Some(c) => !Arc::ptr_eq(&c, &kept) && (Arc::ptr_eq(&c, old) || !c.usable(now)),
        };
        if replace {
            self.insert_known(digest, kept.clone(), seq);
        }
        kept
    }

    /// Redis, then a load slot, then the store.
    async fn resolve(
        &self,
        digest: &KeyDigest,
        permit: Option<OwnedSemaphorePermit>,
        epoch: u64,
        seq: u64,
    ) -> Answer {
        let mut shared_fallback = None;
        if let Some(shared) = &self.shared {
            if let Some(answer) = shared.get(digest).await {
                match self.adopt_shared(digest, answer, epoch, seq) {
                    FromShared::Answer(answer) => return answer,
                    FromShared::Fallback(entry) => shared_fallback = Some(entry),
                    FromShared::Nothing => {}
                }
            }
        }
        let permit = match permit {
            Some(permit) => permit,
            None => {
                let wait = self.config.load_wait;
                let acquire = self.permits.clone().acquire_owned();
                match tokio::time::timeout(wait, acquire).await {
                    Ok(Ok(permit)) => permit,
                    _ => {
                        return Answer::Failed {
                            why: format!(
                                "{} store lookups in flight and none finished within {wait:?}",
                                self.config.max_concurrent_loads
                            ),
                            fallback: shared_fallback,
                        }
                    }
                }
            }
        };
        match self.query_store(digest, Some(permit)).await {
            Ok(found) => self.adopt_store(digest, found, epoch, seq),
            Err(why) => Answer::Failed {
                why,
                fallback: shared_fallback,
            },
        }
    }

    /// One store query under a load slot (none only in naive mode), counted, timed and
    /// bounded by `load_timeout`. Returns the answer with the time it was asked (Unix ms) and
    /// how long it took.
    pub(crate) async fn query_store(
        &self,
        digest: &KeyDigest,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Result<Option<(KeyMatch, u64, Duration)>, String> {
        let limit = self.config.load_timeout;
        let asked_at_ms = unix_ms();
        let started = Instant::now();
        let result = tokio::time::timeout(limit, self.store.lookup(digest)).await;
        let took = started.elapsed();
        drop(permit);
        self.counts.store_queries.fetch_add(1, Ordering::Relaxed);
        let error = match result {
            Ok(Ok(Some(found))) => {
                metrics::store_query("ok", took);
                self.warm.store(true, Ordering::Release);
                return Ok(Some((found, asked_at_ms, took)));
            }
            Ok(Ok(None)) => {
                metrics::store_query("not_found", took);
                self.warm.store(true, Ordering::Release);
                return Ok(None);
            }
            Ok(Err(e)) => format!("store: {e}"),
            Err(_) => format!("store gave no answer within {limit:?}"),
        };
        metrics::store_query("error", took);
        self.store_failed(&error);
        Err(error)
    }

    pub(crate) fn store_failed(&self, error: &str) {
        self.counts.store_errors.fetch_add(1, Ordering::Relaxed);
        if let Some(held_back) = self.store_log.pass(Instant::now().into_std()) {
            warn!(
                error,
                similar_errors_not_logged = held_back,
                "key lookup: store query failed; serving stale answers where there are any"
            );
        }
    }

    pub(crate) fn adopt_store(
        &self,
        digest: &KeyDigest,
        found: Option<(KeyMatch, u64, Duration)>,
        epoch: u64,
        seq: u64,
    ) -> Answer {
        let c = &self.config;
        let now = Instant::now();
        let Some((found, asked_at_ms, took)) = found else {
            let kept = freshness::negative_until(now, Duration::ZERO, c.negative_ttl)
                .is_some_and(|until| self.insert_unknown(digest, Unknown { until }, seq));
            if let (true, Some(shared)) = (kept, &self.shared) {
                let answer = SharedAnswer {
                    fetched_at_ms: unix_ms(),
                    found: None,
                };
                shared.put(digest, &answer, c.negative_ttl);
            }
            return Answer::Unknown(Source::Store);
        };
        let u = rand::random::<f64>();
        let found = Arc::new(found);
        // The answer's age is counted from when it was asked for.
        if let Some(window) =
            freshness::window_for_age(now, took, c.ttl, c.ttl_jitter, c.stale_for, u)
        {
            let entry = Arc::new(Entry::new(found.clone(), window, asked_at_ms, epoch));
            if let (true, Some(shared)) = (self.insert_known(digest, entry, seq), &self.shared) {
                let answer = SharedAnswer {
                    fetched_at_ms: asked_at_ms,
                    found: Some((*found).clone()),
                };
                shared.put(digest, &answer, c.ttl + c.stale_for);
            }
        }
        Answer::Found(found, Source::Store)
    }

    /// A Redis answer younger than the TTL (and than the last flush) is used as it is; an
    /// older one that is still within its stale window is only a fallback for the store.
    fn adopt_shared(
        &self,
        digest: &KeyDigest,
        answer: SharedAnswer,
        epoch: u64,
        seq: u64,
    ) -> FromShared {
        let c = &self.config;
        let now = Instant::now();
        let age = freshness::age_ms(unix_ms(), answer.fetched_at_ms);
        let current = answer.fetched_at_ms >= self.flushed_at_ms.load(Ordering::SeqCst);
        let Some(found) = answer.found else {
            return match freshness::negative_until(now, age, c.negative_ttl) {
                Some(until) if current => {
                    self.warm.store(true, Ordering::Release);
                    self.insert_unknown(digest, Unknown { until }, seq);
                    FromShared::Answer(Answer::Unknown(Source::Redis))
                }
                _ => FromShared::Nothing,
            };
        };
        let u = rand::random::<f64>();
        let Some(window) = freshness::window_for_age(now, age, c.ttl, c.ttl_jitter, c.stale_for, u)
        else {
            return FromShared::Nothing;
        };
        let found = Arc::new(found);
        let entry = Arc::new(Entry::new(
            found.clone(),
            window,
            answer.fetched_at_ms,
            epoch,
        ));
        match freshness::judge(window, now, current) {
            Freshness::Fresh => {
                self.warm.store(true, Ordering::Release);
                self.insert_known(digest, entry, seq);
                FromShared::Answer(Answer::Found(found, Source::Redis))
            }
            Freshness::Stale | Freshness::Revalidate => FromShared::Fallback(entry),
            Freshness::Expired => FromShared::Nothing,
        }
    }
}

pub(crate) fn served(entry: &Entry, outcome: Outcome) -> Lookup {
    Lookup::of(Some(&entry.found), outcome)
}

#[cfg(test)]
mod tests {
    use spillway_config::CacheConfig;
    use spillway_testkit::{digest, eventually, FakeStore};

    use super::*;

    fn state(store: &Arc<FakeStore>) -> Arc<State> {
        Arc::new(State::new(store.clone(), CacheConfig::default(), None))
    }

    /// Waits until no flight of `d` is in the air (it has landed, asking the store or not).
    async fn landed(state: &State, d: &KeyDigest) {
        eventually(Duration::from_secs(10), "the flight landed", || async {
            !state.flights.is_in_air(d)
        })
        .await;
    }

    // A lookup finds nothing, and before it starts its flight another lookup's flight of the
    // same key lands (a thread preempted between the two steps, on a busy machine). Its flight
    // takes the answer that is in the cache now instead of asking the store again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flight_started_just_after_another_landed_takes_its_answer() {
        let store = FakeStore::with_keys(1, "acme");
        let state = state(&store);
        let d = digest(0);
        let Err(fallback) = state.cached(&d, Instant::now()) else {
            panic!("nothing is cached yet");
        };
        let first = state.lookup(&d, Instant::now()).await.unwrap();
        assert_eq!(first.outcome, Outcome::Miss);
        let second = state.load(&d, fallback).await.unwrap();
        assert!(second.found.is_some());
        assert_eq!(second.outcome, Outcome::Fresh);
        assert_eq!(store.lookups(), 1, "one query for the key");
    }

    // A lookup reads a stale entry, and before it starts a refresh another lookup's refresh
    // of that entry lands. The second refresh asks the store nothing: the entry it would
    // refresh is no longer the cache's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refresh_of_an_entry_already_replaced_asks_nothing() {
        let store = FakeStore::with_keys(1, "acme");
        let state = state(&store);
        let d = digest(0);
        let now = Instant::now();
        let window = Window {
            fresh_until: now,
            stale_until: now + Duration::from_secs(60),
        };
        let found = Arc::new(spillway_testkit::key_match(0, "acme"));
        let stale = Arc::new(Entry::new(found, window, unix_ms(), 0));
        assert!(state.insert_known(&d, stale.clone(), 0));
        state.start_refresh(&d, &stale, now);
        landed(&state, &d).await;
        assert_eq!(store.lookups(), 1);
        let Ok(fresh) = state.cached(&d, Instant::now()) else {
            panic!("refreshed");
        };
        assert_eq!(fresh.outcome, Outcome::Fresh);
        state.start_refresh(&d, &stale, now);
        landed(&state, &d).await;
        assert_eq!(store.lookups(), 1, "no second query for the key");
    }
}
