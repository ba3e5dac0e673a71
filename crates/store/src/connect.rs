//! Opening a store from its URL: the one entry point that picks a backend.
//!
//! The URL's scheme selects SQLite or PostgreSQL; everything after that is the backend's
//! business (`sqlite.rs`, `postgres.rs`), which both end in what they share (`pooled.rs`). A URL
//! may carry a password, so no error message repeats it.

use std::sync::Arc;

use crate::pooled::PoolOptions;
use crate::{Store, StoreError};

/// Opens the store at `url` and applies its migrations.
///
/// `sqlite://PATH` or `sqlite:PATH` (the file and its directory are created on first run), or
/// `postgres://…` / `postgresql://…`. Anything else is `Invalid`, and so is a database that
/// refuses the URL's role, password or database name; a database that cannot be reached now is
/// `Unavailable` (a caller may wait that out: [`crate::DeferredStore`]).
pub async fn open(url: &str, options: &PoolOptions) -> Result<Arc<dyn Store>, StoreError> {
    if options.max_connections == 0 {
        return Err(StoreError::Invalid(
            "store pool: max_connections must be at least 1".to_owned(),
        ));
    }
    if options.acquire_timeout.is_zero() {
        return Err(StoreError::Invalid(
            "store pool: acquire_timeout must be longer than zero".to_owned(),
        ));
    }
    if let Some(path) = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
    {
        return crate::sqlite::open(path, options).await;
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return crate::postgres::open(url, options).await;
    }
    let scheme = match url.split_once(':') {
        Some((scheme, _)) if scheme.len() <= 16 => format!("scheme {scheme:?}"),
        _ => "no scheme".to_owned(),
    };
    Err(StoreError::Invalid(format!(
        "store URL with {scheme}: use sqlite://PATH, sqlite:PATH, postgres://… or \
         postgresql://…"
    )))
}
