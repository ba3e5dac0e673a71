//! Prometheus for black-box tests: the `prometheus` and `promtool` binaries (Debian's package,
//! fetched by `.ci/run`), a Prometheus server on 127.0.0.1 killed by its PID on drop, its HTTP
//! API, and the shipped rule and dashboard files read as an operator would load them.
//!
//! The binaries are found from `SPILLWAY_PROMETHEUS` and `SPILLWAY_PROMTOOL`, else on `PATH`.
//! Missing, a test is skipped with a line on stderr, unless `SPILLWAY_REQUIRE_PROMETHEUS=1`
//! (set by `.ci/run`), which makes it fail instead: a gate that silently skips proves nothing.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use spillway_testkit::http::client;

/// The repository's root (two levels above this crate).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn rules_path() -> PathBuf {
    repo_root().join("deploy/prometheus/alerts.yml")
}

pub fn dashboard_path() -> PathBuf {
    repo_root().join("deploy/grafana/spillway.json")
}

/// `name`'s path from environment variable `var`, else the first match on `PATH`; `None` (after
/// saying so) when absent and not required.
pub fn binary(var: &str, name: &str) -> Option<PathBuf> {
    let found = std::env::var_os(var)
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .or_else(|| {
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
                .map(|dir| dir.join(name))
                .find(|p| p.is_file())
        });
    if found.is_none() {
        let why = format!("no `{name}`: set {var} or put it on PATH (.ci/run fetches Debian's prometheus package)");
        if std::env::var("SPILLWAY_REQUIRE_PROMETHEUS").as_deref() == Ok("1") {
            panic!("{why}; SPILLWAY_REQUIRE_PROMETHEUS=1");
        }
        eprintln!("skipped: {why}");
    }
    found
}

pub fn promtool() -> Option<PathBuf> {
    binary("SPILLWAY_PROMTOOL", "promtool")
}

pub fn prometheus_bin() -> Option<PathBuf> {
    binary("SPILLWAY_PROMETHEUS", "prometheus")
}

/// The names of the alerts of a rule file, in order.
pub fn alert_names(rules: &str) -> Vec<String> {
    values_of(rules, "- alert:")
}

/// The trimmed values of every line whose trimmed start is `key`.
pub fn values_of(text: &str, key: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.trim_start().strip_prefix(key))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .collect()
}

/// Every `expr` of a Grafana dashboard, wherever it is nested.
pub fn dashboard_exprs(dashboard: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(dashboard, &mut out);
    out
}

fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, x) in map {
                match x {
                    serde_json::Value::String(s) if k == "expr" => out.push(s.clone()),
                    _ => walk(x, out),
                }
            }
        }
        serde_json::Value::Array(xs) => xs.iter().for_each(|x| walk(x, out)),
        _ => {}
    }
}

/// A Prometheus server, killed by its PID and its directory removed when dropped.
pub struct Prometheus {
    child: Child,
    pub url: String,
    dir: PathBuf,
}

impl Prometheus {
    /// Starts `bin` on a free port of 127.0.0.1 with a fresh TSDB in a directory of its own,
    /// `config` as its configuration file (with `files`, name and content, beside it), and
    /// waits until it is ready.
    pub async fn start(bin: &Path, config: &str, files: &[(&str, String)]) -> Prometheus {
        let dir = std::env::temp_dir().join(format!(
            "spillway-prometheus-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, body) in files {
            std::fs::write(dir.join(name), body).unwrap();
        }
        let config_path = dir.join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn prometheus");
        let p = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            dir,
        };
        let ready = format!("{}/-/ready", p.url);
        spillway_testkit::eventually(Duration::from_secs(30), "prometheus to be ready", || {
            let ready = ready.clone();
            async move {
                matches!(client().get(ready).send().await, Ok(r) if r.status().is_success())
            }
        })
        .await;
        p
    }

    /// The JSON answer of the API at `path` with `query`.
    async fn api(&self, path: &str, query: &[(&str, &str)]) -> serde_json::Value {
        client()
            .get(format!("{}{path}", self.url))
            .query(query)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// The result vector of an instant query.
    pub async fn query(&self, promql: &str) -> Vec<serde_json::Value> {
        let r = self.api("/api/v1/query", &[("query", promql)]).await;
        assert_eq!(r["status"], "success", "query {promql}: {r}");
        r["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// Every alert Prometheus holds (pending and firing).
    pub async fn alerts(&self) -> Vec<serde_json::Value> {
        let r = self.api("/api/v1/alerts", &[]).await;
        r["data"]["alerts"].as_array().cloned().unwrap_or_default()
    }

    /// Every rule of every group, with its `health` and `lastError`.
    pub async fn rules(&self) -> Vec<serde_json::Value> {
        let r = self.api("/api/v1/rules", &[]).await;
        r["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect()
    }

    /// The health of every scrape target, `up` or otherwise with its last error.
    pub async fn targets(&self) -> String {
        client()
            .get(format!("{}/api/v1/targets", self.url))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// What Prometheus logged, for a failure's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A port of 127.0.0.1 that was free a moment ago (Prometheus takes no port 0 it would report).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Names of the alerts in `alerts` whose state is firing.
pub fn firing(alerts: &[serde_json::Value]) -> Vec<String> {
    let mut names: Vec<String> = alerts
        .iter()
        .filter(|a| a["state"] == "firing")
        .filter_map(|a| a["labels"]["alertname"].as_str().map(str::to_owned))
        .collect();
    names.sort();
    names.dedup();
    names
}
