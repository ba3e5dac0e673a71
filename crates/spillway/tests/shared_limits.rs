//! Tenant limits shared by three gateway processes through Redis, and what happens when that
//! Redis is killed: every instance keeps serving, with its share of the limit.
//!
//! The test starts a Redis server of its own (`redis-server` on a free port, killed by its PID
//! at the end), so killing it mid-run touches nothing else on the machine.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use spillway_testkit::http::client;
use support::*;

/// A `redis-server` of this test's own, killed on drop.
struct OwnRedis {
    child: Child,
    port: u16,
}

impl OwnRedis {
    fn start() -> OwnRedis {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (apt-get install redis-server)");
        spillway_testkit::eventually_blocking(
            Duration::from_secs(10),
            "redis-server to listen",
            || TcpStream::connect(("127.0.0.1", port)).is_ok(),
        );
        OwnRedis { child, port }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn chat_as(gw: &Proc, key: &str) -> u16 {
    client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(&chat_body("m", false))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Sends `n` requests round-robin over `gateways`; returns the 200s per gateway and the time.
async fn round_robin(gateways: &[Proc], n: usize) -> (Vec<u32>, Duration) {
    let started = Instant::now();
    let mut ok = vec![0u32; gateways.len()];
    for i in 0..n {
        let g = i % gateways.len();
        match chat_as(&gateways[g], "shared-key").await {
            200 => ok[g] += 1,
            429 => {}
            other => panic!("gateway {g} answered {other}"),
        }
    }
    (ok, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_hold_one_limit_through_redis_and_their_shares_without_it() {
    let mut redis = OwnRedis::start();
    let mock = mock(&["--model", "m", "--ttft", "0ms", "--tokens-per-sec", "0"]);
    let config = format!(
        "[admission]\nredis = \"redis://127.0.0.1:{}\"\ninstances = 3\n{}\n\
         [[tenants]]\nname = \"shared\"\nkeys = [{{ env = \"SHARED_KEY\" }}]\nrequests_per_min = 60\n",
        redis.port,
        model("m", &[("b", "r", mock.url("/v1"))])
    );
    let gateways: Vec<Proc> = (0..3)
        .map(|_| gateway_with_env(&config, &[("SHARED_KEY", "shared-key")]))
        .collect();

    // With Redis: one bucket of 60 (a minute's burst, refilling at one a second) for all three.
    let (ok, took) = round_robin(&gateways, 150).await;
    let admitted: u32 = ok.iter().sum();
    let allowed = 60.0 + took.as_secs_f64();
    assert!(
        f64::from(admitted) <= allowed * 1.05 && f64::from(admitted) >= 60.0,
        "{admitted} admitted across three instances in {took:?}: {ok:?}"
    );

    // Redis killed: every instance keeps serving, each with a third of the limit.
    redis.kill();
    let (ok, took) = round_robin(&gateways, 150).await;
    assert!(
        ok.iter().all(|&n| n > 0),
        "an instance stopped serving: {ok:?}"
    );
    let admitted: u32 = ok.iter().sum();
    assert!(
        f64::from(admitted) <= 60.0 + took.as_secs_f64() + 3.0,
        "{admitted} admitted by three local shares in {took:?}: {ok:?}"
    );
    for gw in &gateways {
        let m = metrics(gw).await;
        assert!(m.contains("spillway_shared_limits_up 0"), "{m}");
        assert!(
            sample(&m, "spillway_shared_limits_fallbacks_total").is_some_and(|n| n > 0.0),
            "{m}"
        );
    }
}
