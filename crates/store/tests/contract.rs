//! The [`Store`] contract, written once against `Arc<dyn Store>` and run on SQLite and on
//! PostgreSQL: whatever the backend, callers get the same answers and the same error kinds.
//!
//! Each case below becomes two tests, `sqlite::<case>` and `postgres::<case>`, each on a fresh
//! database of its own (see `common`).

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{spec, unix_now, Backend, TestDb};
use spillway_store::{digest_secret, PoolOptions, Priority, Store, StoreError, TenantUpdate};

/// Generates one test per backend for every case named.
macro_rules! on_both_backends {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test]
            async fn $case() {
                crate::common::run(crate::Backend::Sqlite, crate::cases::$case).await
            })*
        }
        mod postgres {
            $(#[tokio::test]
            async fn $case() {
                crate::common::run(crate::Backend::Postgres, crate::cases::$case).await
            })*
        }
    };
}

on_both_backends!(
    tenant_lifecycle,
    duplicate_tenant_is_a_conflict,
    upsert_creates_then_matches_spec,
    invalid_names_and_descriptions_are_rejected,
    created_key_is_found_by_digest_of_its_secret,
    secret_is_not_stored,
    revoked_key_still_resolves_with_revoked_at,
    expired_key_is_not_valid,
    unknown_tenant_is_not_found,
    ensure_key_digest_is_idempotent,
    page_keys_covers_every_key_once,
    migrations_are_idempotent,
    an_older_database_is_upgraded_in_place,
    default_model_is_kept_and_cleared,
    pool_stats_report_a_size,
    il_0136_exhausted_pool_fails_fast_and_is_counted,
);

mod cases {
    use super::*;

    pub async fn tenant_lifecycle(db: Arc<TestDb>) {
        let store = db.open_default().await;
        assert_eq!(store.get_tenant("team-a").await.unwrap(), None);
        let created = store.create_tenant(&spec("team-a")).await.unwrap();
        assert_eq!(created.spec, spec("team-a"));
        assert!(created.created_at > 0);
        assert_eq!(
            store.get_tenant("team-a").await.unwrap(),
            Some(created.clone())
        );

        store.create_tenant(&spec("b-team")).await.unwrap();
        let names: Vec<String> = store
            .list_tenants()
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.spec.name)
            .collect();
        assert_eq!(names, ["b-team", "team-a"]);

        let update = TenantUpdate {
            requests_per_min: Some(None),
            tokens_per_min: Some(Some(100_000)),
            priority: Some(Priority::Critical),
            allowed_models: Some(Some(vec!["gpt-4o".into(), "llama".into()])),
            pool: Some(Some("eu".into())),
            ..TenantUpdate::default()
        };
        let updated = store.update_tenant("team-a", &update).await.unwrap();
        assert_eq!(updated.spec.requests_per_min, None);
        assert_eq!(updated.spec.tokens_per_min, Some(100_000));
        assert_eq!(
            updated.spec.max_concurrency,
            Some(8),
            "untouched field kept"
        );
        assert_eq!(updated.spec.priority, Priority::Critical);
        assert_eq!(
            updated.spec.allowed_models.as_deref(),
            Some(&["gpt-4o".to_owned(), "llama".to_owned()][..])
        );
        assert_eq!(updated.spec.pool.as_deref(), Some("eu"));
        assert_eq!(updated.created_at, created.created_at);

        let disable = TenantUpdate {
            enabled: Some(false),
            allowed_models: Some(None),
            ..TenantUpdate::default()
        };
        let disabled = store.update_tenant("team-a", &disable).await.unwrap();
        assert!(!disabled.spec.enabled);
        assert_eq!(disabled.spec.allowed_models, None);
        assert_eq!(disabled.spec.pool.as_deref(), Some("eu"));

        // A disabled tenant's keys still resolve: the caller decides what disabled means.
        let issued = store.create_key("team-a", None, None).await.unwrap();
        let found = store.lookup(&digest_secret(&issued.secret)).await.unwrap();
        assert!(!found.unwrap().tenant.spec.enabled);

        let missing = store
            .update_tenant("nobody", &TenantUpdate::default())
            .await;
        assert!(
            matches!(missing, Err(StoreError::NotFound(_))),
            "{missing:?}"
        );
    }

    pub async fn duplicate_tenant_is_a_conflict(db: Arc<TestDb>) {
        let store = db.open_default().await;
        store.create_tenant(&spec("team-a")).await.unwrap();
        let again = store.create_tenant(&spec("team-a")).await;
        assert!(matches!(again, Err(StoreError::Conflict(_))), "{again:?}");
    }

    pub async fn upsert_creates_then_matches_spec(db: Arc<TestDb>) {
        let store = db.open_default().await;
        let first = store.upsert_tenant(&spec("team-a")).await.unwrap();
        assert_eq!(first.spec, spec("team-a"));
        let same = store.upsert_tenant(&spec("team-a")).await.unwrap();
        assert_eq!(same, first, "an unchanged spec writes nothing");
        let changed_spec = spillway_store::TenantSpec {
            max_concurrency: None,
            priority: Priority::Batch,
            ..spec("team-a")
        };
        let changed = store.upsert_tenant(&changed_spec).await.unwrap();
        assert_eq!(changed.spec, changed_spec);
        assert_eq!(changed.created_at, first.created_at);
        assert_eq!(store.list_tenants().await.unwrap().len(), 1);
    }

    pub async fn invalid_names_and_descriptions_are_rejected(db: Arc<TestDb>) {
        let store = db.open_default().await;
        for name in ["", "has space", "slash/y", "ünï", &"x".repeat(65)] {
            let result = store.create_tenant(&spec(name)).await;
            assert!(matches!(result, Err(StoreError::Invalid(_))), "{name:?}");
        }
        let long_ok = "x".repeat(64);
        store.create_tenant(&spec(&long_ok)).await.unwrap();

        let long = "d".repeat(201);
        let result = store.create_key(&long_ok, Some(&long), None).await;
        assert!(matches!(result, Err(StoreError::Invalid(_))), "{result:?}");
        let result = store.create_key("bad name", None, None).await;
        assert!(matches!(result, Err(StoreError::Invalid(_))), "{result:?}");
        let result = store
            .ensure_key_digest(&long_ok, &digest_secret("k"), &long)
            .await;
        assert!(matches!(result, Err(StoreError::Invalid(_))), "{result:?}");
        let empty_model = spillway_store::TenantSpec {
            allowed_models: Some(vec![String::new()]),
            ..spec("team-m")
        };
        let result = store.create_tenant(&empty_model).await;
        assert!(matches!(result, Err(StoreError::Invalid(_))), "{result:?}");
        store
            .create_key(&long_ok, Some(&"d".repeat(200)), None)
            .await
            .unwrap();
    }

    pub async fn created_key_is_found_by_digest_of_its_secret(db: Arc<TestDb>) {
        let store = db.open_default().await;
        let tenant = store.create_tenant(&spec("team-a")).await.unwrap();
        let issued = store
            .create_key("team-a", Some("ci runner"), None)
            .await
            .unwrap();
        assert!(issued.secret.starts_with("sk-spw-"));
        assert_eq!(issued.secret.len(), 50);
        assert_eq!(issued.key.prefix, issued.secret[..11]);
        assert!(issued.key.id.starts_with("key_"));

        let found = store
            .lookup(&digest_secret(&issued.secret))
            .await
            .unwrap()
            .expect("key found by its digest");
        assert_eq!(found.key, issued.key);
        assert_eq!(found.tenant, tenant);
        assert!(found.key.is_valid_at(unix_now()));
        assert_eq!(found.key.description.as_deref(), Some("ci runner"));

        let other = store.lookup(&digest_secret("sk-spw-nope")).await.unwrap();
        assert_eq!(other, None);
        assert_eq!(store.list_keys("team-a").await.unwrap(), [issued.key]);
    }

    pub async fn secret_is_not_stored(db: Arc<TestDb>) {
        let store = db.open_default().await;
        store.create_tenant(&spec("team-a")).await.unwrap();
        let issued = store.create_key("team-a", None, None).await.unwrap();
        let random_part = &issued.secret["sk-spw-".len()..];

        let dump = db.dump_api_keys().await;
        assert!(dump.contains(&issued.key.id), "dump shows the row: {dump}");
        assert!(!dump.contains(&issued.secret));
        assert!(!dump.contains(random_part));
        for file in db.files() {
            let bytes = std::fs::read(&file).unwrap();
            let found = bytes
                .windows(random_part.len())
                .any(|w| w == random_part.as_bytes());
            assert!(!found, "secret found in {}", file.display());
        }
    }

    pub async fn revoked_key_still_resolves_with_revoked_at(db: Arc<TestDb>) {
        let store = db.open_default().await;
        store.create_tenant(&spec("team-a")).await.unwrap();
        let issued = store.create_key("team-a", None, None).await.unwrap();
        let revoked = store.revoke_key(&issued.key.id).await.unwrap();
        let at = revoked.revoked_at.expect("revoked_at set");
        assert!(at >= issued.key.created_at);

        let found = store
            .lookup(&digest_secret(&issued.secret))
            .await
            .unwrap()
            .expect("a revoked key still resolves");
        assert_eq!(found.key.revoked_at, Some(at));
        assert!(!found.key.is_valid_at(unix_now()));

        let again = store.revoke_key(&issued.key.id).await.unwrap();
        assert_eq!(
            again.revoked_at,
            Some(at),
            "revoking twice keeps the first time"
        );
        let missing = store.revoke_key("key_0000000000000000").await;
        assert!(
            matches!(missing, Err(StoreError::NotFound(_))),
            "{missing:?}"
        );
    }

    pub async fn expired_key_is_not_valid(db: Arc<TestDb>) {
        let store = db.open_default().await;
        store.create_tenant(&spec("team-a")).await.unwrap();
        let now = unix_now();
        // A key that would be expired from the start is refused rather than created.
        let refused = store.create_key("team-a", None, Some(now - 1)).await;
        assert!(
            matches!(refused, Err(StoreError::Invalid(_))),
            "{refused:?}"
        );
        let live = store
            .create_key("team-a", None, Some(now + 3600))
            .await
            .unwrap();
        let live = store
            .lookup(&digest_secret(&live.secret))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(live.key.expires_at, Some(now + 3600));
        assert!(live.key.is_valid_at(now));
        assert!(!live.key.is_valid_at(now + 3600));
    }

    pub async fn unknown_tenant_is_not_found(db: Arc<TestDb>) {
        let store = db.open_default().await;
        let key = store.create_key("ghost", None, None).await;
        assert!(matches!(key, Err(StoreError::NotFound(_))), "{key:?}");
        let ensured = store
            .ensure_key_digest("ghost", &digest_secret("k"), "config")
            .await;
        assert!(
            matches!(ensured, Err(StoreError::NotFound(_))),
            "{ensured:?}"
        );
        let listed = store.list_keys("ghost").await;
        assert!(matches!(listed, Err(StoreError::NotFound(_))), "{listed:?}");
        store.create_tenant(&spec("real")).await.unwrap();
        assert_eq!(store.list_keys("real").await.unwrap(), []);
    }

    pub async fn ensure_key_digest_is_idempotent(db: Arc<TestDb>) {
        let store = db.open_default().await;
        store.create_tenant(&spec("team-a")).await.unwrap();
        store.create_tenant(&spec("team-b")).await.unwrap();
        let digest = digest_secret("sk-from-the-config-file");
        let first = store
            .ensure_key_digest("team-a", &digest, "from config")
            .await
            .unwrap();
        let second = store
            .ensure_key_digest("team-a", &digest, "from config")
            .await
            .unwrap();
        assert_eq!(first, second);
        assert_eq!(first.prefix, "(config)");
        assert_eq!(first.id, format!("key_{}", &hex::encode(digest)[..16]));
        assert_eq!(
            store.list_keys("team-a").await.unwrap(),
            std::slice::from_ref(&first)
        );
        let found = store.lookup(&digest).await.unwrap().unwrap();
        assert_eq!(found.key, first);

        let elsewhere = store
            .ensure_key_digest("team-b", &digest, "same secret, other tenant")
            .await;
        assert!(
            matches!(elsewhere, Err(StoreError::Conflict(_))),
            "{elsewhere:?}"
        );
    }

    pub async fn page_keys_covers_every_key_once(db: Arc<TestDb>) {
        let store = db.open_default().await;
        store.create_tenant(&spec("team-a")).await.unwrap();
        store.create_tenant(&spec("team-b")).await.unwrap();
        let mut expected = Vec::new();
        for i in 0..23 {
            let tenant = if i % 2 == 0 { "team-a" } else { "team-b" };
            let issued = store.create_key(tenant, None, None).await.unwrap();
            expected.push((digest_secret(&issued.secret), issued.key.id));
        }
        expected.sort();

        let mut seen = Vec::new();
        let mut after = None;
        // Bounded, so a page that repeats its start fails the test instead of hanging it.
        for _ in 0..=expected.len() {
            let page = store.page_keys(after, 5).await.unwrap();
            assert!(page.len() <= 5);
            let Some((last, _)) = page.last() else { break };
            after = Some(*last);
            for (digest, found) in page {
                assert_eq!(found.key.tenant, found.tenant.spec.name);
                seen.push((digest, found.key.id));
            }
        }
        assert_eq!(seen, expected, "every key once, in digest order");

        assert_eq!(store.page_keys(None, 0).await.unwrap().len(), 0);
        let all = store.page_keys(None, u32::MAX).await.unwrap();
        assert_eq!(
            all.len(),
            expected.len(),
            "an oversized limit is capped, not refused"
        );
    }

    pub async fn migrations_are_idempotent(db: Arc<TestDb>) {
        let first = db.open_default().await;
        first.create_tenant(&spec("team-a")).await.unwrap();
        let second = db.open_default().await;
        assert!(second.get_tenant("team-a").await.unwrap().is_some());
        second.ping().await.unwrap();
    }

    /// A database an earlier version created and filled gets the later migrations at open,
    /// and what it held reads as before (a column added later reads as unset).
    pub async fn an_older_database_is_upgraded_in_place(db: Arc<TestDb>) {
        db.migrate_first(
            1,
            "INSERT INTO tenants (name, requests_per_min, priority, allowed_models, enabled, \
             created_at, updated_at) VALUES ('old-team', 60, 'batch', '[\"m1\"]', TRUE, 1, 2)",
        )
        .await;
        let store = db.open_default().await;
        let old = store.get_tenant("old-team").await.unwrap().unwrap();
        assert_eq!(old.spec.requests_per_min, Some(60));
        assert_eq!(old.spec.priority, Priority::Batch);
        assert_eq!(
            old.spec.allowed_models.as_deref(),
            Some(&["m1".to_owned()][..])
        );
        assert_eq!(old.spec.default_model, None);
        assert_eq!((old.created_at, old.updated_at), (1, 2));
        let update = TenantUpdate {
            default_model: Some(Some("m1".into())),
            ..TenantUpdate::default()
        };
        let updated = store.update_tenant("old-team", &update).await.unwrap();
        assert_eq!(updated.spec.default_model.as_deref(), Some("m1"));
    }

    pub async fn default_model_is_kept_and_cleared(db: Arc<TestDb>) {
        let store = db.open_default().await;
        let with_default = spillway_store::TenantSpec {
            allowed_models: Some(vec!["m1".into(), "m2".into()]),
            default_model: Some("m2".into()),
            ..spec("team-d")
        };
        let created = store.create_tenant(&with_default).await.unwrap();
        assert_eq!(created.spec, with_default);
        assert_eq!(
            store.upsert_tenant(&with_default).await.unwrap(),
            created,
            "an unchanged default writes nothing"
        );
        let outside = spillway_store::TenantSpec {
            default_model: Some("m3".into()),
            ..with_default.clone()
        };
        let refused = store.upsert_tenant(&outside).await;
        assert!(
            matches!(refused, Err(StoreError::Invalid(_))),
            "{refused:?}"
        );
        let moved = spillway_store::TenantSpec {
            default_model: Some("m1".into()),
            ..with_default.clone()
        };
        let upserted = store.upsert_tenant(&moved).await.unwrap();
        assert_eq!(upserted.spec.default_model.as_deref(), Some("m1"));
        let untouched = TenantUpdate {
            max_concurrency: Some(Some(3)),
            ..TenantUpdate::default()
        };
        let kept = store.update_tenant("team-d", &untouched).await.unwrap();
        assert_eq!(kept.spec.default_model.as_deref(), Some("m1"));
        let clear = TenantUpdate {
            default_model: Some(None),
            ..TenantUpdate::default()
        };
        let cleared = store.update_tenant("team-d", &clear).await.unwrap();
        assert_eq!(cleared.spec.default_model, None);
        assert_eq!(cleared.spec.max_concurrency, Some(3));
    }

    pub async fn pool_stats_report_a_size(db: Arc<TestDb>) {
        let options = PoolOptions {
            max_connections: 3,
            ..PoolOptions::default()
        };
        let store = db.open(&options).await;
        store.ping().await.unwrap();
        let stats = store.pool_stats();
        assert_eq!(stats.max_size, 3);
        assert!(stats.size >= 1 && stats.size <= 3, "{stats:?}");
        assert!(stats.idle <= stats.size, "{stats:?}");
        assert_eq!(stats.waiters, 0);
        assert_eq!(stats.acquire_timeouts, 0);
    }

    /// One connection, held by a write that waits on a lock: the next query must give up at
    /// the acquire timeout with `Unavailable`, and the pool must count it (IL-0136: connections
    /// ran out and nothing showed it).
    pub async fn il_0136_exhausted_pool_fails_fast_and_is_counted(db: Arc<TestDb>) {
        let acquire_timeout = Duration::from_millis(300);
        let options = PoolOptions {
            max_connections: 1,
            acquire_timeout,
            idle_timeout: None,
        };
        let store = db.open(&options).await;
        let lock = db.lock_writes().await;
        let started = Instant::now();
        // Whichever write gets the only connection blocks on the lock while holding it; the
        // other one starves. Which is which does not matter.
        let write = |name: &'static str| {
            let store = store.clone();
            tokio::spawn(async move { store.create_tenant(&spec(name)).await })
        };
        let (mut a, mut b) = (write("team-a"), write("team-b"));
        let (starved, holder) = tokio::select! {
            result = &mut a => (result.unwrap(), b),
            result = &mut b => (result.unwrap(), a),
        };
        let waited = started.elapsed();
        assert!(
            matches!(starved, Err(StoreError::Unavailable(_))),
            "{starved:?}"
        );
        assert!(waited >= acquire_timeout / 2, "gave up after {waited:?}");
        assert!(waited < Duration::from_secs(4), "gave up after {waited:?}");
        assert_eq!(store.pool_stats().acquire_timeouts, 1);

        lock.release().await;
        holder.await.unwrap().expect("the held write completes");
        let stats = store.pool_stats();
        assert_eq!(stats.waiters, 0, "{stats:?}");
        assert_eq!(stats.acquire_timeouts, 1, "{stats:?}");
        assert_eq!(store.list_tenants().await.unwrap().len(), 1);
    }
}

#[tokio::test]
async fn sqlite_file_is_created_with_write_ahead_log() {
    common::run(Backend::Sqlite, |db: Arc<TestDb>| async move {
        let store = db.open_default().await;
        store.create_tenant(&spec("team-a")).await.unwrap();
        let path = db.url.strip_prefix("sqlite://").unwrap().to_owned();
        assert!(
            std::path::Path::new(&path).is_file(),
            "file and directory created"
        );
        assert_eq!(db.sqlite_pragma("journal_mode").await, "wal");

        // The `sqlite:PATH` spelling names the same file.
        let same = spillway_store::open(&format!("sqlite:{path}"), &PoolOptions::default())
            .await
            .unwrap();
        assert!(same.get_tenant("team-a").await.unwrap().is_some());
    })
    .await;
}

#[tokio::test]
async fn unsupported_url_is_invalid() {
    let options = PoolOptions::default();
    for url in [
        "mysql://root@localhost/db",
        "",
        "sqlite:",
        "sqlite::memory:",
        "sqlite://x.db?mode=ro",
        "redis://secret@host",
    ] {
        let result = spillway_store::open(url, &options).await;
        match result {
            Err(StoreError::Invalid(message)) => {
                assert!(!message.contains("secret"), "{message}");
            }
            Err(other) => panic!("{url:?}: {other:?}"),
            Ok(_) => panic!("{url:?} opened"),
        }
    }
}

#[tokio::test]
async fn unreachable_postgres_is_unavailable() {
    let options = PoolOptions {
        acquire_timeout: Duration::from_secs(1),
        ..PoolOptions::default()
    };
    // Port 1 on loopback: nothing listens, the connection is refused at once.
    let result = spillway_store::open("postgres://postgres:pw@127.0.0.1:1/x", &options).await;
    match result {
        Err(StoreError::Unavailable(message)) => assert!(!message.contains(":pw@"), "{message}"),
        Err(other) => panic!("{other:?}"),
        Ok(_) => panic!("opened"),
    }
}

#[tokio::test]
async fn zero_sized_pool_is_invalid() {
    let options = PoolOptions {
        max_connections: 0,
        ..PoolOptions::default()
    };
    let result = spillway_store::open("sqlite://unused.db", &options).await;
    assert!(matches!(result, Err(StoreError::Invalid(_))));
}

/// The test PostgreSQL's URL with another database or role in it.
fn postgres_url_with(user: &str, database: &str) -> String {
    let url = spillway_testkit::postgres_url();
    let options: sqlx::postgres::PgConnectOptions = url.parse().expect("a PostgreSQL URL");
    let host = options.get_host();
    let port = options.get_port();
    format!("postgres://{user}@{host}:{port}/{database}")
}

/// A gateway waits out a store it cannot reach now, but must not wait for a role or database
/// that the server refuses: no wait fixes a configuration.
#[tokio::test]
async fn a_postgres_that_refuses_the_role_or_database_is_invalid_not_unavailable() {
    let no_database = postgres_url_with("postgres", "spillway_no_such_database");
    let no_role = postgres_url_with("spillway_no_such_role", "test");
    for url in [no_database, no_role] {
        match spillway_store::open(&url, &PoolOptions::default()).await {
            Err(StoreError::Invalid(_)) => {}
            Err(other) => panic!("{url}: {other:?}"),
            Ok(_) => panic!("{url} opened"),
        }
    }
}

#[tokio::test]
async fn a_deferred_store_is_unavailable_until_connected_then_is_that_store() {
    common::run(Backend::Sqlite, |db| async move {
        let deferred = spillway_store::DeferredStore::new(7);
        assert!(!deferred.is_connected());
        assert_eq!(deferred.pool_stats().max_size, 7);
        let digest = digest_secret("sk-spw-anything");
        assert!(matches!(
            deferred.lookup(&digest).await,
            Err(StoreError::Unavailable(_))
        ));
        assert!(matches!(
            deferred.ping().await,
            Err(StoreError::Unavailable(_))
        ));
        assert!(matches!(
            deferred.create_tenant(&spec("team-a")).await,
            Err(StoreError::Unavailable(_))
        ));

        let store = db.open_default().await;
        store.create_tenant(&spec("team-a")).await.unwrap();
        assert!(deferred.connect(store.clone()));
        assert!(deferred.is_connected());
        assert!(!deferred.connect(store), "connected once only");
        deferred.ping().await.unwrap();
        let issued = deferred.create_key("team-a", None, None).await.unwrap();
        let found = deferred.lookup(&digest_secret(&issued.secret)).await;
        assert_eq!(found.unwrap().unwrap().tenant.spec.name, "team-a");
        assert_eq!(
            deferred.pool_stats().max_size,
            PoolOptions::default().max_connections
        );
    })
    .await;
}
