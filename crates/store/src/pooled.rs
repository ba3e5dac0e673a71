//! What opening SQLite and PostgreSQL share: the pool settings and the last step of opening,
//! applying the backend's migrations and wrapping the pool in the one [`Store`] implementation.

use std::sync::Arc;
use std::time::Duration;

use sqlx::migrate::{Migrate, MigrateError, Migrator};
use sqlx::{Connection, Database};

use crate::sql_store::SqlStore;
use crate::{db_error, Store, StoreError};

/// Connection-pool settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolOptions {
    /// Most connections open at once (default 16). Bounds what one gateway can ask of the
    /// database, however many cache misses arrive together.
    pub max_connections: u32,
    /// How long a query waits for a free connection before failing `Unavailable`
    /// (default 2 s). Short on purpose: a caller that waits longer is better served stale.
    pub acquire_timeout: Duration,
    /// Closes connections idle this long (default 10 min; `None`: keep them).
    pub idle_timeout: Option<Duration>,
}

impl Default for PoolOptions {
    fn default() -> PoolOptions {
        PoolOptions {
            max_connections: 16,
            acquire_timeout: Duration::from_secs(2),
            idle_timeout: Some(Duration::from_secs(600)),
        }
    }
}

/// Connects a pool of `options` with `connect`, applies `migrator`, and makes it a [`Store`].
/// `what` names the database for errors (a path or "postgres", never a URL).
pub(crate) async fn connect_and_migrate<DB>(
    options: &PoolOptions,
    connect: <DB::Connection as Connection>::Options,
    migrator: &Migrator,
    what: &str,
) -> Result<Arc<dyn Store>, StoreError>
where
    DB: Database,
    DB::Connection: Migrate,
    SqlStore<DB>: Store,
{
    let pool = sqlx::pool::PoolOptions::<DB>::new()
        .max_connections(options.max_connections)
        .acquire_timeout(options.acquire_timeout)
        .idle_timeout(options.idle_timeout)
        // A connection is already tested when it is returned to the pool; testing it again on
        // every acquire would double the round trips the database sees, which is exactly the
        // load that matters when a cache flush sends every lookup to it (IL-0136).
        .test_before_acquire(false)
        .connect_with(connect)
        .await
        .map_err(|err| opening_failed(err, what))?;
    migrator.run(&pool).await.map_err(|err| match err {
        MigrateError::Execute(err) => db_error::read(err, "migrate"),
        // A database migrated by a newer spillway, or edited by hand: not something a retry
        // fixes.
        other => StoreError::Invalid(format!("migrations of {what}: {other}")),
    })?;
    Ok(Arc::new(SqlStore::new(pool)))
}

/// Why a pool could not be opened, as the caller must act on it: a database that cannot be
/// reached now (refused, unreachable, timed out, starting up, out of connections) is
/// `Unavailable`, worth waiting out; one that answered with a refusal no wait will change (no
/// such role or database, a wrong password, a TLS or URL setting it rejects) is `Invalid`, a
/// configuration error to report at once.
fn opening_failed(err: sqlx::Error, what: &str) -> StoreError {
    let refused_for_good = match &err {
        sqlx::Error::Database(db) => db.code().is_some_and(|c| is_configuration_sqlstate(&c)),
        sqlx::Error::Configuration(_) | sqlx::Error::Tls(_) => true,
        _ => false,
    };
    if refused_for_good {
        return StoreError::Invalid(format!("opening {what}: {err}"));
    }
    tracing::warn!(store = what, error = %err, "cannot open the store");
    StoreError::Unavailable(format!("opening {what}: {err}"))
}

/// PostgreSQL's classes of refusal that come from the configuration, not the moment: `28`
/// (invalid authorization: wrong password, no such role, refused by `pg_hba.conf`) and `3D`
/// (no such database). Transient ones (`57P03` starting up, `53300` too many connections) are
/// not among them; SQLite's codes are numeric and never match.
fn is_configuration_sqlstate(code: &str) -> bool {
    code.starts_with("28") || code.starts_with("3D")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let options = PoolOptions::default();
        assert_eq!(options.max_connections, 16);
        assert_eq!(options.acquire_timeout, Duration::from_secs(2));
    }

    #[test]
    fn refusals_of_the_configuration_are_told_from_passing_trouble() {
        // invalid_password, invalid_authorization_specification, invalid_catalog_name
        for code in ["28P01", "28000", "3D000"] {
            assert!(is_configuration_sqlstate(code), "{code}");
        }
        // cannot_connect_now, too_many_connections, admin_shutdown, and a SQLite code
        for code in ["57P03", "53300", "57P01", "14"] {
            assert!(!is_configuration_sqlstate(code), "{code}");
        }
    }

    #[test]
    fn a_refused_connection_is_unavailable() {
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(matches!(
            opening_failed(io, "postgres"),
            StoreError::Unavailable(_)
        ));
        assert!(matches!(
            opening_failed(sqlx::Error::PoolTimedOut, "postgres"),
            StoreError::Unavailable(_)
        ));
        let tls = sqlx::Error::Tls("certificate rejected".into());
        assert!(matches!(
            opening_failed(tls, "postgres"),
            StoreError::Invalid(_)
        ));
    }
}
