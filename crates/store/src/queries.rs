//! Every statement the store runs, written once for both databases.
//!
//! The SQL here is the common dialect of SQLite (3.39 or later, as bundled) and PostgreSQL:
//! `$n` placeholders (the SQLite driver numbers `$n` like `?n`), `ON CONFLICT`, `RETURNING` and
//! `IS DISTINCT FROM`. Keeping one text per statement means a change of schema or semantics is
//! made once and tested against both backends. Each statement is one round trip: the request
//! path meets the database only on a cache miss, and a burst of misses (IL-0136) must cost one
//! query each, not several.

/// The `tenants` columns, in the order [`crate::rows::TenantRow`] names them.
macro_rules! tenant_columns {
    () => {
        "name, requests_per_min, tokens_per_min, max_concurrency, priority, allowed_models, \
         pool, default_model, enabled, created_at, updated_at"
    };
}

/// The `api_keys` columns; `created_at` is renamed so a key and its tenant fit in one row.
macro_rules! key_columns {
    () => {
        "id, tenant, digest, prefix, description, created_at AS key_created_at, expires_at, \
         revoked_at"
    };
}

/// A key joined with its tenant, for [`crate::rows::KeyMatchRow`].
macro_rules! key_match_select {
    () => {
        "SELECT k.id, k.tenant, k.digest, k.prefix, k.description, \
         k.created_at AS key_created_at, k.expires_at, k.revoked_at, \
         t.name, t.requests_per_min, t.tokens_per_min, t.max_concurrency, t.priority, \
         t.allowed_models, t.pool, t.default_model, t.enabled, t.created_at, t.updated_at \
         FROM api_keys k JOIN tenants t ON t.name = k.tenant "
    };
}

pub(crate) const PING: &str = "SELECT 1";

/// `$1..$9`: the columns of a `TenantRecord`; `$10`: now.
pub(crate) const INSERT_TENANT: &str = concat!(
    "INSERT INTO tenants (",
    tenant_columns!(),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10) RETURNING ",
    tenant_columns!()
);

/// As [`INSERT_TENANT`], or changes the existing tenant to match. Returns no row when the
/// tenant already matched (so `updated_at` keeps meaning "last changed").
pub(crate) const UPSERT_TENANT: &str = concat!(
    "INSERT INTO tenants (",
    tenant_columns!(),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10) \
     ON CONFLICT (name) DO UPDATE SET \
     requests_per_min = excluded.requests_per_min, tokens_per_min = excluded.tokens_per_min, \
     max_concurrency = excluded.max_concurrency, priority = excluded.priority, \
     allowed_models = excluded.allowed_models, pool = excluded.pool, \
     default_model = excluded.default_model, enabled = excluded.enabled, updated_at = excluded.updated_at \
     WHERE tenants.requests_per_min IS DISTINCT FROM excluded.requests_per_min \
     OR tenants.tokens_per_min IS DISTINCT FROM excluded.tokens_per_min \
     OR tenants.max_concurrency IS DISTINCT FROM excluded.max_concurrency \
     OR tenants.priority IS DISTINCT FROM excluded.priority \
     OR tenants.allowed_models IS DISTINCT FROM excluded.allowed_models \
     OR tenants.pool IS DISTINCT FROM excluded.pool \
     OR tenants.default_model IS DISTINCT FROM excluded.default_model \
     OR tenants.enabled IS DISTINCT FROM excluded.enabled \
     RETURNING ",
    tenant_columns!()
);

/// `$1`: name.
pub(crate) const GET_TENANT: &str = concat!(
    "SELECT ",
    tenant_columns!(),
    " FROM tenants WHERE name = $1"
);

pub(crate) const LIST_TENANTS: &str =
    concat!("SELECT ", tenant_columns!(), " FROM tenants ORDER BY name");

/// `$1`: name; then a (change?, value) pair per optional column as in `TenantChanges`,
/// `priority` and `enabled` (NULL: keep); `$16`: now. One statement, so concurrent partial
/// updates of different fields do not undo each other.
pub(crate) const UPDATE_TENANT: &str = concat!(
    "UPDATE tenants SET \
     requests_per_min = CASE WHEN $2 THEN $3 ELSE requests_per_min END, \
     tokens_per_min = CASE WHEN $4 THEN $5 ELSE tokens_per_min END, \
     max_concurrency = CASE WHEN $6 THEN $7 ELSE max_concurrency END, \
     priority = COALESCE($8, priority), \
     allowed_models = CASE WHEN $9 THEN $10 ELSE allowed_models END, \
     pool = CASE WHEN $11 THEN $12 ELSE pool END, \
     default_model = CASE WHEN $13 THEN $14 ELSE default_model END, \
     enabled = COALESCE($15, enabled), \
     updated_at = $16 \
     WHERE name = $1 RETURNING ",
    tenant_columns!()
);

/// `$1` id, `$2` tenant, `$3` digest, `$4` prefix, `$5` description, `$6` now, `$7` expiry.
pub(crate) const INSERT_KEY: &str = concat!(
    "INSERT INTO api_keys (id, tenant, digest, prefix, description, created_at, expires_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING ",
    key_columns!()
);

/// As [`INSERT_KEY`], but a key already stored under that digest or id is left as it is (and
/// no row is returned).
pub(crate) const INSERT_KEY_IF_ABSENT: &str = concat!(
    "INSERT INTO api_keys (id, tenant, digest, prefix, description, created_at, expires_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING RETURNING ",
    key_columns!()
);

/// `$1`: tenant.
pub(crate) const LIST_KEYS: &str = concat!(
    "SELECT ",
    key_columns!(),
    " FROM api_keys WHERE tenant = $1 ORDER BY created_at, id"
);

/// `$1` id, `$2` now. Keeps the first revocation time, so revoking twice changes nothing.
pub(crate) const REVOKE_KEY: &str = concat!(
    "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $2) WHERE id = $1 RETURNING ",
    key_columns!()
);

/// `$1`: digest.
pub(crate) const LOOKUP: &str = concat!(key_match_select!(), "WHERE k.digest = $1");

/// `$1`: the last digest of the previous page (empty for the first page: every digest sorts
/// after the empty byte string in both databases), `$2`: page size.
pub(crate) const PAGE_KEYS: &str = concat!(
    key_match_select!(),
    "WHERE k.digest > $1 ORDER BY k.digest LIMIT $2"
);
