//! The shared rate limits against the tests' Redis (`spillway_testkit::redis_url`), and against Redis servers
//! that are down or hang. Every test uses its own tenants and deletes their keys.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use spillway_policy::{Dimension, RateLimit, TenantLimiter};
use spillway_proxy::shared_limits::{key, SharedLimits, Unavailable, ERRORS_BEFORE_PAUSE, PAUSE};
use spillway_testkit::{eventually, redis_authority, redis_url, REDIS_URL_VAR};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const TIMEOUT: Duration = Duration::from_millis(250);
/// What a busy 2-core test machine may add to a bounded call. The variant of each answer
/// (`TimedOut`, `Paused`) says which bound ended it; this only catches a call that hangs.
const SLACK: Duration = Duration::from_secs(2);

/// A tenant of this run only; its keys are deleted when it goes, even when the test fails.
struct Tenant(String);

impl Tenant {
    fn new(name: &str) -> Tenant {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Tenant(format!("test-{}-{n}-{name}", std::process::id()))
    }
}

impl std::ops::Deref for Tenant {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl Drop for Tenant {
    fn drop(&mut self) {
        let keys = [Dimension::Requests, Dimension::Tokens].map(|d| key(&self.0, d));
        if let Ok(mut conn) = redis::Client::open(redis_url()).and_then(|c| c.get_connection()) {
            let _: Result<(), _> = redis::cmd("DEL").arg(&keys).query(&mut conn);
        }
    }
}

fn limit(per_minute: u64, burst: Option<u64>) -> Option<RateLimit> {
    Some(RateLimit::try_new(per_minute, burst).unwrap())
}

async fn shared() -> SharedLimits {
    let limits = SharedLimits::start(&redis_url(), Duration::from_secs(2))
        .await
        .unwrap();
    assert!(
        limits.is_up(),
        "these tests need the Redis of {REDIS_URL_VAR}"
    );
    limits
}

async fn redis() -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(redis_url()).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

#[test]
fn keys_hash_tag_the_tenant_and_escape_anything_unexpected() {
    assert_eq!(
        key("acme-1_a.b", Dimension::Requests),
        "spillway:rl:{acme-1_a.b}:req"
    );
    assert_eq!(key("acme", Dimension::Tokens), "spillway:rl:{acme}:tok");
    assert_eq!(
        key("a}{:%é", Dimension::Requests),
        "spillway:rl:{a%7D%7B%3A%25%C3%A9}:req"
    );
}

#[tokio::test]
async fn admits_exactly_the_burst_then_refuses_until_the_exact_gcra_time() {
    let limits = shared().await;
    let t = Tenant::new("burst");
    // One request a second, twenty at once.
    let requests = limit(60, Some(20));
    let started = Instant::now();
    for k in 1..=20 {
        let d = limits.admit(&t, requests, None, 0).await.unwrap();
        assert!(d.admitted, "request {k}");
        let quota = d.headers.requests.unwrap();
        assert_eq!((quota.limit, quota.remaining), (60, 20 - k));
        assert!(d.headers.tokens.is_none());
    }
    let refused = limits.admit(&t, requests, None, 0).await.unwrap();
    let elapsed = started.elapsed();
    assert!(!refused.admitted);
    let (which, retry_after) = refused.refused.unwrap();
    assert_eq!(which, Dimension::Requests);
    // The bucket drained for (at most) `elapsed` since the first request filled it: the 21st
    // passes one emission interval after the first was admitted.
    let retry_after = retry_after.unwrap();
    assert!(retry_after <= Duration::from_secs(1), "{retry_after:?}");
    assert!(
        retry_after >= Duration::from_secs(1) - elapsed,
        "{retry_after:?} {elapsed:?}"
    );
    let quota = refused.headers.requests.unwrap();
    assert_eq!(quota.remaining, 0);
    assert!(quota.reset <= Duration::from_secs(20) && quota.reset >= Duration::from_secs(19));
    // The key lives one second past the time its bucket needs to refill.
    let ttl: i64 = redis()
        .await
        .pttl(key(&t, Dimension::Requests))
        .await
        .unwrap();
    assert!((19_000..=21_000).contains(&ttl), "{ttl}");
}

async fn hammer(per_minute: u64, burst: Option<u64>, run_for: Duration) {
    let instances = [shared().await, shared().await, shared().await];
    let t = Tenant::new("fleet");
    let requests = limit(per_minute, burst);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for limits in &instances {
        for _ in 0..2 {
            let (limits, t) = (limits.clone(), t.to_string());
            tasks.push(tokio::spawn(async move {
                let (mut admitted, mut refused) = (0u64, 0u64);
                while started.elapsed() < run_for {
                    let d = limits.admit(&t, requests, None, 0).await.unwrap();
                    if d.admitted {
                        admitted += 1;
                    } else {
                        refused += 1;
                    }
                }
                (admitted, refused)
            }));
        }
    }
    let (mut admitted, mut refused) = (0, 0);
    for task in tasks {
        let (a, r) = task.await.unwrap();
        admitted += a;
        refused += r;
    }
    let elapsed = started.elapsed();
    // GCRA from a full bucket: n admissions need n <= burst + rate * (last - first).
    let burst = requests.unwrap().burst();
    let allowed = burst + elapsed.as_micros() as u64 * per_minute / 60_000_000;
    println!(
        "per_minute={per_minute} burst={burst} elapsed={elapsed:?}: admitted {admitted} of \
         {allowed} allowed ({refused} refused)"
    );
    // One more for the rounding of doubles at the boundary.
    assert!(admitted <= allowed + 1, "{admitted} > {allowed}");
    assert!(
        admitted * 100 >= allowed * 95,
        "{admitted} < 95% of {allowed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_admit_one_limit_between_them() {
    hammer(600, None, Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_share_the_refill_rate() {
    hammer(1200, Some(10), Duration::from_secs(3)).await;
}

#[tokio::test]
async fn a_request_takes_from_both_dimensions_or_from_neither() {
    let limits = shared().await;
    let t = Tenant::new("both");
    let (requests, tokens) = (limit(60, Some(100)), limit(1000, None));
    let first = limits.admit(&t, requests, tokens, 600).await.unwrap();
    assert!(first.admitted);
    assert_eq!(first.headers.tokens.unwrap().remaining, 400);

    // Tokens refuse: the request is not taken either.
    let refused = limits.admit(&t, requests, tokens, 600).await.unwrap();
    let (which, retry_after) = refused.refused.unwrap();
    assert_eq!(which, Dimension::Tokens);
    let retry_after = retry_after.unwrap();
    // 200 tokens at 1000 a minute.
    assert!(retry_after <= Duration::from_secs(12) && retry_after > Duration::from_secs(11));
    assert_eq!(refused.headers.requests.unwrap().remaining, 99);
    let fits = limits.admit(&t, requests, tokens, 400).await.unwrap();
    assert!(fits.admitted);
    assert_eq!(fits.headers.requests.unwrap().remaining, 98);

    // Requests refuse: no tokens are taken. A cost above the token burst beats any wait.
    let one = limit(60, Some(1));
    let u = Tenant::new("both");
    assert!(limits.admit(&u, one, tokens, 10).await.unwrap().admitted);
    let refused = limits.admit(&u, one, tokens, 10).await.unwrap();
    assert_eq!(refused.refused.unwrap().0, Dimension::Requests);
    assert_eq!(refused.headers.tokens.unwrap().remaining, 990);
    let too_large = limits.admit(&u, one, tokens, 1001).await.unwrap();
    assert_eq!(too_large.refused, Some((Dimension::Tokens, None)));
}

#[tokio::test]
async fn adjust_refunds_make_room_and_charges_leave_debt() {
    let limits = shared().await;
    let t = Tenant::new("adjust");
    let (requests, tokens) = (limit(60, Some(1)), limit(1000, None));
    assert!(
        limits
            .admit(&t, requests, tokens, 1000)
            .await
            .unwrap()
            .admitted
    );
    let refused = limits.admit(&t, requests, tokens, 500).await.unwrap();
    assert_eq!(refused.refused.unwrap().0, Dimension::Tokens);

    // The backend used 400 of the 1000 reserved, and the request is given back.
    limits
        .adjust(&t, requests, tokens, -600, true)
        .await
        .unwrap();
    let d = limits.admit(&t, requests, tokens, 500).await.unwrap();
    assert!(d.admitted, "{d:?}");

    // 2000 more than reserved: the bucket holds 900 + 2000, so one more token waits until
    // 1901 have drained, 114.06 s at 1000 a minute.
    limits
        .adjust(&t, requests, tokens, 2000, true)
        .await
        .unwrap();
    let d = limits.admit(&t, requests, tokens, 1).await.unwrap();
    let (which, retry_after) = d.refused.unwrap();
    assert_eq!(which, Dimension::Tokens);
    let retry_after = retry_after.unwrap();
    let exact = Duration::from_micros(114_060_000);
    assert!(
        retry_after <= exact && retry_after > exact - SLACK,
        "{retry_after:?}"
    );
}

#[tokio::test]
async fn decisions_and_headers_match_the_local_limiter() {
    let limits = shared().await;
    let t = Tenant::new("local");
    let (requests, tokens) = (limit(60, Some(5)), limit(120, Some(1000)));
    let mut local = TenantLimiter::new(Instant::now(), requests, tokens);
    for est in [300, 0, 500, 300, 200, 0, 1, 1001, 100] {
        let shared = limits.admit(&t, requests, tokens, est).await.unwrap();
        match local.admit(Instant::now(), est) {
            Ok(reservation) => {
                assert!(shared.admitted, "{est}: {shared:?}");
                assert_eq!(shared.headers.requests.unwrap().remaining, {
                    reservation.headers.requests.unwrap().remaining
                });
                assert_eq!(shared.headers.tokens.unwrap().remaining, {
                    reservation.headers.tokens.unwrap().remaining
                });
            }
            Err(refusal) => {
                let (which, retry_after) = shared.refused.unwrap();
                assert_eq!(which, refusal.which, "{est}");
                assert_eq!(retry_after.is_none(), refusal.retry_after.is_none());
                let close = |a: Duration, b: Duration| a.abs_diff(b) < Duration::from_millis(100);
                if let (Some(a), Some(b)) = (retry_after, refusal.retry_after) {
                    assert!(close(a, b), "{a:?} {b:?}");
                }
                let (s, l) = (
                    shared.headers.tokens.unwrap(),
                    refusal.headers.tokens.unwrap(),
                );
                assert_eq!((s.limit, s.remaining), (l.limit, l.remaining));
                assert!(close(s.reset, l.reset), "{s:?} {l:?}");
            }
        }
    }
}

#[tokio::test]
async fn a_redis_that_lost_the_script_gets_it_again_in_the_same_call() {
    let limits = shared().await;
    let t = Tenant::new("noscript");
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut redis().await)
        .await
        .unwrap();
    let d = limits.admit(&t, limit(60, None), None, 0).await.unwrap();
    assert!(d.admitted);
    assert_eq!(limits.errors(), 0);
}

#[tokio::test]
async fn no_limits_need_no_redis() {
    let limits = SharedLimits::start("redis://127.0.0.1:1", TIMEOUT)
        .await
        .unwrap();
    let d = limits.admit("acme", None, None, 10).await.unwrap();
    assert!(d.admitted && d.refused.is_none());
    limits
        .adjust("acme", limit(60, None), None, 0, false)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_bad_url_is_an_error_and_a_closed_port_is_unavailable() {
    assert!(SharedLimits::start("not a url", TIMEOUT).await.is_err());
    let limits = SharedLimits::start("redis://127.0.0.1:1", TIMEOUT)
        .await
        .unwrap();
    let started = Instant::now();
    let answer = limits.admit("acme", limit(60, None), None, 0).await;
    assert!(answer.is_err(), "{answer:?}");
    assert!(started.elapsed() < TIMEOUT + SLACK);
    assert!(!limits.is_up());
    assert!(limits.errors() >= 1);
}

#[tokio::test]
async fn a_redis_that_never_answers_is_unavailable_within_the_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redis://{}", listener.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            open.push(socket);
        }
    });
    let limits = SharedLimits::start(&url, TIMEOUT).await.unwrap();
    let started = Instant::now();
    let answer = limits.admit("acme", limit(60, None), None, 0).await;
    assert!(answer.is_err(), "{answer:?}");
    assert!(started.elapsed() < TIMEOUT + SLACK);
    assert!(!limits.is_up());
    assert!(limits.errors() >= 1);
    held.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_is_down_at_start_is_used_once_it_is_up() {
    // A port that closes every connection until `up`, then forwards to the real Redis.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redis://{}", listener.local_addr().unwrap());
    let up = Arc::new(AtomicBool::new(false));
    let forwarding = up.clone();
    let real = redis_authority();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            if forwarding.load(Ordering::SeqCst) {
                let real = real.clone();
                tokio::spawn(async move {
                    let mut redis = TcpStream::connect(real).await.unwrap();
                    let _ = tokio::io::copy_bidirectional(&mut socket, &mut redis).await;
                });
            }
        }
    });
    let limits = SharedLimits::start(&url, TIMEOUT).await.unwrap();
    assert!(!limits.is_up() && limits.errors() >= 1);
    let t = Tenant::new("late");
    let requests = limit(60, None);
    let answer = limits.admit(&t, requests, None, 0).await;
    assert_eq!(answer, Err(Unavailable::NotConnected));

    up.store(true, Ordering::SeqCst);
    eventually(Duration::from_secs(5), "reconnected", || async {
        limits.is_up()
    })
    .await;
    assert!(limits.admit(&t, requests, None, 0).await.unwrap().admitted);
}

#[tokio::test]
async fn a_redis_that_hangs_is_left_alone_after_errors_in_a_row() {
    let url = hangs_after_handshake().await;
    let limits = SharedLimits::start(&url, TIMEOUT).await.unwrap();
    assert!(limits.is_up());
    // Connected on real time (the handshake is real I/O); from here on the server never
    // answers, so every wait is a timer, and paused time runs each one at once: the timeouts
    // and the pause below are the limits' own clock, not the machine's speed.
    tokio::time::pause();
    let requests = limit(60, None);
    for n in 1..=ERRORS_BEFORE_PAUSE {
        let started = tokio::time::Instant::now();
        let answer = limits.admit("acme", requests, None, 0).await;
        assert_eq!(answer, Err(Unavailable::TimedOut));
        let took = started.elapsed();
        assert!(took >= TIMEOUT && took < TIMEOUT + SLACK, "{took:?}");
        assert!(!limits.is_up());
        assert_eq!(limits.errors(), u64::from(n));
    }
    // Paused: no time spent on Redis at all.
    let started = tokio::time::Instant::now();
    let answer = limits.adjust("acme", requests, None, 0, true).await;
    assert_eq!(answer, Err(Unavailable::Paused));
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(limits.errors(), u64::from(ERRORS_BEFORE_PAUSE));
    // After the pause, one call tries Redis again.
    tokio::time::sleep(PAUSE).await;
    let answer = limits.admit("acme", requests, None, 0).await;
    assert_eq!(answer, Err(Unavailable::TimedOut));
    assert_eq!(limits.errors(), u64::from(ERRORS_BEFORE_PAUSE) + 1);
}

/// A server that completes redis-rs's handshake (`CLIENT SETINFO`) and `SCRIPT LOAD`, then
/// never answers again: a Redis that hangs while connected.
async fn hangs_after_handshake() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redis://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut seen, mut buf, mut hung) = (Vec::new(), [0u8; 4096], false);
                while let Ok(n @ 1..) = socket.read(&mut buf).await {
                    seen.extend_from_slice(&buf[..n]);
                    while let Some((command, used)) = parse_command(&seen) {
                        seen.drain(..used);
                        let verb = command[0].to_ascii_uppercase();
                        hung |= !matches!(&verb[..], b"CLIENT" | b"SCRIPT");
                        if !hung {
                            let reply: &[u8] = if verb == b"SCRIPT" {
                                b"$40\r\n0123456789012345678901234567890123456789\r\n"
                            } else {
                                b"+OK\r\n"
                            };
                            socket.write_all(reply).await.unwrap();
                        }
                    }
                }
            });
        }
    });
    url
}

/// One RESP command (`*<n>` bulk strings) from the front of `buf`, and the bytes it used.
fn parse_command(buf: &[u8]) -> Option<(Vec<Vec<u8>>, usize)> {
    fn line(buf: &[u8], at: usize) -> Option<(usize, usize)> {
        let end = at + buf.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
        let n = std::str::from_utf8(buf.get(at + 1..end)?)
            .ok()?
            .parse()
            .ok()?;
        Some((n, end + 2))
    }
    let (count, mut at) = line(buf, 0)?;
    let mut args = Vec::with_capacity(count);
    for _ in 0..count {
        let (len, start) = line(buf, at)?;
        args.push(buf.get(start..start + len)?.to_vec());
        at = start + len + 2;
    }
    (at <= buf.len()).then_some((args, at))
}

#[tokio::test]
async fn the_largest_limits_neither_overflow_nor_lose_the_wait() {
    let limits = shared().await;
    let t = Tenant::new("large");
    let tokens = limit(1_000_000_000_000, None);
    let started = Instant::now();
    let full = limits
        .admit(&t, None, tokens, 1_000_000_000_000)
        .await
        .unwrap();
    assert!(full.admitted);
    let half = limits
        .admit(&t, None, tokens, 500_000_000_000)
        .await
        .unwrap();
    let elapsed = started.elapsed();
    let retry_after = half.refused.unwrap().1.unwrap();
    let exact = Duration::from_secs(30);
    assert!(
        retry_after <= exact && retry_after >= exact - elapsed,
        "{retry_after:?}"
    );

    // A charge beyond any debt is capped at a day's refill: one more token waits a day, and
    // the bucket is full again after the burst's minute more.
    limits
        .adjust(&t, None, tokens, i64::MAX, false)
        .await
        .unwrap();
    let one = limits.admit(&t, None, tokens, 1).await.unwrap();
    let retry_after = one.refused.unwrap().1.unwrap();
    let day = Duration::from_secs(86_400);
    let minute = Duration::from_secs(60);
    assert!(
        retry_after <= day + Duration::from_micros(1),
        "{retry_after:?}"
    );
    assert!(retry_after > day - SLACK, "{retry_after:?}");
    let reset = one.headers.tokens.unwrap().reset;
    assert!(
        reset <= day + minute && reset > day + minute - SLACK,
        "{reset:?}"
    );
    assert_eq!(one.headers.tokens.unwrap().remaining, 0);
}

#[test]
fn calls_can_run_in_spawned_tasks() {
    fn send<T: Send + 'static>(_: T) {}
    fn calls(limits: SharedLimits) {
        send(async move { limits.admit("acme", None, None, 1).await });
    }
    fn adjusts(limits: SharedLimits) {
        send(async move { limits.adjust("acme", None, None, -1, true).await });
    }
    let _ = (calls, adjusts);
}
