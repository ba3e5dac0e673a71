//! The one reading of a database driver's error as a [`StoreError`].
//!
//! Callers act on the kind: a conflict or a missing row is the caller's to fix, while anything
//! about the database itself (unreachable, timed out, locked, broken) is `Unavailable`, the kind
//! the lookup cache answers by serving what it already has. Only `Unavailable` is logged, once,
//! here; messages carry the driver's text, never bound values (secrets and digests are bound,
//! never formatted into SQL).

use sqlx::error::ErrorKind;

use crate::StoreError;

/// An error of a statement that cannot violate a constraint (a read, or a write whose
/// constraint failures were already told apart).
pub(crate) fn read(err: sqlx::Error, op: &'static str) -> StoreError {
    match err {
        sqlx::Error::RowNotFound => StoreError::NotFound("row".to_owned()),
        sqlx::Error::Database(db) if db.kind() == ErrorKind::CheckViolation => {
            StoreError::Invalid(format!("rejected by the database: {}", db.message()))
        }
        err => {
            tracing::warn!(op, error = %err, "store query failed");
            StoreError::Unavailable(format!("{op}: {err}"))
        }
    }
}

/// An error of a write: a duplicate becomes `on_duplicate()`, a reference to a missing row
/// (a key's tenant) `on_missing_parent()`, anything else as [`read`].
pub(crate) fn write(
    err: sqlx::Error,
    op: &'static str,
    on_duplicate: impl FnOnce() -> StoreError,
    on_missing_parent: impl FnOnce() -> StoreError,
) -> StoreError {
    match &err {
        sqlx::Error::Database(db) if db.kind() == ErrorKind::UniqueViolation => on_duplicate(),
        sqlx::Error::Database(db) if db.kind() == ErrorKind::ForeignKeyViolation => {
            on_missing_parent()
        }
        _ => read(err, op),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_trouble_is_unavailable() {
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(matches!(read(io, "test"), StoreError::Unavailable(_)));
        assert!(matches!(
            read(sqlx::Error::PoolClosed, "test"),
            StoreError::Unavailable(_)
        ));
    }

    #[test]
    fn write_without_constraint_failure_reads_as_read() {
        let err = write(
            sqlx::Error::PoolClosed,
            "test",
            || StoreError::Conflict("x".into()),
            || StoreError::NotFound("y".into()),
        );
        assert!(matches!(err, StoreError::Unavailable(_)));
    }
}
