//! A gateway (re)started while its store is down (IL-0136's restart loop): with a key-cache
//! snapshot it starts, serves the keys the snapshot knows, reports the store as down apart from
//! its probes, and connects, migrates and bootstraps when the store returns; without one, or
//! against a store that refuses its configuration, it refuses to start in one line.
//!
//! "Down" is a port on 127.0.0.1 where nothing listens; "back" is a TCP forwarder started on
//! that port to the test PostgreSQL (`spillway_testkit::postgres_url`: the local `test` database
//! unless `SPILLWAY_TEST_POSTGRES_URL` names another; absent, the tests that need it fail).
//! Each test has its own schemas.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use spillway_testkit::http::client;
use spillway_testkit::{closed_port, eventually, postgres_url, wait_exit};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};
use support::*;

const ADMIN_TOKEN: &str = "test-admin-token-0123456789";
const FAST: [&str; 6] = ["--model", "m", "--ttft", "0ms", "--tokens-per-sec", "0"];
/// Long enough for a background reconnect (backoff capped at 30 s) plus one attempt.
const RECONNECT_DEADLINE: Duration = Duration::from_secs(90);

static NAMES: AtomicUsize = AtomicUsize::new(0);

fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let n = NAMES.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}_{}_{nanos}_{n}", std::process::id())
}

/// `url` with its host and port replaced by 127.0.0.1:`port`.
fn via_port(url: &str, port: u16) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let user = authority.rsplit_once('@').map(|(u, _)| format!("{u}@"));
    format!(
        "{scheme}://{}127.0.0.1:{port}{tail}",
        user.unwrap_or_default()
    )
}

/// A schema of its own in the test database, dropped when the test ends.
struct Schema {
    base: String,
    name: String,
}

impl Schema {
    async fn create(base: &str) -> Schema {
        let name = unique("t_outage");
        let mut conn = PgConnection::connect(base).await.expect("test PostgreSQL");
        sqlx::query(&format!("CREATE SCHEMA {name}"))
            .execute(&mut conn)
            .await
            .unwrap();
        conn.close().await.unwrap();
        Schema {
            base: base.to_owned(),
            name,
        }
    }

    /// The store URL of this schema, straight to PostgreSQL.
    fn url(&self) -> String {
        let sep = if self.base.contains('?') { '&' } else { '?' };
        format!("{}{sep}options=-c%20search_path%3D{}", self.base, self.name)
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let (base, name) = (self.base.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok(mut conn) = PgConnection::connect(&base).await {
                    let drop = format!("DROP SCHEMA IF EXISTS {name} CASCADE");
                    let _ = sqlx::query(&drop).execute(&mut conn).await;
                    let _ = conn.close().await;
                }
            });
        })
        .join();
    }
}

/// The test PostgreSQL's address.
async fn postgres_addr(base: &str) -> SocketAddr {
    let options: PgConnectOptions = base.parse().unwrap();
    let found = tokio::net::lookup_host((options.get_host(), options.get_port()))
        .await
        .unwrap()
        .next()
        .unwrap();
    found
}

/// Forwards connections on 127.0.0.1:`port` to `to` until dropped: the store coming back.
struct Forwarder(tokio::task::JoinHandle<()>);

impl Forwarder {
    async fn start(port: u16, to: SocketAddr) -> Forwarder {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("the released port is free again");
        Forwarder(tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        }))
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A `spillway serve` whose stderr (its log) is kept for the test to read; killed on drop.
struct Served {
    child: Child,
    addr: SocketAddr,
    admin: SocketAddr,
    log: Arc<Mutex<String>>,
    config: PathBuf,
}

/// A `spillway serve` that exited before it listened.
#[derive(Debug)]
struct Refused {
    status: ExitStatus,
    stderr: String,
}

impl Served {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.config);
    }
}

/// Writes a config of `body` (plus the test tenants) and starts `spillway serve` on it. `Err`
/// when the process exited without listening.
fn serve(body: &str) -> Result<Served, Refused> {
    let config = std::env::temp_dir().join(format!("{}.toml", unique("spillway-outage")));
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n{body}\n{}",
        tenants()
    );
    std::fs::write(&config, toml).unwrap();
    let mut child = Command::new(bin())
        .args(["serve", "--config", config.to_str().unwrap()])
        .env("TEST_TENANT_B_KEY", OTHER_KEY)
        .env("SPILLWAY_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("SPILLWAY_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn spillway");
    let log = Arc::new(Mutex::new(String::new()));
    let mut stderr = child.stderr.take().unwrap();
    let sink = log.clone();
    let log_reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stderr.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
        if let Some(line) = lines.find(|l| l.contains("http://")) {
            let _ = tx.send(line);
        }
        lines.for_each(drop);
    });
    let Ok(line) = rx.recv_timeout(Duration::from_secs(60)) else {
        // Exited (stdout closed) or hung: either way it did not start.
        let status = wait_exit(&mut child, Duration::from_secs(30))
            .expect("spillway neither listened nor exited");
        let _ = log_reader.join();
        let _ = std::fs::remove_file(&config);
        let stderr = log.lock().unwrap().clone();
        return Err(Refused { status, stderr });
    };
    let addrs = addrs_in(&line);
    Ok(Served {
        child,
        addr: addrs[0],
        admin: addrs[1],
        log,
        config,
    })
}

fn store_section(url: &str) -> String {
    // A short acquire timeout: each attempt on a closed port gives up sooner.
    format!("[store]\nurl = \"{url}\"\nacquire_timeout = \"500ms\"\n")
}

fn cache_section(snapshot: &std::path::Path) -> String {
    format!("[cache]\nsnapshot = \"{}\"\n", snapshot.display())
}

/// A file under the temp directory, removed (with SQLite's companions) when the test ends,
/// passed or failed.
struct Scratch(PathBuf);

impl Scratch {
    fn new(ext: &str) -> Scratch {
        Scratch(std::env::temp_dir().join(format!("{}.{ext}", unique("spillway-outage"))))
    }
}

impl std::ops::Deref for Scratch {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.0.display()));
        }
    }
}

fn snapshot_path() -> Scratch {
    Scratch::new("json")
}

/// Runs a gateway on `store_url` that serves tenant-a's key once and saves its key cache to
/// `snapshot` at SIGTERM: what the gateway restarted during the outage had before.
async fn learn_key_into_snapshot(mock: &Proc, store_url: &str, snapshot: &std::path::Path) {
    let body = format!(
        "{}\n{}\n{}",
        model("m", &[("b", "r", mock.url("/v1"))]),
        cache_section(snapshot),
        store_section(store_url)
    );
    let mut before = gateway(&body);
    assert_eq!(chat_as(before.url(""), KEY).await.status(), 200);
    before.signal("TERM");
    let status = before
        .wait_exit(Duration::from_secs(30))
        .expect("the gateway exits after SIGTERM");
    assert!(status.success(), "{status}");
    assert!(snapshot.exists(), "no snapshot at {}", snapshot.display());
}

async fn chat_as(base: String, key: &str) -> reqwest::Response {
    client()
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(key)
        .json(&chat_body("m", false))
        .send()
        .await
        .unwrap()
}

async fn admin(
    gw: &Served,
    method: reqwest::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> reqwest::Response {
    admin_call(gw.admin_url(path), ADMIN_TOKEN, method, body).await
}

async fn deps_status(gw: &Served) -> (u16, serde_json::Value) {
    let r = client()
        .get(gw.admin_url("/healthz/deps"))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

fn gateway_body(mock: &Proc, snapshot: &std::path::Path, store_url: &str) -> String {
    format!(
        "{}\n{}\n{}",
        model("m", &[("b", "r", mock.url("/v1"))]),
        cache_section(snapshot),
        store_section(store_url)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_restarted_while_postgres_is_down_serves_known_keys_from_its_snapshot() {
    let base = postgres_url();
    let mock = mock(&FAST);
    let schema = Schema::create(&base).await;
    let snapshot = snapshot_path();
    learn_key_into_snapshot(&mock, &schema.url(), &snapshot).await;

    // The same store, but nothing answers where the gateway looks for it now.
    let down = via_port(&schema.url(), closed_port());
    let gw = serve(&gateway_body(&mock, &snapshot, &down))
        .unwrap_or_else(|refused| panic!("did not start without its store: {refused:?}"));
    let c = client();
    assert_eq!(c.get(gw.url("/livez")).send().await.unwrap().status(), 200);
    eventually(
        Duration::from_secs(10),
        "ready from the snapshot",
        || async { matches!(c.get(gw.url("/readyz")).send().await, Ok(r) if r.status() == 200) },
    )
    .await;

    // The key the snapshot knows is served end to end.
    let r = chat_as(gw.url(""), KEY).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    assert_eq!(chats_received(&mock).await, 2);

    // A key it does not know cannot be judged: 503 with Retry-After, not 401.
    let r = chat_as(gw.url(""), "sk-spw-not-in-the-snapshot").await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"), "{:?}", r.headers());
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "store_unavailable", "{v}");

    // The store is reported as down, apart from the probes.
    let (status, deps) = deps_status(&gw).await;
    assert_eq!(status, 503, "{deps}");
    assert_eq!(deps["store"]["status"], "error", "{deps}");
    assert_eq!(c.get(gw.url("/readyz")).send().await.unwrap().status(), 200);

    // The admin API answers at once, in its error shape.
    let r = admin(&gw, reqwest::Method::GET, "/admin/tenants", None).await;
    assert_eq!(r.status(), 503);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "store_unavailable", "{v}");
    let new = serde_json::json!({"name": "team-x"});
    let r = admin(&gw, reqwest::Method::POST, "/admin/tenants", Some(new)).await;
    assert_eq!(r.status(), 503);

    let log = gw.log();
    assert!(
        log.contains("WARN") && log.contains("started without its store"),
        "{log}"
    );
    assert!(log.contains("will keep trying"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_started_while_postgres_is_down_connects_migrates_and_bootstraps_when_it_returns()
{
    let base = postgres_url();
    let mock = mock(&FAST);
    let before = Schema::create(&base).await;
    let snapshot = snapshot_path();
    learn_key_into_snapshot(&mock, &before.url(), &snapshot).await;

    // A fresh, never migrated schema behind a port where nothing listens yet.
    let fresh = Schema::create(&base).await;
    let port = closed_port();
    let gw = serve(&gateway_body(
        &mock,
        &snapshot,
        &via_port(&fresh.url(), port),
    ))
    .unwrap_or_else(|refused| panic!("did not start without its store: {refused:?}"));
    let (status, deps) = deps_status(&gw).await;
    assert_eq!(status, 503, "started with its store: {deps}");
    assert_eq!(chat_as(gw.url(""), KEY).await.status(), 200);

    let _back = Forwarder::start(port, postgres_addr(&base).await).await;
    eventually(RECONNECT_DEADLINE, "the store reported up", || async {
        deps_status(&gw).await.0 == 200
    })
    .await;

    // Migrated and bootstrapped: the config's tenants are in the fresh schema.
    let r = admin(&gw, reqwest::Method::GET, "/admin/tenants", None).await;
    assert_eq!(r.status(), 200);
    let listed = r.text().await.unwrap();
    assert!(
        listed.contains("tenant-a") && listed.contains("tenant-b"),
        "{listed}"
    );
    // tenant-b's key was never in the snapshot: it is now known from the store (its tenant
    // may use no model), no longer "cannot be checked".
    assert_eq!(chat_as(gw.url(""), OTHER_KEY).await.status(), 403);

    // Served from the store as normal: a key created after the recovery is accepted.
    let post = reqwest::Method::POST;
    let team = serde_json::json!({"name": "team-x"});
    let r = admin(&gw, post.clone(), "/admin/tenants", Some(team)).await;
    assert_eq!(r.status(), 201);
    let r = admin(&gw, post, "/admin/tenants/team-x/keys", None).await;
    assert_eq!(r.status(), 201);
    let v: serde_json::Value = r.json().await.unwrap();
    let secret = v["secret"].as_str().unwrap().to_owned();
    let r = chat_as(gw.url(""), &secret).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    assert_eq!(chat_as(gw.url(""), KEY).await.status(), 200);
}

/// The last line of a refused start: `spillway: ...`, alone.
fn one_line_error(refused: &Refused) -> &str {
    assert!(!refused.status.success(), "{refused:?}");
    let errors: Vec<&str> = refused
        .stderr
        .lines()
        .filter(|l| l.starts_with("spillway:"))
        .collect();
    assert_eq!(errors.len(), 1, "{}", refused.stderr);
    assert_eq!(
        refused.stderr.lines().last(),
        Some(errors[0]),
        "{}",
        refused.stderr
    );
    errors[0]
}

#[tokio::test]
async fn a_gateway_with_no_snapshot_to_serve_from_refuses_to_start_while_its_store_is_down() {
    let mock = mock(&FAST);
    let down = format!("postgres://postgres@127.0.0.1:{}/test", closed_port());
    let garbage = snapshot_path();
    std::fs::write(&*garbage, b"{not a snapshot").unwrap();
    let missing = snapshot_path();
    let models = model("m", &[("b", "r", mock.url("/v1"))]);
    for cache in [
        String::new(),
        cache_section(&missing),
        cache_section(&garbage),
    ] {
        let started = serve(&format!("{models}\n{cache}\n{}", store_section(&down)));
        let refused = match started {
            Ok(_) => panic!("started with nothing to serve ({cache:?})"),
            Err(refused) => refused,
        };
        let line = one_line_error(&refused);
        assert!(
            line.contains("store unavailable") && line.contains("cache.snapshot"),
            "{line}"
        );
    }
}

#[tokio::test]
async fn a_store_that_refuses_the_configuration_fails_the_start_even_with_a_snapshot() {
    let base = postgres_url();
    let mock = mock(&FAST);
    let snapshot = snapshot_path();
    let sqlite = Scratch::new("db");
    let sqlite_url = format!("sqlite://{}", sqlite.display());
    learn_key_into_snapshot(&mock, &sqlite_url, &snapshot).await;

    let options: PgConnectOptions = base.parse().unwrap();
    let no_database = format!(
        "postgres://postgres@{}:{}/spillway_no_such_database",
        options.get_host(),
        options.get_port()
    );
    let refused = match serve(&gateway_body(&mock, &snapshot, &no_database)) {
        Ok(_) => panic!("waited out a database that does not exist"),
        Err(refused) => refused,
    };
    let line = one_line_error(&refused);
    assert!(line.contains("does not exist"), "{line}");
}
