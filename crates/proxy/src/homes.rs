//! Where each stored object lives: the Responses API keeps a response's state on the server that
//! created it, so its lifecycle calls (`GET`/`DELETE /v1/responses/{id}`, `cancel`,
//! `input_items`) and every create that continues it (`previous_response_id`) must reach that
//! same backend; a chat completion created with `store: true` is kept by its backend too, and
//! its `/v1/chat/completions/{id}` calls go there.
//!
//! The gateway learns a response's id from the answer to its create, as it is relayed (the first
//! `"id": "resp_..."` in the answer's first [`ID_SCAN_BYTES`]: the object's own id in a plain
//! answer, `response.created`'s in a stream), and remembers its home: model, backend and tenant.
//! The map is bounded ([`MAX_HOMES`], least recently used evicted first) and each entry expires
//! [`HOME_TTL`] after it was last used, so memory does not grow with traffic. It lives in the
//! process: after a restart, or on another gateway instance, an id is unknown and answered 404.

use std::sync::Arc;
use std::time::Duration;

use moka::sync::Cache;

/// Response homes remembered at most.
pub const MAX_HOMES: u64 = 100_000;
/// How long a response's home is remembered after its last use.
pub const HOME_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// How much of a create's answer is looked at for its id.
pub const ID_SCAN_BYTES: usize = 8 * 1024;
/// The longest id remembered.
const MAX_ID_LEN: usize = 256;

/// The backend a stored response lives on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Home {
    pub model: Arc<str>,
    pub backend: Arc<str>,
    /// Only this tenant may reach it: another tenant's id is unknown to it.
    pub tenant: Arc<str>,
}

/// The homes of the responses created through this gateway.
pub struct Homes {
    map: Cache<Box<str>, Home>,
}

impl Default for Homes {
    fn default() -> Self {
        Homes {
            map: Cache::builder()
                .max_capacity(MAX_HOMES)
                .time_to_idle(HOME_TTL)
                .build(),
        }
    }
}

impl Homes {
    pub fn remember(&self, id: &str, home: Home) {
        if !id.is_empty() && id.len() <= MAX_ID_LEN {
            self.map.insert(id.into(), home);
        }
    }

    /// The home of `id` for `tenant`, if it created it here.
    pub fn find(&self, id: &str, tenant: &str) -> Option<Home> {
        self.map.get(id).filter(|h| &*h.tenant == tenant)
    }

    pub fn forget(&self, id: &str) {
        self.map.invalidate(id);
    }
}

/// Finds a stored object's id (one starting with a given prefix: `resp_` for a response,
/// `chatcmpl` for a chat completion) in the first [`ID_SCAN_BYTES`] of its create's answer, fed
/// chunk by chunk as it is relayed.
#[derive(Debug)]
pub struct IdScanner {
    prefix: &'static str,
    seen: Vec<u8>,
    found: Option<String>,
    done: bool,
}

impl IdScanner {
    pub fn new(prefix: &'static str) -> Self {
        IdScanner {
            prefix,
            seen: Vec::new(),
            found: None,
            done: false,
        }
    }

    pub fn feed(&mut self, chunk: &[u8]) {
        if self.done {
            return;
        }
        let room = ID_SCAN_BYTES - self.seen.len();
        self.seen.extend_from_slice(&chunk[..chunk.len().min(room)]);
        self.found = first_id(&self.seen, self.prefix).map(str::to_owned);
        if self.found.is_some() || self.seen.len() >= ID_SCAN_BYTES {
            self.done = true;
            self.seen = Vec::new();
        }
    }

    pub fn id(&self) -> Option<&str> {
        self.found.as_deref()
    }
}

/// The first `"id": "<prefix>..."` value in `text` (whitespace allowed around the colon),
/// complete and without escapes.
fn first_id<'a>(text: &'a [u8], prefix: &str) -> Option<&'a str> {
    const KEY: &[u8] = b"\"id\"";
    let mut from = 0;
    while let Some(at) = find(&text[from..], KEY) {
        let mut i = from + at + KEY.len();
        from = i;
        let skip = |i: &mut usize| {
            while text.get(*i).is_some_and(|b| b.is_ascii_whitespace()) {
                *i += 1;
            }
        };
        skip(&mut i);
        if text.get(i) != Some(&b':') {
            continue;
        }
        i += 1;
        skip(&mut i);
        if text.get(i) != Some(&b'"') {
            continue;
        }
        let start = i + 1;
        let len = text[start..]
            .iter()
            .position(|&b| b == b'"' || b == b'\\')?;
        if text.get(start + len) != Some(&b'"') || len > MAX_ID_LEN {
            continue;
        }
        let id = std::str::from_utf8(&text[start..start + len]).ok()?;
        if id.starts_with(prefix) {
            return Some(id);
        }
    }
    None
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn the_responses_own_id_is_found_in_plain_answers_and_streams() {
        let plain = br#"{"completed_at":1,"id" : "resp_abc","output":[{"id":"msg_1"}]}"#;
        let stream = b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_xyz\",\"object\":\"response\"}}\n\n";
        let item_first = br#"{"output":[{"id":"msg_1"}],"id":"resp_late"}"#;
        for (body, id) in [
            (&plain[..], "resp_abc"),
            (stream, "resp_xyz"),
            (item_first, "resp_late"),
        ] {
            for cut in 0..body.len() {
                let mut s = IdScanner::new("resp_");
                s.feed(&body[..cut]);
                s.feed(&body[cut..]);
                assert_eq!(s.id(), Some(id), "cut at {cut}");
            }
        }
        let mut s = IdScanner::new("resp_");
        s.feed(br#"{"id":"chatcmpl-1"}"#);
        assert_eq!(s.id(), None);
        let mut s = IdScanner::new("chatcmpl");
        s.feed(br#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk"}"#);
        assert_eq!(s.id(), Some("chatcmpl-1"));
    }

    #[test]
    fn homes_are_per_tenant_and_can_be_forgotten() {
        let homes = Homes::default();
        let home = Home {
            model: Arc::from("m"),
            backend: Arc::from("b"),
            tenant: Arc::from("t"),
        };
        homes.remember("resp_1", home.clone());
        assert_eq!(homes.find("resp_1", "t"), Some(home));
        assert_eq!(homes.find("resp_1", "other"), None);
        homes.forget("resp_1");
        assert_eq!(homes.find("resp_1", "t"), None);
        homes.remember(
            &"r".repeat(MAX_ID_LEN + 1),
            Home {
                model: Arc::from("m"),
                backend: Arc::from("b"),
                tenant: Arc::from("t"),
            },
        );
        assert_eq!(homes.find(&"r".repeat(MAX_ID_LEN + 1), "t"), None);
    }

    proptest! {
        /// Any bytes, any chunking: no panic, and the scanner never holds more than its cap.
        #[test]
        fn any_body_is_scanned_within_the_cap(body in prop::collection::vec(any::<u8>(), 0..20_000), cut in 0usize..20_000) {
            let mut s = IdScanner::new("resp_");
            let cut = cut.min(body.len());
            s.feed(&body[..cut]);
            prop_assert!(s.seen.len() <= ID_SCAN_BYTES);
            s.feed(&body[cut..]);
            prop_assert!(s.seen.len() <= ID_SCAN_BYTES);
        }
    }
}
