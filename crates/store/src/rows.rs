//! Rows as the databases hold them, and their conversion to and from the crate's types.
//!
//! Both schemas store the same columns with types that decode the same way in both drivers
//! (integers as 64-bit, booleans, text, bytes), so one set of row structs serves SQLite and
//! PostgreSQL. What the databases cannot express (a `u32` limit, a priority, a JSON list, a
//! 32-byte digest) is converted here, and a stored value that does not convert is reported as
//! corrupt rather than guessed at.

use sqlx::FromRow;

use crate::{validate, ApiKey, KeyDigest, KeyMatch, StoreError, Tenant, TenantSpec, TenantUpdate};

/// A `tenants` row, columns as listed by `queries::tenant_columns!`.
#[derive(Debug, FromRow)]
pub(crate) struct TenantRow {
    name: String,
    requests_per_min: Option<i64>,
    tokens_per_min: Option<i64>,
    max_concurrency: Option<i64>,
    priority: String,
    allowed_models: Option<String>,
    pool: Option<String>,
    default_model: Option<String>,
    enabled: bool,
    created_at: i64,
    updated_at: i64,
}

/// An `api_keys` row, columns as listed by `queries::key_columns!` (its `created_at` renamed so
/// it can share a joined row with the tenant's).
#[derive(Debug, FromRow)]
pub(crate) struct KeyRow {
    id: String,
    tenant: String,
    digest: Vec<u8>,
    prefix: String,
    description: Option<String>,
    #[sqlx(rename = "key_created_at")]
    created_at: i64,
    expires_at: Option<i64>,
    revoked_at: Option<i64>,
}

/// A key joined with its tenant.
#[derive(Debug, FromRow)]
pub(crate) struct KeyMatchRow {
    #[sqlx(flatten)]
    key: KeyRow,
    #[sqlx(flatten)]
    tenant: TenantRow,
}

impl TenantRow {
    pub fn into_tenant(self) -> Result<Tenant, StoreError> {
        let name = &self.name;
        let corrupt = |column: &str, why: &dyn std::fmt::Display| {
            StoreError::corrupt(format!("tenant {name:?}, column {column}: {why}"))
        };
        let limit = |column: &str, value: Option<i64>| {
            value
                .map(u32::try_from)
                .transpose()
                .map_err(|e| corrupt(column, &e))
        };
        let requests_per_min = limit("requests_per_min", self.requests_per_min)?;
        let tokens_per_min = limit("tokens_per_min", self.tokens_per_min)?;
        let max_concurrency = limit("max_concurrency", self.max_concurrency)?;
        let priority = self.priority.parse().map_err(|e| corrupt("priority", &e))?;
        let allowed_models: Option<Vec<String>> = self
            .allowed_models
            .as_deref()
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| corrupt("allowed_models", &e))?;
        // A list stored with "*" before the store read it as every model means every model.
        let allowed_models =
            allowed_models.filter(|list| validate::allowed_models(Some(list)).is_some());
        Ok(Tenant {
            spec: TenantSpec {
                name: self.name,
                requests_per_min,
                tokens_per_min,
                max_concurrency,
                priority,
                allowed_models,
                pool: self.pool,
                default_model: self.default_model,
                enabled: self.enabled,
            },
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }
}

impl KeyRow {
    /// The key and its digest.
    pub fn into_key(self) -> Result<(KeyDigest, ApiKey), StoreError> {
        let digest = KeyDigest::try_from(self.digest.as_slice()).map_err(|_| {
            StoreError::corrupt(format!(
                "key {}: digest of {} bytes, expected 32",
                self.id,
                self.digest.len()
            ))
        })?;
        let key = ApiKey {
            id: self.id,
            tenant: self.tenant,
            prefix: self.prefix,
            description: self.description,
            created_at: self.created_at,
            expires_at: self.expires_at,
            revoked_at: self.revoked_at,
        };
        Ok((digest, key))
    }
}

impl KeyMatchRow {
    pub fn into_match(self) -> Result<(KeyDigest, KeyMatch), StoreError> {
        let (digest, key) = self.key.into_key()?;
        let tenant = self.tenant.into_tenant()?;
        Ok((digest, KeyMatch { key, tenant }))
    }
}

/// A tenant as written: every column but the timestamps, validated.
#[derive(Debug)]
pub(crate) struct TenantRecord {
    pub name: String,
    pub requests_per_min: Option<i64>,
    pub tokens_per_min: Option<i64>,
    pub max_concurrency: Option<i64>,
    pub priority: String,
    pub allowed_models: Option<String>,
    pub pool: Option<String>,
    pub default_model: Option<String>,
    pub enabled: bool,
}

impl TenantRecord {
    pub fn try_from_spec(spec: &TenantSpec) -> Result<TenantRecord, StoreError> {
        validate::tenant_name(&spec.name)?;
        validate::limit("requests_per_min", spec.requests_per_min)?;
        validate::limit("tokens_per_min", spec.tokens_per_min)?;
        validate::limit("max_concurrency", spec.max_concurrency)?;
        let models = validate::allowed_models(spec.allowed_models.as_deref());
        validate::tenant_references(models, spec.pool.as_deref(), spec.default_model.as_deref())?;
        Ok(TenantRecord {
            name: spec.name.clone(),
            requests_per_min: spec.requests_per_min.map(i64::from),
            tokens_per_min: spec.tokens_per_min.map(i64::from),
            max_concurrency: spec.max_concurrency.map(i64::from),
            priority: spec.priority.as_str().to_owned(),
            allowed_models: models.map(models_json),
            pool: spec.pool.clone(),
            default_model: spec.default_model.clone(),
            enabled: spec.enabled,
        })
    }
}

/// One optional column of a partial update: whether to set it, and to what.
pub(crate) type ColumnChange<T> = (bool, Option<T>);

/// A [`TenantUpdate`] as bound to the one `UPDATE` statement: for each optional column, a flag
/// saying whether it changes (so `None` can mean "clear" when the flag is set).
#[derive(Debug)]
pub(crate) struct TenantChanges {
    pub requests_per_min: ColumnChange<i64>,
    pub tokens_per_min: ColumnChange<i64>,
    pub max_concurrency: ColumnChange<i64>,
    pub priority: Option<String>,
    pub allowed_models: ColumnChange<String>,
    pub pool: ColumnChange<String>,
    pub default_model: ColumnChange<String>,
    pub enabled: Option<bool>,
}

impl TenantChanges {
    pub fn try_from_update(update: &TenantUpdate) -> Result<TenantChanges, StoreError> {
        let models =
            validate::allowed_models(update.allowed_models.as_ref().and_then(Option::as_deref));
        let pool = update.pool.as_ref().and_then(Option::as_deref);
        let default_model = update.default_model.as_ref().and_then(Option::as_deref);
        for (field, change) in [
            ("requests_per_min", update.requests_per_min),
            ("tokens_per_min", update.tokens_per_min),
            ("max_concurrency", update.max_concurrency),
        ] {
            validate::limit(field, change.flatten())?;
        }
        validate::tenant_references(models, pool, default_model)?;
        let limit =
            |change: Option<Option<u32>>| (change.is_some(), change.flatten().map(i64::from));
        Ok(TenantChanges {
            requests_per_min: limit(update.requests_per_min),
            tokens_per_min: limit(update.tokens_per_min),
            max_concurrency: limit(update.max_concurrency),
            priority: update.priority.map(|p| p.as_str().to_owned()),
            allowed_models: (update.allowed_models.is_some(), models.map(models_json)),
            pool: (update.pool.is_some(), pool.map(str::to_owned)),
            default_model: (
                update.default_model.is_some(),
                default_model.map(str::to_owned),
            ),
            enabled: update.enabled,
        })
    }
}

fn models_json(models: &[String]) -> String {
    serde_json::Value::from(models).to_string()
}

impl StoreError {
    /// A stored value this version cannot read. Reported as unavailable: the caller cannot fix
    /// it, and the lookup cache should keep serving what it had.
    pub(crate) fn corrupt(what: String) -> StoreError {
        tracing::warn!(%what, "store holds a value it cannot read");
        StoreError::Unavailable(format!("corrupt row: {what}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Priority;

    fn row() -> TenantRow {
        TenantRow {
            name: "team-a".into(),
            requests_per_min: Some(60),
            tokens_per_min: None,
            max_concurrency: Some(4),
            priority: "batch".into(),
            allowed_models: Some(r#"["m1","m2"]"#.into()),
            pool: Some("eu".into()),
            default_model: Some("m2".into()),
            enabled: true,
            created_at: 1,
            updated_at: 2,
        }
    }

    #[test]
    fn spec_round_trips_through_record_and_row() {
        let tenant = row().into_tenant().unwrap();
        let record = TenantRecord::try_from_spec(&tenant.spec).unwrap();
        assert_eq!(record.allowed_models.as_deref(), Some(r#"["m1","m2"]"#));
        assert_eq!(tenant.spec.priority, Priority::Batch);
        assert_eq!(tenant.spec.max_concurrency, Some(4));
        assert_eq!(tenant.spec.name, "team-a");
        assert_eq!(record.default_model.as_deref(), Some("m2"));
    }

    #[test]
    fn out_of_range_limit_is_corrupt_not_truncated() {
        let bad = TenantRow {
            requests_per_min: Some(-1),
            ..row()
        };
        assert!(matches!(bad.into_tenant(), Err(StoreError::Unavailable(_))));
    }

    #[test]
    fn unknown_priority_is_corrupt() {
        let bad = TenantRow {
            priority: "urgent".into(),
            ..row()
        };
        assert!(matches!(bad.into_tenant(), Err(StoreError::Unavailable(_))));
    }

    #[test]
    fn update_flags_distinguish_keep_from_clear() {
        let update = TenantUpdate {
            requests_per_min: Some(None),
            tokens_per_min: Some(Some(5)),
            pool: Some(None),
            ..TenantUpdate::default()
        };
        let changes = TenantChanges::try_from_update(&update).unwrap();
        assert_eq!(changes.requests_per_min, (true, None));
        assert_eq!(changes.tokens_per_min, (true, Some(5)));
        assert_eq!(changes.max_concurrency, (false, None));
        assert_eq!(changes.pool, (true, None));
        assert_eq!(changes.allowed_models, (false, None));
    }

    #[test]
    fn a_star_is_stored_and_read_as_every_model() {
        let spec = TenantSpec {
            allowed_models: Some(vec!["m1".into(), "*".into()]),
            ..row().into_tenant().unwrap().spec
        };
        assert_eq!(
            TenantRecord::try_from_spec(&spec).unwrap().allowed_models,
            None
        );
        let update = TenantUpdate {
            allowed_models: Some(Some(vec!["*".into()])),
            ..TenantUpdate::default()
        };
        let changes = TenantChanges::try_from_update(&update).unwrap();
        assert_eq!(changes.allowed_models, (true, None));
        let stored = TenantRow {
            allowed_models: Some(r#"["*"]"#.into()),
            ..row()
        };
        assert_eq!(stored.into_tenant().unwrap().spec.allowed_models, None);
    }

    #[test]
    fn zero_limits_are_refused_on_create_and_update() {
        let spec = TenantSpec {
            tokens_per_min: Some(0),
            ..row().into_tenant().unwrap().spec
        };
        assert!(matches!(
            TenantRecord::try_from_spec(&spec),
            Err(StoreError::Invalid(why)) if why.contains("tokens_per_min")
        ));
        let update = TenantUpdate {
            max_concurrency: Some(Some(0)),
            ..TenantUpdate::default()
        };
        assert!(TenantChanges::try_from_update(&update).is_err());
    }

    #[test]
    fn short_digest_is_corrupt() {
        let key = KeyRow {
            id: "key_1".into(),
            tenant: "t".into(),
            digest: vec![0; 31],
            prefix: "p".into(),
            description: None,
            created_at: 0,
            expires_at: None,
            revoked_at: None,
        };
        assert!(matches!(key.into_key(), Err(StoreError::Unavailable(_))));
    }
}
