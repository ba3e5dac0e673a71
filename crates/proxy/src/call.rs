//! The one value a request is on its path, `Call`: built once by the read stage
//! (`handler/read.rs`) and handed to each stage after it (admission, the attempt loop, the
//! response), like pingora's one context handed to every phase, so no stage reaches back into
//! another's locals.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::HeaderValue;
use spillway_policy::Priority;

use crate::admission::gate::Entered;
use crate::auth::Tenant;
use crate::endpoint::Endpoint;
use crate::lines::Lines;
use crate::metrics::Labels;
use crate::pool::{ModelPool, ThrottlePass};
use crate::request::{BodyHold, RequestSummary};

/// The header that carries a request's id, to the backend and back to the caller (one of the
/// names the HTTP/1 readers know, where it is defined).
pub(crate) use crate::upstream::h1::names::X_REQUEST_ID;
/// The Messages API's name for it: a backend's is kept aside, the caller gets spillway's.
pub(crate) const REQUEST_ID: http::HeaderName = http::HeaderName::from_static("request-id");

/// The longest caller's request id kept; a longer one is replaced.
const MAX_REQUEST_ID_LEN: usize = 128;

/// The id of a request with `headers`: the caller's `x-request-id` when it is short and
/// printable, else a new one, put in `headers` so it travels upstream. The connection layer puts
/// it on the response too (`connections`, HTTP/1 and HTTP/2 alike), with no middleware of its
/// own per request.
pub(crate) fn request_id(headers: &mut Lines) -> HeaderValue {
    let theirs = headers.value(&X_REQUEST_ID).filter(|v| {
        !v.is_empty()
            && v.len() <= MAX_REQUEST_ID_LEN
            && v.as_bytes().iter().all(|b| b.is_ascii_graphic())
    });
    if let Some(id) = theirs {
        return id;
    }
    let id = new_request_id();
    headers.insert(X_REQUEST_ID, id.clone());
    id
}

/// A new request id: 128 random bits in hex, written without a formatter or a string.
fn new_request_id() -> HeaderValue {
    let bits = rand::random::<u128>();
    let mut text = [0u8; 32];
    // Eight digits at a time, from each 32 bits: a short loop rather than 32 unrolled steps,
    // as this runs on every request that brings no id of its own. The digits of a random
    // number may come in any order.
    for (digits, word) in text.chunks_exact_mut(8).zip(0..4) {
        digits.copy_from_slice(&hex_digits((bits >> (32 * word)) as u32).to_le_bytes());
    }
    // Owned in place: one allocation, and clones of the value (the call's, the headers') share
    // it, where a copied slice would be allocated again when first cloned.
    HeaderValue::from_maybe_shared(bytes::Bytes::from_owner(text))
        .expect("hex is a valid header value")
}

/// The eight hex digits of `word` (lowercase ASCII), one a byte, its lowest first.
fn hex_digits(word: u32) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    // Each nibble spread into a byte of its own.
    let mut x = u64::from(word);
    x = (x | (x << 16)) & 0x0000_ffff_0000_ffff;
    x = (x | (x << 8)) & 0x00ff_00ff_00ff_00ff;
    x = (x | (x << 4)) & 0x0f0f_0f0f_0f0f_0f0f;
    // `0`-`9` for 0-9; 10-15 carry into bit 4 when 6 is added, and take `a`-`f` 39 further on.
    let letters = ((x + 6 * ONES) >> 4) & ONES;
    x + u64::from(b'0') * ONES + letters * 39
}

/// One request, as every stage of its path sees it.
pub(crate) struct Call<'l> {
    pub endpoint: Endpoint,
    /// The query string the caller sent, passed on to the backend.
    pub query: Option<Box<str>>,
    pub started: Instant,
    /// No attempt starts after this (`retry.deadline` from `started`).
    pub deadline: Instant,
    pub tenant: Arc<Tenant>,
    /// Its headers as they came but for the region header, spillway's own; those that cross are
    /// chosen as each attempt is written (`upstream::hop::write_request_headers`).
    pub headers: Lines,
    pub body: Bytes,
    pub summary: RequestSummary,
    /// The caller named the model (rather than leaving it to the stored response it continues
    /// or to its tenant's default).
    pub model_named: bool,
    /// Its model's pool, lent by the config the request runs on (`Live`, held to its end).
    pub pool: &'l Arc<ModelPool>,
    /// The region whose backends are tried first.
    pub region: Option<Arc<str>>,
    /// The class it is scheduled in: its tenant's, or lower if it asked.
    pub priority: Priority,
    /// Its affinity key, if its model balances by affinity.
    pub affinity_key: Option<u64>,
    /// The backend (by index in `pool`) of the stored response it continues, if any.
    pub home: Option<usize>,
    /// The caller marked it as its own retry.
    pub client_retry: bool,
    /// The last backend its attempts went to (its label in `spillway_requests_total`; the
    /// tenant's and the model's are read from `tenant` and `pool`, [`Call::labels`]).
    pub backend_label: Option<&'l Arc<str>>,
    /// Its pass through the model's adaptive throttling, once admitted.
    pub throttle_pass: Option<ThrottlePass>,
    /// Its trace (`crate::trace`), handed to the response's relay once chosen.
    pub trace: crate::trace::CallTrace,
    /// Its places in the in-flight counts, taken at its head, until admission takes them over.
    pub entered: Option<Entered>,
    /// Room in the body budget for the copies of the body its attempts make for backends that
    /// are told another model name, a priority or a tenant tag, or for a fallback model
    /// (`handler/read.rs`); the body holds its own place.
    pub _rewrite_room: Option<BodyHold>,
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        // The pass and the count it is on are its model's: `pool` (see `close_throttle_pass`).
        // A pass its first attempt did not close (none was made, or none was recorded) is
        // taken off its model's count now.
        if let Some(pass) = &mut self.throttle_pass {
            pass.end(&self.pool.throttle_pending);
        }
    }
}

impl Call<'_> {
    /// Its first attempt was recorded (on its model or a fallback): its pass through its
    /// model's adaptive throttling, if it holds one, is taken off the model's pending count.
    pub fn close_throttle_pass(&self) {
        if let Some(pass) = &self.throttle_pass {
            pass.close(&self.pool.throttle_pending);
        }
    }

    /// Its labels in the request series, borrowed from its tenant, its pool and the backend
    /// that answered.
    pub fn labels(&self) -> Labels<'_> {
        Labels::new(
            Some(&self.tenant.name),
            Some(&self.pool.name),
            self.backend_label,
        )
    }

    /// `x-request-id` (the caller's, or one made for it), for log lines: read from the headers
    /// that carry it upstream rather than held a second time.
    pub fn id(&self) -> Option<&str> {
        self.headers.get(&X_REQUEST_ID).and_then(crate::lines::text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn eight_digits_are_a_words_nibbles_lowest_first() {
        assert_eq!(&hex_digits(0x0123_4567).to_le_bytes(), b"76543210");
        assert_eq!(&hex_digits(0x89ab_cdef).to_le_bytes(), b"fedcba98");
        assert_eq!(&hex_digits(0).to_le_bytes(), b"00000000");
        assert_eq!(&hex_digits(u32::MAX).to_le_bytes(), b"ffffffff");
    }

    proptest! {
        #[test]
        fn the_digits_read_back_as_the_word(word in any::<u32>()) {
            let digits = hex_digits(word).to_le_bytes();
            let text: String = digits.iter().rev().map(|&b| b as char).collect();
            prop_assert_eq!(u32::from_str_radix(&text, 16).ok(), Some(word));
            prop_assert!(digits.iter().all(|b| b"0123456789abcdef".contains(b)));
        }
    }

    #[test]
    fn new_ids_are_32_hex_digits_and_differ() {
        let ids: std::collections::HashSet<Vec<u8>> = (0..1000)
            .map(|_| new_request_id().as_bytes().to_vec())
            .collect();
        assert_eq!(ids.len(), 1000);
        for id in &ids {
            assert_eq!(id.len(), 32);
            assert!(id.iter().all(|b| b"0123456789abcdef".contains(b)), "{id:?}");
        }
        // Every digit turns up in every place: no place is stuck.
        for place in 0..32 {
            let seen: std::collections::HashSet<u8> = ids.iter().map(|id| id[place]).collect();
            assert_eq!(seen.len(), 16, "place {place}");
        }
    }
}
