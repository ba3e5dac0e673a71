//! `spillway replay noisy-neighbor`: one tenant floods, another must not notice.
//!
//! IL-0248's internal workload skipped the limits external callers had, and its amplified
//! traffic took the shared routing layer down; IL-0110 is a node taken down by one
//! memory-hungry neighbour. Here two tenants share one model served by one `spillway
//! mock-backend` (about 0.2 s per request) through 8 seats of a gateway: `quiet` sends
//! `--quiet-rate` requests per second throughout, within its limit (600 a minute); `flood`
//! (limit `--flood-limit` a minute) sends at its limit, then at 50 times it during the flood
//! phase, resending every 429, 5xx and failure at once up to 48 times. Each mode runs on a fresh
//! gateway: `protected` (tenant limits, fair queuing, bounded queues) and `naive`
//! (`admission.naive`: no limits, one unbounded first-come-first-served queue).

mod args;
mod report;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::ReplayError;
use crate::http::{uri, HttpClient};
use crate::incident::{self, say, Incident};
use crate::load::{self, Target};
use crate::plan::{LoadPlan, Mode};
use crate::process::ChildProcess;
use crate::ready::{self, START_DEADLINE};
use crate::rss::RssSampler;
use crate::scratch::Scratch;
use crate::tally::{Schedule, Tally};
use crate::timeline::{GatewayReading, Recording, StoreCount, Timeline};

pub use args::NoisyNeighborArgs;
use args::{NeighborPlan, PHASES};
use report::{NeighborReport, RunReport};

const MODEL: &str = "gpt-neighbor";
const FLOOD_KEY_ENV: &str = "SPILLWAY_REPLAY_FLOOD_KEY";
const QUIET_KEY_ENV: &str = "SPILLWAY_REPLAY_QUIET_KEY";
/// The quiet tenant's limit, per minute.
const QUIET_LIMIT: u32 = 600;
/// The gateway's seats on the one backend.
const SEATS: u32 = 8;
/// How much the flood multiplies the flooding tenant's limit.
const FLOOD_FACTOR: f64 = 50.0;
const MOCK_FLAGS: [&str; 14] = [
    "--model",
    MODEL,
    "--capacity",
    "64",
    "--queue",
    "4096",
    "--ttft",
    "200ms",
    "--tokens-per-sec",
    "200",
    "--max-output-tokens",
    "4",
    "--listen",
    "127.0.0.1:0",
];

/// Checks `args` into a plan, and returns the replay of it, not started yet: every mode run,
/// the table printed, the JSON written if asked.
pub(crate) fn replay(
    args: &NoisyNeighborArgs,
) -> Result<impl Future<Output = Result<(), ReplayError>>, ReplayError> {
    let plan = args.check()?;
    Ok(async move { incident::replay(&plan).await })
}

impl Incident for NeighborPlan {
    const SCENARIO: &'static str = "noisy-neighbor";
    type Run = RunReport;
    type Report = NeighborReport;

    fn modes(&self) -> &[Mode] {
        &self.modes
    }

    fn json(&self) -> Option<&PathBuf> {
        self.json.as_ref()
    }

    fn out(&self) -> Option<&PathBuf> {
        self.out.as_ref()
    }

    async fn run_mode(&self, mode: Mode) -> Result<(RunReport, Timeline), ReplayError> {
        run_mode(self, mode).await
    }

    fn report(&self, runs: Vec<RunReport>) -> NeighborReport {
        NeighborReport::new(self, runs)
    }

    fn table(report: &NeighborReport) -> String {
        report::table(report)
    }
}

async fn run_mode(plan: &NeighborPlan, mode: Mode) -> Result<(RunReport, Timeline), ReplayError> {
    say(mode, "starting a mock backend and the gateway");
    let (mock, mock_addrs) =
        ChildProcess::start("mock backend", &mock_args(), &[], START_DEADLINE).await?;
    let scratch = Scratch::create(format!("neighbor-{mode}"))?;
    let config = scratch.path.join("gateway.toml");
    let toml = format!(
        "{}\n[store]\nurl = \"sqlite://{}\"\n",
        gateway_config(mode, plan, mock_addrs[0]),
        scratch.path.join("spillway.db").display()
    );
    std::fs::write(&config, toml).map_err(|source| ReplayError::Scratch {
        what: config.display().to_string(),
        source,
    })?;
    let (flood_key, quiet_key) = (key("flood"), key("quiet"));
    let config_arg = config.to_string_lossy();
    let control = HttpClient::new(4);
    let (mut gateway, addrs) = ChildProcess::start(
        &format!("{mode} gateway"),
        &["serve", "--config", &config_arg],
        &[(FLOOD_KEY_ENV, &flood_key), (QUIET_KEY_ENV, &quiet_key)],
        START_DEADLINE,
    )
    .await?;
    let outcome = async {
        ready::wait_ready(&mut gateway, addrs[0], &control).await?;
        say(mode, &format!("gateway (pid {}) ready", gateway.pid()));
        let admin = addrs.get(1).copied().unwrap_or(addrs[0]);
        let keys = (flood_key.as_str(), quiet_key.as_str());
        Ok::<_, ReplayError>(drive(plan, mode, (addrs[0], admin), gateway.pid(), keys).await)
    }
    .await;
    gateway.stop().await;
    mock.stop().await;
    drop(scratch);
    say(mode, "stopped every process of this run");
    outcome
}

async fn drive(
    plan: &NeighborPlan,
    mode: Mode,
    (api, admin): (std::net::SocketAddr, std::net::SocketAddr),
    pid: u32,
    (flood_key, quiet_key): (&str, &str),
) -> (RunReport, Timeline) {
    let schedule = Schedule::new(Instant::now(), &plan.phases);
    // The gateway's metrics at the start and at the end of each phase, for queue waits.
    let pages = tokio::spawn(async move {
        let client = HttpClient::new(1);
        let mut pages = vec![metrics_page(&client, admin).await];
        for i in 0..PHASES.len() {
            tokio::time::sleep_until(schedule.end_of(i)).await;
            pages.push(metrics_page(&client, admin).await);
        }
        pages
    });
    let target = |key: &str| {
        Arc::new(Target::chat(
            uri(api, "/v1/chat/completions"),
            &[key.to_owned()],
            MODEL,
        ))
    };
    let limit_rate = f64::from(plan.flood_limit) / 60.0;
    let flood_plan = LoadPlan {
        rate: limit_rate,
        max_outstanding: 1024,
        client_retries: 48,
        resend_429: true,
        surge: Some((1, limit_rate * FLOOD_FACTOR)),
        attempt_timeout: Duration::from_secs(5),
    };
    let quiet_plan = LoadPlan {
        rate: plan.quiet_rate,
        max_outstanding: 256,
        client_retries: 0,
        resend_429: false,
        surge: None,
        attempt_timeout: Duration::from_secs(5),
    };
    let (flood, quiet) = (
        Arc::new(Tally::new(&schedule)),
        Arc::new(Tally::new(&schedule)),
    );
    let rss = RssSampler::start(pid, schedule);
    let gateway = plan.out.as_ref().map(|_| GatewayReading {
        admin,
        store: StoreCount::Gateway,
    });
    let recording = Recording::start(mode, &PHASES, schedule, gateway);
    say(
        mode,
        &format!(
            "flood sends {limit_rate:.1}/s, {:.0}/s during the flood; quiet sends {}/s",
            limit_rate * FLOOD_FACTOR,
            plan.quiet_rate
        ),
    );
    let (flood_drained, quiet_drained) = tokio::join!(
        load::offer(flood_plan, target(flood_key), schedule, flood.clone()),
        load::offer(quiet_plan, target(quiet_key), schedule, quiet.clone()),
    );
    let rss = rss.stop().await;
    let timeline = recording.finish(&[&flood, &quiet]).await;
    let pages = pages.await.unwrap_or_default();
    let report = RunReport::completed(
        mode,
        &plan.phases,
        [&flood.snapshot(), &quiet.snapshot()],
        &pages,
        &rss,
        flood_drained.in_flight_at_end + quiet_drained.in_flight_at_end,
    );
    (report, timeline)
}

/// The gateway's `/metrics` page, or nothing if it does not answer.
async fn metrics_page(client: &HttpClient, admin: std::net::SocketAddr) -> String {
    match client
        .get(uri(admin, "/metrics"), Duration::from_secs(2))
        .await
    {
        Ok((status, body)) if status.is_success() => String::from_utf8_lossy(&body).into_owned(),
        _ => String::new(),
    }
}

fn mock_args() -> Vec<&'static str> {
    let mut args = vec!["mock-backend"];
    args.extend_from_slice(&MOCK_FLAGS);
    args
}

fn gateway_config(mode: Mode, plan: &NeighborPlan, mock: std::net::SocketAddr) -> String {
    let admission = match mode {
        Mode::Protected => String::new(),
        Mode::Naive => "[admission]\nnaive = true\n".to_owned(),
    };
    format!(
        "# Written by `spillway replay noisy-neighbor` ({mode} mode).\n\
         [server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nshutdown_grace = \"1s\"\n\n\
         {admission}\n\
         [[tenants]]\nname = \"flood\"\nkeys = [{{ env = \"{FLOOD_KEY_ENV}\" }}]\nrequests_per_min = {}\n\n\
         [[tenants]]\nname = \"quiet\"\nkeys = [{{ env = \"{QUIET_KEY_ENV}\" }}]\nrequests_per_min = {QUIET_LIMIT}\n\n\
         [[models]]\nname = \"{MODEL}\"\n\n\
         [[models.backends]]\nname = \"mock\"\nkind = \"openai\"\nregion = \"local\"\n\
         url = \"http://{mock}/v1\"\nmax_concurrency = {SEATS}\n",
        plan.flood_limit
    )
}

/// A key for this run only.
fn key(tenant: &str) -> String {
    format!("sk-replay-{tenant}-{:016x}", rand::random::<u64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_naive_config_turns_admission_off() {
        let plan = NeighborPlan {
            modes: vec![Mode::Protected],
            phases: [Duration::from_secs(1); 3],
            flood_limit: 120,
            quiet_rate: 5.0,
            json: None,
            out: None,
        };
        let addr = "127.0.0.1:9".parse().unwrap();
        let protected = gateway_config(Mode::Protected, &plan, addr);
        let naive = gateway_config(Mode::Naive, &plan, addr);
        assert!(!protected.contains("naive"), "{protected}");
        assert!(naive.contains("[admission]\nnaive = true"), "{naive}");
        for toml in [protected, naive] {
            assert!(toml.contains("requests_per_min = 120"), "{toml}");
            assert!(toml.contains("max_concurrency = 8"), "{toml}");
        }
    }
}
