//! HTTP/1.1 as clients speak it, byte by byte over raw TCP on 127.0.0.1: bodies framed by
//! length or in chunks, requests sent without waiting, HTTP/1.0, `100 Continue`, streams,
//! answers relayed in frames of every size; heads that two readers could frame differently
//! (request smuggling) refused; a client that leaves while its request waits upstream gives
//! its place back at once; and the caller's headers reach the backend in their order, over
//! HTTP/1 and HTTP/2.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use std::time::Duration;

use spillway_testkit::eventually;
use support::raw::*;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn gateway_and_mock(flags: &[&str]) -> (Proc, Proc) {
    let m = mock(flags);
    let gw = gateway(&model("m", &[("b", "r", m.url("/v1"))]));
    (gw, m)
}

fn chat_json(stream: bool) -> Vec<u8> {
    serde_json::to_vec(&chat_body("m", stream)).unwrap()
}

/// Waits until the gateway counts `want` requests in flight.
async fn until_in_flight(gw: &Proc, want: f64) {
    eventually(Duration::from_secs(15), "requests in flight", || async {
        let page = metrics(gw).await;
        sample(&page, "spillway_requests_in_flight ").unwrap_or(0.0) == want
    })
    .await
}

/// An answer the gateway gives itself (here a refusal: no key) carries a `Date` on the system
/// clock, which it reads once a second, not at every answer: a later answer carries a later
/// second.
#[tokio::test]
async fn the_gateways_own_answers_are_dated_and_the_date_moves_with_the_clock() {
    let (gw, _m) = gateway_and_mock(&[]);
    let c = spillway_testkit::http::client();
    let refused = || async {
        let r = c
            .post(gw.url("/v1/chat/completions"))
            .json(&chat_body("m", false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401);
        dated_now(r.headers())
    };
    let first = refused().await;
    eventually(Duration::from_secs(5), "a later second's date", || async {
        refused().await > first
    })
    .await;
}

/// `body` in chunks of `size` bytes, with a chunk extension on the first, and the last chunk.
fn chunked(body: &[u8], size: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, piece) in body.chunks(size).enumerate() {
        let ext = if i == 0 { ";note=first" } else { "" };
        out.extend_from_slice(format!("{:X}{ext}\r\n", piece.len()).as_bytes());
        out.extend_from_slice(piece);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

#[tokio::test]
async fn a_chunked_request_body_is_read_whole_and_the_connection_goes_on() {
    let (gw, _m) = gateway_and_mock(&["--model", "m"]);
    let mut s = connect(&gw).await;
    for size in [7, 4096] {
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\n\
             content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(&chunked(&chat_json(false), size))
            .await
            .unwrap();
        let (status, head, body) = response(&mut s).await;
        assert_eq!(status, 200, "{head}\n{body}");
        assert!(!head.contains("connection: close"), "{head}");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(
            json["choices"][0]["message"]["content"].is_string(),
            "{json}"
        );
    }
}

#[tokio::test]
async fn requests_sent_without_waiting_are_answered_in_order() {
    let (gw, _m) = gateway_and_mock(&["--model", "m"]);
    let chat = chat_json(false);
    let mut all = Vec::new();
    for path in [
        "/v1/chat/completions",
        "/livez",
        "/v1/chat/completions",
        "/nowhere",
    ] {
        if path == "/v1/chat/completions" {
            all.extend_from_slice(chat_head(chat.len(), "").as_bytes());
            all.extend_from_slice(&chat);
        } else {
            all.extend_from_slice(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes());
        }
    }
    all.extend_from_slice(b"GET /livez HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    let mut s = connect(&gw).await;
    s.write_all(&all).await.unwrap();
    // The answers come back to back, each framed by its content-length; the last closes.
    let got = String::from_utf8(until_closed(&mut s).await.expect("closed")).unwrap();
    let mut rest = got.as_str();
    let mut answers = Vec::new();
    while let Some((head, after)) = rest.split_once("\r\n\r\n") {
        let head = head.to_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .map_or(0, |v| v.trim().parse().unwrap());
        answers.push((head[9..12].to_string(), after[..length].to_string()));
        rest = &after[length..];
    }
    assert_eq!(rest, "", "{got}");
    let statuses: Vec<&str> = answers.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(statuses, ["200", "200", "200", "404", "200"], "{got}");
    assert!(answers[0].1.contains("\"choices\""), "{got}");
    assert!(answers[2].1.contains("\"choices\""), "{got}");
    assert!(!answers[1].1.contains("\"choices\""), "{got}");
}

#[tokio::test]
async fn http_10_clients_are_answered_and_closed_unless_they_ask_to_keep_alive() {
    let (gw, _m) = gateway_and_mock(&["--model", "m"]);
    let mut s = connect(&gw).await;
    s.write_all(b"GET /livez HTTP/1.0\r\n\r\n").await.unwrap();
    let all = String::from_utf8(until_closed(&mut s).await.expect("closed")).unwrap();
    assert!(all.starts_with("HTTP/1.1 200 "), "{all}");
    assert!(all.to_lowercase().contains("connection: close"), "{all}");

    let mut s = connect(&gw).await;
    for _ in 0..2 {
        s.write_all(b"GET /livez HTTP/1.0\r\nconnection: keep-alive\r\n\r\n")
            .await
            .unwrap();
        let (status, head, _) = response(&mut s).await;
        assert_eq!(status, 200);
        assert!(head.contains("connection: keep-alive"), "{head}");
    }
}

#[tokio::test]
async fn a_head_request_gets_the_head_alone_and_the_connection_goes_on() {
    let (gw, _m) = gateway_and_mock(&["--model", "m"]);
    let mut s = connect(&gw).await;
    s.write_all(b"HEAD /livez HTTP/1.1\r\nhost: x\r\n\r\nGET /livez HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let all = String::from_utf8(until_closed(&mut s).await.expect("closed")).unwrap();
    let (head, rest) = all.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 "), "{all}");
    assert!(!head.to_lowercase().contains("transfer-encoding"), "{all}");
    // What follows the first head is the second answer, whole.
    assert!(rest.starts_with("HTTP/1.1 200 "), "{all}");
    let (_, body) = rest.split_once("\r\n\r\n").unwrap();
    assert!(!body.is_empty(), "{all}");
}

#[tokio::test]
async fn a_client_expecting_100_continue_gets_it_before_it_sends_the_body() {
    let (gw, _m) = gateway_and_mock(&["--model", "m"]);
    let body = chat_json(false);
    let mut s = connect(&gw).await;
    s.write_all(chat_head(body.len(), "expect: 100-continue\r\n").as_bytes())
        .await
        .unwrap();
    let interim = b"HTTP/1.1 100 Continue\r\n\r\n";
    let mut got = vec![0u8; interim.len()];
    tokio::time::timeout(PATIENCE, s.read_exact(&mut got))
        .await
        .expect("100 Continue in time")
        .unwrap();
    assert_eq!(&got, interim);
    s.write_all(&body).await.unwrap();
    let (status, head, _) = response(&mut s).await;
    assert_eq!(status, 200, "{head}");
}

/// A body that came whole with its head is taken with it: no `100 Continue` is owed for it, and
/// a request refused before its body is read (a key the gateway does not know) leaves the
/// connection fit for the next request, which is answered.
#[tokio::test]
async fn a_body_sent_with_its_head_is_read_with_it_and_the_connection_goes_on() {
    let (gw, _m) = gateway_and_mock(&["--model", "m"]);
    let body = chat_json(false);
    let mut s = connect(&gw).await;
    let mut sent = chat_head(body.len(), "expect: 100-continue\r\n").into_bytes();
    sent.extend_from_slice(&body);
    s.write_all(&sent).await.unwrap();
    let (status, head, _) = response(&mut s).await;
    assert_eq!(status, 200, "{head}");
    let unknown = chat_head(body.len(), "").replace(KEY, "sk-unknown-0000");
    let mut sent = unknown.into_bytes();
    sent.extend_from_slice(&body);
    s.write_all(&sent).await.unwrap();
    let (status, head, _) = response(&mut s).await;
    assert_eq!(status, 401, "{head}");
    assert!(!head.contains("connection: close"), "{head}");
    let mut sent = chat_head(body.len(), "").into_bytes();
    sent.extend_from_slice(&body);
    s.write_all(&sent).await.unwrap();
    let (status, head, _) = response(&mut s).await;
    assert_eq!(status, 200, "{head}");
}

#[tokio::test]
async fn a_stream_is_sent_in_chunks_that_end_with_the_last_chunk() {
    let (gw, _m) = gateway_and_mock(&["--model", "m"]);
    let body = chat_json(true);
    let mut s = connect(&gw).await;
    let mut head = chat_head(body.len(), "");
    head = head.replace("HTTP/1.1\r\n", "HTTP/1.1\r\nconnection: close\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(&body).await.unwrap();
    let all = String::from_utf8(until_closed(&mut s).await.expect("closed")).unwrap();
    let (head, chunks) = all.split_once("\r\n\r\n").unwrap();
    let head = head.to_lowercase();
    assert!(head.starts_with("http/1.1 200 "), "{head}");
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    assert!(head.contains("text/event-stream"), "{head}");
    assert!(chunks.contains("data: [DONE]"), "{chunks}");
    assert!(chunks.ends_with("\r\n0\r\n\r\n"), "{chunks:?}");
}

/// Each head is framed one way by some readers and another way by others; the bytes after it
/// are a second request that a reader taking the other framing would serve. The gateway
/// answers 400 in JSON and closes, so that second request is never served.
#[tokio::test]
async fn heads_framed_ambiguously_get_400_and_nothing_after_them_is_served() {
    let (gw, _m) = gateway_and_mock(&["--model", "m"]);
    let smuggled = "GET /livez HTTP/1.1\r\nhost: x\r\n\r\n";
    let heads = [
        "transfer-encoding: chunked\r\ncontent-length: 4\r\n",
        "content-length: 4\r\ntransfer-encoding: chunked\r\n",
        "content-length: 4\r\ncontent-length: 40\r\n",
        "transfer-encoding: gzip, chunked\r\n",
        "transfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n",
        "transfer-encoding : chunked\r\n",
        "x-a: 1\r\n transfer-encoding: chunked\r\n",
        "content-length: +4\r\n",
    ];
    for extra in heads {
        let mut s = connect(&gw).await;
        let request = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\n\
             {extra}\r\n0\r\n\r\n{smuggled}"
        );
        s.write_all(request.as_bytes()).await.unwrap();
        let all = String::from_utf8(until_closed(&mut s).await.expect("closed")).unwrap();
        assert!(all.starts_with("HTTP/1.1 400 "), "{extra:?}: {all}");
        assert_eq!(all.matches("HTTP/1.1 ").count(), 1, "{extra:?}: {all}");
        assert!(all.contains("\"invalid_request\""), "{all}");
        assert!(all.to_lowercase().contains("connection: close"), "{all}");
    }
    // HTTP/1.0 with a transfer coding, too.
    let mut s = connect(&gw).await;
    s.write_all(format!("POST /v1/chat/completions HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}").as_bytes())
        .await
        .unwrap();
    let all = String::from_utf8(until_closed(&mut s).await.expect("closed")).unwrap();
    assert!(all.starts_with("HTTP/1.1 400 "), "{all}");
    assert_eq!(all.matches("HTTP/1.1 ").count(), 1, "{all}");
    let m = metrics(&gw).await;
    assert_eq!(
        sample(
            &m,
            "spillway_client_connections_closed_total{listener=\"api\",reason=\"malformed_head\"}"
        ),
        Some(heads.len() as f64 + 1.0),
        "{m}"
    );
}

/// A client that closes its connection while its request waits for a slow backend: the
/// request ends then, its place under the in-flight count given back, not when the backend
/// would have answered.
#[tokio::test]
async fn a_client_that_leaves_while_its_request_waits_gives_its_place_back() {
    let (gw, _m) = gateway_and_mock(&["--model", "m", "--ttft", "120s", "--tokens-per-sec", "0"]);
    let body = chat_json(false);
    // Many at once: each leaving client's request ends, not only a lone one's.
    let mut clients = Vec::new();
    for _ in 0..16 {
        let mut s = connect(&gw).await;
        send_chat(&mut s, &body).await;
        clients.push(s);
    }
    until_in_flight(&gw, 16.0).await;
    drop(clients);
    until_in_flight(&gw, 0.0).await;
}

/// A client that asks for a long stream and never reads it: once the connection's buffers are
/// full and nothing more is taken for `server.idle_timeout`, the gateway drops the request and
/// its place, though the client keeps its connection open.
#[tokio::test]
async fn a_client_that_takes_none_of_its_answer_is_dropped_after_the_idle_timeout() {
    let m = mock(&[
        "--model",
        "m",
        "--ttft",
        "0ms",
        "--tokens-per-sec",
        "0",
        "--max-output-tokens",
        "200000",
    ]);
    let gw = gateway(&format!(
        "idle_timeout = \"1s\"\n{}",
        model("m", &[("b", "r", m.url("/v1"))])
    ));
    let mut body = chat_body("m", true);
    body["max_tokens"] = 200_000.into();
    let body = serde_json::to_vec(&body).unwrap();
    // Several at once, each with a small receive window, so the answer fills it at once.
    let mut clients = Vec::new();
    for _ in 0..8 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut s = socket.connect(gw.addr).await.unwrap();
        send_chat(&mut s, &body).await;
        clients.push(s);
    }
    until_in_flight(&gw, 8.0).await;
    until_in_flight(&gw, 0.0).await;
    drop(clients);
}

/// A client that sends a body over the cap without waiting for an answer: the gateway answers
/// 413 at once and reads away what more comes for a moment before it closes, so the client's
/// write goes through and it reads the answer and a clean close, not a reset connection.
#[tokio::test]
async fn a_body_over_the_cap_sent_whole_is_answered_413_not_reset() {
    let m = mock(&["--model", "m"]);
    let gw = gateway(&format!(
        "max_body_bytes = 65536\n{}",
        model("m", &[("b", "r", m.url("/v1"))])
    ));
    for _ in 0..5 {
        let s = connect(&gw).await;
        let (mut read, mut write) = s.into_split();
        let size = 4 * 1024 * 1024;
        let sending = tokio::spawn(async move {
            write.write_all(chat_head(size, "").as_bytes()).await?;
            write.write_all(&vec![b' '; size]).await
        });
        let mut got = Vec::new();
        let read_all = tokio::time::timeout(PATIENCE, read.read_to_end(&mut got)).await;
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 413 "), "{read_all:?}: {text:?}");
        assert!(text.contains("\"body_too_large\""), "{text}");
        // The connection ended with a close, not a reset, and the body went out whole.
        assert!(matches!(read_all, Ok(Ok(_))), "{read_all:?}");
        let sent = sending.await.unwrap();
        assert!(sent.is_ok(), "the body's write failed: {sent:?}");
    }
}

/// A backend's chunked answer whose pieces are every size around the writer's limits (one
/// byte, the 4 KiB it copies next to the framing, the 16 KiB it gathers, and more than a read)
/// reaches the client byte for byte in well-formed chunks, on a connection that then carries
/// the next request: small frames gathered, larger ones written from where they lie, and each
/// chunk's framing around its own bytes either way.
#[tokio::test]
async fn an_answer_in_frames_of_every_size_arrives_whole_in_well_formed_chunks() {
    let content: String = (0..120_000u32)
        .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
        .collect();
    let answer = format!(
        r#"{{"id":"c","object":"chat.completion","created":0,"model":"m","choices":[{{"index":0,"message":{{"role":"assistant","content":"{content}"}},"finish_reason":"stop"}}]}}"#
    );
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let sent = answer.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let sent = sent.clone();
            std::thread::spawn(move || answer_in_pieces(stream, sent.as_bytes()));
        }
    });
    let gw = gateway(&format!(
        "[health_check]\nenabled = false\n[[models]]\nname = \"m\"\n[[models.backends]]\n\
         name = \"b\"\nregion = \"r\"\nurl = \"{url}\"\nengine = \"none\"\n"
    ));
    let body = chat_json(false);
    let mut s = connect(&gw).await;
    for last in [false, true] {
        let extra = if last { "connection: close\r\n" } else { "" };
        s.write_all(chat_head(body.len(), extra).as_bytes())
            .await
            .unwrap();
        s.write_all(&body).await.unwrap();
        let (head, got) = tokio::time::timeout(PATIENCE, read_chunked(&mut s))
            .await
            .expect("the answer in time");
        assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
        assert!(
            head.to_lowercase().contains("transfer-encoding: chunked"),
            "{head}"
        );
        assert!(got == answer.as_bytes(), "the answer arrived changed");
    }
    assert_eq!(until_closed(&mut s).await, Some(Vec::new()));
}

/// Answers each request on `stream` with `body` in chunks of many sizes, each written on its
/// own: the gateway's decoder makes each chunk (or the part of it one read holds) a frame.
fn answer_in_pieces(stream: std::net::TcpStream, body: &[u8]) {
    use std::io::Write;
    let mut writer = stream.try_clone().unwrap();
    let mut reader = std::io::BufReader::new(stream);
    let sizes = [
        1, 100, 4_096, 4_097, 3_000, 5_000, 9_000, 16_384, 20_000, 7, 40_000,
    ];
    while read_request(&mut reader).is_some() {
        let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                    transfer-encoding: chunked\r\n\r\n";
        if writer.write_all(head.as_bytes()).is_err() {
            return;
        }
        let mut rest = body;
        for size in sizes.iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (piece, after) = rest.split_at((*size).min(rest.len()));
            rest = after;
            let mut chunk = format!("{:x}\r\n", piece.len()).into_bytes();
            chunk.extend_from_slice(piece);
            chunk.extend_from_slice(b"\r\n");
            if writer.write_all(&chunk).is_err() {
                return;
            }
        }
        if writer.write_all(b"0\r\n\r\n").is_err() {
            return;
        }
    }
}

/// One response read from `s`, its body framed in chunks: its head, and the body decoded. Every
/// chunk must be well formed: a hexadecimal size, CRLF, that many bytes, CRLF.
async fn read_chunked(s: &mut tokio::net::TcpStream) -> (String, Vec<u8>) {
    let mut buf = Vec::new();
    let mut at = loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        read_more(s, &mut buf).await;
    };
    let head = String::from_utf8(buf[..at].to_vec()).unwrap();
    let mut body = Vec::new();
    loop {
        let line_end = loop {
            if let Some(end) = buf[at..].windows(2).position(|w| w == b"\r\n") {
                break at + end;
            }
            read_more(s, &mut buf).await;
        };
        let size = std::str::from_utf8(&buf[at..line_end]).unwrap();
        let size = usize::from_str_radix(size, 16).unwrap_or_else(|_| panic!("size {size:?}"));
        at = line_end + 2;
        while buf.len() < at + size + 2 {
            read_more(s, &mut buf).await;
        }
        body.extend_from_slice(&buf[at..at + size]);
        assert_eq!(&buf[at + size..at + size + 2], b"\r\n", "a chunk's end");
        at += size + 2;
        if size == 0 {
            assert_eq!(at, buf.len(), "bytes after the last chunk");
            return (head, body);
        }
    }
}

async fn read_more(s: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) {
    let mut more = [0u8; 8192];
    let n = s.read(&mut more).await.unwrap();
    assert!(n > 0, "the connection closed mid-answer");
    buf.extend_from_slice(&more[..n]);
}

/// The caller's headers reach the backend in the order the caller sent them, each value byte for
/// byte (bytes past ASCII too), a repeated name's values each in its place; the hop-by-hop ones,
/// those `Connection` names and the caller's key stay behind. Over HTTP/1 from the head's own
/// bytes; over HTTP/2 from hyper's header map, which keeps a name's values together.
#[tokio::test]
async fn the_callers_headers_reach_the_backend_in_their_order_and_as_they_were() {
    let (gw, seen) = gateway_noting_heads();
    let sent: [(&str, &[u8]); 6] = [
        ("x-order", b"1"),
        ("accept", b"application/json"),
        ("x-order", b"2"),
        ("x-bytes", b"caf\xc3\xa9 \xff\tend"),
        ("x-hop", b"stays"),
        ("x-order", b"3"),
    ];
    let expected: Vec<Vec<u8>> = sent
        .iter()
        .filter(|(name, _)| *name != "x-hop")
        .map(|(name, value)| [name.as_bytes(), b": ", value].concat())
        .collect();
    let ours = |head: Vec<u8>| -> Vec<Vec<u8>> {
        head.split(|&b| b == b'\n')
            .map(|line| line.strip_suffix(b"\r").unwrap_or(line).to_vec())
            .filter(|line| {
                sent.iter()
                    .any(|(name, _)| line.starts_with(name.as_bytes()))
            })
            .collect()
    };
    let body = chat_json(false);

    let mut s = connect(&gw).await;
    let mut head = chat_head(body.len(), "connection: keep-alive, X-Hop\r\n").into_bytes();
    head.truncate(head.len() - 2);
    for (name, value) in sent {
        head.extend_from_slice(&[name.as_bytes(), b": ", value, b"\r\n"].concat());
    }
    head.extend_from_slice(b"\r\n");
    s.write_all(&[head, body.clone()].concat()).await.unwrap();
    let (status, answer, _) = response(&mut s).await;
    assert_eq!(status, 200, "{answer}");
    let got = seen.recv_timeout(PATIENCE).expect("the backend's request");
    assert_eq!(
        ours(got.clone()),
        expected,
        "{}",
        String::from_utf8_lossy(&got)
    );
    let lower = String::from_utf8_lossy(&got).to_lowercase();
    assert!(!lower.contains(KEY), "the caller's key crossed: {lower}");

    let (mut h2, conn) = h2::client::handshake(connect(&gw).await).await.unwrap();
    tokio::spawn(conn);
    let mut req = http::Request::post("http://x/v1/chat/completions")
        .header("authorization", format!("Bearer {KEY}"))
        .header("content-type", "application/json");
    for (name, value) in sent {
        req = req.header(name, http::HeaderValue::from_bytes(value).unwrap());
    }
    let (answer, mut stream) = h2.send_request(req.body(()).unwrap(), false).unwrap();
    stream.send_data(body.into(), true).unwrap();
    let answer = tokio::time::timeout(PATIENCE, answer)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer.status(), 200);
    let got = seen.recv_timeout(PATIENCE).expect("the backend's request");
    // HTTP/2 has no `Connection` header: `x-hop` is the caller's own there, and crosses. hyper's
    // map keeps a name's values together, in their order, where the name first came.
    let grouped: Vec<Vec<u8>> = ["x-order", "accept", "x-bytes", "x-hop"]
        .iter()
        .flat_map(|n| sent.iter().filter(move |(name, _)| name == n))
        .map(|(name, value)| [name.as_bytes(), b": ", value].concat())
        .collect();
    assert_eq!(
        ours(got.clone()),
        grouped,
        "{}",
        String::from_utf8_lossy(&got)
    );
}

/// The most header lines a head may have, sixteen of them nominated by its `Connection` header
/// (the most it may nominate), every other a repeat of one of a few names: the gateway's passes
/// over the lines, each compared with every nominated name, are at their longest. The request is
/// answered, and the lines that cross reach the backend in their order.
#[tokio::test]
async fn a_head_of_the_most_lines_with_the_most_nominated_crosses_in_order() {
    let (gw, seen) = gateway_noting_heads();
    let body = chat_json(false);
    let nominated: Vec<String> = (0..16).map(|i| format!("x-hop-{i}")).collect();
    let mut lines = vec![format!("connection: {}", nominated.join(", "))];
    // The head's own four lines (`chat_head`) and the Connection line count within the 100.
    for i in 0..100 - 5 {
        lines.push(match i % 3 {
            0 => format!("x-hop-{}: h{i}", i % 16),
            1 => format!("x-kept: k{i}"),
            _ => format!("x-other-{}: o{i}", i % 5),
        });
    }
    let extra: String = lines.iter().map(|l| format!("{l}\r\n")).collect();
    let mut s = connect(&gw).await;
    s.write_all(&[chat_head(body.len(), &extra).into_bytes(), body].concat())
        .await
        .unwrap();
    let (status, answer, _) = response(&mut s).await;
    assert_eq!(status, 200, "{answer}");
    let got = seen.recv_timeout(PATIENCE).expect("the backend's request");
    let got = String::from_utf8(got).unwrap();
    let crossed: Vec<&str> = got
        .lines()
        .filter(|l| l.starts_with("x-"))
        .filter(|l| !l.starts_with("x-request-id"))
        .collect();
    let expected: Vec<&str> = lines[1..]
        .iter()
        .map(String::as_str)
        .filter(|l| !l.starts_with("x-hop-"))
        .collect();
    assert_eq!(crossed, expected, "{got}");
}

/// A gateway whose one backend answers every request with a small chat completion and hands
/// the request's head to the receiver.
fn gateway_noting_heads() -> (Proc, std::sync::mpsc::Receiver<Vec<u8>>) {
    let (heads, seen) = std::sync::mpsc::channel::<Vec<u8>>();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let heads = heads.clone();
            std::thread::spawn(move || answer_noting_heads(stream, &heads));
        }
    });
    let gw = gateway(&format!(
        "[health_check]\nenabled = false\n[[models]]\nname = \"m\"\n[[models.backends]]\n\
         name = \"b\"\nregion = \"r\"\nurl = \"{url}\"\nengine = \"none\"\n"
    ));
    (gw, seen)
}

/// Answers each request on `stream` with a small chat completion, handing its head to `heads`.
fn answer_noting_heads(stream: std::net::TcpStream, heads: &std::sync::mpsc::Sender<Vec<u8>>) {
    use std::io::{BufRead, Read, Write};
    let mut writer = stream.try_clone().unwrap();
    let mut reader = std::io::BufReader::new(stream);
    let answer = br#"{"id":"c","object":"chat.completion","created":0,"model":"m","choices":[]}"#;
    loop {
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            match reader.read_until(b'\n', &mut head) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
        let text = String::from_utf8_lossy(&head).to_lowercase();
        let length = text
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(0);
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() || heads.send(head).is_err() {
            return;
        }
        let reply = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            answer.len()
        );
        if writer
            .write_all(&[reply.as_bytes(), answer].concat())
            .is_err()
        {
            return;
        }
    }
}
