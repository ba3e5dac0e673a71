//! Clients that are slow, huge, many or malformed, over raw TCP on 127.0.0.1: each holds the
//! gateway's connections and memory only as long and as much as its limits allow, and gets the
//! API's own JSON error when it is refused.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use std::time::Duration;

use spillway_testkit::eventually;
use spillway_testkit::http::client;
use support::raw::*;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A gateway whose client timeouts are a second, with `settings` (`key = value` lines of
/// `[server]`) in place of the defaults they name, and the mock backend behind it.
fn quick_timeouts(settings: &str) -> (Proc, Proc) {
    let m = mock(&["--model", "m"]);
    let mut server = String::new();
    for (key, value) in [
        ("header_read_timeout", "\"1s\""),
        ("idle_timeout", "\"1s\""),
        ("body_read_timeout", "\"1s\""),
        ("max_body_bytes", "65536"),
    ] {
        if !settings.contains(key) {
            server += &format!("{key} = {value}\n");
        }
    }
    let gw = gateway(&format!(
        "{server}{settings}\n{}",
        model("m", &[("b", "r", m.url("/v1"))])
    ));
    (gw, m)
}

#[tokio::test]
async fn a_half_sent_head_is_closed_after_the_header_read_timeout() {
    let (gw, _m) = quick_timeouts("");
    let mut s = connect(&gw).await;
    s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    assert!(until_closed(&mut s).await.is_some(), "still open");
}

#[tokio::test]
async fn a_head_trickled_a_byte_at_a_time_is_closed_after_the_header_read_timeout() {
    let (gw, _m) = quick_timeouts("idle_timeout = \"1h\"");
    let mut s = connect(&gw).await;
    let head = b"GET /livez HTTP/1.1\r\nhost: x\r\nx-padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let mut closed = false;
    // Each byte arrives well within any idle timeout; the head as a whole never does.
    for b in head.iter().cycle().take(300) {
        if s.write_all(&[*b]).await.is_err() {
            closed = true;
            break;
        }
        let mut buf = [0u8; 64];
        match tokio::time::timeout(Duration::from_millis(100), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                closed = true;
                break;
            }
            _ => {}
        }
    }
    assert!(closed, "a head trickled for 30 s was still being read");
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let (gw, _m) = quick_timeouts("");
    let mut s = kept_alive(&gw).await;
    assert!(
        until_closed(&mut s).await.is_some(),
        "idle connection still open"
    );
}

#[tokio::test]
async fn a_stalled_body_gets_408_in_json_and_the_connection_closes() {
    let (gw, _m) = quick_timeouts("");
    let mut s = connect(&gw).await;
    s.write_all(chat_head(1000, "").as_bytes()).await.unwrap();
    s.write_all(br#"{"model":"m","#).await.unwrap();
    let (status, head, body) = response(&mut s).await;
    assert_eq!(status, 408, "{head}\n{body}");
    assert_eq!(error_code(&body), "body_read_timeout");
    assert!(head.contains("connection: close"), "{head}");
    assert!(until_closed(&mut s).await.is_some());
}

#[tokio::test]
async fn a_chunked_body_that_never_ends_gets_408() {
    let (gw, _m) = quick_timeouts("");
    let mut s = connect(&gw).await;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\n\
         transfer-encoding: chunked\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    // A chunk every 50 ms, for at most 20 s: within any per-read timeout, never the end.
    for _ in 0..400 {
        if s.write_all(b"1\r\n \r\n").await.is_err() {
            break;
        }
        let mut buf = [0u8; 4096];
        match tokio::time::timeout(Duration::from_millis(50), s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {
                answer.extend_from_slice(&buf[..n]);
                break;
            }
            Ok(_) => break,
            Err(_) => {}
        }
    }
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text:?}");
}

#[tokio::test]
async fn connections_over_the_cap_get_503_at_once_and_the_admin_probes_still_answer() {
    let (gw, _m) =
        quick_timeouts("max_connections = 8\nheader_read_timeout = \"1h\"\nidle_timeout = \"1h\"");
    // Ready first: the key cache warms from the store after the listeners are up, and until it
    // has, /readyz says 503 whatever the connections do.
    eventually(Duration::from_secs(10), "/readyz answers 200", || async {
        let r = client().get(gw.admin_url("/readyz")).send().await;
        r.is_ok_and(|r| r.status() == 200)
    })
    .await;
    // Eight connections that never finish a head hold every place.
    let mut held = Vec::new();
    for _ in 0..8 {
        let mut s = connect(&gw).await;
        s.write_all(b"GET /livez HTTP/1.1\r\n").await.unwrap();
        held.push(s);
    }
    // The gateway counts them once it has accepted them all.
    eventually(Duration::from_secs(10), "8 connections open", || async {
        let m = metrics(&gw).await;
        sample(&m, "spillway_client_connections ").unwrap_or(0.0) == 8.0
    })
    .await;
    let mut extra = connect(&gw).await;
    extra
        .write_all(b"GET /livez HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let (status, head, body) = response(&mut extra).await;
    assert_eq!(status, 503, "{head}");
    assert!(head.contains("retry-after: 1"), "{head}");
    assert!(head.contains("connection: close"), "{head}");
    assert_eq!(error_code(&body), "too_many_connections");
    for probe in ["/livez", "/readyz"] {
        let r = client().get(gw.admin_url(probe)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{probe} on the admin listener");
    }
    let m = metrics(&gw).await;
    assert_eq!(
        sample(
            &m,
            "spillway_client_connections_closed_total{listener=\"api\",reason=\"over_capacity\"}"
        ),
        Some(1.0),
        "{m}"
    );
    // A place freed is a place taken again.
    drop(held.pop());
    eventually(Duration::from_secs(10), "a freed place serves", || async {
        client()
            .get(gw.url("/livez"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
}

#[tokio::test]
async fn refusals_of_a_bad_head_carry_the_json_error_shape() {
    let (gw, _m) = quick_timeouts("");
    let cases: [(Vec<u8>, u16, &str); 2] = [
        (b"NOT HTTP AT ALL\r\n\r\n".to_vec(), 400, "invalid_request"),
        (
            format!(
                "GET /livez HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
                "a".repeat(100 * 1024)
            )
            .into_bytes(),
            431,
            "request_head_too_large",
        ),
    ];
    for (request, want, code) in cases {
        let mut s = connect(&gw).await;
        let _ = s.write_all(&request).await;
        let (status, head, body) = response(&mut s).await;
        assert_eq!(status, want, "{head}");
        assert!(head.contains("content-type: application/json"), "{head}");
        assert!(head.contains("connection: close"), "{head}");
        assert_eq!(error_code(&body), code);
    }
}

#[tokio::test]
async fn a_declared_length_over_the_cap_gets_413_without_100_continue() {
    let (gw, _m) = quick_timeouts("");
    let mut s = connect(&gw).await;
    s.write_all(chat_head(10 * 1024 * 1024, "expect: 100-continue\r\n").as_bytes())
        .await
        .unwrap();
    let (status, head, body) = response(&mut s).await;
    assert_eq!(
        status, 413,
        "an interim 100 came first, or another answer: {head}"
    );
    assert_eq!(error_code(&body), "body_too_large");
    assert!(head.contains("connection: close"), "{head}");
}

#[tokio::test]
async fn an_answer_before_the_body_was_read_says_connection_close() {
    let (gw, _m) = quick_timeouts("");
    let mut s = connect(&gw).await;
    let head =
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk-nobody\r\n\
                content-type: application/json\r\ncontent-length: 100\r\n\r\n";
    s.write_all(head.as_bytes()).await.unwrap();
    let (status, head, _) = response(&mut s).await;
    assert_eq!(status, 401);
    assert!(head.contains("connection: close"), "{head}");
    // With its body read, a request's answer keeps the connection: the next request on it works.
    let body = serde_json::to_vec(&chat_body("m", false)).unwrap();
    let mut s = connect(&gw).await;
    for _ in 0..2 {
        send_chat(&mut s, &body).await;
        let (status, head, _) = response(&mut s).await;
        assert_eq!(status, 200, "{head}");
        assert!(!head.contains("connection: close"), "{head}");
    }
}

#[tokio::test]
async fn http2_streams_per_connection_are_capped() {
    let (gw, _m) = quick_timeouts("http2_max_concurrent_streams = 4");
    let tcp = connect(&gw).await;
    let (mut h2, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    // One round trip, so the server's settings have been read.
    let req = http::Request::get("/livez").body(()).unwrap();
    let (answer, _) = h2.send_request(req, true).unwrap();
    assert_eq!(answer.await.unwrap().status(), 200);
    h2 = h2.ready().await.unwrap();
    assert_eq!(h2.current_max_send_streams(), 4);
}

/// A gateway with a tenant `limited` (key `limited-key`, `limits` as TOML lines) beside the
/// support tenants, with the client timeouts of an hour: only the caps are at work.
fn with_limited_tenant(server: &str, admission: &str, limits: &str) -> (Proc, Proc) {
    let m = mock(&["--model", "m"]);
    let gw = gateway_with_env(
        &format!(
            "header_read_timeout = \"1h\"\nidle_timeout = \"1h\"\nbody_read_timeout = \"1h\"\n{server}\n\
             [admission]\n{admission}\n{}\n\
             [[tenants]]\nname = \"limited\"\nkeys = [{{ env = \"LIMITED_KEY\" }}]\n{limits}\n",
            model("m", &[("b", "r", m.url("/v1"))])
        ),
        &[("LIMITED_KEY", "limited-key")],
    );
    (gw, m)
}

/// Opens a request of the tenant `limited` declaring `declared` bytes of body and sends only the
/// first few: it holds its place until the connection is dropped.
async fn stalled_request(gw: &Proc, declared: usize) -> TcpStream {
    let mut s = connect(gw).await;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer limited-key\r\n\
         content-type: application/json\r\ncontent-length: {declared}\r\n\r\n{{\"model\":\"m\","
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s
}

#[tokio::test]
async fn one_slow_tenant_cannot_hold_the_body_budget_from_the_others() {
    let (gw, _m) = with_limited_tenant(
        "max_body_bytes = 200000",
        "max_buffered_body_bytes = 1048576\nmax_buffered_body_bytes_per_tenant = 262144",
        "",
    );
    // Twenty slow bodies of 150 KB would hold 3 MB; the tenant's share holds one of them.
    let mut slow = Vec::new();
    for _ in 0..20 {
        slow.push(stalled_request(&gw, 150_000).await);
    }
    let mut refused = 0;
    for s in &mut slow {
        let mut buf = [0u8; 4096];
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(500), s.read(&mut buf)).await
        {
            let text = String::from_utf8_lossy(&buf[..n]);
            assert!(text.starts_with("HTTP/1.1 429"), "{text}");
            assert!(text.contains("body_budget_exceeded"), "{text}");
            refused += 1;
        }
    }
    assert_eq!(
        refused, 19,
        "the tenant's share holds exactly one 150 KB body"
    );
    // Another tenant's large body still fits in the budget.
    let mut body = chat_body("m", false);
    body["messages"][0]["content"] = "x".repeat(150_000).into();
    let r = chat(&gw, &body).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
}

#[tokio::test]
async fn a_request_whose_body_is_still_arriving_counts_against_its_tenants_concurrency() {
    let (gw, _m) = with_limited_tenant("", "", "max_concurrency = 2");
    let _held = [
        stalled_request(&gw, 1000).await,
        stalled_request(&gw, 1000).await,
    ];
    // Both heads are read once the gateway counts them.
    eventually(
        Duration::from_secs(10),
        "two requests in flight",
        || async { sample(&metrics(&gw).await, "spillway_requests_in_flight ") == Some(2.0) },
    )
    .await;
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth("limited-key")
        .json(&chat_body("m", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "concurrency_limit_exceeded");
}

#[tokio::test]
async fn requests_refused_before_any_route_are_counted_and_admin_errors_are_json() {
    let m = mock(&["--model", "m"]);
    let gw = gateway_with_env(
        &model("m", &[("b", "r", m.url("/v1"))]),
        &[("SPILLWAY_ADMIN_TOKEN", "test-admin-token-0123456789")],
    );
    let c = client();
    let r = c
        .get(gw.url("/v1/models"))
        .bearer_auth("sk-nobody")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = c.get(gw.url("/v1/nothing-here")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let m = metrics(&gw).await;
    for status in ["401", "404"] {
        let line = format!("spillway_requests_total{{tenant=\"unknown\",model=\"unknown\",backend=\"none\",status=\"{status}\"}}");
        assert!(sample_sum(&m, &line) >= 1.0, "{line} missing:\n{m}");
    }
    let r = c.delete(gw.admin_url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 405);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "method_not_allowed");
    let r = c
        .post(gw.admin_url("/admin/tenants"))
        .bearer_auth("test-admin-token-0123456789")
        .header("content-type", "application/json")
        .body(vec![b' '; 100 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "body_too_large");
}

#[tokio::test]
async fn an_http2_client_that_stops_answering_pings_is_disconnected() {
    let (gw, _m) = quick_timeouts(
        "idle_timeout = \"1h\"\nbody_read_timeout = \"1h\"\n\
         http2_keepalive_interval = \"1s\"\nhttp2_keepalive_timeout = \"1s\"",
    );
    let tcp = connect(&gw).await;
    let (h2, conn) = h2::client::handshake(tcp).await.unwrap();
    // The client's side of the connection is driven only until a request with an unfinished
    // body is open (so no idle or body timeout applies), then kept open but never read again:
    // nothing answers the gateway's pings.
    let mut conn = Box::pin(conn);
    let open = async {
        let mut h2 = h2.ready().await.unwrap();
        let req = http::Request::post("/v1/chat/completions")
            .header("authorization", format!("Bearer {KEY}"))
            .header("content-length", "1000")
            .body(())
            .unwrap();
        let (answer, mut body) = h2.send_request(req, false).unwrap();
        body.send_data(b"{\"model\":".to_vec().into(), false)
            .unwrap();
        eventually(Duration::from_secs(10), "the request in flight", || async {
            sample(&metrics(&gw).await, "spillway_requests_in_flight ") == Some(1.0)
        })
        .await;
        (h2, answer, body)
    };
    let held = tokio::select! {
        _ = &mut conn => panic!("the connection ended before the request was in flight"),
        held = open => held,
    };
    eventually(PATIENCE, "the silent connection closed", || async {
        sample(&metrics(&gw).await, "spillway_client_connections ") == Some(0.0)
    })
    .await;
    drop((held, conn));
}

/// A backend that knows the model by another name is sent a copy of the body, and the copy is
/// counted in the body budget beside the body: a body that fits alone is refused while its copy
/// does not fit, and one whose copy could never fit is 413, saying why. A model with fallbacks
/// holds room for two copies.
#[tokio::test]
async fn the_copy_a_renamed_backend_is_sent_is_counted_in_the_body_budget() {
    let m = mock(&["--model", "m"]);
    let gw = gateway_with_env(
        &format!(
            "header_read_timeout = \"1h\"\nbody_read_timeout = \"1h\"\nmax_body_bytes = 2000000\n\
             [admission]\nmax_buffered_body_bytes = 2500000\n\
             max_buffered_body_bytes_per_tenant = 2500000\n{}\
             [[models]]\nname = \"alias\"\n[[models.backends]]\nname = \"b\"\nregion = \"r\"\n\
             url = \"{}\"\nupstream_model = \"m\"\n\
             [[models]]\nname = \"falls\"\nfallbacks = [{{ model = \"m\" }}]\n\
             [[models.backends]]\nname = \"b\"\nregion = \"r\"\nurl = \"{}\"\n\
             upstream_model = \"m\"\n\
             [[tenants]]\nname = \"limited\"\nkeys = [{{ env = \"LIMITED_KEY\" }}]\n",
            model("m", &[("b", "r", m.url("/v1"))]),
            m.url("/v1"),
            m.url("/v1")
        ),
        &[("LIMITED_KEY", "limited-key")],
    );
    let body_of = |model: &str, bytes: usize| {
        let mut body = chat_body(model, false);
        body["messages"][0]["content"] = "x".repeat(bytes).into();
        body
    };
    // Alone, each fits: 0.9 MB of body and as much again for its copy, of 2.5 MB.
    for model in ["m", "alias"] {
        let r = chat(&gw, &body_of(model, 900_000)).await;
        assert_eq!(r.status(), 200, "{model}: {}", r.text().await.unwrap());
    }
    let _held = stalled_request(&gw, 900_000).await;
    eventually(Duration::from_secs(10), "a stalled body held", || async {
        sample(&metrics(&gw).await, "spillway_buffered_body_bytes ") == Some(900_000.0)
    })
    .await;
    // Beside another tenant's held 0.9 MB, a body still fits (1.8 MB); a body and its copy (2.7 MB) do not.
    let r = chat(&gw, &body_of("m", 900_000)).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let r = chat(&gw, &body_of("alias", 900_000)).await;
    assert_eq!(r.status(), 503);
    let e: serde_json::Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "gateway_overloaded", "{e}");
    // 1.3 MB and its copy could never fit in 2.5 MB, held body or not.
    let r = chat(&gw, &body_of("m", 1_300_000)).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let r = chat(&gw, &body_of("alias", 1_300_000)).await;
    assert_eq!(r.status(), 413);
    let e: serde_json::Value = r.json().await.unwrap();
    let message = e["error"]["message"].as_str().unwrap();
    assert!(message.contains("are sent a copy of it"), "{message}");
    // A model with fallbacks holds room for two copies (the fallback's body and its backend's
    // copy): 0.9 MB and two copies do not fit in 2.5 MB where one copy did.
    let r = chat(&gw, &body_of("falls", 900_000)).await;
    assert_eq!(r.status(), 413, "{}", r.text().await.unwrap());
    let r = chat(&gw, &body_of("falls", 500_000)).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
}

/// Headers a `Connection` header nominates belong to the client's connection and stay behind
/// (RFC 9110 §7.6.1). A head that nominates thousands of names (60 KiB of them, within what the
/// gateway reads of a head) is refused with 400 at once and reaches no backend.
#[tokio::test]
async fn headers_a_connection_header_nominates_stay_behind_and_thousands_of_names_get_400() {
    let (gw, m) = quick_timeouts("");
    let body = serde_json::to_string(&chat_body("m", false)).unwrap();
    let mut s = connect(&gw).await;
    let extra = "connection: keep-alive, X-Hop-Secret\r\nx-hop-secret: s\r\nx-kept: k\r\n";
    s.write_all(format!("{}{body}", chat_head(body.len(), extra)).as_bytes())
        .await
        .unwrap();
    let (status, head, _) = response(&mut s).await;
    assert_eq!(status, 200, "{head}");
    let stats = spillway_testkit::http::get_json(&m.url("/stats")).await;
    let names = &stats["last_request"]["header_names"];
    let names: Vec<&str> = names
        .as_array()
        .unwrap_or_else(|| panic!("header names: {stats}"))
        .iter()
        .filter_map(|n| n.as_str())
        .collect();
    assert!(names.contains(&"x-kept"), "{names:?}");
    assert!(!names.contains(&"x-hop-secret"), "{names:?}");
    let received = stats["received"].as_u64().unwrap();

    let many = vec!["x-a"; 15_000].join(",");
    let mut s = connect(&gw).await;
    let extra = format!("connection: {many}\r\n");
    s.write_all(format!("{}{body}", chat_head(body.len(), &extra)).as_bytes())
        .await
        .unwrap();
    let (status, head, body) = response(&mut s).await;
    assert_eq!(status, 400, "{head}");
    assert_eq!(error_code(&body), "invalid_request");
    assert!(body.contains("Connection header names more than"), "{body}");
    let stats = spillway_testkit::http::get_json(&m.url("/stats")).await;
    assert_eq!(stats["received"].as_u64().unwrap(), received);
}
