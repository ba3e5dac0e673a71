//! A fresh, private database per test, for either backend, and what the tests need to look
//! under the [`Store`] trait: the raw `api_keys` rows and a way to hold the write lock.
//!
//! SQLite tests get a file under the temp directory; PostgreSQL tests get a schema of their own
//! in the tests' database (`spillway_testkit::postgres_url`: `SPILLWAY_TEST_POSTGRES_URL`, by
//! default the local `test` database; absent, the tests fail naming the variable), selected per
//! connection with the `search_path` option. Both are removed when the test ends, passed or failed, so tests run
//! in parallel and leave nothing behind.

#![allow(dead_code)] // each test binary uses a different part of the harness

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use rand::Rng;
use spillway_store::{PoolOptions, Store, TenantSpec};
use sqlx::{Connection, PgConnection, Row, SqliteConnection};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// One test's database.
pub struct TestDb {
    pub backend: Backend,
    /// What `spillway_store::open` is given.
    pub url: String,
    place: Place,
}

enum Place {
    File(PathBuf),
    Schema { admin_url: String, name: String },
}

/// A lock that makes every write of the store wait (a reader is not held up).
pub enum WriteLock {
    Sqlite(SqliteConnection),
    Postgres(PgConnection),
}

/// Runs `case` against a fresh database of `backend`, then removes the database whatever the
/// outcome, and fails the test if `case` panicked.
pub async fn run<F, Fut>(backend: Backend, case: F)
where
    F: FnOnce(Arc<TestDb>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let db = Arc::new(TestDb::create(backend).await);
    // A panic inside the spawned task comes back as an error here, after which we clean up.
    let outcome = tokio::spawn(case(db.clone())).await;
    db.remove().await;
    if let Err(err) = outcome {
        std::panic::resume_unwind(err.into_panic());
    }
}

pub fn spec(name: &str) -> TenantSpec {
    TenantSpec {
        name: name.to_owned(),
        requests_per_min: Some(600),
        tokens_per_min: None,
        max_concurrency: Some(8),
        priority: Default::default(),
        allowed_models: None,
        pool: None,
        default_model: None,
        enabled: true,
    }
}

pub fn unix_now() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    i64::try_from(since.as_secs()).unwrap()
}

fn unique_suffix() -> String {
    hex::encode(rand::rng().random::<[u8; 8]>())
}

impl TestDb {
    async fn create(backend: Backend) -> TestDb {
        match backend {
            Backend::Sqlite => {
                let path = std::env::temp_dir()
                    .join(format!("spillway-store-test-{}", unique_suffix()))
                    .join("meta.db");
                TestDb {
                    backend,
                    url: format!("sqlite://{}", path.display()),
                    place: Place::File(path),
                }
            }
            Backend::Postgres => {
                let admin_url = spillway_testkit::postgres_url();
                let name = format!("t_{}", unique_suffix());
                let mut admin = PgConnection::connect(&admin_url).await.unwrap_or_else(|e| {
                    panic!(
                        "PostgreSQL for tests at {}: {e}",
                        spillway_testkit::POSTGRES_URL_VAR
                    )
                });
                sqlx::query(&format!("CREATE SCHEMA {name}"))
                    .execute(&mut admin)
                    .await
                    .unwrap();
                admin.close().await.unwrap();
                let separator = if admin_url.contains('?') { '&' } else { '?' };
                TestDb {
                    backend,
                    url: format!("{admin_url}{separator}options=-c%20search_path%3D{name}"),
                    place: Place::Schema { admin_url, name },
                }
            }
        }
    }

    pub async fn open(&self, options: &PoolOptions) -> Arc<dyn Store> {
        spillway_store::open(&self.url, options)
            .await
            .unwrap_or_else(|e| panic!("opening {:?} store: {e}", self.backend))
    }

    pub async fn open_default(&self) -> Arc<dyn Store> {
        self.open(&PoolOptions::default()).await
    }

    /// Applies the crate's first `count` migrations and no later ones, as an older spillway
    /// left the database, then runs the one statement `sql` on it (rows as that version wrote
    /// them). On a thread and runtime of its own: sqlx's migrator future is not `Send` for every
    /// lifetime, which the spawned test case needs.
    pub async fn migrate_first(&self, count: usize, sql: &str) {
        let folder = match self.backend {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        };
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("migrations")
            .join(folder);
        let url = match &self.place {
            Place::File(path) => {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                format!("sqlite://{}?mode=rwc", path.display())
            }
            Place::Schema { .. } => self.url.clone(),
        };
        let (backend, sql) = (self.backend, sql.to_owned());
        let old = move || async move {
            let mut migrator = sqlx::migrate::Migrator::new(dir).await.unwrap();
            assert!(migrator.migrations.len() > count, "no later migration");
            migrator.migrations = migrator.migrations[..count].to_vec().into();
            match backend {
                Backend::Sqlite => {
                    let mut conn = SqliteConnection::connect(&url).await.unwrap();
                    migrator.run(&mut conn).await.unwrap();
                    sqlx::query(&sql).execute(&mut conn).await.unwrap();
                    conn.close().await.unwrap();
                }
                Backend::Postgres => {
                    let mut conn = PgConnection::connect(&url).await.unwrap();
                    migrator.run(&mut conn).await.unwrap();
                    sqlx::query(&sql).execute(&mut conn).await.unwrap();
                    conn.close().await.unwrap();
                }
            }
        };
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(old())
        })
        .join()
        .unwrap();
    }

    /// Every column of every `api_keys` row, as text (bytes in hex), one row per line.
    pub async fn dump_api_keys(&self) -> String {
        match &self.place {
            Place::File(path) => {
                let mut conn = SqliteConnection::connect(&format!("sqlite://{}", path.display()))
                    .await
                    .unwrap();
                let columns: Vec<String> =
                    sqlx::query_scalar("SELECT name FROM pragma_table_info('api_keys')")
                        .fetch_all(&mut conn)
                        .await
                        .unwrap();
                assert!(columns.len() >= 8, "api_keys columns: {columns:?}");
                let quoted: Vec<String> = columns.iter().map(|c| format!("quote({c})")).collect();
                let sql = format!("SELECT {} FROM api_keys", quoted.join(" || '|' || "));
                let rows: Vec<String> =
                    sqlx::query_scalar(&sql).fetch_all(&mut conn).await.unwrap();
                conn.close().await.unwrap();
                rows.join("\n")
            }
            Place::Schema { .. } => {
                let mut conn = PgConnection::connect(&self.url).await.unwrap();
                let rows = sqlx::query("SELECT row_to_json(k)::text FROM api_keys k")
                    .fetch_all(&mut conn)
                    .await
                    .unwrap();
                conn.close().await.unwrap();
                let rows: Vec<String> = rows.iter().map(|r| r.get::<String, _>(0)).collect();
                rows.join("\n")
            }
        }
    }

    /// The database's files, for SQLite (the file and its write-ahead log); none for
    /// PostgreSQL.
    pub fn files(&self) -> Vec<PathBuf> {
        match &self.place {
            Place::File(path) => ["", "-wal", "-shm"]
                .iter()
                .map(|suffix| PathBuf::from(format!("{}{suffix}", path.display())))
                .filter(|p| p.exists())
                .collect(),
            Place::Schema { .. } => Vec::new(),
        }
    }

    /// The value of a SQLite pragma, read on a connection of its own.
    pub async fn sqlite_pragma(&self, name: &str) -> String {
        let Place::File(path) = &self.place else {
            panic!("pragma of a PostgreSQL database")
        };
        let mut conn = SqliteConnection::connect(&format!("sqlite://{}", path.display()))
            .await
            .unwrap();
        let value: String = sqlx::query_scalar(&format!("PRAGMA {name}"))
            .fetch_one(&mut conn)
            .await
            .unwrap();
        conn.close().await.unwrap();
        value
    }

    /// Takes the database's write lock from a connection of its own.
    pub async fn lock_writes(&self) -> WriteLock {
        match &self.place {
            Place::File(path) => {
                let mut conn = SqliteConnection::connect(&format!("sqlite://{}", path.display()))
                    .await
                    .unwrap();
                sqlx::query("BEGIN IMMEDIATE")
                    .execute(&mut conn)
                    .await
                    .unwrap();
                WriteLock::Sqlite(conn)
            }
            Place::Schema { .. } => {
                let mut conn = PgConnection::connect(&self.url).await.unwrap();
                sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
                // Conflicts with the ROW EXCLUSIVE lock every INSERT takes; SELECT still runs.
                sqlx::query("LOCK TABLE tenants IN SHARE ROW EXCLUSIVE MODE")
                    .execute(&mut conn)
                    .await
                    .unwrap();
                WriteLock::Postgres(conn)
            }
        }
    }

    async fn remove(&self) {
        match &self.place {
            Place::File(path) => {
                if let Some(dir) = path.parent() {
                    let _ = std::fs::remove_dir_all(dir);
                }
            }
            Place::Schema { admin_url, name } => {
                let mut admin = PgConnection::connect(admin_url).await.unwrap();
                sqlx::query(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
                    .execute(&mut admin)
                    .await
                    .unwrap();
                admin.close().await.unwrap();
            }
        }
    }
}

impl WriteLock {
    pub async fn release(self) {
        match self {
            WriteLock::Sqlite(mut conn) => {
                sqlx::query("ROLLBACK").execute(&mut conn).await.unwrap();
                conn.close().await.unwrap();
            }
            WriteLock::Postgres(mut conn) => {
                sqlx::query("ROLLBACK").execute(&mut conn).await.unwrap();
                conn.close().await.unwrap();
            }
        }
    }
}
