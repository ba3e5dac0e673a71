//! `spillway top`: a live view of who drives a running gateway's load, from its admin API
//! (`GET /admin/top`): per tenant what it offered, what was admitted, queued and shed (by
//! reason), its callers' own retries and the upstream attempts it caused; per model the
//! amplification ratio (upstream attempts ÷ requests offered); per backend its state, load and
//! adaptive limit.
//!
//! The gateway keeps cumulative counters; the rates here are the differences between two reads
//! `--interval` apart (`rates.rs`), so any number of viewers see the same rates and the gateway
//! keeps no window for them. `--once` takes its two reads `--interval` apart and prints one
//! frame; `--json` prints that frame as JSON for scripts (the shape of [`rates::View`],
//! documented in docs/top.md).
//!
//! With no flags it reads `http://127.0.0.1:9090`, where the quickstart's admin listener is,
//! with the admin token from `SPILLWAY_ADMIN_TOKEN` if that is set (a gateway without a token
//! answers this route on a loopback admin listener only: `spillway_proxy::top`).

mod frame;
mod rates;
mod screen;

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use spillway_proxy::top::Top;

/// The longest answer read.
const MAX_ANSWER: usize = 8 * 1024 * 1024;
/// How long one read may take.
const TIMEOUT: Duration = Duration::from_secs(5);
/// The shortest interval: a view refreshed faster than this is no easier to read.
const MIN_INTERVAL: Duration = Duration::from_millis(100);

#[derive(Args)]
pub struct TopArgs {
    /// The gateway's admin listener and its token (sent when the variable is set).
    #[command(flatten)]
    admin: crate::remote::AdminArgs,
    /// Time between refreshes, and between the two reads of --once (`2s`, `500ms`, or seconds).
    #[arg(long, default_value = "2s", value_parser = interval)]
    interval: Duration,
    /// Print one frame and exit: rates between two reads --interval apart. Also what happens when
    /// standard output is not a terminal.
    #[arg(long)]
    once: bool,
    /// Print the frame as JSON (implies --once): totals and rates per tenant, model and backend.
    #[arg(long)]
    json: bool,
}

/// `spillway top`.
pub async fn run(args: TopArgs) -> anyhow::Result<()> {
    let reader = Reader::new(&args)?;
    let terminal = std::io::stdout().is_terminal();
    if args.json {
        let view = once(&reader, args.interval).await?;
        println!("{}", serde_json::to_string_pretty(&view)?);
        return Ok(());
    }
    if args.once || !terminal {
        if !args.once {
            eprintln!(
                "spillway top: standard output is not a terminal: printing one frame (as --once)"
            );
        }
        let view = once(&reader, args.interval).await?;
        let width = if terminal {
            screen::size().0
        } else {
            usize::MAX
        };
        for line in frame::render(&view, width, None) {
            println!("{line}");
        }
        return Ok(());
    }
    screen::live(&reader, args.interval).await
}

/// One view: two reads `interval` apart.
async fn once(reader: &Reader, interval: Duration) -> anyhow::Result<rates::View> {
    let before = reader.read().await?;
    tokio::time::sleep(interval).await;
    let now = reader.read().await?;
    Ok(rates::view(&reader.url, Some(&before), &now))
}

/// Reads `GET /admin/top` of one gateway.
struct Reader {
    url: String,
    token_env: String,
    token: Option<String>,
    client: reqwest::Client,
}

impl Reader {
    fn new(args: &TopArgs) -> anyhow::Result<Reader> {
        let token = std::env::var(&args.admin.token_env)
            .ok()
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty());
        Ok(Reader {
            url: args.admin.admin_url.trim_end_matches('/').to_owned(),
            token_env: args.admin.token_env.clone(),
            token,
            client: reqwest::Client::builder().timeout(TIMEOUT).build()?,
        })
    }

    async fn read(&self) -> anyhow::Result<Top> {
        let mut request = self.client.get(format!("{}/admin/top", self.url));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let url = &self.url;
        let response = request.send().await.map_err(|e| {
            let why = if e.is_timeout() {
                "no answer in time".to_owned()
            } else {
                "nothing answers there".to_owned()
            };
            anyhow::anyhow!(
                "cannot reach the gateway's admin listener at {url} ({why}): is `spillway serve` running? (--admin-url, SPILLWAY_ADMIN_URL)"
            )
        })?;
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .with_context(|| format!("{url}/admin/top: the answer broke off"))?;
        if bytes.len() > MAX_ANSWER {
            bail!("{url}/admin/top: answer larger than {MAX_ANSWER} bytes");
        }
        if status.is_success() {
            return serde_json::from_slice(&bytes).with_context(|| {
                format!("{url}/admin/top: an answer spillway top cannot read (a gateway of another version?)")
            });
        }
        let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        let code = body["error"]["code"].as_str().unwrap_or("");
        let var = &self.token_env;
        match (status.as_u16(), code, &self.token) {
            (401, _, None) => bail!(
                "the gateway at {url} needs its admin token: set {var} to it"
            ),
            (401, _, Some(_)) => bail!(
                "the gateway at {url} refused the admin token in {var} (wrong token)"
            ),
            (404, "admin_api_disabled", _) => bail!(
                "the gateway's admin API is off at {url}: start it with {var} set (admin.token_env), and set {var} here too"
            ),
            (404, _, _) => bail!(
                "{url} has no /admin/top: is it a spillway admin listener of this version?"
            ),
            _ => {
                let message = body["error"]["message"].as_str().unwrap_or("no message");
                bail!("{url}/admin/top: {status}: {message}")
            }
        }
    }
}

/// An interval: a number of seconds, or a duration with its unit (`2s`, `500ms`).
fn interval(text: &str) -> Result<Duration, String> {
    let d = match text.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s >= 0.0 => Duration::from_secs_f64(s),
        Ok(_) => return Err("must be a positive number of seconds".to_owned()),
        Err(_) => humantime::parse_duration(text.trim()).map_err(|e| e.to_string())?,
    };
    if d < MIN_INTERVAL {
        return Err(format!("must be at least {}ms", MIN_INTERVAL.as_millis()));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_are_seconds_or_durations_and_not_too_short() {
        assert_eq!(interval("2"), Ok(Duration::from_secs(2)));
        assert_eq!(interval("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(interval("750ms"), Ok(Duration::from_millis(750)));
        assert_eq!(interval("1m"), Ok(Duration::from_secs(60)));
        assert!(interval("10ms").is_err());
        assert!(interval("-1").is_err());
        assert!(interval("soon").is_err());
    }
}
