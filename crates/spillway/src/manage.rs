//! `spillway tenants ...` and `spillway keys ...`: the admin operations against the configured
//! store, from the command line (the admin HTTP API offers the same on a running gateway).
//!
//! A key created here is printed once; the store keeps only its digest. A revocation made here
//! reaches running gateways within their key cache TTL (`cache.ttl`, 30 s by default); the
//! admin API's revoke also drops the key from that gateway's cache at once.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use spillway_config::Config;
use spillway_store::{Priority, Store, Tenant, TenantSpec, TenantUpdate};

/// Where the store is: the config file's `[store]`, or a URL.
#[derive(Args)]
pub struct StoreArgs {
    /// Read `[store]` from this config file (default: the quickstart's SQLite file).
    #[arg(long, short, global = true)]
    config: Option<PathBuf>,
    /// Use this store instead (`sqlite://PATH` or `postgres://...`).
    #[arg(
        long,
        global = true,
        env = "SPILLWAY_STORE_URL",
        hide_env_values = true
    )]
    store: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Args)]
pub struct Limits {
    /// Requests per minute, at least 1 (omit: no limit).
    #[arg(long)]
    rpm: Option<u32>,
    /// Tokens per minute, at least 1.
    #[arg(long)]
    tpm: Option<u32>,
    /// Concurrent requests at most, at least 1.
    #[arg(long)]
    max_concurrency: Option<u32>,
    /// critical, standard or batch.
    #[arg(long)]
    priority: Option<Priority>,
    /// Models the tenant may use, comma-separated (omit, or `*`: all).
    #[arg(long, value_delimiter = ',')]
    models: Option<Vec<String>>,
    /// A dedicated backend pool.
    #[arg(long)]
    pool: Option<String>,
    /// The model a Responses API create that names none goes to (one of `--models`).
    #[arg(long)]
    default_model: Option<String>,
}

#[derive(Subcommand)]
pub enum TenantsCommand {
    /// Create a tenant.
    Add {
        name: String,
        #[command(flatten)]
        limits: Limits,
        /// Create it disabled.
        #[arg(long)]
        disabled: bool,
    },
    /// List tenants.
    List,
    /// Show one tenant and its keys.
    Show { name: String },
    /// Change a tenant's limits, models, pool or default model (only the options given).
    Update {
        name: String,
        #[command(flatten)]
        limits: Limits,
        /// Enable it again.
        #[arg(long)]
        enable: bool,
        /// Clear a setting: no limit of that kind, every model, no pool or no default model
        /// (repeatable).
        #[arg(long, value_enum, value_name = "SETTING")]
        clear: Vec<Setting>,
    },
    /// Disable a tenant: its keys are refused (403) until it is enabled again.
    Disable { name: String },
}

/// An optional setting of a tenant, as `tenants update --clear` names it.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Setting {
    Rpm,
    Tpm,
    MaxConcurrency,
    Models,
    Pool,
    DefaultModel,
}

/// `Some(Some(v))` to set, `Some(None)` to clear (`setting` is among `clear`), `None` to leave;
/// both at once is a mistake. The setting's option has its name (`--rpm`, `--clear rpm`).
fn change<T>(
    value: Option<T>,
    clear: &[Setting],
    setting: Setting,
) -> anyhow::Result<Option<Option<T>>> {
    let flag = setting
        .to_possible_value()
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default();
    match (value, clear.contains(&setting)) {
        (Some(_), true) => anyhow::bail!("--{flag} and --clear {flag} contradict each other"),
        (Some(v), false) => Ok(Some(Some(v))),
        (None, true) => Ok(Some(None)),
        (None, false) => Ok(None),
    }
}

#[derive(Subcommand)]
pub enum KeysCommand {
    /// Create a key for a tenant and print its secret, once.
    Create {
        tenant: String,
        #[arg(long)]
        description: Option<String>,
        /// Expire after this long (e.g. `30d`, `12h`; more than 0).
        #[arg(long)]
        expires_in: Option<humantime::Duration>,
    },
    /// List a tenant's keys (never their secrets).
    List { tenant: String },
    /// Revoke a key by its id (`key_...`).
    Revoke { id: String },
}

async fn open(args: &StoreArgs) -> anyhow::Result<Arc<dyn Store>> {
    let (url, max_connections, acquire_timeout) = match (&args.store, &args.config) {
        (Some(url), _) => (url.clone(), 2, std::time::Duration::from_secs(5)),
        (None, path) => {
            let mut config = match path {
                Some(p) => Config::load(p).with_context(|| format!("{}", p.display()))?,
                None => Config::quickstart(),
            };
            // `store.url_env`: the URL (and its password) from the environment.
            let env = |name: &str| std::env::var(name).ok();
            if let Some(p) = spillway_proxy::preflight::resolve_secrets(&mut config, &env)
                .into_iter()
                .find(|p| p.location.starts_with("store."))
            {
                anyhow::bail!("{p}");
            }
            (config.store.url, 2, config.store.acquire_timeout)
        }
    };
    let options = spillway_store::PoolOptions {
        max_connections,
        acquire_timeout,
        ..spillway_store::PoolOptions::default()
    };
    Ok(spillway_store::open(&url, &options).await?)
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn print_tenants(tenants: &[Tenant], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(tenants)?);
        return Ok(());
    }
    println!(
        "{:<24} {:>8} {:>10} {:>8} {:<9} {:<8} {:<10} {:<16} models",
        "name", "rpm", "tpm", "conc", "priority", "enabled", "pool", "default"
    );
    let opt = |v: Option<u32>| v.map_or("-".to_owned(), |v| v.to_string());
    for t in tenants {
        let s = &t.spec;
        println!(
            "{:<24} {:>8} {:>10} {:>8} {:<9} {:<8} {:<10} {:<16} {}",
            s.name,
            opt(s.requests_per_min),
            opt(s.tokens_per_min),
            opt(s.max_concurrency),
            s.priority.as_str(),
            s.enabled,
            s.pool.as_deref().unwrap_or("-"),
            s.default_model.as_deref().unwrap_or("-"),
            s.allowed_models
                .as_ref()
                .map_or("all".to_owned(), |m| m.join(","))
        );
    }
    Ok(())
}

pub async fn tenants(command: TenantsCommand, args: StoreArgs) -> anyhow::Result<()> {
    let store = open(&args).await?;
    match command {
        TenantsCommand::Add {
            name,
            limits,
            disabled,
        } => {
            let spec = TenantSpec {
                name,
                requests_per_min: limits.rpm,
                tokens_per_min: limits.tpm,
                max_concurrency: limits.max_concurrency,
                priority: limits.priority.unwrap_or_default(),
                allowed_models: limits.models,
                pool: limits.pool,
                default_model: limits.default_model,
                enabled: !disabled,
            };
            let t = store.create_tenant(&spec).await?;
            print_tenants(&[t], args.json)
        }
        TenantsCommand::List => print_tenants(&store.list_tenants().await?, args.json),
        TenantsCommand::Show { name } => {
            let t = store
                .get_tenant(&name)
                .await?
                .with_context(|| format!("no tenant {name:?}"))?;
            let keys = store.list_keys(&name).await?;
            if args.json {
                let body = serde_json::json!({ "tenant": t, "keys": keys });
                println!("{}", serde_json::to_string_pretty(&body)?);
                return Ok(());
            }
            print_tenants(&[t], false)?;
            println!();
            print_keys(&keys, false)
        }
        TenantsCommand::Update {
            name,
            limits,
            enable,
            clear,
        } => {
            let update = TenantUpdate {
                requests_per_min: change(limits.rpm, &clear, Setting::Rpm)?,
                tokens_per_min: change(limits.tpm, &clear, Setting::Tpm)?,
                max_concurrency: change(limits.max_concurrency, &clear, Setting::MaxConcurrency)?,
                priority: limits.priority,
                allowed_models: change(limits.models, &clear, Setting::Models)?,
                pool: change(limits.pool, &clear, Setting::Pool)?,
                default_model: change(limits.default_model, &clear, Setting::DefaultModel)?,
                enabled: enable.then_some(true),
            };
            let t = store.update_tenant(&name, &update).await?;
            print_tenants(&[t], args.json)
        }
        TenantsCommand::Disable { name } => {
            let update = TenantUpdate {
                enabled: Some(false),
                ..TenantUpdate::default()
            };
            let t = store.update_tenant(&name, &update).await?;
            print_tenants(&[t], args.json)
        }
    }
}

fn print_keys(keys: &[spillway_store::ApiKey], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(keys)?);
        return Ok(());
    }
    println!(
        "{:<21} {:<16} {:<12} {:<8} description",
        "id", "tenant", "prefix", "state"
    );
    let t = now();
    for k in keys {
        let state = if k.revoked_at.is_some() {
            "revoked"
        } else if k.is_valid_at(t) {
            "active"
        } else {
            "expired"
        };
        println!(
            "{:<21} {:<16} {:<12} {:<8} {}",
            k.id,
            k.tenant,
            k.prefix,
            state,
            k.description.as_deref().unwrap_or("")
        );
    }
    Ok(())
}

pub async fn keys(command: KeysCommand, args: StoreArgs) -> anyhow::Result<()> {
    let store = open(&args).await?;
    match command {
        KeysCommand::Create {
            tenant,
            description,
            expires_in,
        } => {
            let expires_at = expires_in.map(|d| now() + d.as_secs() as i64);
            let issued = store
                .create_key(&tenant, description.as_deref(), expires_at)
                .await?;
            if args.json {
                let body = serde_json::json!({ "secret": issued.secret, "key": issued.key });
                println!("{}", serde_json::to_string_pretty(&body)?);
            } else {
                println!("{}", issued.secret);
                eprintln!(
                    "key {} for tenant {tenant}: the secret above is shown this once; the store keeps only its hash",
                    issued.key.id
                );
            }
            Ok(())
        }
        KeysCommand::List { tenant } => print_keys(&store.list_keys(&tenant).await?, args.json),
        KeysCommand::Revoke { id } => {
            let key = store.revoke_key(&id).await?;
            print_keys(&[key], args.json)
        }
    }
}
