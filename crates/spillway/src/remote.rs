//! Commands that steer a running gateway through its admin API: `reload`, `config show` and
//! `config rollback`. The admin token is read from the environment, never from the command line
//! (where `ps` would show it).

use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use serde_json::Value;

/// How long one admin call may take (a reload checks and builds a whole config).
const TIMEOUT: Duration = Duration::from_secs(60);
/// The longest admin answer read.
const MAX_ANSWER: usize = 1024 * 1024;

#[derive(Args)]
pub struct AdminArgs {
    /// The gateway's admin listener.
    #[arg(
        long,
        env = "SPILLWAY_ADMIN_URL",
        default_value = "http://127.0.0.1:9090"
    )]
    pub(crate) admin_url: String,
    /// The environment variable that holds the admin token.
    #[arg(long, value_name = "VAR", default_value = "SPILLWAY_ADMIN_TOKEN")]
    pub(crate) token_env: String,
}

#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Show the running config, the file as it is now (pending), the last-known-good config
    /// and the last reload.
    Show(AdminArgs),
    /// Put the saved last-known-good config in place (checked and swapped in like a reload).
    Rollback(AdminArgs),
}

#[derive(Subcommand)]
pub enum RolloutCommand {
    /// Every running rollout: its step, the new version's share, its state and counts.
    Status(AdminArgs),
    /// Move MODEL's rollout to its next step now, whatever the step's time and counts.
    Promote(Steered),
    /// Stop MODEL's rollout: its new version takes no traffic from now on.
    Abort(Steered),
    /// Start MODEL's rollout again at its first step (after a halt or an abort).
    Restart(Steered),
}

#[derive(Args)]
pub struct Steered {
    /// The model whose rollout to steer.
    model: String,
    #[command(flatten)]
    admin: AdminArgs,
}

/// `spillway rollout ...`: shows or steers rollouts; prints the admin API's JSON answer.
pub async fn rollout(command: RolloutCommand) -> anyhow::Result<bool> {
    let (admin, method, path) = match command {
        RolloutCommand::Status(admin) => {
            (admin, reqwest::Method::GET, "/admin/rollouts".to_owned())
        }
        RolloutCommand::Promote(s) => steer(s, "promote"),
        RolloutCommand::Abort(s) => steer(s, "abort"),
        RolloutCommand::Restart(s) => steer(s, "restart"),
    };
    let answer = call(&admin, method, &path).await?;
    println!("{}", serde_json::to_string_pretty(&answer)?);
    Ok(true)
}

fn steer(s: Steered, what: &str) -> (AdminArgs, reqwest::Method, String) {
    let model: String = url_path_segment(&s.model);
    (
        s.admin,
        reqwest::Method::POST,
        format!("/admin/rollouts/{model}/{what}"),
    )
}

/// `text` escaped as one segment of a URL's path.
fn url_path_segment(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `spillway reload`: the gateway reloads its config file; prints what changed.
pub async fn reload(admin: AdminArgs) -> anyhow::Result<bool> {
    let answer = call(&admin, reqwest::Method::POST, "/admin/config/reload").await?;
    Ok(print_outcome(&answer))
}

pub async fn config(command: ConfigCommand) -> anyhow::Result<bool> {
    match command {
        ConfigCommand::Show(admin) => {
            let answer = call(&admin, reqwest::Method::GET, "/admin/config").await?;
            println!("{}", serde_json::to_string_pretty(&answer)?);
            Ok(true)
        }
        ConfigCommand::Rollback(admin) => {
            let answer = call(&admin, reqwest::Method::POST, "/admin/config/rollback").await?;
            Ok(print_outcome(&answer))
        }
    }
}

async fn call(admin: &AdminArgs, method: reqwest::Method, path: &str) -> anyhow::Result<Value> {
    let token = std::env::var(&admin.token_env)
        .ok()
        .filter(|t| !t.trim().is_empty())
        .with_context(|| format!("the admin token's variable {} is not set", admin.token_env))?;
    let url = format!("{}{path}", admin.admin_url.trim_end_matches('/'));
    let client = reqwest::Client::builder().timeout(TIMEOUT).build()?;
    let response = client
        .request(method, &url)
        .bearer_auth(token.trim())
        .send()
        .await
        .with_context(|| format!("cannot reach the admin API at {}", admin.admin_url))?;
    let status = response.status();
    let bytes = response.bytes().await?;
    if bytes.len() > MAX_ANSWER {
        bail!("{url}: answer larger than {MAX_ANSWER} bytes");
    }
    let body: Value = serde_json::from_slice(&bytes)
        .with_context(|| format!("{url}: answered {status} without JSON"))?;
    // A rejected reload (422) is an answer to print, not a failed call.
    if !status.is_success() && status != reqwest::StatusCode::UNPROCESSABLE_ENTITY {
        let message = body["error"]["message"].as_str().unwrap_or("no message");
        bail!("{url}: {status}: {message}");
    }
    Ok(body)
}

/// Prints a reload's outcome; whether it was not rejected.
fn print_outcome(answer: &Value) -> bool {
    let strings = |key: &str| -> Vec<&str> {
        answer[key]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default()
    };
    let hash = answer["hash"].as_str().unwrap_or("?");
    match answer["result"].as_str() {
        Some("applied") => {
            println!(
                "applied {hash}: models kept {}, changed {}, added {}, removed {}; backends kept with their state {}, fresh {}",
                strings("models_kept").len(),
                strings("models_changed").len(),
                strings("models_added").len(),
                strings("models_removed").len(),
                strings("backends_kept").len(),
                strings("backends_fresh").len(),
            );
            let restart = strings("restart_required");
            if !restart.is_empty() {
                println!(
                    "needs a restart to take effect (running values kept): {}",
                    restart.join(", ")
                );
            }
            true
        }
        Some("unchanged") => {
            println!("unchanged: {hash} is the running config");
            true
        }
        _ => {
            for p in strings("problems") {
                eprintln!("spillway: {p}");
            }
            eprintln!("spillway: config rejected; the running config keeps serving");
            false
        }
    }
}
