//! The processes of the bad-rollout scenario, and the operator's hands on them.
//!
//! IL-0235's shape in miniature: model `gpt-rollout` served in every region by a backend of the
//! current version, and a new version of it, one backend per region, that refuses a feature
//! (`--reject-field tools`: 400 `unsupported_parameter`) and has a fraction of the capacity. The
//! gateway starts on the old version only; the rollout is started as an operator would start
//! it: the config file rewritten with a `[models.rollout]` section and reloaded through the
//! admin API. The two modes differ only in that section's `mode`. Each mode gets a fresh fleet
//! and a fresh data directory, so no rollout state carries over from one mode to the other.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode};
use serde::Deserialize;
use serde_json::Value;

use super::args::BadRolloutPlan;
use crate::error::{one_line, ReplayError};
use crate::http::{request, uri, HttpClient};
use crate::plan::Mode;
use crate::process::ChildProcess;
use crate::ready::{wait_ready, START_DEADLINE};
use crate::scratch::Scratch;

/// The model every backend serves and the client asks for.
pub(crate) const MODEL: &str = "gpt-rollout";
/// The feature the new version does not support: a top-level field of the request body.
pub(crate) const FEATURE: &str = "tools";
/// The steps of the staged rollout, in percent of first attempts. Fewer and larger than a
/// production rollout's (1, 5, 25, 50, 100) because the replay's phase lasts seconds, not
/// hours: its first step must still see enough requests to show an excess (10 % of 40
/// requests a second, 30 % of them with the feature, is 1.2 refusals a second, and five against
/// none halt it), which is IL-0235's lesson about the early stages of a rollout.
pub(crate) const STEPS: [u32; 3] = [10, 50, 100];
/// Requests the new version must answer before a step may be promoted.
pub(crate) const MIN_STEP_REQUESTS: u64 = 20;
/// How long a mock takes to serve one request at [`PACE`]: 0.3 s to the first token and three
/// more tokens at 100 a second.
const SERVICE_SECS: f64 = 0.33;
/// Queue of the old version: ample, so that it never refuses the whole load.
const OLD_QUEUE: &str = "256";
/// Queue of the new version: enough for a burst, not for a load beyond its slots.
const NEW_QUEUE: &str = "2";
/// Both versions generate at the same pace (0.3 s to the first token, 4 tokens at 100 a
/// second), so the comparator's first-token times see the same engine on both sides.
const PACE: [&str; 6] = [
    "--ttft",
    "300ms",
    "--tokens-per-sec",
    "100",
    "--max-output-tokens",
    "4",
];
/// The environment variables the gateway reads the client's key and the admin token from.
const KEY_ENV: &str = "SPILLWAY_REPLAY_KEY";
const ADMIN_TOKEN_ENV: &str = "SPILLWAY_ADMIN_TOKEN";
/// Deadline for one control request to a mock or the gateway.
pub(crate) const CONTROL_TIMEOUT: Duration = Duration::from_secs(2);
/// A reload checks the whole file and may write tenants to the store: more than a poll.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(10);

/// One mock backend of the scenario.
struct Backend {
    name: String,
    addr: SocketAddr,
    process: ChildProcess,
}

/// What the new version's backends counted, summed over regions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct NewCounters {
    /// Inference requests that reached a new-version backend.
    pub(crate) received: u64,
    /// Refused with 429: every slot and the queue taken.
    pub(crate) queue_full: u64,
    /// Refused with 400 for the feature.
    pub(crate) rejected_field: u64,
}

/// The scenario's running processes.
pub(crate) struct Fleet {
    old: Vec<Backend>,
    new: Vec<Backend>,
    pub(crate) gateway_addr: SocketAddr,
    /// The gateway's admin listener, where its `/metrics` is.
    pub(crate) admin_addr: SocketAddr,
    pub(crate) gateway_pid: u32,
    /// The tenant key the client presents.
    pub(crate) key: String,
    admin: HeaderValue,
    config: PathBuf,
    gateway: ChildProcess,
    scratch: Scratch,
}

impl Fleet {
    /// Starts both versions' mocks in every region, then the gateway on the old version only,
    /// and waits until its `/readyz` answers 200.
    pub(crate) async fn start(
        mode: Mode,
        plan: &BadRolloutPlan,
        control: &HttpClient,
    ) -> Result<Fleet, ReplayError> {
        let mut old = Vec::with_capacity(plan.regions);
        let mut new = Vec::with_capacity(plan.regions);
        let (old_slots, new_slots) = slots(plan);
        let old_slots = ["--capacity", &old_slots.to_string(), "--queue", OLD_QUEUE];
        let new_slots = ["--capacity", &new_slots.to_string(), "--queue", NEW_QUEUE];
        let new_flags = [&new_slots[..], &["--reject-field", FEATURE]].concat();
        for region in regions(plan.regions) {
            old.push(Backend::start(format!("old-{region}"), &old_slots).await?);
            new.push(Backend::start(format!("new-{region}"), &new_flags).await?);
        }
        let scratch = Scratch::create(format!("rollout-{mode}"))?;
        let config = scratch.path.join("gateway.toml");
        let store = scratch.path.join("spillway.db");
        write(&config, &config_file(mode, &addrs(&old), None, &store))?;
        let key = secret("key");
        let token = secret("admin");
        let admin = HeaderValue::from_str(&format!("Bearer {token}"))
            .expect("a generated token is a valid header value");
        let config_arg = config.to_string_lossy().into_owned();
        let data_dir = scratch.path.join("data").to_string_lossy().into_owned();
        let (mut gateway, gateway_addrs) = ChildProcess::start(
            &format!("{mode} gateway"),
            &["serve", "--config", &config_arg, "--data-dir", &data_dir],
            &[(KEY_ENV, &key), (ADMIN_TOKEN_ENV, &token)],
            START_DEADLINE,
        )
        .await?;
        let gateway_addr = gateway_addrs[0];
        wait_ready(&mut gateway, gateway_addr, control).await?;
        Ok(Fleet {
            old,
            new,
            gateway_addr,
            admin_addr: gateway_addrs.get(1).copied().unwrap_or(gateway_addr),
            gateway_pid: gateway.pid(),
            key,
            admin,
            config,
            gateway,
            scratch,
        })
    }

    /// Starts the rollout as an operator would: the config file rewritten with the new
    /// version in `[models.rollout]`, then `POST /admin/config/reload`, which must answer
    /// `applied`.
    pub(crate) async fn start_rollout(
        &self,
        mode: Mode,
        plan: &BadRolloutPlan,
        control: &HttpClient,
    ) -> Result<(), ReplayError> {
        let rollout = rollout_section(mode, plan.phases[1], &addrs(&self.new));
        let store = self.scratch.path.join("spillway.db");
        let toml = config_file(mode, &addrs(&self.old), Some(rollout), &store);
        write(&self.config, &toml)?;
        let what = "POST /admin/config/reload on the gateway";
        let body = self
            .admin_call(
                control,
                Method::POST,
                "/admin/config/reload",
                RELOAD_TIMEOUT,
            )
            .await
            .map_err(|detail| control_error(what, detail))?;
        match body["result"].as_str() {
            Some("applied") => Ok(()),
            _ => Err(control_error(
                what,
                format!(
                    "the rollout's config was not applied: {}",
                    one_line(&body.to_string())
                ),
            )),
        }
    }

    /// The gateway's `/admin/rollouts` entry for the model; `None` before the rollout.
    pub(crate) async fn rollout_view(&self, control: &HttpClient) -> Result<Option<Value>, String> {
        let body = self
            .admin_call(control, Method::GET, "/admin/rollouts", CONTROL_TIMEOUT)
            .await?;
        let rollouts = body["rollouts"].as_array().cloned().unwrap_or_default();
        Ok(rollouts.into_iter().find(|r| r["model"] == MODEL))
    }

    /// The new version's counters from every new backend's `/stats`, summed.
    pub(crate) async fn new_counters(
        &self,
        control: &HttpClient,
    ) -> Result<NewCounters, ReplayError> {
        #[derive(Deserialize)]
        struct Stats {
            received: u64,
            rejected_queue_full: u64,
            rejected_field: u64,
        }
        let mut sum = NewCounters::default();
        for backend in &self.new {
            let what = format!("GET /stats on mock backend {}", backend.name);
            let stats = match control
                .get(uri(backend.addr, "/stats"), CONTROL_TIMEOUT)
                .await
            {
                Ok((StatusCode::OK, body)) => serde_json::from_slice::<Stats>(&body)
                    .map_err(|e| control_error(&what, format!("unexpected body: {e}")))?,
                Ok((status, _)) => return Err(control_error(&what, status.to_string())),
                Err(failure) => return Err(control_error(&what, failure.to_string())),
            };
            sum.received += stats.received;
            sum.queue_full += stats.rejected_queue_full;
            sum.rejected_field += stats.rejected_field;
        }
        Ok(sum)
    }

    /// Kills every process by its PID (the gateway first, so it stops sending to the mocks)
    /// and removes the scratch directory.
    pub(crate) async fn stop(self) {
        self.gateway.stop().await;
        for backend in self.old.into_iter().chain(self.new) {
            backend.process.stop().await;
        }
        drop(self.scratch);
    }

    /// An admin API call with the token; its JSON body when it answered 200.
    async fn admin_call(
        &self,
        control: &HttpClient,
        method: Method,
        path: &str,
        timeout: Duration,
    ) -> Result<Value, String> {
        let req = request(
            method,
            uri(self.admin_addr, path),
            Some(&self.admin),
            Bytes::new(),
        );
        match control.exchange(req, timeout).await {
            Ok((StatusCode::OK, body)) => {
                serde_json::from_slice(&body).map_err(|e| format!("unexpected body: {e}"))
            }
            Ok((status, body)) => Err(format!(
                "{status}: {}",
                one_line(&String::from_utf8_lossy(&body))
            )),
            Err(failure) => Err(failure.to_string()),
        }
    }
}

impl Backend {
    async fn start(name: String, flags: &[&str]) -> Result<Backend, ReplayError> {
        let mut args = vec!["mock-backend", "--listen", "127.0.0.1:0", "--model", MODEL];
        args.extend_from_slice(&PACE);
        args.extend_from_slice(flags);
        let what = format!("mock backend {name}");
        let (process, addrs) = ChildProcess::start(&what, &args, &[], START_DEADLINE).await?;
        Ok(Backend {
            name,
            addr: addrs[0],
            process,
        })
    }
}

/// Generation slots of each old and each new backend. The old version's are ample: twice what
/// its region's share of the load keeps busy, and at least 64. The new version's are two thirds
/// of what its region's requests without the feature need (those with it are refused before a
/// slot is taken), and at least one: at the defaults, 40 / 3 = 13 a second per region, 9 of them
/// without `tools`, need 3 slots at 0.33 s, and 2 serve 6 a second. So a new version given every
/// request refuses about a third of them with 429 (IL-0235's reduced capacity), while at the
/// first step's 10 % it has room to spare, as a version sized for a share of the traffic would.
fn slots(plan: &BadRolloutPlan) -> (u32, u32) {
    let per_region = plan.load.rate / plan.regions as f64;
    let old = (2.0 * per_region * SERVICE_SECS).ceil().max(64.0);
    let new = (per_region * (1.0 - plan.tools_share) * SERVICE_SECS * 2.0 / 3.0)
        .round()
        .max(1.0);
    (old as u32, new as u32)
}

/// The regions' names: `r1`, `r2`, ...
fn regions(n: usize) -> impl Iterator<Item = String> {
    (1..=n).map(|i| format!("r{i}"))
}

fn addrs(backends: &[Backend]) -> Vec<SocketAddr> {
    backends.iter().map(|b| b.addr).collect()
}

/// The whole config file: the old version's backends, the rollout's section once it starts,
/// and the store in the scratch directory.
fn config_file(mode: Mode, old: &[SocketAddr], rollout: Option<String>, store: &Path) -> String {
    format!(
        "{}{}\n{}",
        base_config(mode, old),
        rollout.unwrap_or_default(),
        store_section(store)
    )
}

/// The gateway's config on the old version only: one `openai` backend per address, the
/// region's in order.
fn base_config(mode: Mode, old: &[SocketAddr]) -> String {
    let mut toml = format!(
        "# Written by `spillway replay bad-rollout` ({mode} mode).\n\
         [server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nshutdown_grace = \"1s\"\n\n\
         [[tenants]]\nname = \"replay\"\nkeys = [{{ env = \"{KEY_ENV}\" }}]\n\n\
         [[models]]\nname = \"{MODEL}\"\n"
    );
    toml += &backends("models.backends", "old", old);
    toml
}

/// The `[models.rollout]` section that brings the new version: staged for the protected mode,
/// with its steps held for a quarter of the rollout phase each (so a healthy version would
/// reach 100 % and hold it within the phase), or the naive deployment's `replace`.
fn rollout_section(mode: Mode, rollout_phase: Duration, new: &[SocketAddr]) -> String {
    let mut toml = match mode {
        Mode::Protected => {
            let steps: Vec<String> = STEPS.iter().map(u32::to_string).collect();
            format!(
                "\n[models.rollout]\nmode = \"staged\"\nsteps = [{}]\n\
                 min_step_duration = \"{}ms\"\nmin_step_requests = {MIN_STEP_REQUESTS}\n",
                steps.join(", "),
                step_duration(rollout_phase).as_millis()
            )
        }
        Mode::Naive => "\n[models.rollout]\nmode = \"replace\"\n".to_owned(),
    };
    toml += &backends("models.rollout.backends", "new", new);
    toml
}

/// The `[models.rollout]` mode each gateway mode reloads.
pub(crate) fn rollout_mode(mode: Mode) -> &'static str {
    match mode {
        Mode::Protected => "staged",
        Mode::Naive => "replace",
    }
}

/// How long each staged step holds: a quarter of the rollout phase, so that the three steps
/// and the hold of the last fit in it.
pub(crate) fn step_duration(rollout_phase: Duration) -> Duration {
    (rollout_phase / 4).max(Duration::from_millis(1))
}

fn backends(table: &str, version: &str, addrs: &[SocketAddr]) -> String {
    regions(addrs.len())
        .zip(addrs)
        .map(|(region, addr)| {
            format!(
                "\n[[{table}]]\nname = \"{version}-{region}\"\nkind = \"openai\"\n\
                 region = \"{region}\"\nurl = \"http://{addr}/v1\"\n"
            )
        })
        .collect()
}

fn store_section(path: &Path) -> String {
    format!("[store]\nurl = \"sqlite://{}\"\n", path.display())
}

fn write(path: &Path, toml: &str) -> Result<(), ReplayError> {
    std::fs::write(path, toml).map_err(|source| ReplayError::Scratch {
        what: path.display().to_string(),
        source,
    })
}

fn control_error(what: &str, detail: String) -> ReplayError {
    ReplayError::Control {
        what: what.to_owned(),
        detail,
    }
}

/// A secret for this run only; it never leaves this machine's loopback.
fn secret(what: &str) -> String {
    format!("sk-replay-{what}-{:016x}", rand::random::<u64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs(first: u16, n: u16) -> Vec<SocketAddr> {
        (0..n)
            .map(|i| SocketAddr::from(([127, 0, 0, 1], first + i)))
            .collect()
    }

    #[test]
    fn the_new_version_has_two_thirds_of_the_slots_its_share_needs() {
        let plan = |rate: f64, regions: usize, tools_share: f64| BadRolloutPlan {
            modes: vec![Mode::Protected],
            phases: [Duration::from_secs(1); 3],
            load: crate::plan::LoadPlan {
                rate,
                max_outstanding: 1,
                client_retries: 0,
                resend_429: false,
                surge: None,
                attempt_timeout: Duration::from_secs(1),
            },
            tools_share,
            regions,
            json: None,
            out: None,
        };
        assert_eq!(slots(&plan(40.0, 3, 0.3)), (64, 2));
        assert_eq!(slots(&plan(40.0, 7, 0.3)), (64, 1));
        // 200 a second per region: 66 busy old slots, doubled; 140 without tools need 46.
        let (old, new) = slots(&plan(400.0, 2, 0.3));
        assert!((132..=133).contains(&old) && new == 31, "{old} {new}");
        assert_eq!(slots(&plan(40.0, 3, 1.0)), (64, 1));
    }

    #[test]
    fn the_gateway_starts_on_the_old_version_only() {
        let toml = base_config(Mode::Protected, &addrs(9001, 3));
        assert_eq!(toml.matches("[[models.backends]]").count(), 3);
        for (name, region, port) in [("old-r1", "r1", 9001), ("old-r3", "r3", 9003)] {
            let backend = format!(
                "name = \"{name}\"\nkind = \"openai\"\nregion = \"{region}\"\n\
                 url = \"http://127.0.0.1:{port}/v1\"\n"
            );
            assert!(toml.contains(&backend), "{toml}");
        }
        assert!(!toml.contains("[models.rollout"), "{toml}");
        assert!(
            toml.contains(&format!("{{ env = \"{KEY_ENV}\" }}")),
            "{toml}"
        );
    }

    #[test]
    fn the_protected_rollout_is_staged_in_quarters_of_the_phase() {
        let toml = rollout_section(Mode::Protected, Duration::from_secs(24), &addrs(9101, 3));
        assert!(
            toml.starts_with(
                "\n[models.rollout]\nmode = \"staged\"\nsteps = [10, 50, 100]\n\
                 min_step_duration = \"6000ms\"\nmin_step_requests = 20\n"
            ),
            "{toml}"
        );
        assert_eq!(toml.matches("[[models.rollout.backends]]").count(), 3);
        assert!(toml.contains("name = \"new-r2\"\nkind = \"openai\"\nregion = \"r2\"\nurl = \"http://127.0.0.1:9102/v1\"\n"), "{toml}");
    }

    #[test]
    fn the_naive_rollout_replaces_the_old_version_at_once() {
        let toml = rollout_section(Mode::Naive, Duration::from_secs(24), &addrs(9101, 2));
        let head = "\n[models.rollout]\nmode = \"replace\"\n\n[[models.rollout.backends]]\n";
        assert!(toml.starts_with(head), "{toml}");
        assert!(!toml.contains("steps"), "{toml}");
        assert_eq!(toml.matches("[[models.rollout.backends]]").count(), 2);
    }
}
