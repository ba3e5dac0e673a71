//! The processes of the retry-storm scenario: three mock backends and one gateway.
//!
//! IL-0248's shape in miniature: model `gpt-storm` served by two backends in the home region
//! (`a1`, `a2`, the ones that fail) and one in another region (`b1`, healthy throughout), behind
//! a gateway whose only difference between the two modes is its `[retry]` section. Each mode
//! gets a fresh fleet, so counters and learned state never carry over from one to the other.
//! The gateway's config is written to a scratch directory that is removed with the fleet; its
//! tenant key reaches the gateway only through the environment.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::StatusCode;
use serde::Deserialize;
use serde_json::json;

use crate::error::{one_line, ReplayError};
use crate::http::{uri, HttpClient};
use crate::plan::Mode;
use crate::process::ChildProcess;
use crate::ready::{wait_ready, START_DEADLINE};
use crate::scratch::Scratch;

/// The model every backend serves and the client asks for.
pub(crate) const MODEL: &str = "gpt-storm";
/// The gateway's home region: its backends are tried first.
const HOME_REGION: &str = "region-a";
/// Name, region, and whether the scenario's fault hits it.
const BACKENDS: [(&str, &str, bool); 3] = [
    ("a1", HOME_REGION, true),
    ("a2", HOME_REGION, true),
    ("b1", "region-b", false),
];
/// The mocks' profile: a finite capacity and queue, a small time to first token and few tokens,
/// so a healthy request takes a few tens of milliseconds.
const MOCK_FLAGS: [&str; 12] = [
    "--model",
    MODEL,
    "--capacity",
    "32",
    "--queue",
    "64",
    "--ttft",
    "20ms",
    "--tokens-per-sec",
    "200",
    "--max-output-tokens",
    "4",
];
/// The environment variable the gateway reads the client's key from.
const KEY_ENV: &str = "SPILLWAY_REPLAY_KEY";

/// Deadline for one control or counter request to a mock or the gateway.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(2);

/// One mock backend of the scenario.
pub(crate) struct Backend {
    pub(crate) name: &'static str,
    pub(crate) faulted: bool,
    pub(crate) addr: SocketAddr,
    process: ChildProcess,
}

/// The scenario's running processes.
pub(crate) struct Fleet {
    pub(crate) backends: Vec<Backend>,
    pub(crate) gateway_addr: SocketAddr,
    /// The gateway's admin listener, where its `/metrics` is.
    pub(crate) admin_addr: SocketAddr,
    pub(crate) gateway_pid: u32,
    /// The tenant key the client presents.
    pub(crate) key: String,
    gateway: ChildProcess,
    scratch: Scratch,
}

impl Fleet {
    /// Starts the three mocks, then the gateway configured for `mode`, and waits until the
    /// gateway's `/readyz` answers 200.
    pub(crate) async fn start(mode: Mode, control: &HttpClient) -> Result<Fleet, ReplayError> {
        let mut backends = Vec::with_capacity(BACKENDS.len());
        for (name, _, faulted) in BACKENDS {
            let mut args = vec!["mock-backend", "--listen", "127.0.0.1:0"];
            args.extend_from_slice(&MOCK_FLAGS);
            let what = format!("mock backend {name}");
            let (process, addrs) = ChildProcess::start(&what, &args, &[], START_DEADLINE).await?;
            backends.push(Backend {
                name,
                faulted,
                addr: addrs[0],
                process,
            });
        }
        let scratch = Scratch::create(mode)?;
        let config = scratch.path.join("gateway.toml");
        let addrs: Vec<SocketAddr> = backends.iter().map(|b| b.addr).collect();
        let store = scratch.path.join("spillway.db");
        let toml = format!(
            "{}\n[store]\nurl = \"sqlite://{}\"\n",
            gateway_config(mode, &addrs),
            store.display()
        );
        std::fs::write(&config, toml).map_err(|source| ReplayError::Scratch {
            what: config.display().to_string(),
            source,
        })?;
        let key = client_key();
        let config_arg = config.to_string_lossy();
        let (mut gateway, gateway_addrs) = ChildProcess::start(
            &format!("{mode} gateway"),
            &["serve", "--config", &config_arg],
            &[(KEY_ENV, &key)],
            START_DEADLINE,
        )
        .await?;
        let gateway_addr = gateway_addrs[0];
        wait_ready(&mut gateway, gateway_addr, control).await?;
        Ok(Fleet {
            backends,
            gateway_addr,
            admin_addr: gateway_addrs.get(1).copied().unwrap_or(gateway_addr),
            gateway_pid: gateway.pid(),
            key,
            gateway,
            scratch,
        })
    }

    /// Turns the scenario's fault on or off on every backend it hits: on, every request gets
    /// HTTP 500 at once (IL-0248's capacity failures surfacing as transient server errors).
    /// Switches the fault on or off on the faulted backends (a1, a2), or on every backend.
    pub(crate) async fn set_fault(
        &self,
        control: &HttpClient,
        on: bool,
        everywhere: bool,
    ) -> Result<(), ReplayError> {
        let patch = if on {
            json!({"fault": {"error_rate": 1.0, "error_status": 500}})
        } else {
            json!({"fault": {"error_rate": 0.0}})
        };
        for backend in self.backends.iter().filter(|b| everywhere || b.faulted) {
            let what = || format!("PATCH /control on mock backend {}", backend.name);
            let answer = control
                .patch_json(uri(backend.addr, "/control"), &patch, CONTROL_TIMEOUT)
                .await;
            match answer {
                Ok((StatusCode::OK, _)) => {}
                Ok((status, body)) => {
                    return Err(ReplayError::Control {
                        what: what(),
                        detail: format!("{status}: {}", one_line(&String::from_utf8_lossy(&body))),
                    })
                }
                Err(failure) => {
                    return Err(ReplayError::Control {
                        what: what(),
                        detail: failure.to_string(),
                    })
                }
            }
        }
        Ok(())
    }

    /// Each backend's `received` counter from its `/stats`, in [`BACKENDS`] order.
    pub(crate) async fn received(&self, control: &HttpClient) -> Result<Vec<u64>, ReplayError> {
        #[derive(Deserialize)]
        struct Counters {
            received: u64,
        }
        let mut out = Vec::with_capacity(self.backends.len());
        for backend in &self.backends {
            let what = || format!("GET /stats on mock backend {}", backend.name);
            let counters = match control
                .get(uri(backend.addr, "/stats"), CONTROL_TIMEOUT)
                .await
            {
                Ok((StatusCode::OK, body)) => {
                    serde_json::from_slice::<Counters>(&body).map_err(|e| ReplayError::Control {
                        what: what(),
                        detail: format!("unexpected body: {e}"),
                    })?
                }
                Ok((status, _)) => {
                    return Err(ReplayError::Control {
                        what: what(),
                        detail: status.to_string(),
                    })
                }
                Err(failure) => {
                    return Err(ReplayError::Control {
                        what: what(),
                        detail: failure.to_string(),
                    })
                }
            };
            out.push(counters.received);
        }
        Ok(out)
    }

    /// Kills every process by its PID (gateway first, so it stops sending to the mocks) and
    /// removes the scratch directory.
    pub(crate) async fn stop(self) {
        self.gateway.stop().await;
        for backend in self.backends {
            backend.process.stop().await;
        }
        drop(self.scratch);
    }
}

/// The gateway's config for `mode`, with one `openai` backend per address in [`BACKENDS`]
/// order.
fn gateway_config(mode: Mode, addrs: &[SocketAddr]) -> String {
    let mut toml = format!(
        "# Written by `spillway replay retry-storm` ({mode} mode).\n\
         [server]\n\
         listen = \"127.0.0.1:0\"\n\
         admin_listen = \"127.0.0.1:0\"\n\
         home_region = \"{HOME_REGION}\"\n\
         shutdown_grace = \"1s\"\n\n\
         [[tenants]]\n\
         name = \"replay\"\n\
         keys = [{{ env = \"{KEY_ENV}\" }}]\n\n\
         [[models]]\n\
         name = \"{MODEL}\"\n"
    );
    for ((name, region, _), addr) in BACKENDS.iter().zip(addrs) {
        toml += &format!(
            "\n[[models.backends]]\n\
             name = \"{name}\"\n\
             kind = \"openai\"\n\
             region = \"{region}\"\n\
             url = \"http://{addr}/v1\"\n"
        );
    }
    match mode {
        // The protected mode runs the retry defaults; an absent `[retry]` section means exactly
        // that, and is also understood by a gateway that predates the section.
        Mode::Protected => {}
        // "Retry every 5xx immediately, up to max_attempts, no budget, no backoff, no ejection."
        Mode::Naive => toml += "\n[retry]\nnaive = true\nmax_attempts = 5\n",
    }
    toml
}

/// A key for this run only; it never leaves this machine's loopback.
fn client_key() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("sk-replay-{}-{nanos:08x}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs() -> Vec<SocketAddr> {
        (1..=3)
            .map(|p| SocketAddr::from(([127, 0, 0, 1], 9000 + p)))
            .collect()
    }

    #[test]
    fn protected_config_has_three_openai_backends_and_no_retry_override() {
        let toml = gateway_config(Mode::Protected, &addrs());
        assert_eq!(toml.matches("kind = \"openai\"").count(), 3);
        assert!(
            toml.contains("url = \"http://127.0.0.1:9003/v1\""),
            "{toml}"
        );
        assert!(toml.contains("home_region = \"region-a\""), "{toml}");
        assert!(
            toml.contains(&format!("{{ env = \"{KEY_ENV}\" }}")),
            "{toml}"
        );
        assert!(!toml.contains("[retry]"), "{toml}");
    }

    #[test]
    fn naive_config_retries_every_5xx_five_times() {
        let toml = gateway_config(Mode::Naive, &addrs());
        assert!(
            toml.ends_with("\n[retry]\nnaive = true\nmax_attempts = 5\n"),
            "{toml}"
        );
    }
}
