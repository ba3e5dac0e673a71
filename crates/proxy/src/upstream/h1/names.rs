//! Header names as both HTTP/1 readers (the client's request head, a backend's response head)
//! turn them into `http`'s: the dozen names nearly every head carries are recognised by their
//! length and a comparison of their bytes that ignores case, and become `http`'s constant for
//! the name; any other goes through `HeaderName::from_bytes`, which lowers it into a buffer
//! through a table and then looks it up among every standard name (about 120 instructions for
//! `content-type`, a fifth of that here).

use http::header::{self, HeaderName, InvalidHeaderName};

const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// `bytes` as a header name: the same name, and the same refusal, as
/// `HeaderName::from_bytes(bytes)`.
pub(crate) fn header_name(bytes: &[u8]) -> Result<HeaderName, InvalidHeaderName> {
    match known(bytes) {
        Some(name) => Ok(name),
        None => HeaderName::from_bytes(bytes),
    }
}

/// The common name `bytes` spells in any case, if it is one.
fn known(bytes: &[u8]) -> Option<HeaderName> {
    let is = |lower: &[u8]| spells(bytes, lower);
    let name = match bytes.len() {
        4 if is(b"host") => header::HOST,
        4 if is(b"date") => header::DATE,
        6 if is(b"accept") => header::ACCEPT,
        6 if is(b"server") => header::SERVER,
        10 if is(b"user-agent") => header::USER_AGENT,
        10 if is(b"connection") => header::CONNECTION,
        12 if is(b"content-type") => header::CONTENT_TYPE,
        12 if is(b"x-request-id") => X_REQUEST_ID,
        13 if is(b"authorization") => header::AUTHORIZATION,
        13 if is(b"cache-control") => header::CACHE_CONTROL,
        14 if is(b"content-length") => header::CONTENT_LENGTH,
        15 if is(b"accept-encoding") => header::ACCEPT_ENCODING,
        17 if is(b"transfer-encoding") => header::TRANSFER_ENCODING,
        _ => return None,
    };
    Some(name)
}

/// Whether `bytes` is `lower` in any case. `lower` holds lowercase letters and other bytes that
/// have no case: at a letter's position both its cases match (the bit that makes a letter
/// lowercase is set in `bytes` before they are compared), at any other only the byte itself.
/// Compared a word at a time (two words, overlapping, cover 8 to 16 bytes); `lower` is a
/// constant at every call, so which of its bytes are letters is worked out when compiling.
#[inline(always)]
fn spells(bytes: &[u8], lower: &[u8]) -> bool {
    let n = bytes.len();
    if n != lower.len() {
        return false;
    }
    let same = |at: usize, width: usize| {
        let (b, l) = (word(bytes, at, width), word(lower, at, width));
        b | letters(l) == l
    };
    match n {
        0..4 => (0..n).all(|at| same(at, 1)),
        4..8 => same(0, 4) & same(n - 4, 4),
        8..=16 => same(0, 8) & same(n - 8, 8),
        _ => (0..n - 8).step_by(8).all(|at| same(at, 8)) & same(n - 8, 8),
    }
}

/// `width` (at most 8) bytes of `s` from `at`, as a little-endian word.
#[inline(always)]
fn word(s: &[u8], at: usize, width: usize) -> u64 {
    let mut w = [0u8; 8];
    w[..width].copy_from_slice(&s[at..at + width]);
    u64::from_le_bytes(w)
}

/// `0x20` in each byte of `w` that is a lowercase ASCII letter.
#[inline(always)]
fn letters(w: u64) -> u64 {
    (0..8)
        .filter(|i| (w >> (8 * i)).to_le_bytes()[0].is_ascii_lowercase())
        .fold(0, |m, i| m | 0x20 << (8 * i))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const COMMON: [&str; 15] = [
        "host",
        "date",
        "accept",
        "server",
        "user-agent",
        "connection",
        "content-type",
        "x-request-id",
        "authorization",
        "cache-control",
        "content-length",
        "accept-encoding",
        "transfer-encoding",
        "x-stainless-os",
        "openai-organization",
    ];

    #[test]
    fn every_common_name_in_any_case_is_the_standard_one() {
        for name in COMMON {
            for spelled in [name.to_owned(), name.to_ascii_uppercase(), title_case(name)] {
                let ours = header_name(spelled.as_bytes()).unwrap();
                assert_eq!(ours, HeaderName::from_bytes(name.as_bytes()).unwrap());
                assert_eq!(ours.as_str(), name);
            }
        }
        assert!(known(b"Content-Type").is_some());
        assert!(
            known(b"x-stainless-os").is_none(),
            "not one of the kept names"
        );
    }

    #[test]
    fn a_byte_that_only_looks_alike_in_a_name_is_not_the_name() {
        // `\r` | 0x20 is `-`, `^` | 0x20 is `~`: neither takes the place of what it becomes.
        for almost in [
            &b"content\rtype"[..],
            b"content\x0dlength",
            b"user\x0dagent",
            b"x-request\x0did",
            b"x-request-i\x04",
            b"CONTENT-TYPE\r",
        ] {
            assert_eq!(
                header_name(almost).ok(),
                HeaderName::from_bytes(almost).ok(),
                "{almost:?}"
            );
        }
        assert!(known(b"content\rtype").is_none());
        assert!(
            known(b"x-request-i\x04").is_none(),
            "0x04 | 0x20 is `$`, not `d`"
        );
    }

    fn title_case(name: &str) -> String {
        name.split('-')
            .map(|part| {
                let mut c = part.chars();
                c.next()
                    .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("-")
    }

    proptest! {
        /// Any bytes, and near misses of the common names: the same answer as `http`'s.
        #[test]
        fn the_same_as_from_bytes(
            bytes in prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..24),
                (0..COMMON.len(), any::<usize>(), any::<u8>()).prop_map(|(i, at, b)| {
                    let mut v = COMMON[i].as_bytes().to_vec();
                    let at = at % v.len();
                    v[at] = b;
                    v
                }),
                (0..COMMON.len(), proptest::collection::vec(any::<bool>(), 24)).prop_map(
                    |(i, upper)| COMMON[i]
                        .bytes()
                        .zip(upper)
                        .map(|(b, u)| if u { b.to_ascii_uppercase() } else { b })
                        .collect()
                ),
            ]
        ) {
            prop_assert_eq!(header_name(&bytes).ok(), HeaderName::from_bytes(&bytes).ok());
        }
    }
}
