//! Header lines as the request path keeps them, a request's and a relayed answer's
//! (`crate::answer`): in the order they came, each value a place in the head it was read from (or
//! a value of its own), looked up by a pass over them.
//!
//! An `http::HeaderMap` hashes every name it is given and keeps each value as a `Bytes` of its
//! own; built from an HTTP/1 head that cost about 180 instructions a line and an atomic count on
//! the head's buffer per value, for a request whose lines are then looked up a handful of times
//! and written upstream once, in order. A pass over a few tens of lines to find one costs less
//! than a hash: a standard name, which is most of what clients send, is one comparison.
//!
//! The inference path reads a request's lines here from its head (HTTP/1) or from hyper's map
//! (HTTP/2, [`Lines::from_map`]); the rest of the API, served by axum, gets them back as a map
//! ([`Lines::into_map`]).

use std::ops::Range;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};

/// A request's header lines.
#[derive(Debug, Default, Clone)]
pub(crate) struct Lines {
    /// The head the values read from it lie in.
    head: Bytes,
    list: Vec<(HeaderName, Value)>,
}

#[derive(Debug, Clone)]
enum Value {
    /// Where in the head the value lies.
    Head {
        start: u32,
        end: u32,
    },
    Own(HeaderValue),
}

impl Lines {
    /// The lines of `head` whose values lie at the places given, with room for `more` lines
    /// besides. Each value must be a valid field value (RFC 9110 §5.5: no control character
    /// but a tab), as the head's reader checked it was: they are written on as they are.
    pub(crate) fn in_head(
        head: Bytes,
        lines: impl ExactSizeIterator<Item = (HeaderName, Range<usize>)>,
        more: usize,
    ) -> Self {
        let mut list = Vec::with_capacity(lines.len() + more);
        for (name, at) in lines {
            debug_assert!(HeaderValue::from_bytes(&head[at.clone()]).is_ok());
            // A head is at most the connection's buffer, far below 4 GiB.
            let value = Value::Head {
                start: at.start as u32,
                end: at.end as u32,
            };
            list.push((name, value));
        }
        Lines { head, list }
    }

    /// No lines yet, with room for `n`.
    pub(crate) fn with_capacity(n: usize) -> Self {
        Lines {
            head: Bytes::new(),
            list: Vec::with_capacity(n),
        }
    }

    /// The lines of `map`, in its order (a name's values together, in the order they came).
    pub(crate) fn from_map(map: HeaderMap) -> Self {
        let mut list = Vec::with_capacity(map.len());
        let mut last: Option<HeaderName> = None;
        for (name, value) in map {
            // The map names a name's first value only; the rest follow it unnamed.
            if let Some(name) = name {
                last = Some(name);
            }
            if let Some(name) = &last {
                list.push((name.clone(), Value::Own(value)));
            }
        }
        Lines {
            head: Bytes::new(),
            list,
        }
    }

    /// The same lines as a map, for a handler that takes one.
    pub(crate) fn into_map(self) -> HeaderMap {
        let mut map = HeaderMap::with_capacity(self.list.len());
        for (name, value) in &self.list {
            map.append(name.clone(), self.owned(value));
        }
        map
    }

    /// The first value of `name`.
    pub(crate) fn get(&self, name: &HeaderName) -> Option<&[u8]> {
        self.first(name).map(|v| self.bytes(v))
    }

    /// Every value of `name`, in order.
    pub(crate) fn get_all<'a>(&'a self, name: &'a HeaderName) -> impl Iterator<Item = &'a [u8]> {
        self.list
            .iter()
            .filter(move |(n, _)| n == name)
            .map(|(_, v)| self.bytes(v))
    }

    /// The first value of `name`, as a value of its own (which shares the head's buffer).
    pub(crate) fn value(&self, name: &HeaderName) -> Option<HeaderValue> {
        self.first(name).map(|v| self.owned(v))
    }

    fn first(&self, name: &HeaderName) -> Option<&Value> {
        self.list.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// Every line, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&HeaderName, &[u8])> {
        self.list.iter().map(|(n, v)| (n, self.bytes(v)))
    }

    /// `value` as the only one of `name`: in the place of its first line, or last.
    pub(crate) fn insert(&mut self, name: HeaderName, value: HeaderValue) {
        match self.list.iter().position(|(n, _)| *n == name) {
            Some(first) => {
                self.list[first].1 = Value::Own(value);
                let mut index = 0;
                self.list.retain(|(n, _)| {
                    let keep = index <= first || *n != name;
                    index += 1;
                    keep
                });
            }
            None => self.list.push((name, Value::Own(value))),
        }
    }

    /// Another line, last.
    #[cfg(test)]
    pub(crate) fn append(&mut self, name: HeaderName, value: HeaderValue) {
        self.list.push((name, Value::Own(value)));
    }

    /// Drops every line of `name`.
    pub(crate) fn remove(&mut self, name: &HeaderName) {
        self.list.retain(|(n, _)| n != name);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }

    fn bytes<'a>(&'a self, value: &'a Value) -> &'a [u8] {
        match value {
            Value::Head { start, end } => &self.head[*start as usize..*end as usize],
            Value::Own(v) => v.as_bytes(),
        }
    }

    fn owned(&self, value: &Value) -> HeaderValue {
        match value {
            Value::Head { start, end } => {
                let bytes = self.head.slice(*start as usize..*end as usize);
                // Valid, as `in_head` takes only valid values (the head's test holds its reader
                // to refusing every byte a `HeaderValue` does): the empty value is never given.
                HeaderValue::from_maybe_shared(bytes)
                    .unwrap_or_else(|_| HeaderValue::from_static(""))
            }
            Value::Own(v) => v.clone(),
        }
    }
}

impl FromIterator<(HeaderName, HeaderValue)> for Lines {
    fn from_iter<I: IntoIterator<Item = (HeaderName, HeaderValue)>>(lines: I) -> Self {
        Lines {
            head: Bytes::new(),
            list: lines.into_iter().map(|(n, v)| (n, Value::Own(v))).collect(),
        }
    }
}

/// `req` without its header lines, and them.
pub(crate) fn taken<B>(mut req: http::Request<B>) -> (http::Request<B>, Lines) {
    let lines = Lines::from_map(std::mem::take(req.headers_mut()));
    (req, lines)
}

/// The value as `HeaderValue::to_str` reads it: visible ASCII (and tabs), else `None`.
pub(crate) fn text(value: &[u8]) -> Option<&str> {
    value
        .iter()
        .all(|&b| b == b'\t' || (0x20..0x7f).contains(&b))
        .then(|| std::str::from_utf8(value).ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn name(s: &str) -> HeaderName {
        HeaderName::from_bytes(s.as_bytes()).unwrap()
    }

    const NAMES: &[&str] = &["host", "x-a", "authorization", "x-b", "connection"];

    fn lines_strategy() -> impl Strategy<Value = Vec<(usize, String)>> {
        prop::collection::vec((0..NAMES.len(), "[a-z0-9 ,]{0,6}"), 0..12)
    }

    /// The same lines read from a head, as a map's, and as owned values.
    fn three_ways(lines: &[(usize, String)]) -> (Lines, HeaderMap, Lines) {
        let mut head = Vec::new();
        let mut places = Vec::new();
        let mut map = HeaderMap::new();
        for (n, v) in lines {
            head.extend_from_slice(NAMES[*n].as_bytes());
            head.extend_from_slice(b": ");
            places.push((name(NAMES[*n]), head.len()..head.len() + v.len()));
            head.extend_from_slice(v.as_bytes());
            head.extend_from_slice(b"\r\n");
            map.append(name(NAMES[*n]), HeaderValue::from_str(v).unwrap());
        }
        let read = Lines::in_head(Bytes::from(head), places.into_iter(), 1);
        let owned = Lines::from_map(map.clone());
        (read, map, owned)
    }

    proptest! {
        /// Looked up, lines answer as a `HeaderMap` of them does, read from a head or not.
        #[test]
        fn lines_answer_as_a_map_of_them_does(lines in lines_strategy()) {
            let (read, map, owned) = three_ways(&lines);
            for n in NAMES {
                let n = name(n);
                for lines in [&read, &owned] {
                    prop_assert_eq!(lines.get(&n), map.get(&n).map(HeaderValue::as_bytes));
                    let all: Vec<&[u8]> = lines.get_all(&n).collect();
                    let expected: Vec<&[u8]> = map.get_all(&n).iter().map(HeaderValue::as_bytes).collect();
                    prop_assert_eq!(all, expected);
                    prop_assert_eq!(lines.value(&n), map.get(&n).cloned());
                }
            }
            prop_assert_eq!(read.clone().into_map(), map.clone());
            prop_assert_eq!(owned.into_map(), map);
            let in_order: Vec<(String, Vec<u8>)> = read
                .iter()
                .map(|(n, v)| (n.as_str().to_owned(), v.to_vec()))
                .collect();
            let sent: Vec<(String, Vec<u8>)> = lines
                .iter()
                .map(|(n, v)| (NAMES[*n].to_owned(), v.as_bytes().to_vec()))
                .collect();
            prop_assert_eq!(in_order, sent);
        }

        /// `insert`, `append` and `remove` change lines as they change a map.
        #[test]
        fn lines_change_as_a_map_does(lines in lines_strategy(), n in 0..NAMES.len(), op in 0..3u8) {
            let (mut read, mut map, _) = three_ways(&lines);
            let n = name(NAMES[n]);
            let v = HeaderValue::from_static("new");
            match op {
                0 => {
                    read.insert(n.clone(), v.clone());
                    map.insert(n.clone(), v);
                }
                1 => {
                    read.append(n.clone(), v.clone());
                    map.append(n.clone(), v);
                }
                _ => {
                    read.remove(&n);
                    map.remove(&n);
                }
            }
            prop_assert_eq!(read.len(), map.len());
            prop_assert_eq!(read.into_map(), map);
        }
    }

    #[test]
    fn insert_keeps_the_place_of_the_first_line_of_its_name() {
        let mut lines: Lines = [
            (name("x-a"), HeaderValue::from_static("1")),
            (name("x-b"), HeaderValue::from_static("2")),
            (name("x-a"), HeaderValue::from_static("3")),
        ]
        .into_iter()
        .collect();
        lines.insert(name("x-a"), HeaderValue::from_static("4"));
        let got: Vec<(&str, &[u8])> = lines.iter().map(|(n, v)| (n.as_str(), v)).collect();
        assert_eq!(got, [("x-a", &b"4"[..]), ("x-b", b"2")]);
    }

    #[test]
    fn text_is_what_to_str_reads() {
        for b in 0..=255u8 {
            let v = [b'a', b, b'z'];
            let expected = HeaderValue::from_bytes(&v)
                .ok()
                .and_then(|h| h.to_str().ok().map(str::to_owned));
            let valid = HeaderValue::from_bytes(&v).is_ok();
            if valid {
                assert_eq!(text(&v).map(str::to_owned), expected, "byte {b}");
            }
        }
    }
}
