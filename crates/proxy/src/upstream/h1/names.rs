//! Header names as both HTTP/1 readers (the client's request head, a backend's response head)
//! turn them into `http`'s: the names nearly every head carries, and those the official OpenAI
//! SDKs send with every request (`x-stainless-*`, nine of them), are recognised by their length
//! and a comparison of their bytes that ignores case, and become a constant; any other goes
//! through `HeaderName::from_bytes`, which lowers it into a buffer through a table and looks it
//! up among every standard name (about 120 instructions a name on the benchmark's heads, about
//! a quarter of that here), and copies a name that is not standard into an allocation of its
//! own.

use http::header::{self, HeaderName, InvalidHeaderName};

/// The header that carries a request's id, to the backend and back to the caller
/// (`crate::call` names it too).
pub(crate) const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

const X_STAINLESS_OS: HeaderName = HeaderName::from_static("x-stainless-os");
const X_STAINLESS_LANG: HeaderName = HeaderName::from_static("x-stainless-lang");
const X_STAINLESS_ARCH: HeaderName = HeaderName::from_static("x-stainless-arch");
const X_STAINLESS_ASYNC: HeaderName = HeaderName::from_static("x-stainless-async");
const X_STAINLESS_RUNTIME: HeaderName = HeaderName::from_static("x-stainless-runtime");
const X_STAINLESS_RETRY_COUNT: HeaderName = HeaderName::from_static("x-stainless-retry-count");
const X_STAINLESS_READ_TIMEOUT: HeaderName = HeaderName::from_static("x-stainless-read-timeout");
const X_STAINLESS_PACKAGE_VERSION: HeaderName =
    HeaderName::from_static("x-stainless-package-version");
const X_STAINLESS_RUNTIME_VERSION: HeaderName =
    HeaderName::from_static("x-stainless-runtime-version");

/// `bytes` as a header name: the same name, and the same refusal, as
/// `HeaderName::from_bytes(bytes)`.
pub(crate) fn header_name(bytes: &[u8]) -> Result<HeaderName, InvalidHeaderName> {
    match known(bytes) {
        Some(name) => Ok(name),
        None => HeaderName::from_bytes(bytes),
    }
}

/// The common name `bytes` spells in any case, if it is one. Names of one length are tried in
/// turn, the most common first.
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
        14 if is(b"x-stainless-os") => X_STAINLESS_OS,
        15 if is(b"accept-encoding") => header::ACCEPT_ENCODING,
        16 if is(b"x-stainless-lang") => X_STAINLESS_LANG,
        16 if is(b"x-stainless-arch") => X_STAINLESS_ARCH,
        17 if is(b"transfer-encoding") => header::TRANSFER_ENCODING,
        17 if is(b"x-stainless-async") => X_STAINLESS_ASYNC,
        19 if is(b"x-stainless-runtime") => X_STAINLESS_RUNTIME,
        23 if is(b"x-stainless-retry-count") => X_STAINLESS_RETRY_COUNT,
        24 if is(b"x-stainless-read-timeout") => X_STAINLESS_READ_TIMEOUT,
        27 if is(b"x-stainless-package-version") => X_STAINLESS_PACKAGE_VERSION,
        27 if is(b"x-stainless-runtime-version") => X_STAINLESS_RUNTIME_VERSION,
        _ => return None,
    };
    Some(name)
}

/// Whether `bytes` is `lower` in any case. `lower` holds lowercase letters and other bytes that
/// have no case: at a letter's position both its cases match (the bit that makes a letter
/// lowercase is set in `bytes` before they are compared), at any other only the byte itself.
/// Compared a word at a time, without an early exit (two words, overlapping, cover 8 to 16
/// bytes; a longer name takes one more word for each 8 bytes more); `lower` is a constant at
/// every call, so which of its bytes are letters is worked out when compiling.
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
        0..4 => (0..n).fold(true, |ok, at| ok & same(at, 1)),
        4..8 => same(0, 4) & same(n - 4, 4),
        8..=16 => same(0, 8) & same(n - 8, 8),
        _ => (0..n - 8)
            .step_by(8)
            .fold(same(n - 8, 8), |ok, at| ok & same(at, 8)),
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

    /// Every name [`known`] keeps.
    const KEPT: [&str; 22] = [
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
        "x-stainless-os",
        "accept-encoding",
        "x-stainless-lang",
        "x-stainless-arch",
        "transfer-encoding",
        "x-stainless-async",
        "x-stainless-runtime",
        "x-stainless-retry-count",
        "x-stainless-read-timeout",
        "x-stainless-package-version",
        "x-stainless-runtime-version",
    ];

    /// Names near those that are not kept.
    const NOT_KEPT: [&str; 4] = [
        "openai-organization",
        "x-stainless-timeout",
        "x-stainless-helper-method",
        "anthropic-version",
    ];

    fn common() -> impl Iterator<Item = &'static str> {
        KEPT.into_iter().chain(NOT_KEPT)
    }

    #[test]
    fn every_common_name_in_any_case_is_the_standard_one() {
        for name in common() {
            for spelled in [name.to_owned(), name.to_ascii_uppercase(), title_case(name)] {
                let ours = header_name(spelled.as_bytes()).unwrap();
                assert_eq!(ours, HeaderName::from_bytes(name.as_bytes()).unwrap());
                assert_eq!(ours.as_str(), name);
                assert_eq!(known(spelled.as_bytes()).is_some(), KEPT.contains(&name));
            }
        }
    }

    #[test]
    fn a_byte_that_only_looks_alike_in_a_name_is_not_the_name() {
        // `\r` | 0x20 is `-`: where a name has a hyphen, only a hyphen matches.
        for almost in [
            &b"content\rtype"[..],
            b"content\rlength",
            b"user\ragent",
            b"x-request\rid",
            b"x\rstainless-package-version",
            b"CONTENT-TYPE\r",
        ] {
            assert_eq!(
                header_name(almost).ok(),
                HeaderName::from_bytes(almost).ok(),
                "{almost:?}"
            );
        }
        assert!(known(b"content\rtype").is_none());
        assert!(known(b"x\rstainless-package-version").is_none());
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
                (0..KEPT.len() + NOT_KEPT.len(), any::<usize>(), any::<u8>()).prop_map(|(i, at, b)| {
                    let mut v = common().nth(i).unwrap().as_bytes().to_vec();
                    let at = at % v.len();
                    v[at] = b;
                    v
                }),
                (0..KEPT.len() + NOT_KEPT.len(), proptest::collection::vec(any::<bool>(), 32)).prop_map(
                    |(i, upper)| common().nth(i).unwrap()
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
