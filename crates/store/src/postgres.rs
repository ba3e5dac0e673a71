//! The PostgreSQL backend: one store shared by several gateway instances.
//!
//! What is particular to PostgreSQL is the URL (parsed by the driver: host, credentials, TLS,
//! `options`) and that each connection names itself `spillway`, so an operator counting
//! connections in `pg_stat_activity` during an incident can tell the gateway's from the rest.
//! Queries, rows and errors are shared with SQLite (`sql_store.rs`).

use std::str::FromStr;
use std::sync::Arc;

use sqlx::migrate::Migrator;
use sqlx::postgres::PgConnectOptions;
use sqlx::Postgres;

use crate::pooled::{connect_and_migrate, PoolOptions};
use crate::{Store, StoreError};

static MIGRATOR: Migrator = sqlx::migrate!("migrations/postgres");

/// Connects to the database at `url` (`postgres://…` or `postgresql://…`).
pub(crate) async fn open(url: &str, options: &PoolOptions) -> Result<Arc<dyn Store>, StoreError> {
    // The driver's parse errors describe the part that is wrong, not the whole URL, so they
    // are safe to show even when the URL holds a password.
    let connect = PgConnectOptions::from_str(url)
        .map_err(|err| StoreError::Invalid(format!("postgres URL: {err}")))?
        .application_name("spillway");
    connect_and_migrate::<Postgres>(options, connect, &MIGRATOR, "postgres").await
}
