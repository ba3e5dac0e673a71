//! Real processes on 127.0.0.1 for black-box tests: `spillway mock-backend` and `spillway serve`.
//!
//! Every process binds port 0 and reports its address on its first stdout line, so tests never
//! race for ports. Processes are killed when their handle drops. Waiting is always polling with
//! a deadline (`spillway_testkit::eventually`), never a fixed sleep.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use spillway_testkit::http::{client, get_json};

pub mod memory;
pub mod raw;

pub const KEY: &str = "sk-test-tenant-a";
pub const OTHER_KEY: &str = "sk-test-tenant-b";

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_spillway")
}

/// A child process killed on drop.
pub struct Proc {
    child: Child,
    pub addr: SocketAddr,
    pub admin: Option<SocketAddr>,
    config: Option<PathBuf>,
}

impl Proc {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!(
            "http://{}{path}",
            self.admin.expect("gateway has an admin listener")
        )
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The config file a gateway was started with.
    pub fn config_path(&self) -> &std::path::Path {
        self.config
            .as_deref()
            .expect("a gateway started from a config file")
    }

    /// Where a gateway keeps its own state (`--data-dir`), beside its config.
    pub fn data_dir(&self) -> PathBuf {
        data_dir_of(self.config_path())
    }

    /// Replaces the gateway's config file with `body` in the frame `gateway` puts it in (the
    /// same listeners, tenants and store), for a reload to read.
    pub fn rewrite_config(&self, body: &str) {
        let path = self.config_path();
        let db = path.with_extension("db");
        std::fs::write(path, gateway_config(body, &db)).unwrap();
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args(["-s", sig, &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }

    /// Waits up to `deadline` for the process to exit and returns its status.
    pub fn wait_exit(&mut self, deadline: Duration) -> Option<std::process::ExitStatus> {
        spillway_testkit::wait_exit(&mut self.child, deadline)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(path) = &self.config {
            let _ = std::fs::remove_file(path);
            let _ = std::fs::remove_dir_all(data_dir_of(path));
            // The gateway's own SQLite store, next to its config.
            for ext in ["db", "db-wal", "db-shm"] {
                let _ = std::fs::remove_file(path.with_extension(ext));
            }
        }
    }
}

/// Starts `spillway ARGS`, waits for the first stdout line containing `http://`, and returns the
/// process with the address(es) read from it.
fn start(args: &[&str], envs: &[(&str, &str)], config: Option<PathBuf>) -> Proc {
    let mut child = Command::new(bin())
        .args(args)
        .envs(envs.iter().copied())
        .env("SPILLWAY_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn spillway");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if !sent && line.contains("http://") {
                let _ = tx.send(line);
                sent = true;
            }
        }
    });
    let line = match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(line) => line,
        Err(_) => {
            let _ = child.kill();
            panic!("spillway {args:?} did not report a listening address");
        }
    };
    let addrs = addrs_in(&line);
    Proc {
        child,
        addr: addrs[0],
        admin: addrs.get(1).copied(),
        config,
    }
}

/// The addresses a process printed in its `http://...` line, in order.
pub fn addrs_in(line: &str) -> Vec<SocketAddr> {
    line.split("http://")
        .skip(1)
        .map(|s| {
            let end = s
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == ':'))
                .unwrap_or(s.len());
            s[..end].parse().unwrap()
        })
        .collect()
}

/// One admin API call with `token`, with `body` as JSON if given.
pub async fn admin_call(
    url: String,
    token: &str,
    method: reqwest::Method,
    body: Option<serde_json::Value>,
) -> reqwest::Response {
    let mut req = client().request(method, url).bearer_auth(token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    req.send().await.unwrap()
}

/// Starts a standalone mock backend with extra flags.
pub fn mock(flags: &[&str]) -> Proc {
    let mut args = vec!["mock-backend", "--listen", "127.0.0.1:0"];
    args.extend_from_slice(flags);
    start(&args, &[], None)
}

/// A standalone mock backend of `models` that answers at once (no first-token delay, no pace
/// between tokens), with `extra` flags.
pub fn fast_mock(models: &[&str], extra: &[&str]) -> Proc {
    let mut flags = vec!["--ttft", "0ms", "--tokens-per-sec", "0"];
    for m in models {
        flags.extend(["--model", m]);
    }
    flags.extend_from_slice(extra);
    mock(&flags)
}

/// Starts a standalone mock backend on a given address (to restart one where it was).
pub fn mock_at(listen: &str, flags: &[&str]) -> Proc {
    let mut args = vec!["mock-backend", "--listen", listen];
    args.extend_from_slice(flags);
    start(&args, &[], None)
}

pub fn mock_with_env(flags: &[&str], envs: &[(&str, &str)]) -> Proc {
    let mut args = vec!["mock-backend", "--listen", "127.0.0.1:0"];
    args.extend_from_slice(flags);
    start(&args, envs, None)
}

static CONFIGS: AtomicUsize = AtomicUsize::new(0);

/// The tenants every test config starts with: tenant-a may use everything, tenant-b none
/// no model at all.
pub fn tenants() -> String {
    format!(
        r#"
[[tenants]]
name = "tenant-a"
keys = [{{ sha256 = "{}" }}]

[[tenants]]
name = "tenant-b"
keys = [{{ env = "TEST_TENANT_B_KEY" }}]
models = []
"#,
        sha256_hex(KEY)
    )
}

pub fn sha256_hex(key: &str) -> String {
    spillway_config::key_digest(key)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Starts `spillway serve` with `body` appended to a server section on port 0.
pub fn gateway(body: &str) -> Proc {
    gateway_with_env(body, &[])
}

pub fn gateway_with_env(body: &str, envs: &[(&str, &str)]) -> Proc {
    gateway_with_args(body, envs, &[])
}

/// `spillway serve` with `body` in the test frame, extra `envs` and extra `args`.
pub fn gateway_with_args(body: &str, envs: &[(&str, &str)], args: &[&str]) -> Proc {
    let path = new_config_path();
    std::fs::write(&path, gateway_config(body, &path.with_extension("db"))).unwrap();
    serve_file(path, envs, args)
}

/// A fresh config file name in the temporary directory (the gateway's store and data directory
/// go beside it).
pub fn new_config_path() -> PathBuf {
    let n = CONFIGS.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("spillway-test-{}-{n}.toml", std::process::id()))
}

/// `spillway serve --config PATH` with the test environment; the file and what the gateway keeps
/// beside it are removed when the process is dropped.
pub fn serve_file(path: PathBuf, envs: &[(&str, &str)], args: &[&str]) -> Proc {
    let mut env = vec![("TEST_TENANT_B_KEY", OTHER_KEY)];
    env.extend_from_slice(envs);
    let config = path.to_str().unwrap().to_owned();
    let data = data_dir_of(&path).to_str().unwrap().to_owned();
    let mut all = vec!["serve", "--config", &config];
    if !args.contains(&"--data-dir") {
        all.extend(["--data-dir", &data]);
    }
    all.extend_from_slice(args);
    start(&all, &env, Some(path))
}

/// The data directory of the gateway whose config is `path`.
pub fn data_dir_of(path: &std::path::Path) -> PathBuf {
    path.with_extension("data")
}

/// A gateway's config: listeners on port 0, `body`, the test tenants, and its own SQLite store
/// at `db` unless `body` names a store.
pub fn gateway_config(body: &str, db: &std::path::Path) -> String {
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n{body}\n{}",
        tenants()
    );
    if body.contains("[store]") {
        toml
    } else {
        format!("{toml}\n[store]\nurl = \"sqlite://{}\"\n", db.display())
    }
}

/// A `[[models]]` block with one openai backend per (name, region, url).
pub fn model(name: &str, backends: &[(&str, &str, String)]) -> String {
    let mut s = format!("[[models]]\nname = \"{name}\"\n");
    for (b, region, url) in backends {
        s += &format!(
            "[[models.backends]]\nname = \"{b}\"\nregion = \"{region}\"\nurl = \"{url}\"\n"
        );
    }
    s
}

/// An answer's `Date` (RFC 9110 §6.6.1), held to be a second of the system clock's at most a
/// few seconds back.
pub fn dated_now(headers: &reqwest::header::HeaderMap) -> std::time::SystemTime {
    let value = headers
        .get("date")
        .expect("a date header")
        .to_str()
        .unwrap();
    let at = httpdate::parse_http_date(value).unwrap_or_else(|e| panic!("{value}: {e}"));
    let behind = std::time::SystemTime::now()
        .duration_since(at)
        .unwrap_or_else(|_| panic!("{value} is ahead of the clock"));
    assert!(
        behind < Duration::from_secs(3),
        "{value} is {behind:?} behind the clock"
    );
    at
}

/// Sends `body` to the gateway's chat completions endpoint as tenant-a.
pub async fn chat(gw: &Proc, body: &serde_json::Value) -> reqwest::Response {
    chat_with_header(gw, body, None).await
}

/// The same, with one extra request header.
pub async fn chat_with_header(
    gw: &Proc,
    body: &serde_json::Value,
    header: Option<(&str, &str)>,
) -> reqwest::Response {
    let mut req = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(body);
    if let Some((name, value)) = header {
        req = req.header(name, value);
    }
    req.send().await.unwrap()
}

/// Sends every body at once to the gateway's chat completions endpoint as tenant-a, and asserts
/// that each was answered 200.
pub async fn all_served_at_once(gw: &Proc, bodies: impl IntoIterator<Item = serde_json::Value>) {
    let c = client();
    let sends = bodies.into_iter().map(|body| {
        c.post(gw.url("/v1/chat/completions"))
            .bearer_auth(KEY)
            .json(&body)
            .send()
    });
    for r in futures_util::future::join_all(sends).await {
        let r = r.unwrap();
        let status = r.status();
        assert_eq!(status, 200, "{}", r.text().await.unwrap());
    }
}

/// Applies `patch` to a mock backend's profile (`PATCH /control`) and checks it was taken.
pub async fn control(m: &Proc, patch: serde_json::Value) {
    let r = client()
        .patch(m.url("/control"))
        .json(&patch)
        .send()
        .await
        .unwrap();
    assert!(
        r.status().is_success(),
        "PATCH /control {patch}: {}",
        r.status()
    );
}

/// The sum of every sample whose line starts with `prefix` (all label sets of a series).
pub fn sample_sum(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The gateway's `/metrics` page.
pub async fn metrics(gw: &Proc) -> String {
    client()
        .get(gw.admin_url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of the first sample whose line starts with `prefix`.
pub fn sample(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Chat completion requests a mock backend received (health checks excluded).
pub async fn chats_received(m: &Proc) -> u64 {
    get_json(&m.url("/stats")).await["by_path"]["/v1/chat/completions"]
        .as_u64()
        .unwrap_or(0)
}

pub fn chat_body(model: &str, stream: bool) -> serde_json::Value {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "Hello there"}],
        "stream": stream,
        "max_tokens": 8,
    })
}

/// A backend URL on a port of 127.0.0.1 where nothing listens.
pub fn closed_port_url() -> String {
    format!("http://127.0.0.1:{}/v1", spillway_testkit::closed_port())
}

/// `spillway ARGS --admin-url URL` against `gw`'s admin listener, with its admin `token` in the
/// environment: exit status, stdout, stderr.
pub fn admin_cli(
    gw: &Proc,
    token: &str,
    args: &[&str],
) -> (std::process::ExitStatus, String, String) {
    let out = Command::new(bin())
        .args(args)
        .args(["--admin-url", &gw.admin_url("")])
        .env("SPILLWAY_ADMIN_TOKEN", token)
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status, text(&out.stdout), text(&out.stderr))
}

/// `spillway ARGS --store URL`: exit status, stdout, stderr.
pub fn cli_at(url: &str, args: &[&str]) -> (std::process::ExitStatus, String, String) {
    let out = Command::new(bin())
        .args(args)
        .args(["--store", url])
        .output()
        .unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A SQLite store of its own for one test, removed on drop.
pub struct TempStore(pub std::path::PathBuf);

impl TempStore {
    pub fn new(tag: &str) -> TempStore {
        let name = format!("spillway-{tag}-{}.db", std::process::id());
        TempStore(std::env::temp_dir().join(name))
    }

    pub fn url(&self) -> String {
        format!("sqlite://{}", self.0.display())
    }
}

impl Drop for TempStore {
    fn drop(&mut self) {
        for ext in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{ext}", self.0.display()));
        }
    }
}

/// Reads one HTTP/1.1 request (head and Content-Length body) and returns its body; `None` at end
/// of stream.
pub fn read_request(reader: &mut BufReader<std::net::TcpStream>) -> Option<Vec<u8>> {
    let mut length = 0usize;
    let mut first = true;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" && !first {
            break;
        }
        first = false;
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(body)
}
