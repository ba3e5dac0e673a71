//! The responses this server stored: what `GET`, `DELETE`, `cancel` and `input_items` under
//! `/v1/responses/{id}` read, and what a create's `previous_response_id` continues.
//!
//! A real server keeps stored responses for weeks; the mock keeps the most recent ones within
//! two bounds, [`MAX_STORED_RESPONSES`] and [`MAX_STORED_BYTES`] (the latter estimated from the
//! request bodies the input items came from), and forgets the oldest first beyond either, so
//! a load test that stores every response cannot grow the server's memory without limit. A
//! response forgotten so is answered as one never stored: 404, or
//! `previous_response_not_found` on a create that names it. The store outlives profile changes
//! and `/stats/reset`, as a real server's data outlives its configuration.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde_json::Value;

/// The most responses kept at once.
pub(crate) const MAX_STORED_RESPONSES: usize = 1024;

/// The most bytes of stored responses kept at once, by [`Stored::bytes`]. A single response
/// larger than this (a request body may be up to 8 MiB) is still kept, alone.
pub(crate) const MAX_STORED_BYTES: usize = 64 * 1024 * 1024;

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
    /// The estimated memory this entry holds, for [`MAX_STORED_BYTES`].
    pub(crate) bytes: usize,
}

/// What a create that names a stored response continues from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Earlier {
    pub(crate) id: String,
    pub(crate) model: String,
    pub(crate) conversation_tokens: u32,
}

/// The stored responses, oldest evicted first. Cheap to share; every operation takes one short
/// lock.
#[derive(Debug)]
pub(crate) struct ResponseStore {
    max_entries: usize,
    max_bytes: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Id to the tick it was stored at and the entry.
    by_id: HashMap<String, (u64, Stored)>,
    /// Tick to id, oldest first: the eviction order.
    by_age: BTreeMap<u64, String>,
    tick: u64,
    bytes: usize,
}

impl Default for ResponseStore {
    fn default() -> Self {
        Self::with_bounds(MAX_STORED_RESPONSES, MAX_STORED_BYTES)
    }
}

impl ResponseStore {
    /// A store that keeps at most `max_entries` responses (at least one) and about `max_bytes`.
    pub(crate) fn with_bounds(max_entries: usize, max_bytes: usize) -> Self {
        Self {
            max_entries: max_entries.max(1),
            max_bytes,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Stores `stored` under `id` as the newest entry, then forgets the oldest beyond the
    /// bounds (never the one just stored).
    pub(crate) fn insert(&self, id: String, stored: Stored) {
        let mut inner = self.lock();
        inner.remove(&id);
        inner.tick += 1;
        let tick = inner.tick;
        inner.bytes = inner.bytes.saturating_add(stored.bytes);
        inner.by_age.insert(tick, id.clone());
        inner.by_id.insert(id, (tick, stored));
        while inner.by_id.len() > self.max_entries
            || (inner.bytes > self.max_bytes && inner.by_id.len() > 1)
        {
            let Some((_, oldest)) = inner.by_age.pop_first() else {
                break;
            };
            if let Some((_, gone)) = inner.by_id.remove(&oldest) {
                inner.bytes = inner.bytes.saturating_sub(gone.bytes);
            }
        }
    }

    /// The stored response object.
    pub(crate) fn response(&self, id: &str) -> Option<Value> {
        self.lock().by_id.get(id).map(|(_, s)| s.response.clone())
    }

    /// The stored input items.
    pub(crate) fn input_items(&self, id: &str) -> Option<Arc<Vec<Value>>> {
        self.lock()
            .by_id
            .get(id)
            .map(|(_, s)| Arc::clone(&s.input_items))
    }

    /// What a create continuing `id` needs of it.
    pub(crate) fn earlier(&self, id: &str) -> Option<Earlier> {
        self.lock().by_id.get(id).map(|(_, s)| Earlier {
            id: id.to_owned(),
            model: s.model.clone(),
            conversation_tokens: s.conversation_tokens,
        })
    }

    /// Forgets `id`; whether it was stored.
    pub(crate) fn delete(&self, id: &str) -> bool {
        self.lock().remove(id)
    }

    /// Marks `id` cancelled, keeping its place in the eviction order, and returns the response
    /// object as now stored.
    pub(crate) fn cancel(&self, id: &str) -> Option<Value> {
        let mut inner = self.lock();
        let (_, stored) = inner.by_id.get_mut(id)?;
        if let Some(fields) = stored.response.as_object_mut() {
            fields.insert("status".to_owned(), "cancelled".into());
        }
        Some(stored.response.clone())
    }

    /// Responses stored now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().by_id.len()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Inner {
    fn remove(&mut self, id: &str) -> bool {
        let Some((tick, gone)) = self.by_id.remove(id) else {
            return false;
        };
        self.by_age.remove(&tick);
        self.bytes = self.bytes.saturating_sub(gone.bytes);
        true
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn stored(n: u32, bytes: usize) -> Stored {
        Stored {
            response: json!({"id": format!("resp_{n}"), "status": "completed"}),
            input_items: Arc::new(vec![json!({"id": format!("msg_{n}")})]),
            model: "m".to_owned(),
            conversation_tokens: n,
            bytes,
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
            store.insert(format!("resp_{n}"), stored(n, 10));
        }
        assert_eq!(ids(&store, 5), [2, 3, 4]);
        assert_eq!(store.len(), 3);
        // Cancelling does not make an entry newer.
        assert!(store.cancel("resp_2").is_some());
        store.insert("resp_5".to_owned(), stored(5, 10));
        assert_eq!(ids(&store, 6), [3, 4, 5]);
        assert_eq!(MAX_STORED_RESPONSES, ResponseStore::default().max_entries);
    }

    #[test]
    fn the_byte_bound_evicts_but_keeps_the_newest_alone() {
        let store = ResponseStore::with_bounds(100, 100);
        for n in 0..4 {
            store.insert(format!("resp_{n}"), stored(n, 40));
        }
        assert_eq!(ids(&store, 4), [2, 3]);
        store.insert("resp_4".to_owned(), stored(4, 1000));
        assert_eq!(ids(&store, 5), [4]);
        store.insert("resp_5".to_owned(), stored(5, 1));
        assert_eq!(ids(&store, 6), [5]);
        assert_eq!(store.lock().bytes, 1);
    }

    #[test]
    fn a_deleted_response_is_gone_and_frees_its_place() {
        let store = ResponseStore::with_bounds(2, 100);
        store.insert("resp_0".to_owned(), stored(0, 60));
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
            store.insert(format!("resp_{n}"), stored(n, 60));
            store.delete(&format!("resp_{n}"));
        }
        assert_eq!(store.len(), 0);
        assert!(store.lock().by_age.is_empty());
    }

    #[test]
    fn cancel_marks_the_stored_response_cancelled() {
        let store = ResponseStore::default();
        store.insert("resp_7".to_owned(), stored(7, 1));
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
