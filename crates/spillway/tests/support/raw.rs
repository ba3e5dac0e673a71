//! Raw HTTP/1 over TCP, for tests of what a client sends byte by byte: one response read by its
//! `content-length`, a connection read until the gateway closes it.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{Proc, KEY};

/// Longest any test waits for the gateway to act on a timeout of about a second.
pub const PATIENCE: Duration = Duration::from_secs(20);

pub async fn connect(gw: &Proc) -> TcpStream {
    TcpStream::connect(gw.addr).await.unwrap()
}

/// A connection that has had one request answered (`GET /livez`) and was kept open for the next.
pub async fn kept_alive(gw: &Proc) -> TcpStream {
    let mut s = connect(gw).await;
    s.write_all(b"GET /livez HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let (status, head, _) = response(&mut s).await;
    assert_eq!(status, 200, "{head}");
    assert!(!head.contains("connection: close"), "{head}");
    s
}

/// Reads until the peer closes the connection (or `PATIENCE` passes: `None`).
pub async fn until_closed(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let read = tokio::time::timeout(PATIENCE, async {
        let mut buf = [0u8; 8192];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    read.ok().map(|_| got)
}

/// One whole response read from `s`: status, head, body (by its Content-Length).
pub async fn response(s: &mut TcpStream) -> (u16, String, String) {
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    let (head, body_start) = loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break (String::from_utf8_lossy(&got[..end]).to_lowercase(), end + 4);
        }
        let n = tokio::time::timeout(PATIENCE, s.read(&mut buf))
            .await
            .expect("a response in time")
            .unwrap();
        assert!(
            n > 0,
            "closed before a response: {:?}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    };
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map_or(0, |v| v.trim().parse().unwrap());
    while got.len() < body_start + length {
        let n = tokio::time::timeout(PATIENCE, s.read(&mut buf))
            .await
            .expect("the body in time")
            .unwrap();
        assert!(n > 0, "closed in the body");
        got.extend_from_slice(&buf[..n]);
    }
    let status = head[9..12].parse().unwrap();
    let body = String::from_utf8_lossy(&got[body_start..body_start + length]).into_owned();
    (status, head, body)
}

pub fn error_code(body: &str) -> String {
    let json: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|_| panic!("a JSON error body: {body:?}"));
    json["error"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Sends a chat completion request with `body` on `s`: its head, then its body.
pub async fn send_chat(s: &mut TcpStream, body: &[u8]) {
    s.write_all(chat_head(body.len(), "").as_bytes())
        .await
        .unwrap();
    s.write_all(body).await.unwrap();
}

pub fn chat_head(content_length: usize, extra: &str) -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\n\
         content-type: application/json\r\ncontent-length: {content_length}\r\n{extra}\r\n"
    )
}
