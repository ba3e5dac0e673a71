//! TOML text into the raw structs, with as many type errors as can be found in one pass.
//!
//! A derived `Deserialize` stops at its first error and cannot resume: the value it failed on
//! is half consumed and the struct has no way to stand in for it. So one parse of the whole file
//! gives one error. After a failed parse, each top-level section (`[server]`, `[retry]`, the
//! list of `[[models]]`, ...) is deserialized again on its own, from the same text so that its
//! error keeps its line, with every other section skipped unread. A file with mistakes in three
//! sections then reports three errors. Within one section only its first error is found, for
//! the reason above; fixing it shows the next.

use std::marker::PhantomData;

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use crate::raw::{
    RawAdaptive, RawAdmin, RawAdmission, RawCache, RawConfig, RawEngineMetrics, RawHealthCheck,
    RawModel, RawOutlier, RawRetry, RawServer, RawStore, RawTenant, RawUpstream,
};

/// The raw configuration, or every error found, each a message with its line.
pub(crate) fn raw(text: &str) -> Result<RawConfig, Vec<String>> {
    let first = match toml::from_str::<RawConfig>(text) {
        Ok(raw) => return Ok(raw),
        Err(e) => e,
    };
    if text.parse::<toml::Table>().is_err() {
        // Not TOML at all: the parser stops at the first syntax error, so that is all there is.
        return Err(vec![first.to_string()]);
    }
    let mut errors = vec![first];
    let sections = [
        section::<RawServer>(text, "server"),
        section::<RawUpstream>(text, "upstream"),
        section::<RawStore>(text, "store"),
        section::<RawCache>(text, "cache"),
        section::<RawAdmin>(text, "admin"),
        section::<RawAdmission>(text, "admission"),
        section::<RawRetry>(text, "retry"),
        section::<RawOutlier>(text, "outlier"),
        section::<RawHealthCheck>(text, "health_check"),
        section::<RawAdaptive>(text, "adaptive_concurrency"),
        section::<RawEngineMetrics>(text, "engine_metrics"),
        section::<Vec<RawTenant>>(text, "tenants"),
        section::<Vec<RawModel>>(text, "models"),
    ];
    for e in sections.into_iter().flatten() {
        if !errors.iter().any(|known| known.span() == e.span()) {
            errors.push(e);
        }
    }
    // In file order, as an editor would walk them.
    errors.sort_by_key(|e| e.span().map_or(0, |s| s.start));
    Err(errors.iter().map(ToString::to_string).collect())
}

/// The error in the top-level section `key` of `text`, read as a `T`, if any.
fn section<T: for<'de> Deserialize<'de>>(text: &str, key: &'static str) -> Option<toml::de::Error> {
    let only = Only::<T> {
        key,
        section: PhantomData,
    };
    only.deserialize(toml::Deserializer::new(text)).err()
}

/// Reads the top-level table, deserializing the value under `key` as a `T` and skipping the
/// rest unread.
struct Only<T> {
    key: &'static str,
    section: PhantomData<T>,
}

impl<'de, T: Deserialize<'de>> DeserializeSeed<'de> for Only<T> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for Only<T> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a table with an optional `{}`", self.key)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            if key == self.key {
                map.next_value::<T>()?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}
