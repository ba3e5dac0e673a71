//! The [`Store`] implementation, written once for any SQL database the crate supports.
//!
//! SQLite and PostgreSQL differ in how they are opened, configured and migrated (see
//! `sqlite.rs` and `postgres.rs`), not in what the store asks of them: the statements
//! (`queries.rs`), rows (`rows.rs`) and error reading (`db_error.rs`) are shared. So the
//! behaviour is generic over the sqlx driver, and the bounds below are the whole contract a
//! backend has to meet. Every query acquires its connection through [`CountedPool`].

use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Type};

use crate::counted_pool::CountedPool;
use crate::keys::{self, NewKey};
use crate::rows::{KeyMatchRow, KeyRow, TenantChanges, TenantRecord, TenantRow};
use crate::{db_error, queries, validate};
use crate::{ApiKey, IssuedKey, KeyDigest, KeyMatch, PoolStats, Store, StoreError, StoreFuture};
use crate::{Tenant, TenantSpec, TenantUpdate};

/// The most keys [`Store::page_keys`] returns at once, whatever the caller asks.
pub const MAX_PAGE_KEYS: u32 = 10_000;

pub(crate) struct SqlStore<DB: Database> {
    pool: CountedPool<DB>,
}

impl<DB: Database> SqlStore<DB> {
    pub fn new(pool: sqlx::Pool<DB>) -> SqlStore<DB> {
        SqlStore {
            pool: CountedPool::new(pool),
        }
    }
}

/// Binds a [`TenantRecord`] as `$1..$9` and `now` as `$10`, for `INSERT_TENANT` and
/// `UPSERT_TENANT`.
macro_rules! bind_tenant_record {
    ($query:expr, $record:expr, $now:expr) => {{
        let r = $record;
        $query
            .bind(r.name)
            .bind(r.requests_per_min)
            .bind(r.tokens_per_min)
            .bind(r.max_concurrency)
            .bind(r.priority)
            .bind(r.allowed_models)
            .bind(r.pool)
            .bind(r.default_model)
            .bind(r.enabled)
            .bind($now)
    }};
}

impl<DB> Store for SqlStore<DB>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> String: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> bool: Encode<'q, DB> + Type<DB>,
    for<'q> Vec<u8>: Encode<'q, DB> + Type<DB>,
    for<'q> Option<String>: Encode<'q, DB> + Type<DB>,
    for<'q> Option<i64>: Encode<'q, DB> + Type<DB>,
    for<'q> Option<bool>: Encode<'q, DB> + Type<DB>,
    for<'r> TenantRow: FromRow<'r, DB::Row>,
    for<'r> KeyRow: FromRow<'r, DB::Row>,
    for<'r> KeyMatchRow: FromRow<'r, DB::Row>,
{
    fn lookup(&self, digest: &KeyDigest) -> StoreFuture<'_, Option<KeyMatch>> {
        let digest = digest.to_vec();
        Box::pin(async move {
            let mut conn = self.pool.acquire("lookup").await?;
            let row: Option<KeyMatchRow> = sqlx::query_as(queries::LOOKUP)
                .bind(digest)
                .fetch_optional(&mut *conn)
                .await
                .map_err(|e| db_error::read(e, "lookup"))?;
            Ok(row
                .map(KeyMatchRow::into_match)
                .transpose()?
                .map(|(_, found)| found))
        })
    }

    fn create_tenant(&self, spec: &TenantSpec) -> StoreFuture<'_, Tenant> {
        let record = TenantRecord::try_from_spec(spec);
        Box::pin(async move {
            let record = record?;
            let name = record.name.clone();
            let mut conn = self.pool.acquire("create_tenant").await?;
            let query = sqlx::query_as(queries::INSERT_TENANT);
            let row: TenantRow = bind_tenant_record!(query, record, unix_now())
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| {
                    db_error::write(
                        e,
                        "create_tenant",
                        || StoreError::Conflict(format!("tenant {name:?}")),
                        || StoreError::NotFound(format!("tenant {name:?}")),
                    )
                })?;
            row.into_tenant()
        })
    }

    fn upsert_tenant(&self, spec: &TenantSpec) -> StoreFuture<'_, Tenant> {
        let record = TenantRecord::try_from_spec(spec);
        Box::pin(async move {
            let record = record?;
            let name = record.name.clone();
            let changed: Option<TenantRow> = {
                let mut conn = self.pool.acquire("upsert_tenant").await?;
                let query = sqlx::query_as(queries::UPSERT_TENANT);
                bind_tenant_record!(query, record, unix_now())
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(|e| db_error::read(e, "upsert_tenant"))?
            };
            match changed {
                Some(row) => row.into_tenant(),
                // Already as specified: nothing was written, so read it back.
                None => self
                    .get_tenant(&name)
                    .await?
                    .ok_or_else(|| StoreError::NotFound(format!("tenant {name:?}"))),
            }
        })
    }

    fn get_tenant(&self, name: &str) -> StoreFuture<'_, Option<Tenant>> {
        let name = name.to_owned();
        Box::pin(async move {
            let mut conn = self.pool.acquire("get_tenant").await?;
            let row: Option<TenantRow> = sqlx::query_as(queries::GET_TENANT)
                .bind(name)
                .fetch_optional(&mut *conn)
                .await
                .map_err(|e| db_error::read(e, "get_tenant"))?;
            row.map(TenantRow::into_tenant).transpose()
        })
    }

    fn list_tenants(&self) -> StoreFuture<'_, Vec<Tenant>> {
        Box::pin(async move {
            let mut conn = self.pool.acquire("list_tenants").await?;
            let rows: Vec<TenantRow> = sqlx::query_as(queries::LIST_TENANTS)
                .fetch_all(&mut *conn)
                .await
                .map_err(|e| db_error::read(e, "list_tenants"))?;
            rows.into_iter().map(TenantRow::into_tenant).collect()
        })
    }

    fn update_tenant(&self, name: &str, update: &TenantUpdate) -> StoreFuture<'_, Tenant> {
        let name = name.to_owned();
        let changes = TenantChanges::try_from_update(update);
        Box::pin(async move {
            let c = changes?;
            let mut conn = self.pool.acquire("update_tenant").await?;
            let row: Option<TenantRow> = sqlx::query_as(queries::UPDATE_TENANT)
                .bind(name.clone())
                .bind(c.requests_per_min.0)
                .bind(c.requests_per_min.1)
                .bind(c.tokens_per_min.0)
                .bind(c.tokens_per_min.1)
                .bind(c.max_concurrency.0)
                .bind(c.max_concurrency.1)
                .bind(c.priority)
                .bind(c.allowed_models.0)
                .bind(c.allowed_models.1)
                .bind(c.pool.0)
                .bind(c.pool.1)
                .bind(c.default_model.0)
                .bind(c.default_model.1)
                .bind(c.enabled)
                .bind(unix_now())
                .fetch_optional(&mut *conn)
                .await
                .map_err(|e| db_error::read(e, "update_tenant"))?;
            row.ok_or_else(|| StoreError::NotFound(format!("tenant {name:?}")))?
                .into_tenant()
        })
    }

    fn create_key(
        &self,
        tenant: &str,
        description: Option<&str>,
        expires_at: Option<i64>,
    ) -> StoreFuture<'_, IssuedKey> {
        let tenant = tenant.to_owned();
        let description = description.map(str::to_owned);
        Box::pin(async move {
            validate::tenant_name(&tenant)?;
            if let Some(text) = &description {
                validate::description(text)?;
            }
            validate::expiry(expires_at, unix_now())?;
            let new = NewKey::generate(&mut rand::rng());
            let mut conn = self.pool.acquire("create_key").await?;
            let row: KeyRow = sqlx::query_as(queries::INSERT_KEY)
                .bind(new.id.clone())
                .bind(tenant.clone())
                .bind(new.digest.to_vec())
                .bind(new.prefix)
                .bind(description)
                .bind(unix_now())
                .bind(expires_at)
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| {
                    db_error::write(
                        e,
                        "create_key",
                        // A 64-bit id or 256-bit digest collision: astronomically rare, and
                        // safe to report rather than retry.
                        || StoreError::Conflict(format!("key {}", new.id)),
                        || StoreError::NotFound(format!("tenant {tenant:?}")),
                    )
                })?;
            let (_, key) = row.into_key()?;
            Ok(IssuedKey {
                secret: new.secret,
                key,
            })
        })
    }

    fn ensure_key_digest(
        &self,
        tenant: &str,
        digest: &KeyDigest,
        description: &str,
    ) -> StoreFuture<'_, ApiKey> {
        let tenant = tenant.to_owned();
        let digest = *digest;
        let description = description.to_owned();
        Box::pin(async move {
            validate::tenant_name(&tenant)?;
            validate::description(&description)?;
            let inserted: Option<KeyRow> = {
                let mut conn = self.pool.acquire("ensure_key_digest").await?;
                sqlx::query_as(queries::INSERT_KEY_IF_ABSENT)
                    .bind(keys::config_key_id(&digest))
                    .bind(tenant.clone())
                    .bind(digest.to_vec())
                    .bind(keys::CONFIG_KEY_PREFIX.to_owned())
                    .bind(Some(description))
                    .bind(unix_now())
                    .bind(None::<i64>)
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(|e| {
                        db_error::write(
                            e,
                            "ensure_key_digest",
                            || StoreError::Conflict("key digest".to_owned()),
                            || StoreError::NotFound(format!("tenant {tenant:?}")),
                        )
                    })?
            };
            if let Some(row) = inserted {
                return Ok(row.into_key()?.1);
            }
            // Already there: fine if it is this tenant's, a conflict if the same secret was
            // declared for two tenants (or, vanishingly unlikely, two digests share an id).
            match self.lookup(&digest).await? {
                Some(found) if found.key.tenant == tenant => Ok(found.key),
                _ => Err(StoreError::Conflict(format!(
                    "key with digest {}… (registered for another tenant, or its id is taken)",
                    keys::short_digest(&digest)
                ))),
            }
        })
    }

    fn list_keys(&self, tenant: &str) -> StoreFuture<'_, Vec<ApiKey>> {
        let tenant = tenant.to_owned();
        Box::pin(async move {
            let rows: Vec<KeyRow> = {
                let mut conn = self.pool.acquire("list_keys").await?;
                sqlx::query_as(queries::LIST_KEYS)
                    .bind(tenant.clone())
                    .fetch_all(&mut *conn)
                    .await
                    .map_err(|e| db_error::read(e, "list_keys"))?
            };
            if rows.is_empty() && self.get_tenant(&tenant).await?.is_none() {
                return Err(StoreError::NotFound(format!("tenant {tenant:?}")));
            }
            rows.into_iter()
                .map(|row| row.into_key().map(|(_, key)| key))
                .collect()
        })
    }

    fn revoke_key(&self, id: &str) -> StoreFuture<'_, ApiKey> {
        let id = id.to_owned();
        Box::pin(async move {
            let mut conn = self.pool.acquire("revoke_key").await?;
            let row: Option<KeyRow> = sqlx::query_as(queries::REVOKE_KEY)
                .bind(id.clone())
                .bind(unix_now())
                .fetch_optional(&mut *conn)
                .await
                .map_err(|e| db_error::read(e, "revoke_key"))?;
            let row = row.ok_or_else(|| StoreError::NotFound(format!("key {id:?}")))?;
            Ok(row.into_key()?.1)
        })
    }

    fn page_keys(
        &self,
        after: Option<KeyDigest>,
        limit: u32,
    ) -> StoreFuture<'_, Vec<(KeyDigest, KeyMatch)>> {
        Box::pin(async move {
            let limit = limit.min(MAX_PAGE_KEYS);
            if limit == 0 {
                return Ok(Vec::new());
            }
            let mut conn = self.pool.acquire("page_keys").await?;
            let rows: Vec<KeyMatchRow> = sqlx::query_as(queries::PAGE_KEYS)
                .bind(after.map(Vec::from).unwrap_or_default())
                .bind(i64::from(limit))
                .fetch_all(&mut *conn)
                .await
                .map_err(|e| db_error::read(e, "page_keys"))?;
            rows.into_iter().map(KeyMatchRow::into_match).collect()
        })
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let mut conn = self.pool.acquire("ping").await?;
            sqlx::query(queries::PING)
                .execute(&mut *conn)
                .await
                .map_err(|e| db_error::read(e, "ping"))?;
            Ok(())
        })
    }

    fn pool_stats(&self) -> PoolStats {
        self.pool.stats()
    }
}

/// Now, in Unix seconds: the store's one clock read, for `created_at`, `updated_at` and
/// `revoked_at`.
fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}
