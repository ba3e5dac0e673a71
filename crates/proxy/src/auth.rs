//! Who is calling: API key extraction and the tenant directory behind a trait.
//!
//! A key is hashed (SHA-256) as soon as it is read and only the digest travels further, so no
//! layer after this one can log or leak it. The directory is a trait; its implementation is the
//! store behind the lookup cache (`tenants`), which also holds the config file's tenants.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use http::HeaderName;
use spillway_config::key_digest;

use crate::error::{ApiError, ErrorKind};
use crate::lines::Lines;

/// A caller as the request path needs it.
#[derive(Debug)]
pub struct Tenant {
    pub name: Arc<str>,
    /// `None`: every configured model.
    pub allowed_models: Option<Vec<String>>,
    /// A disabled tenant's keys are refused (403).
    pub enabled: bool,
    /// What admission holds the tenant to.
    pub limits: TenantLimits,
    /// Its dedicated backend pool (bulkhead): it uses those backends and no others.
    pub pool: Option<Arc<str>>,
    /// The model a Responses API create that names none (and continues no response) goes to.
    pub default_model: Option<Arc<str>>,
}

/// A tenant's limits from its record; `None`: no limit of that kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TenantLimits {
    pub requests_per_min: Option<u32>,
    pub tokens_per_min: Option<u32>,
    pub max_concurrency: Option<u32>,
    pub priority: spillway_policy::Priority,
}

impl Tenant {
    pub fn may_use(&self, model: &str) -> bool {
        self.allowed_models
            .as_ref()
            .is_none_or(|list| list.iter().any(|m| m == model))
    }
}

/// The SHA-256 of a presented API key.
pub type KeyDigest = [u8; 32];

/// Why a lookup could not answer (as opposed to answering "no such key").
#[derive(Debug, thiserror::Error)]
#[error("tenant directory unavailable: {0}")]
pub struct LookupError(pub String);

pub type LookupFuture<'a> = Pin<Box<dyn Future<Output = Looked> + Send + 'a>>;

/// What a lookup answers: the tenant, `None` for a key no one has, or why there is no answer.
pub type Looked = Result<Option<Arc<Tenant>>, LookupError>;

/// Resolves a key digest to its tenant.
pub trait TenantDirectory: Send + Sync + 'static {
    fn lookup<'a>(&'a self, digest: &'a KeyDigest) -> LookupFuture<'a>;

    /// The answer `lookup` would give, when it is at hand without waiting (a cache hit);
    /// `None` sends the caller to `lookup`.
    fn cached(&self, _digest: &KeyDigest) -> Option<Looked> {
        None
    }
}

/// Azure's name for the key's header.
static API_KEY: HeaderName = HeaderName::from_static("api-key");
/// Anthropic's.
static X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// Longest key accepted; anything longer is refused before hashing.
const MAX_KEY_LEN: usize = 512;

/// Reads the caller's key from `Authorization: Bearer KEY`, Azure-style `api-key: KEY` or
/// Anthropic-style `x-api-key: KEY` (first found, in that order) and returns its digest.
///
/// A key that is there but not printable ASCII (what a header value must be to be read as text)
/// is refused as invalid, not as missing: the caller did send one, and being told to send one
/// would mislead them.
pub(crate) fn presented_key(headers: &Lines) -> Result<KeyDigest, ApiError> {
    let bearer = headers.get(&http::header::AUTHORIZATION).and_then(|v| {
        v.strip_prefix(b"Bearer ")
            .or_else(|| v.strip_prefix(b"bearer "))
    });
    let key = bearer
        .or_else(|| headers.get(&API_KEY))
        .or_else(|| headers.get(&X_API_KEY))
        .map(<[u8]>::trim_ascii)
        .filter(|k| !k.is_empty())
        .ok_or_else(|| {
            ApiError::new(
                ErrorKind::MissingApiKey,
                "no API key: send `Authorization: Bearer KEY`, `api-key: KEY` or `x-api-key: KEY`",
            )
        })?;
    if key.len() > MAX_KEY_LEN {
        return Err(ApiError::new(ErrorKind::InvalidApiKey, "invalid API key"));
    }
    let key = std::str::from_utf8(key)
        .ok()
        .filter(|k| k.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b)))
        .ok_or_else(|| {
            ApiError::new(
                ErrorKind::InvalidApiKey,
                "invalid API key: it has characters other than printable ASCII, which no key has",
            )
        })?;
    Ok(key_digest(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> Lines {
        pairs
            .iter()
            .map(|(k, v)| (http::HeaderName::from_static(k), v.parse().unwrap()))
            .collect()
    }

    #[test]
    fn bearer_azure_and_anthropic_style_keys_are_all_read() {
        let d = key_digest("sk-1");
        assert_eq!(
            presented_key(&headers(&[("authorization", "Bearer sk-1")])).unwrap(),
            d
        );
        assert_eq!(presented_key(&headers(&[("api-key", "sk-1")])).unwrap(), d);
        assert_eq!(
            presented_key(&headers(&[("x-api-key", "sk-1")])).unwrap(),
            d
        );
    }

    #[test]
    fn missing_and_oversized_keys_are_refused() {
        let missing = presented_key(&headers(&[("authorization", "Basic abc")])).unwrap_err();
        assert_eq!(missing.kind, ErrorKind::MissingApiKey);
        let long = "k".repeat(MAX_KEY_LEN + 1);
        let e = presented_key(&headers(&[("api-key", &long)])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidApiKey);
    }
}
