//! Which headers cross the gateway, either way. Hop-by-hop headers belong to one connection and
//! are never relayed over the next (RFC 9110 §7.6.1): the fixed ones (`Connection`, `TE`,
//! `Upgrade`, ...) and every header a message's `Connection` header nominates. A request also
//! loses the caller's credentials and the framing the gateway writes itself.
//!
//! What a `Connection` header may nominate is bounded ([`MAX_NOMINATED`]): a request head may be
//! 64 KiB, and tens of thousands of nominated names, each compared with each header present,
//! would cost milliseconds. Real clients and servers nominate one or two.

use http::{header, HeaderName, HeaderValue};

use crate::lines::Lines;

/// The most header names a message's `Connection` headers may nominate. A request that
/// nominates more is refused (400); a backend's answer that does is not a valid head (502).
pub(crate) const MAX_NOMINATED: usize = 16;

/// A message's `Connection` headers nominate more than [`MAX_NOMINATED`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TooManyNominated;

impl std::fmt::Display for TooManyNominated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the Connection header names more than {MAX_NOMINATED} headers"
        )
    }
}

impl From<TooManyNominated> for crate::error::ApiError {
    fn from(e: TooManyNominated) -> Self {
        crate::error::ApiError::new(crate::error::ErrorKind::MalformedRequest, e.to_string())
    }
}

/// The names a message's `Connection` headers nominate, as sent (any case); held in place for
/// the one or two a message names.
#[derive(Default)]
pub(crate) struct Nominated<'a>(smallvec::SmallVec<[&'a [u8]; 2]>);

impl<'a> Nominated<'a> {
    /// Adds a name read from a `Connection` header (the reader bounds how many).
    pub(crate) fn push(&mut self, name: &'a [u8]) {
        self.0.push(name);
    }

    /// Whether `name` (lower case, as `HeaderName`s are) is one of them.
    fn names(&self, name: &str) -> bool {
        self.0
            .iter()
            .any(|n| n.eq_ignore_ascii_case(name.as_bytes()))
    }
}

/// The items of a header's comma-separated list, trimmed; empty ones skipped (RFC 9110 §5.6.1).
pub(crate) fn list_items(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|item| !item.is_empty())
}

/// The names `headers`' `Connection` headers nominate. Empty list items are not counted; the
/// work is one pass over the values, stopping at the first name past the bound.
pub(crate) fn nominated(headers: &Lines) -> Result<Nominated<'_>, TooManyNominated> {
    let mut found = Nominated::default();
    for value in headers.get_all(&header::CONNECTION) {
        for name in list_items(value) {
            if found.0.len() == MAX_NOMINATED {
                return Err(TooManyNominated);
            }
            found.0.push(name);
        }
    }
    Ok(found)
}

/// Request headers that never travel upstream besides the hop-by-hop ones: the caller's own
/// credentials (the upstream gets the backend's key instead), and framing the client recomputes.
fn stripped_request_header(name: &str) -> bool {
    hop_by_hop(name)
        || matches!(
            name,
            "authorization"
                | "api-key"
                | "x-api-key"
                | "proxy-authorization"
                | "host"
                | "content-length"
                | "cookie"
        )
}

/// Headers that belong to one connection, never relayed over the next, whatever `Connection`
/// says.
fn hop_by_hop(name: &str) -> bool {
    matches!(
        name,
        "connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "keep-alive"
            | "proxy-connection"
    )
}

/// A caller's request headers as the request path keeps them: refused (400) when its
/// `Connection` headers name more than [`MAX_NOMINATED`] headers, and without `ours`, the
/// header the caller told spillway its region in (`None` when it sent none). Those that must
/// not cross are left out as each attempt is written ([`write_request_headers`]).
pub(crate) fn take_request_headers(
    headers: &mut Lines,
    ours: Option<&HeaderName>,
) -> Result<(), TooManyNominated> {
    nominated(headers)?;
    if let Some(ours) = ours {
        headers.remove(ours);
    }
    Ok(())
}

/// Hands `write` the caller's request `headers` that travel upstream, in the order they came:
/// neither those that must
/// not cross (hop-by-hop ones, those its `Connection` header names among them, the caller's
/// credentials, framing) nor any named in `own`; then `own`, the gateway's, which take the place
/// of the caller's of those names. A request naming too many headers ([`take_request_headers`]) would
/// cross with none of the caller's.
pub(crate) fn write_request_headers(
    headers: &Lines,
    own: &[(&HeaderName, &HeaderValue)],
    mut write: impl FnMut(&HeaderName, &[u8]),
) {
    if let Ok(nominated) = nominated(headers) {
        for (name, value) in headers.iter() {
            let text = name.as_str();
            let stays = stripped_request_header(text)
                || nominated.names(text)
                || own.iter().any(|(n, _)| *n == name);
            if !stays {
                write(name, value);
            }
        }
    }
    for (name, value) in own {
        write(name, value.as_bytes());
    }
}

/// Whether a header of a backend's answer stays behind rather than being relayed: a hop-by-hop
/// one, or one its `Connection` headers nominate. The answer's head is read with this
/// (`h1::Conn`), so these never enter its header map; a head that nominates more than
/// [`MAX_NOMINATED`] names is refused there.
pub(crate) fn stays_behind(name: &HeaderName, nominated: &Nominated<'_>) -> bool {
    let name = name.as_str();
    hop_by_hop(name) || nominated.names(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> Lines {
        let mut h = Lines::default();
        for (name, value) in pairs {
            h.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        h
    }

    /// The header lines a request with the caller's `headers` is written with, the gateway's
    /// `own` added, in the order written.
    fn written(headers: &Lines, own: &[(&HeaderName, &HeaderValue)]) -> Vec<String> {
        let mut lines = Vec::new();
        write_request_headers(headers, own, |name, value| {
            lines.push(format!("{}: {}", name, std::str::from_utf8(value).unwrap()));
        });
        lines
    }

    #[test]
    fn headers_that_must_not_cross_are_left_out_with_every_value_and_the_rest_kept() {
        let h = map(&[
            ("authorization", "Bearer sk-caller"),
            ("x-api-key", "k"),
            ("Cookie", "a=1"),
            ("cookie", "b=2"),
            ("connection", "keep-alive"),
            ("accept", "application/json"),
            ("x-custom", "kept"),
            ("content-length", "12"),
            ("accept", "text/event-stream"),
            ("content-type", "text/plain"),
            ("host", "gateway"),
        ]);
        let (host, json) = (
            HeaderValue::from_static("b:8000"),
            HeaderValue::from_static("application/json"),
        );
        let own = [(&header::HOST, &host), (&header::CONTENT_TYPE, &json)];
        assert_eq!(
            written(&h, &own),
            [
                "accept: application/json",
                "x-custom: kept",
                "accept: text/event-stream",
                "host: b:8000",
                "content-type: application/json",
            ]
        );

        let none = Nominated::default();
        let left: Vec<_> = [
            "transfer-encoding",
            "keep-alive",
            "proxy-connection",
            "x-ratelimit-remaining-requests",
            "upgrade",
            "content-type",
            "trailer",
            "te",
            "connection",
        ]
        .into_iter()
        .filter(|name| !stays_behind(&HeaderName::from_static(name), &none))
        .collect();
        assert_eq!(left, ["x-ratelimit-remaining-requests", "content-type"]);
    }

    #[test]
    fn headers_a_connection_header_nominates_go_too_in_any_case_from_every_value() {
        let h = map(&[
            ("connection", "keep-alive, X-Hop ,, x-other"),
            ("connection", "X-Third"),
            ("x-hop", "1"),
            ("x-other", "2"),
            ("x-third", "3"),
            ("x-kept", "4"),
        ]);
        assert_eq!(written(&h, &[]), ["x-kept: 4"]);

        let mut nominated = Nominated::default();
        nominated.push(b"X-Backend-Hop");
        let behind = |name| stays_behind(&HeaderName::from_static(name), &nominated);
        assert!(behind("x-backend-hop"));
        assert!(!behind("x-ratelimit-remaining-tokens"));
    }

    #[test]
    fn more_names_than_the_bound_refuse_a_request() {
        let names: Vec<String> = (0..=MAX_NOMINATED).map(|i| format!("x-n{i}")).collect();
        let at_bound = names[..MAX_NOMINATED].join(",");
        let mut h = map(&[
            ("connection", &at_bound),
            ("x-n0", "1"),
            ("x-kept", "2"),
            ("x-region", "eu"),
        ]);
        let region = HeaderName::from_static("x-region");
        assert_eq!(take_request_headers(&mut h, Some(&region)), Ok(()));
        assert_eq!(written(&h, &[]), ["x-kept: 2"]);

        // Empty items are not names.
        let padded = format!("{at_bound}{}", ", ,".repeat(1000));
        assert!(nominated(&map(&[("connection", &padded)])).is_ok());

        let past = names.join(",");
        let mut h = map(&[("connection", &past), ("x-kept", "2")]);
        let err = take_request_headers(&mut h, Some(&region)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the Connection header names more than 16 headers"
        );
        // Were it written all the same, none of the caller's headers would cross.
        let value = HeaderValue::from_static("b");
        assert_eq!(written(&h, &[(&header::HOST, &value)]), ["host: b"]);
        // Split over several headers, the names count together.
        let (a, b) = names.split_at(8);
        let split = map(&[("connection", &a.join(",")), ("connection", &b.join(","))]);
        assert!(nominated(&split).is_err());
    }
}
