//! What a caller asks for in its request headers, read in one pass over them.
//!
//! The read stage looks for a handful of names, most of them chosen in the config (the region
//! header, the class header, the caller's retry markers) and none of them standard. Looked up one
//! by one (in a `HeaderMap`, as the headers once were) each cost a hash of its name (about 180
//! instructions): about 1,100 instructions a request on the benchmark. The pass compares every
//! header's name with the few looked for (a standard name, which is most of what clients send,
//! differs from a custom one at its first comparison): about 510. Each value is the first of its
//! name, as `Lines::get` gives it (a property test holds the pass to that).

use http::HeaderName;
use spillway_config::MAX_CLIENT_RETRY_HEADERS;

use crate::lines::Lines;

// The markers seen are kept as bits of a `u64`; the config caps how many there are.
const _: () = assert!(MAX_CLIENT_RETRY_HEADERS <= 64);

/// The names looked for.
pub(super) struct Looked<'n> {
    pub region: &'n HeaderName,
    pub class: &'n HeaderName,
    /// Headers that mark a caller's own retry, with any value but `0` or nothing (at most
    /// [`MAX_CLIENT_RETRY_HEADERS`], as the config allows).
    pub retry_markers: &'n [HeaderName],
}

/// What the caller sent of them.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Asked<'h> {
    pub region: Option<&'h [u8]>,
    pub class: Option<&'h [u8]>,
    /// A retry marker came with a value other than `0` or nothing.
    pub retry: bool,
}

/// The first value of each name `looked` names, and whether a retry marker says this is a retry.
pub(super) fn asked<'h>(headers: &'h Lines, looked: &Looked<'_>) -> Asked<'h> {
    let markers = &looked.retry_markers[..looked.retry_markers.len().min(MAX_CLIENT_RETRY_HEADERS)];
    let mut asked = Asked::default();
    // The markers whose first value has been seen: only that one counts, as with `get`.
    let mut marked: u64 = 0;
    for (name, value) in headers.iter() {
        // Not `else if`: a config may give two of them one name.
        if name == looked.region {
            asked.region = asked.region.or(Some(value));
        }
        if name == looked.class {
            asked.class = asked.class.or(Some(value));
        }
        for (i, marker) in markers.iter().enumerate() {
            if name == marker && marked & (1 << i) == 0 {
                marked |= 1 << i;
                asked.retry |= is_retry_mark(value);
            }
        }
    }
    asked
}

fn is_retry_mark(value: &[u8]) -> bool {
    !value.is_empty() && value != b"0"
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use http::HeaderValue;

    use super::*;

    /// The same answer by one hashed lookup per name.
    fn by_lookups<'h>(headers: &'h Lines, looked: &Looked<'_>) -> Asked<'h> {
        Asked {
            region: headers.get(looked.region),
            class: headers.get(looked.class),
            retry: looked
                .retry_markers
                .iter()
                .any(|name| headers.get(name).is_some_and(is_retry_mark)),
        }
    }

    fn name(s: &str) -> HeaderName {
        HeaderName::from_bytes(s.as_bytes()).unwrap()
    }

    /// Names drawn from the ones looked for, standard ones and a few others, so that every
    /// name is often repeated.
    const NAMES: &[&str] = &[
        "x-spillway-region",
        "x-spillway-class",
        "x-request-id",
        "x-stainless-retry-count",
        "x-retry-attempt",
        "authorization",
        "content-type",
        "user-agent",
        "x-other",
    ];
    const VALUES: &[&str] = &["0", "", "1", "eu", "batch", "abc"];

    fn looked(markers: &[HeaderName]) -> Looked<'_> {
        static REGION: HeaderName = HeaderName::from_static("x-spillway-region");
        static CLASS: HeaderName = HeaderName::from_static("x-spillway-class");
        Looked {
            region: &REGION,
            class: &CLASS,
            retry_markers: markers,
        }
    }

    proptest! {
        #[test]
        fn one_pass_finds_what_a_lookup_of_each_name_finds(
            pairs in prop::collection::vec((0..NAMES.len(), 0..VALUES.len()), 0..24),
            marker_names in prop::collection::vec(0..NAMES.len(), 0..4),
        ) {
            let mut headers = Lines::default();
            for (n, v) in pairs {
                headers.append(name(NAMES[n]), HeaderValue::from_static(VALUES[v]));
            }
            let markers: Vec<HeaderName> = marker_names.iter().map(|&n| name(NAMES[n])).collect();
            let looked = looked(&markers);
            prop_assert_eq!(asked(&headers, &looked), by_lookups(&headers, &looked));
        }
    }

    #[test]
    fn only_the_first_value_of_a_name_counts() {
        let mut headers = Lines::default();
        headers.append(name("x-retry-attempt"), HeaderValue::from_static("0"));
        headers.append(name("x-retry-attempt"), HeaderValue::from_static("2"));
        headers.append(name("x-spillway-region"), HeaderValue::from_static("eu"));
        headers.append(name("x-spillway-region"), HeaderValue::from_static("us"));
        let markers = [name("x-retry-attempt")];
        let found = asked(&headers, &looked(&markers));
        assert!(!found.retry, "the first value, 0, says no retry");
        assert_eq!(found.region.unwrap(), b"eu");
    }
}
