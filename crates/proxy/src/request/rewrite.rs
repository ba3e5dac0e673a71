//! The rewrites spillway makes to a request body: `model` for a backend that knows the model by
//! another name or a fallback model, `priority` for engines that schedule by it, and the
//! tenant's tag in `metadata` for a completion the backend stores.
//!
//! Each is a splice of the bytes the caller sent: only the values set change, every other byte
//! (field order, spacing, fields spillway does not know) is kept, and the result is one buffer
//! whose size is known before it is made, so it can be counted in the body budget first. No
//! tree of the body is built: a 4 MiB body costs one 4 MiB copy, not a parse and a print.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::held::Filling;
use crate::error::{ApiError, ErrorKind};

/// The metadata key that names the tenant on a completion a backend stores, so that listing
/// stored completions through one backend key shows each tenant only its own.
pub const TENANT_TAG: &str = "spillway_tenant";

/// What a rewrite sets; `None` leaves a field as the caller sent it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Changes<'a> {
    pub model: Option<&'a str>,
    pub priority: Option<i64>,
    /// `metadata.spillway_tenant`, the caller's other metadata kept (a `metadata` that is
    /// neither an object nor null is left for the backend to refuse).
    pub tenant_tag: Option<&'a str>,
}

impl Changes<'_> {
    pub fn is_empty(&self) -> bool {
        *self == Changes::default()
    }
}

/// A rewrite worked out: the byte ranges replaced and what replaces them, and the size of the
/// result.
#[derive(Debug)]
pub struct Plan {
    edits: Vec<(Range<usize>, String)>,
    len: usize,
}

impl Plan {
    /// The rewrite of `body` (a JSON object) that makes `changes`. Every top-level `model` or
    /// `priority` (and every `spillway_tenant` in `metadata`) is set, so a duplicated key
    /// cannot keep the caller's value; a field not there is added at the end of its object.
    pub fn new(body: &[u8], changes: &Changes<'_>) -> Result<Plan, ApiError> {
        let text = std::str::from_utf8(body).map_err(malformed)?;
        let top = fields(text, text)?;
        let mut edits = Vec::new();
        let mut added = Vec::new();
        let mut set = |key: &str, value: String, added: &mut Vec<String>| {
            let mut found = false;
            for (_, span) in top.iter().filter(|(k, _)| k == key) {
                edits.push((span.clone(), value.clone()));
                found = true;
            }
            if !found {
                added.push(format!("{}:{value}", quoted(key)));
            }
        };
        if let Some(model) = changes.model {
            set("model", quoted(model), &mut added);
        }
        if let Some(priority) = changes.priority {
            set("priority", priority.to_string(), &mut added);
        }
        if let Some(tenant) = changes.tenant_tag {
            let tag = format!("{}:{}", quoted(TENANT_TAG), quoted(tenant));
            let metadata: Vec<_> = top.iter().filter(|(k, _)| k == "metadata").collect();
            if metadata.is_empty() {
                added.push(format!("\"metadata\":{{{tag}}}"));
            }
            for (_, span) in metadata {
                let value = &text[span.clone()];
                if value == "null" {
                    edits.push((span.clone(), format!("{{{tag}}}")));
                } else if value.starts_with('{') {
                    let inner = fields(text, value)?;
                    let tags: Vec<_> = inner.iter().filter(|(k, _)| k == TENANT_TAG).collect();
                    for (_, at) in &tags {
                        edits.push((at.clone(), quoted(tenant)));
                    }
                    if tags.is_empty() {
                        let close = span.end - 1;
                        let comma = if inner.is_empty() { "" } else { "," };
                        edits.push((close..close, format!("{comma}{tag}")));
                    }
                }
            }
        }
        if !added.is_empty() {
            // The object's closing brace: only whitespace may follow it.
            let close = text.trim_end().len() - 1;
            let comma = if top.is_empty() { "" } else { "," };
            edits.push((close..close, format!("{comma}{}", added.join(","))));
        }
        edits.sort_by_key(|(at, _)| at.start);
        let len = edits
            .iter()
            .fold(body.len(), |len, (at, with)| len - at.len() + with.len());
        Ok(Plan { edits, len })
    }

    /// The size of the rewritten body.
    pub fn size(&self) -> usize {
        self.len
    }

    /// The rewritten body, in one buffer of its size.
    pub(super) fn apply(&self, body: &[u8]) -> Filling {
        let mut out = Filling::new(self.len);
        let mut at = 0;
        for (range, with) in &self.edits {
            out.extend(&body[at..range.start]);
            out.extend(with.as_bytes());
            at = range.end;
        }
        out.extend(&body[at..]);
        out
    }
}

fn malformed(e: impl fmt::Display) -> ApiError {
    ApiError::new(ErrorKind::MalformedRequest, e.to_string())
}

/// `s` as a JSON string.
fn quoted(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

/// Where `part` (a slice of `text`) starts in `text`.
fn offset(text: &str, part: &str) -> usize {
    part.as_ptr() as usize - text.as_ptr() as usize
}

/// A field of an object: its key, unescaped, and where its value is in the body.
type Field<'a> = (Cow<'a, str>, Range<usize>);

/// The fields of `object` (a slice of `text`): each key, unescaped, and where its value is in
/// `text`. An `object` that is not a JSON object is malformed.
fn fields<'a>(text: &str, object: &'a str) -> Result<Vec<Field<'a>>, ApiError> {
    let Fields(fields) = serde_json::from_str(object).map_err(malformed)?;
    Ok(fields
        .into_iter()
        .map(|(key, value)| {
            let start = offset(text, value.get());
            (key, start..start + value.get().len())
        })
        .collect())
}

/// An object's keys and raw values, borrowed from its text.
struct Fields<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de> Deserialize<'de> for Fields<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Object;
        impl<'de> Visitor<'de> for Object {
            type Value = Fields<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields<'de>, A::Error> {
                let mut fields = Vec::new();
                while let Some((Key(key), value)) = map.next_entry::<Key<'de>, &'de RawValue>()? {
                    fields.push((key, value));
                }
                Ok(Fields(fields))
            }
        }
        d.deserialize_map(Object)
    }
}

/// An object's key: borrowed, unless it had escapes to undo.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Text;
        impl<'de> Visitor<'de> for Text {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(Text)
    }
}

#[cfg(test)]
#[path = "rewrite_tests.rs"]
mod tests;
