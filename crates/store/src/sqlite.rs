//! The SQLite backend: a single file beside the gateway, the default that needs no service.
//!
//! What is particular to SQLite is how the file is opened: it and its directory are created on
//! first run; the journal is a write-ahead log, so lookups (reads) never wait for a writer; a
//! writer that finds the database locked waits up to [`BUSY_TIMEOUT`] instead of failing at
//! once; every commit is synced; foreign keys are enforced (SQLite leaves them off unless
//! asked). Queries, rows and errors are shared with PostgreSQL (`sql_store.rs`).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::Sqlite;

use crate::pooled::{connect_and_migrate, PoolOptions};
use crate::{Store, StoreError};

/// How long a statement waits for another connection's write lock before failing.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

static MIGRATOR: Migrator = sqlx::migrate!("migrations/sqlite");

/// Opens (creating if needed) the database file at `path`.
pub(crate) async fn open(path: &str, options: &PoolOptions) -> Result<Arc<dyn Store>, StoreError> {
    let path = database_path(path)?;
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|err| {
            StoreError::Unavailable(format!("creating directory {}: {err}", dir.display()))
        })?;
    }
    let connect = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        // Writes are rare (admin changes) and some must not be lost: a revocation that a
        // power cut undid would bring a key back. So every commit is synced.
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(BUSY_TIMEOUT)
        .foreign_keys(true);
    let what = path.display().to_string();
    connect_and_migrate::<Sqlite>(options, connect, &MIGRATOR, &what).await
}

/// The file named by the part of the URL after `sqlite:` or `sqlite://`.
fn database_path(path: &str) -> Result<&Path, StoreError> {
    if path.is_empty() {
        return Err(StoreError::Invalid(
            "sqlite URL without a path: use sqlite://PATH".to_owned(),
        ));
    }
    if path.contains('?') {
        return Err(StoreError::Invalid(
            "sqlite URL with parameters: give only the path; journal, locking and foreign keys \
             are set by spillway"
                .to_owned(),
        ));
    }
    // Every pooled connection would get its own, empty, in-memory database.
    if path == ":memory:" {
        return Err(StoreError::Invalid(
            "sqlite in-memory databases are not supported: give a file path".to_owned(),
        ));
    }
    Ok(Path::new(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_from_urls() {
        assert_eq!(
            database_path("/var/lib/spillway/meta.db"),
            Ok(Path::new("/var/lib/spillway/meta.db"))
        );
        assert_eq!(database_path("meta.db"), Ok(Path::new("meta.db")));
        for bad in ["", ":memory:", "meta.db?mode=ro"] {
            assert!(
                matches!(database_path(bad), Err(StoreError::Invalid(_))),
                "{bad}"
            );
        }
    }
}
