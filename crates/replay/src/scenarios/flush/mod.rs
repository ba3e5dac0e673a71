//! `spillway replay cache-flush`: IL-0136 with real processes on 127.0.0.1.
//!
//! In IL-0136 a deployment flushed a service's caches at peak and lookups bypassed the cache;
//! the metadata database took about twenty times its usual load, its connections ran out, and
//! health checks that needed the database restarted instances in a loop for hours. This replay
//! puts a gateway in front of PostgreSQL holding one tenant and `--keys` API keys, sends
//! `--rate` requests per second spread uniformly over the keys, and runs six phases:
//!
//! 1. **start**: from the gateway's first start, how it fills its cache;
//! 2. **steady**: the store's usual query rate, the baseline of every "vs steady" figure;
//! 3. **flush**: `POST /admin/cache/flush` at its start;
//! 4. **restart**: the gateway is restarted (SIGTERM, then a new process on the same ports);
//! 5. **outage**: the store's port is closed and its connections broken;
//! 6. **recovery**: the store is back.
//!
//! The gateway reaches PostgreSQL through the replay's [`StoreLink`], which counts the SQL
//! statements on the wire (so counts survive restarts and include every query the gateway
//! makes) and takes the store away. A supervisor probes the gateway like an orchestrator and
//! restarts it after three failed probes. Each mode runs once: `protected` (spillway's
//! defaults, a cache snapshot, the supervisor on `/livez`) and `naive` (`cache.naive`, no
//! snapshot or warm-up, the supervisor on `/healthz/deps`).
//!
//! Architecture Invariant: as elsewhere in this crate the gateway is a child process known by
//! its command line, config and HTTP API; only the fixture (schema, tenant, keys) is made
//! through `spillway-store`, as an operator provisioning keys would.

mod args;
mod gateway;
mod keyring;
mod report;
mod store_link;
mod watch;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method};
use tokio::time::Instant;

use crate::error::ReplayError;
use crate::http::{request, uri, HttpClient};
use crate::incident::{self, say, Incident};
use crate::load::{self, Target};
use crate::plan::{LoadPlan, Mode};
use crate::scratch::Scratch;
use crate::tally::{Schedule, Tally};
use crate::timeline::{GatewayReading, Recording, StoreCount, Timeline};

pub use args::CacheFlushArgs;
use args::{FlushPlan, PHASES};
use gateway::{free_ports, Gateway, Probe};
use keyring::Keyring;
use report::{FlushReport, Mark, RunReport};
use store_link::StoreLink;
use watch::LivezWatch;

/// The model the client asks for, served by an in-process mock backend of the gateway.
const MODEL: &str = "gpt-flush";
/// The environment variable the gateway reads its admin token from.
const ADMIN_TOKEN_ENV: &str = "SPILLWAY_ADMIN_TOKEN";
/// Requests in flight at most; more are dropped and counted, never queued.
const MAX_OUTSTANDING: usize = 1024;
/// Time allowed for one request, body included.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);

/// Checks `args` into a plan, and returns the replay of it, not started yet: the store
/// prepared, every mode run, the table printed, the JSON written if asked, and the schema
/// dropped whatever happened.
pub(crate) fn replay(
    args: &CacheFlushArgs,
) -> Result<impl Future<Output = Result<(), ReplayError>>, ReplayError> {
    let plan = args.check()?;
    Ok(run(plan))
}

async fn run(plan: FlushPlan) -> Result<(), ReplayError> {
    let pg = keyring::server_addr(&plan.store)?;
    eprintln!(
        "replay: creating tenant {:?} and {} keys in a new schema of {pg}",
        keyring::TENANT,
        plan.keys
    );
    let started = Instant::now();
    let keyring = Keyring::create(&plan.store, plan.keys).await?;
    eprintln!(
        "replay: schema {} ready in {:.1} s",
        keyring.schema(),
        started.elapsed().as_secs_f64()
    );
    let link = match StoreLink::start(pg).await {
        Ok(link) => link,
        Err(e) => {
            keyring.drop_schema().await;
            return Err(ReplayError::Store(format!(
                "cannot start the store link: {e}"
            )));
        }
    };
    incident::replay(&CacheFlush {
        plan,
        keyring,
        link,
    })
    .await
}

/// The cache-flush incident: its plan, and the store every mode's gateway uses.
struct CacheFlush {
    plan: FlushPlan,
    keyring: Keyring,
    link: StoreLink,
}

impl Incident for CacheFlush {
    const SCENARIO: &'static str = "cache-flush";
    type Run = RunReport;
    type Report = FlushReport;

    fn modes(&self) -> &[Mode] {
        &self.plan.modes
    }

    fn json(&self) -> Option<&PathBuf> {
        self.plan.json.as_ref()
    }

    fn out(&self) -> Option<&PathBuf> {
        self.plan.out.as_ref()
    }

    async fn run_mode(&self, mode: Mode) -> Result<(RunReport, Timeline), ReplayError> {
        run_mode(&self.plan, mode, &self.keyring, &self.link).await
    }

    /// Closes the link (and every connection through it), then drops the schema.
    async fn release(&self) {
        self.link.cut().await;
        self.keyring.drop_schema().await;
    }

    fn report(&self, runs: Vec<RunReport>) -> FlushReport {
        FlushReport::new(&self.plan, runs)
    }

    fn table(report: &FlushReport) -> String {
        report::table(report)
    }
}

async fn run_mode(
    plan: &FlushPlan,
    mode: Mode,
    keyring: &Keyring,
    link: &StoreLink,
) -> Result<(RunReport, Timeline), ReplayError> {
    link.restore()
        .await
        .map_err(|e| ReplayError::Store(format!("cannot reopen the store link: {e}")))?;
    let scratch = Scratch::create(format!("flush-{mode}"))?;
    let [api, admin] = free_ports::<2>()?;
    let config = scratch.path.join("gateway.toml");
    let toml = gateway_config(
        mode,
        api,
        admin,
        &keyring.url_via(link.addr()),
        &scratch.path,
    );
    std::fs::write(&config, toml).map_err(|source| ReplayError::Scratch {
        what: config.display().to_string(),
        source,
    })?;
    let token = admin_token();
    let control = HttpClient::new(8);
    say(mode, "starting the gateway");
    let env = vec![(ADMIN_TOKEN_ENV.to_owned(), token.clone())];
    let gateway = Gateway::start(api, admin, config, env, &control).await?;
    say(
        mode,
        &format!("gateway ready on http://{api} (admin http://{admin})"),
    );
    let outcome = drive(plan, mode, keyring, link, &gateway, &control, &token).await;
    gateway.stop().await;
    link.restore()
        .await
        .map_err(|e| ReplayError::Store(format!("cannot reopen the store link: {e}")))?;
    say(mode, "stopped the gateway");
    drop(scratch);
    outcome
}

async fn drive(
    plan: &FlushPlan,
    mode: Mode,
    keyring: &Keyring,
    link: &StoreLink,
    gateway: &Arc<Gateway>,
    control: &HttpClient,
    token: &str,
) -> Result<(RunReport, Timeline), ReplayError> {
    let schedule = Schedule::new(Instant::now(), &plan.phases);
    let tally = Arc::new(Tally::new(&schedule));
    // The link's count, not the gateway's: it includes every process's statements, restarts
    // and warm-ups too, and is the figure the table reports.
    let reading = plan.out.as_ref().map(|_| GatewayReading {
        admin: gateway.admin,
        store: StoreCount::Counted {
            what: "store statements (on the wire)",
            read: link.statement_counter(),
        },
    });
    let recording = Recording::start(mode, &PHASES, schedule, reading);
    let target = Arc::new(Target::chat(
        uri(gateway.api, "/v1/chat/completions"),
        &keyring.keys,
        MODEL,
    ));
    let load_plan = LoadPlan {
        rate: plan.rate,
        max_outstanding: MAX_OUTSTANDING,
        client_retries: 0,
        resend_429: false,
        surge: None,
        attempt_timeout: ATTEMPT_TIMEOUT,
    };
    let load = load::offer(load_plan, target, schedule, Arc::clone(&tally));
    let livez = LivezWatch::start(gateway.api, schedule);
    let probe = match mode {
        Mode::Protected => Probe::Livez,
        Mode::Naive => Probe::Deps,
    };
    let supervisor = gateway.supervise(probe, control.clone());
    let mut missed = Vec::new();
    let phases = async {
        let mut marks = vec![Mark::take(link, gateway, control).await];
        for (i, name) in PHASES.iter().enumerate() {
            // A gateway event that fails (the supervisor was restarting the gateway just then)
            // is reported with the run, not fatal to it: it is part of what the run shows.
            let event = match i {
                2 => flush(gateway, control, token).await,
                3 => gateway.restart().await,
                _ => Ok(()),
            };
            if let Err(e) = event {
                say(mode, &format!("{name}: its event failed: {e}"));
                missed.push(format!("{name}: {e}"));
            }
            match i {
                4 => link.cut().await,
                5 => link
                    .restore()
                    .await
                    .map_err(|e| ReplayError::Store(format!("cannot reopen the link: {e}")))?,
                _ => {}
            }
            say(
                mode,
                &format!("{name} ({})", humantime::format_duration(plan.phases[i])),
            );
            tokio::time::sleep_until(schedule.end_of(i)).await;
            let mark = Mark::take(link, gateway, control).await;
            let before = &marks[marks.len() - 1];
            say(
                mode,
                &format!(
                    "{name} done: {} store statements, {} restarts",
                    mark.statements - before.statements,
                    mark.restarts - before.restarts
                ),
            );
            marks.push(mark);
        }
        Ok::<_, ReplayError>(marks)
    };
    let (marks, drained) = tokio::try_join!(phases, async { Ok(load.await) })?;
    supervisor.stop().await;
    let livez = livez.stop().await;
    let timeline = recording.finish(&[&tally]).await;
    let mut report = RunReport::completed(
        mode,
        &plan.phases,
        &tally.snapshot(),
        &marks,
        &livez,
        drained,
    );
    report.events_failed = missed;
    Ok((report, timeline))
}

/// `POST /admin/cache/flush` with the admin token.
async fn flush(gateway: &Gateway, control: &HttpClient, token: &str) -> Result<(), ReplayError> {
    let bearer = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|e| ReplayError::Store(format!("admin token: {e}")))?;
    let req = request(
        Method::POST,
        uri(gateway.admin, "/admin/cache/flush"),
        Some(&bearer),
        Bytes::new(),
    );
    match control.exchange(req, CONTROL_TIMEOUT).await {
        Ok((status, _)) if status.is_success() => Ok(()),
        Ok((status, body)) => Err(ReplayError::Control {
            what: "POST /admin/cache/flush".to_owned(),
            detail: format!("{status}: {}", String::from_utf8_lossy(&body)),
        }),
        Err(failure) => Err(ReplayError::Control {
            what: "POST /admin/cache/flush".to_owned(),
            detail: failure.to_string(),
        }),
    }
}

/// The gateway's config: fixed ports (kept across restarts), the store through the link, an
/// in-process mock backend, and the cache as `mode` wants it.
fn gateway_config(
    mode: Mode,
    api: std::net::SocketAddr,
    admin: std::net::SocketAddr,
    store_url: &str,
    scratch: &std::path::Path,
) -> String {
    let cache = match mode {
        Mode::Protected => format!(
            "snapshot = \"{}\"\n",
            scratch.join("key-cache.snapshot").display()
        ),
        Mode::Naive => "naive = true\nwarm_max_keys = 0\n".to_owned(),
    };
    format!(
        "# Written by `spillway replay cache-flush` ({mode} mode).\n\
         [server]\n\
         listen = \"{api}\"\n\
         admin_listen = \"{admin}\"\n\
         shutdown_grace = \"1s\"\n\n\
         [store]\n\
         url = \"{store_url}\"\n\n\
         [cache]\n\
         {cache}\n\
         [[models]]\n\
         name = \"{MODEL}\"\n\n\
         [[models.backends]]\n\
         name = \"mock\"\n\
         kind = \"mock\"\n\
         region = \"local\"\n\
         mock = {{ ttft = \"0ms\", tokens_per_sec = 0.0, capacity = 4096 }}\n"
    )
}

/// A token for this run only.
fn admin_token() -> String {
    format!("replay-admin-{:032x}", rand::random::<u128>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ports_a_gateway_is_given_are_never_one_port_twice() {
        for _ in 0..200 {
            let [api, admin] = free_ports::<2>().unwrap();
            assert_ne!(api, admin);
            assert!(api.ip().is_loopback() && api.port() != 0);
        }
    }

    #[test]
    fn the_modes_differ_only_in_their_cache() {
        let a = "127.0.0.1:1".parse().unwrap();
        let b = "127.0.0.1:2".parse().unwrap();
        let dir = std::path::Path::new("/tmp/x");
        let protected = gateway_config(Mode::Protected, a, b, "postgres://l/test", dir);
        let naive = gateway_config(Mode::Naive, a, b, "postgres://l/test", dir);
        assert!(protected.contains("snapshot = \"/tmp/x/key-cache.snapshot\""));
        assert!(!protected.contains("naive"));
        assert!(naive.contains("naive = true\nwarm_max_keys = 0"));
        assert!(!naive.contains("snapshot"));
        for toml in [protected, naive] {
            assert!(toml.contains("listen = \"127.0.0.1:1\""), "{toml}");
            assert!(toml.contains("url = \"postgres://l/test\""), "{toml}");
        }
    }
}
