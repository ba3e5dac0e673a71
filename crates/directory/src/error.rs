//! The directory's one error type, and what a caller may do about each kind.
//!
//! A lookup fails only when there is no usable answer at all: the store failed or was too slow
//! and nothing cached could stand in. That is `Unavailable`, the one kind worth retrying (later,
//! not at once: an immediate retry is the load IL-0136 drowned in). The other kinds come from
//! start-up and maintenance calls, never from the request path.

use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DirectoryError {
    /// No usable answer: the store failed, timed out, or too many lookups were already waiting
    /// on it, and no cached entry was within its stale window. The text says which.
    #[error("key directory unavailable: {0}")]
    Unavailable(String),
    /// The settings were rejected by `config::check` (or the Redis URL did not parse).
    #[error("invalid key cache settings: {0}")]
    InvalidConfig(String),
    /// The snapshot could not be read or written.
    #[error("key cache snapshot {}: {reason}", path.display())]
    Snapshot { path: PathBuf, reason: String },
}

impl DirectoryError {
    /// Whether the same call may succeed later without anyone changing anything.
    pub fn is_retryable(&self) -> bool {
        matches!(self, DirectoryError::Unavailable(_))
    }
}
