//! What this server stored: the Responses API's stored responses (what `GET`, `DELETE`,
//! `cancel` and `input_items` under `/v1/responses/{id}` read, and what a create's
//! `previous_response_id` continues) and stored chat completions (`chats.rs`), each kind in
//! its own [`Store`].
//!
//! A real server keeps stored objects for weeks; the mock keeps the most recent ones within
//! two bounds per store, [`MAX_STORED_ENTRIES`] and [`MAX_STORED_BYTES`] (the latter estimated
//! from the request bodies the entries came from), and forgets the oldest first beyond either,
//! so a load test that stores every reply cannot grow the server's memory without limit. An
//! entry forgotten so is answered as one never stored: 404, or `previous_response_not_found`
//! on a create that names it. The stores outlive profile changes and `/stats/reset`, as a real
//! server's data outlives its configuration.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde_json::Value;

/// The most entries one store keeps at once.
pub(crate) const MAX_STORED_ENTRIES: usize = 1024;

/// The most bytes of entries one store keeps at once, by the estimate each was inserted with. A
/// single entry larger than this (a request body may be up to 8 MiB) is still kept, alone.
pub(crate) const MAX_STORED_BYTES: usize = 64 * 1024 * 1024;

/// The Responses API's stored responses.
pub(crate) type ResponseStore = Store<Stored>;

/// One stored response.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    /// The response object as answered, or as cancelled since.
    pub(crate) response: Value,
    /// The create's `input` as a list of items, each with an `id`.
    pub(crate) input_items: Arc<Vec<Value>>,
    pub(crate) model: String,
    /// The tokens the conversation up to and including this response holds: its prompt (the
    /// earlier responses' tokens included) and its output. A create that continues it counts
    /// these into its prompt.
    pub(crate) conversation_tokens: u32,
}

/// What a create that names a stored response continues from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Earlier {
    pub(crate) id: String,
    pub(crate) model: String,
    pub(crate) conversation_tokens: u32,
}

/// Entries by id, oldest evicted first. Cheap to share; every operation takes one short lock.
#[derive(Debug)]
pub(crate) struct Store<T> {
    max_entries: usize,
    max_bytes: usize,
    inner: Mutex<Inner<T>>,
}

#[derive(Debug)]
struct Inner<T> {
    /// Id to the entry, its estimated size and the tick it was stored at.
    by_id: HashMap<String, Slot<T>>,
    /// Tick to id, oldest first: the eviction order, and the order entries are listed in.
    by_age: BTreeMap<u64, String>,
    tick: u64,
    bytes: usize,
}

#[derive(Debug)]
struct Slot<T> {
    tick: u64,
    bytes: usize,
    entry: T,
}

impl<T> Default for Store<T> {
    fn default() -> Self {
        Self::with_bounds(MAX_STORED_ENTRIES, MAX_STORED_BYTES)
    }
}

impl<T> Store<T> {
    /// A store that keeps at most `max_entries` entries (at least one) and about `max_bytes`.
    pub(crate) fn with_bounds(max_entries: usize, max_bytes: usize) -> Self {
        Self {
            max_entries: max_entries.max(1),
            max_bytes,
            inner: Mutex::new(Inner {
                by_id: HashMap::new(),
                by_age: BTreeMap::new(),
                tick: 0,
                bytes: 0,
            }),
        }
    }

    /// Stores `entry`, reckoned to hold `bytes`, under `id` as the newest entry, then forgets
    /// the oldest beyond the bounds (never the one just stored).
    pub(crate) fn insert(&self, id: String, entry: T, bytes: usize) {
        let mut inner = self.lock();
        inner.remove(&id);
        inner.tick += 1;
        let tick = inner.tick;
        inner.bytes = inner.bytes.saturating_add(bytes);
        inner.by_age.insert(tick, id.clone());
        inner.by_id.insert(id, Slot { tick, bytes, entry });
        while inner.by_id.len() > self.max_entries
            || (inner.bytes > self.max_bytes && inner.by_id.len() > 1)
        {
            let Some((_, oldest)) = inner.by_age.pop_first() else {
                break;
            };
            if let Some(gone) = inner.by_id.remove(&oldest) {
                inner.bytes = inner.bytes.saturating_sub(gone.bytes);
            }
        }
    }

    /// `read` of the entry stored under `id`, if there is one.
    pub(crate) fn get<R>(&self, id: &str, read: impl FnOnce(&T) -> R) -> Option<R> {
        self.lock().by_id.get(id).map(|slot| read(&slot.entry))
    }

    /// Changes the entry under `id` with `edit`, keeping its place in the eviction order and
    /// its size estimate (so an edit must not grow it without bound), and returns what `edit`
    /// did.
    pub(crate) fn update<R>(&self, id: &str, edit: impl FnOnce(&mut T) -> R) -> Option<R> {
        self.lock()
            .by_id
            .get_mut(id)
            .map(|slot| edit(&mut slot.entry))
    }

    /// Forgets `id`; whether it was stored.
    pub(crate) fn delete(&self, id: &str) -> bool {
        self.lock().remove(id)
    }

    /// `read` of every entry with its id, oldest first (the iterator may be reversed).
    pub(crate) fn scan<R>(
        &self,
        read: impl FnOnce(&mut dyn DoubleEndedIterator<Item = (&str, &T)>) -> R,
    ) -> R {
        let inner = self.lock();
        let mut entries = inner.by_age.values().filter_map(|id| {
            let slot = inner.by_id.get(id)?;
            Some((id.as_str(), &slot.entry))
        });
        read(&mut entries)
    }

    /// Entries stored now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().by_id.len()
    }

    fn lock(&self) -> MutexGuard<'_, Inner<T>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T> Inner<T> {
    fn remove(&mut self, id: &str) -> bool {
        let Some(gone) = self.by_id.remove(id) else {
            return false;
        };
        self.by_age.remove(&gone.tick);
        self.bytes = self.bytes.saturating_sub(gone.bytes);
        true
    }
}

impl Store<Stored> {
    /// The stored response object.
    pub(crate) fn response(&self, id: &str) -> Option<Value> {
        self.get(id, |s| s.response.clone())
    }

    /// The stored input items.
    pub(crate) fn input_items(&self, id: &str) -> Option<Arc<Vec<Value>>> {
        self.get(id, |s| Arc::clone(&s.input_items))
    }

    /// What a create continuing `id` needs of it.
    pub(crate) fn earlier(&self, id: &str) -> Option<Earlier> {
        self.get(id, |s| Earlier {
            id: id.to_owned(),
            model: s.model.clone(),
            conversation_tokens: s.conversation_tokens,
        })
    }

    /// Marks `id` cancelled, keeping its place in the eviction order, and returns the response
    /// object as now stored.
    pub(crate) fn cancel(&self, id: &str) -> Option<Value> {
        self.update(id, |stored| {
            if let Some(fields) = stored.response.as_object_mut() {
                fields.insert("status".to_owned(), "cancelled".into());
            }
            stored.response.clone()
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn stored(n: u32) -> Stored {
        Stored {
            response: json!({"id": format!("resp_{n}"), "status": "completed"}),
            input_items: Arc::new(vec![json!({"id": format!("msg_{n}")})]),
            model: "m".to_owned(),
            conversation_tokens: n,
        }
    }

    fn ids(store: &ResponseStore, upto: u32) -> Vec<u32> {
        (0..upto)
            .filter(|n| store.response(&format!("resp_{n}")).is_some())
            .collect()
    }

    #[test]
    fn the_oldest_go_first_beyond_the_entry_bound() {
        let store = ResponseStore::with_bounds(3, usize::MAX);
        for n in 0..5 {
            store.insert(format!("resp_{n}"), stored(n), 10);
        }
        assert_eq!(ids(&store, 5), [2, 3, 4]);
        assert_eq!(store.len(), 3);
        // Cancelling does not make an entry newer.
        assert!(store.cancel("resp_2").is_some());
        store.insert("resp_5".to_owned(), stored(5), 10);
        assert_eq!(ids(&store, 6), [3, 4, 5]);
        assert_eq!(MAX_STORED_ENTRIES, ResponseStore::default().max_entries);
    }

    #[test]
    fn the_byte_bound_evicts_but_keeps_the_newest_alone() {
        let store = ResponseStore::with_bounds(100, 100);
        for n in 0..4 {
            store.insert(format!("resp_{n}"), stored(n), 40);
        }
        assert_eq!(ids(&store, 4), [2, 3]);
        store.insert("resp_4".to_owned(), stored(4), 1000);
        assert_eq!(ids(&store, 5), [4]);
        store.insert("resp_5".to_owned(), stored(5), 1);
        assert_eq!(ids(&store, 6), [5]);
        assert_eq!(store.lock().bytes, 1);
    }

    #[test]
    fn a_deleted_response_is_gone_and_frees_its_place() {
        let store = ResponseStore::with_bounds(2, 100);
        store.insert("resp_0".to_owned(), stored(0), 60);
        assert!(store.delete("resp_0"));
        assert!(!store.delete("resp_0"));
        assert!(store.response("resp_0").is_none());
        assert!(store.input_items("resp_0").is_none());
        assert!(store.earlier("resp_0").is_none());
        assert!(store.cancel("resp_0").is_none());
        let inner = store.lock();
        assert!(inner.by_age.is_empty() && inner.bytes == 0, "{inner:?}");
        drop(inner);
        // Creating and deleting many never leaves anything behind.
        for n in 0..50 {
            store.insert(format!("resp_{n}"), stored(n), 60);
            store.delete(&format!("resp_{n}"));
        }
        assert_eq!(store.len(), 0);
        assert!(store.lock().by_age.is_empty());
    }

    #[test]
    fn entries_are_scanned_oldest_first_and_edited_in_place() {
        let store = ResponseStore::with_bounds(3, usize::MAX);
        for n in 0..4 {
            store.insert(format!("resp_{n}"), stored(n), 1);
        }
        let edited = store.update("resp_1", |s| {
            s.model = "n".to_owned();
            s.conversation_tokens
        });
        assert_eq!(edited, Some(1));
        assert_eq!(store.update("resp_0", |_| ()), None);
        let scanned = |rev: bool| {
            store.scan(|entries| {
                let seen: Vec<String> = if rev {
                    entries
                        .rev()
                        .map(|(id, s)| format!("{id}:{}", s.model))
                        .collect()
                } else {
                    entries.map(|(id, s)| format!("{id}:{}", s.model)).collect()
                };
                seen
            })
        };
        assert_eq!(scanned(false), ["resp_1:n", "resp_2:m", "resp_3:m"]);
        assert_eq!(scanned(true), ["resp_3:m", "resp_2:m", "resp_1:n"]);
        // Storing an id again makes it the newest.
        store.insert("resp_2".to_owned(), stored(2), 1);
        assert_eq!(scanned(false), ["resp_1:n", "resp_3:m", "resp_2:m"]);
    }

    #[test]
    fn cancel_marks_the_stored_response_cancelled() {
        let store = ResponseStore::default();
        store.insert("resp_7".to_owned(), stored(7), 1);
        let cancelled = store.cancel("resp_7").unwrap();
        assert_eq!(cancelled["status"], "cancelled");
        assert_eq!(store.response("resp_7").unwrap()["status"], "cancelled");
        let earlier = store.earlier("resp_7").unwrap();
        assert_eq!(
            earlier,
            Earlier {
                id: "resp_7".to_owned(),
                model: "m".to_owned(),
                conversation_tokens: 7
            }
        );
        assert_eq!(store.input_items("resp_7").unwrap()[0]["id"], "msg_7");
    }
}
