//! The cache-flush scenario's database: a schema of its own in the given PostgreSQL, holding
//! one tenant and many API keys, created before the runs and dropped after them.
//!
//! The keys are created through the store, as `spillway keys create` would, so they are real
//! keys (random secrets, stored as digests). Inserting ten thousand of them one transaction at
//! a time is slow with synchronous commits, so this connection alone turns them off: the keys
//! are test fixtures, and the gateway's own connections are unaffected.

use std::sync::Arc;
use std::time::Duration;

use spillway_store::{PoolOptions, Priority, Store, TenantSpec};
use sqlx::{Connection, PgConnection};
use tokio::task::JoinSet;

use crate::error::ReplayError;

/// The tenant every key belongs to.
pub(crate) const TENANT: &str = "replay";
/// Keys created at once.
const CREATE_CONCURRENCY: usize = 8;

/// The scenario's schema and the secrets of its keys.
pub(crate) struct Keyring {
    base: String,
    schema: String,
    pub(crate) keys: Vec<String>,
}

impl Keyring {
    /// Creates a fresh schema in the database at `base`, the tenant, and `count` keys.
    pub(crate) async fn create(base: &str, count: u32) -> Result<Keyring, ReplayError> {
        let schema = format!(
            "spillway_replay_{}_{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or_default()
        );
        execute(base, &format!("CREATE SCHEMA {schema}")).await?;
        let mut ring = Keyring {
            base: base.to_owned(),
            schema,
            keys: Vec::with_capacity(count as usize),
        };
        if let Err(e) = ring.fill(count).await {
            ring.drop_schema().await;
            return Err(e);
        }
        Ok(ring)
    }

    async fn fill(&mut self, count: u32) -> Result<(), ReplayError> {
        let url = with_options(&self.base, &self.schema, "-c synchronous_commit=off");
        let options = PoolOptions {
            max_connections: CREATE_CONCURRENCY as u32,
            acquire_timeout: Duration::from_secs(10),
            ..PoolOptions::default()
        };
        let store: Arc<dyn Store> = spillway_store::open(&url, &options)
            .await
            .map_err(|e| ReplayError::Store(e.to_string()))?;
        let spec = TenantSpec {
            name: TENANT.to_owned(),
            requests_per_min: None,
            tokens_per_min: None,
            max_concurrency: None,
            priority: Priority::default(),
            allowed_models: None,
            pool: None,
            default_model: None,
            enabled: true,
        };
        store
            .create_tenant(&spec)
            .await
            .map_err(|e| ReplayError::Store(e.to_string()))?;
        let mut tasks = JoinSet::new();
        let per_task = count.div_ceil(CREATE_CONCURRENCY as u32);
        let mut left = count;
        while left > 0 {
            let n = per_task.min(left);
            left -= n;
            let store = Arc::clone(&store);
            tasks.spawn(async move {
                let mut secrets = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    let key = store.create_key(TENANT, Some("replay"), None).await?;
                    secrets.push(key.secret);
                }
                Ok::<_, spillway_store::StoreError>(secrets)
            });
        }
        while let Some(done) = tasks.join_next().await {
            let secrets = done
                .map_err(|e| ReplayError::Store(format!("key creation task: {e}")))?
                .map_err(|e| ReplayError::Store(e.to_string()))?;
            self.keys.extend(secrets);
        }
        Ok(())
    }

    /// The URL a gateway uses to reach this schema through `link` (host and port replaced),
    /// in clear text so the link can count statements.
    pub(crate) fn url_via(&self, link: std::net::SocketAddr) -> String {
        let url = with_options(&self.base, &self.schema, "");
        let url = replace_host(&url, &link.to_string());
        let separator = if url.contains('?') { '&' } else { '?' };
        format!("{url}{separator}sslmode=disable")
    }

    pub(crate) fn schema(&self) -> &str {
        &self.schema
    }

    /// Drops the schema and everything in it; a failure is reported on stderr, not fatal.
    pub(crate) async fn drop_schema(&self) {
        // Quietly: PostgreSQL's notice lists every table the cascade drops.
        let sql = format!(
            "SET client_min_messages = warning; DROP SCHEMA IF EXISTS {} CASCADE",
            self.schema
        );
        if let Err(e) = execute(&self.base, &sql).await {
            eprintln!("replay: could not drop schema {}: {e}", self.schema);
        }
    }
}

/// The PostgreSQL server's address in `url` (`postgres://[user@]host[:port]/...`).
pub(crate) fn server_addr(url: &str) -> Result<std::net::SocketAddr, ReplayError> {
    use std::net::ToSocketAddrs;
    let authority = authority(url);
    let hostport = authority.rsplit('@').next().unwrap_or(authority);
    let hostport = if hostport.contains(':') {
        hostport.to_owned()
    } else {
        format!("{hostport}:5432")
    };
    hostport
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| ReplayError::Store(format!("cannot resolve {hostport}")))
}

async fn execute(url: &str, sql: &str) -> Result<(), ReplayError> {
    let mut conn = PgConnection::connect(url)
        .await
        .map_err(|e| ReplayError::Store(format!("cannot connect: {e}")))?;
    sqlx::raw_sql(sql)
        .execute(&mut conn)
        .await
        .map_err(|e| ReplayError::Store(format!("{sql}: {e}")))?;
    let _ = conn.close().await;
    Ok(())
}

/// `url` with `search_path` set to `schema` and any `extra` server options.
fn with_options(url: &str, schema: &str, extra: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    let mut options = format!("-c search_path={schema}");
    if !extra.is_empty() {
        options = format!("{options} {extra}");
    }
    let encoded = options.replace(' ', "%20").replace('=', "%3D");
    format!("{url}{separator}options={encoded}")
}

/// The part of `url` between `://` and the next `/` (or `?`).
fn authority(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    &rest[..end]
}

/// `url` with the host and port of its authority replaced by `hostport`.
fn replace_host(url: &str, hostport: &str) -> String {
    let authority = authority(url);
    let user = authority
        .rsplit_once('@')
        .map(|(user, _)| format!("{user}@"))
        .unwrap_or_default();
    url.replacen(authority, &format!("{user}{hostport}"), 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_link_takes_the_server_s_place_in_the_url() {
        let url = "postgres://postgres@127.0.0.1:5432/test";
        assert_eq!(
            replace_host(url, "127.0.0.1:4000"),
            "postgres://postgres@127.0.0.1:4000/test"
        );
        assert_eq!(
            replace_host("postgres://db/x?a=b", "127.0.0.1:1"),
            "postgres://127.0.0.1:1/x?a=b"
        );
        assert_eq!(server_addr(url).unwrap(), "127.0.0.1:5432".parse().unwrap());
        assert_eq!(
            server_addr("postgres://u:p@127.0.0.1/test").unwrap(),
            "127.0.0.1:5432".parse().unwrap()
        );
    }

    #[test]
    fn options_are_encoded_into_the_url() {
        assert_eq!(
            with_options("postgres://h/db", "s1", "-c synchronous_commit=off"),
            "postgres://h/db?options=-c%20search_path%3Ds1%20-c%20synchronous_commit%3Doff"
        );
        assert_eq!(
            with_options("postgres://h/db?x=1", "s1", ""),
            "postgres://h/db?x=1&options=-c%20search_path%3Ds1"
        );
    }
}
