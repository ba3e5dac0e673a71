//! Changing the configuration of a running gateway: reload, last-known-good, and what cannot
//! change without a restart.
//!
//! In IL-0235 a configuration change that the deployed engines did not support failed requests
//! in seven regions, and rolling it back took fifteen hours. Two lessons shape this module: a
//! change must be checked completely before anything of it takes effect, and a configuration
//! known to have worked must be at hand when a fresh one cannot be trusted.
//!
//! A reload (`SIGHUP`, `POST /admin/config/reload`, `spillway reload`, or the file watch) reads
//! the file, checks it with every check `spillway check-config` makes (the environment variables
//! it names included), and only then builds the new config's state, keeping the live state of
//! every backend, pool, queue and tenant that did not change (`pool/build.rs`,
//! `Admission::reloaded`), and swaps it in with one atomic store (`live.rs`). Requests in flight
//! finish on the config they started with. A reload that fails any step changes nothing and says
//! why: in its answer, in the log, and in `spillway_config_reloads_total{result="rejected"}`.
//! Settings that a running process cannot change (the listeners, the store, the key cache, the
//! upstream client; `restart.rs`) keep their running values and are reported as needing a
//! restart. A config that has served for `reload.last_known_good_after` with no anomaly is saved
//! as the last-known-good one (`saved.rs`), which `serve --fallback-to-last-known-good` starts
//! with when the file does not pass its checks, and which `POST /admin/config/rollback` puts
//! back in place.

mod admin;
mod restart;
pub mod saved;
mod tasks;

use std::sync::Arc;
use std::time::SystemTime;

use metrics::{counter, describe_counter};
use spillway_config::{Config, ConfigError};
use tracing::{info, warn};

pub use crate::changes::{hash, Loaded, Startup, MAX_CONFIG_BYTES};
use crate::changes::{Changes, Ended, Outcome};
use crate::gateway::Gateway;
use crate::live::{Live, Source};
use crate::mocks::base_resolver;
use crate::pool::{Models, Rebuilt};

pub(crate) use admin::routes;
pub(crate) use tasks::{hangups, spawn as spawn_tasks};

const RELOADS: &str = "spillway_config_reloads_total";
const WATCH_CHECKS: &str = "spillway_config_watch_checks_total";

/// Where a reload reads its config from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum From {
    /// The config file, as it is now.
    File,
    /// The saved last-known-good config (a rollback).
    LastKnownGood,
}

/// Reloads `gw`'s config from `from`: checks it whole, builds its state keeping what did not
/// change, and swaps it in; or changes nothing and says why.
pub(crate) async fn reload(gw: &Gateway, from: From) -> Outcome {
    let changes = &gw.changes;
    let _one_at_a_time = changes.lock.lock().await;
    let running = gw.live();
    let outcome = match read(changes, from) {
        Err(problems) => rejected(&running, None, problems),
        Ok((loaded, path)) => apply(gw, &running, loaded, path, from).await,
    };
    counter!(RELOADS, "result" => outcome.result.as_str()).increment(1);
    match outcome.result {
        Ended::Applied => info!(
            hash = %outcome.hash.as_deref().unwrap_or(""),
            kept = outcome.rebuilt.backends_kept.len(),
            fresh = outcome.rebuilt.backends_fresh.len(),
            restart_required = ?outcome.restart_required,
            "config reloaded"
        ),
        Ended::Unchanged => info!(hash = %outcome.running, "config reload: unchanged"),
        Ended::Rejected => warn!(
            problems = %outcome.problems.join("; "),
            "config reload rejected; the running config keeps serving"
        ),
    }
    *changes.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome.clone());
    outcome
}

fn read(changes: &Changes, from: From) -> Result<(Loaded, Option<String>), Vec<String>> {
    match from {
        From::File => {
            let Some(path) = changes.path() else {
                return Err(vec![
                    "the gateway runs the built-in quickstart: there is no config file to reload"
                        .to_owned(),
                ]);
            };
            let text = crate::changes::read_config(path).map_err(problems)?;
            changes.saw(hash(text.as_bytes()));
            let loaded = Loaded::from_text(text).map_err(problems)?;
            Ok((loaded, Some(path.display().to_string())))
        }
        From::LastKnownGood => match saved::load(changes.data_dir()) {
            Ok(Some((loaded, _))) => Ok((loaded, changes.path().map(|p| p.display().to_string()))),
            Ok(None) => Err(vec![format!(
                "no last-known-good config is saved in {}",
                changes.data_dir().display()
            )]),
            Err(e) => Err(vec![e]),
        },
    }
}

pub(crate) fn describe() {
    describe_counter!(
        RELOADS,
        "Config reloads, by result: applied, unchanged, or rejected (nothing changed)."
    );
    describe_counter!(
        WATCH_CHECKS,
        "Times the watched config file was read (reload.watch): a watch that stopped shows here."
    );
    // Present from the start, so a rate or an alert on rejections has a series to read.
    for ended in [Ended::Applied, Ended::Unchanged, Ended::Rejected] {
        counter!(RELOADS, "result" => ended.as_str()).absolute(0);
    }
}

/// Appends the running config's gauges to the metrics page. They are written here rather than
/// registered, so the page shows only the running config's hash, never every hash it had.
pub(crate) fn render(live: &Live, changes: &Changes, page: &mut String) {
    use std::fmt::Write;
    let s = &live.source;
    let origin = match (&s.path, s.last_known_good) {
        (_, true) => "last_known_good",
        (Some(_), false) => "file",
        (None, false) => "quickstart",
    };
    let loaded = s
        .loaded_at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let restart = changes
        .last()
        .filter(|o| o.result == Ended::Applied)
        .map_or(0, |o| o.restart_required.len());
    let _ = write!(
        page,
        "# HELP spillway_config_info The running config: the SHA-256 of its text, and where it came from.\n\
         # TYPE spillway_config_info gauge\n\
         spillway_config_info{{sha256=\"{}\",source=\"{origin}\"}} 1\n\
         # HELP spillway_config_loaded_timestamp_seconds When the running config was put in place.\n\
         # TYPE spillway_config_loaded_timestamp_seconds gauge\n\
         spillway_config_loaded_timestamp_seconds {loaded:.3}\n\
         # HELP spillway_config_restart_required Settings the last reload changed that keep their running values until a restart.\n\
         # TYPE spillway_config_restart_required gauge\n\
         spillway_config_restart_required {restart}\n",
        s.hash
    );
}

/// A config's problems, one line each.
fn problems(e: ConfigError) -> Vec<String> {
    match e {
        ConfigError::Invalid(problems) => problems.iter().map(|p| p.to_string()).collect(),
        ConfigError::Parse(errors) => errors,
        other => vec![other.to_string()],
    }
}

fn rejected(running: &Live, hash: Option<String>, problems: Vec<String>) -> Outcome {
    Outcome {
        result: Ended::Rejected,
        hash,
        running: running.source.hash.clone(),
        problems,
        restart_required: Vec::new(),
        rebuilt: Rebuilt::default(),
    }
}

async fn apply(
    gw: &Gateway,
    running: &Arc<Live>,
    loaded: Loaded,
    path: Option<String>,
    from: From,
) -> Outcome {
    let last_known_good = from == From::LastKnownGood;
    if loaded.hash == running.source.hash && last_known_good == running.source.last_known_good {
        return Outcome {
            result: Ended::Unchanged,
            hash: Some(loaded.hash),
            running: running.source.hash.clone(),
            problems: Vec::new(),
            restart_required: Vec::new(),
            rebuilt: Rebuilt::default(),
        };
    }
    let mut config = loaded.config;
    gw.changes.startup.apply_overrides(&mut config);
    let restart_required = restart::pin(&running.config, &mut config);
    let hash = Some(loaded.hash.clone());
    let mocks = match gw.mocks.plan(&config).await {
        Ok(plan) => plan,
        Err(e) => return rejected(running, hash, vec![format!("mock backends: {e}")]),
    };
    let bases = mocks.bases();
    let (models, rebuilt) =
        match Models::rebuilt(&config, base_resolver(&bases), &running.models, &|m| {
            gw.rollouts.cell_for(m)
        }) {
            Ok(built) => built,
            Err(e) => return rejected(running, hash, vec![e]),
        };
    if config.tenants != running.config.tenants {
        if let Err(e) = apply_tenants(gw, &running.config, &config).await {
            return rejected(running, hash, vec![e]);
        }
    }
    let admission = running.admission.reloaded(
        &config.admission,
        config.retry.shed_client_retries,
        models.pools().iter().map(|p| &**p),
    );
    let grace = config.server.shutdown_grace;
    let source = Source {
        hash: loaded.hash,
        text: loaded.text,
        loaded_at: SystemTime::now(),
        path,
        last_known_good,
    };
    let next = Live::new(config, source, models, admission);
    next.spawn_tasks(gw.upstream.client());
    gw.mocks.commit(mocks, grace);
    let cells = next.models.rollouts();
    let old = gw.swap(next);
    gw.rollouts.adopt(cells);
    old.retire();
    forget_removed(&old.models, &gw.live().models);
    Outcome {
        result: Ended::Applied,
        hash,
        running: gw.live().source.hash.clone(),
        problems: Vec::new(),
        restart_required,
        rebuilt,
    }
}

/// Zeroes the gauges of the backends `previous` had and `next` has not: the page shows only the
/// running config's backends, and the last values of a removed one would otherwise stand (an
/// ejected or anomalous backend that is gone would keep its alert firing).
fn forget_removed(previous: &Models, next: &Models) {
    let kept: Vec<_> = next
        .pools()
        .iter()
        .flat_map(|p| p.backends.clone())
        .collect();
    for pool in previous.pools() {
        for b in pool
            .backends
            .iter()
            .filter(|b| !kept.iter().any(|k| Arc::ptr_eq(k, b)))
        {
            b.metrics.read_gauges(0, 0, false);
            crate::anomaly::forget(&pool.name, &b.name);
        }
    }
}

/// Writes the config's tenants to the store, as at start, and forgets the cached lookups of
/// those that changed. A tenant dropped from the file stays in the store, as one added through
/// the admin API would: disable it there.
async fn apply_tenants(gw: &Gateway, running: &Config, next: &Config) -> Result<(), String> {
    let bootstrap = crate::tenants::Bootstrap::resolve(&next.tenants)?;
    bootstrap
        .apply(gw.tenants.store().as_ref())
        .await
        .map_err(|e| format!("tenants not written to the store, so nothing changed: {e}"))?;
    for t in &next.tenants {
        if !running.tenants.contains(t) {
            gw.tenants.tenant_changed(&t.name);
        }
    }
    Ok(())
}
