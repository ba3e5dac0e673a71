use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgSslMode};
use sqlx::{Connection, Executor, PgConnection};
use tokio::net::TcpListener;

use spillway_testkit::eventually;

use super::*;

/// How long anything asynchronous in these tests may take before it counts as a failure.
const DEADLINE: Duration = Duration::from_secs(5);
const PROTOCOL_3_0: u32 = 196_608;

fn untyped(code: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(8 + payload.len()).expect("test messages are small");
    [&len.to_be_bytes()[..], &code.to_be_bytes(), payload].concat()
}

fn typed(kind: u8, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(4 + payload.len()).expect("test messages are small");
    [&[kind][..], &len.to_be_bytes(), payload].concat()
}

fn startup() -> Vec<u8> {
    untyped(PROTOCOL_3_0, b"user\0postgres\0database\0test\0\0")
}

/// A session like sqlx's after an SSLRequest the server declined: a simple query whose text
/// holds 'Q' and 'E' bytes, a query prepared then executed, a Sync-only ping, the prepared
/// query executed again, then Terminate. Three statements.
fn session() -> Vec<u8> {
    [
        untyped(SSL_REQUEST, b""),
        startup(),
        typed(b'p', b"secret\0"),
        typed(b'Q', b"SELECT 'QEQ'\0"),
        typed(b'P', b"sqlx_s_1\0SELECT 1\0\0\0"),
        typed(b'D', b"Ssqlx_s_1\0"),
        typed(b'S', b""),
        typed(b'B', b"\0sqlx_s_1\0\0\0\0\0\0\0"),
        typed(b'E', b"\0\0\0\0\0"),
        typed(b'C', b"P\0"),
        typed(b'S', b""),
        typed(b'S', b""),
        typed(b'B', b"\0sqlx_s_1\0\0\0\0\0\0\0"),
        typed(b'E', b"\0\0\0\0\0"),
        typed(b'C', b"P\0"),
        typed(b'H', b""),
        typed(b'S', b""),
        typed(b'X', b""),
    ]
    .concat()
}

#[test]
fn statements_are_counted_whatever_the_read_boundaries() {
    let bytes = session();
    for first in 0..=bytes.len() {
        for second in first..=bytes.len() {
            let mut counter = FrontendCounter::default();
            let counted = counter.feed(&bytes[..first])
                + counter.feed(&bytes[first..second])
                + counter.feed(&bytes[second..]);
            assert_eq!(counted, 3, "reads split at {first} and {second}");
            assert_eq!(counter.phase, Phase::Typed, "split at {first} and {second}");
        }
    }
    let mut counter = FrontendCounter::default();
    let one_byte_at_a_time: u64 = bytes.iter().map(|b| counter.feed(&[*b])).sum();
    assert_eq!(one_byte_at_a_time, 3);
}

#[test]
fn a_statement_counts_once_its_header_is_read() {
    let mut counter = FrontendCounter::default();
    assert_eq!(counter.feed(&startup()), 0);
    let query = typed(b'Q', b"SELECT 1\0");
    assert_eq!(counter.feed(&query[..4]), 0);
    assert_eq!(counter.feed(&query[4..5]), 1);
    assert_eq!(counter.feed(&query[5..]), 0);
}

#[test]
fn tls_after_an_ssl_request_ends_counting_gracefully() {
    let mut counter = FrontendCounter::default();
    assert_eq!(counter.feed(&untyped(SSL_REQUEST, b"")), 0);
    // The server answered 'S': a TLS ClientHello follows, then encrypted records.
    let client_hello = [
        0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
    ];
    assert_eq!(counter.feed(&client_hello), 0);
    assert_eq!(counter.phase, Phase::Uncounted);
    assert_eq!(counter.feed(&typed(b'Q', b"SELECT 1\0")), 0);
}

#[test]
fn gss_request_declined_then_startup_counts() {
    let mut counter = FrontendCounter::default();
    let bytes = [
        untyped(GSSENC_REQUEST, b""),
        untyped(SSL_REQUEST, b""),
        untyped(PROTOCOL_3_0 + 2, b"user\0postgres\0\0"),
        typed(b'Q', b"SELECT 1\0"),
    ]
    .concat();
    assert_eq!(counter.feed(&bytes), 1);
}

#[test]
fn a_cancel_request_ends_counting() {
    let mut counter = FrontendCounter::default();
    let cancel = untyped(CANCEL_REQUEST, &[0, 0, 0x30, 0x39, 1, 2, 3, 4]);
    assert_eq!(counter.feed(&cancel), 0);
    assert_eq!(counter.phase, Phase::Uncounted);
    assert_eq!(counter.feed(&typed(b'Q', b"SELECT 1\0")), 0);
}

#[test]
fn impossible_messages_end_counting_without_panicking() {
    let short = [startup(), vec![b'Q', 0, 0, 0, 3]].concat();
    let absurd = [startup(), vec![b'Q', 0x7f, 0xff, 0xff, 0xff]].concat();
    let unknown_type = [startup(), typed(b'z', b"")].concat();
    let http = b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n".to_vec();
    let long_startup = untyped(PROTOCOL_3_0, &[b'a'; 20_000]);
    let ssl_request_with_payload = untyped(SSL_REQUEST, b"x");
    for garbage in [
        short,
        absurd,
        unknown_type,
        http,
        long_startup,
        ssl_request_with_payload,
    ] {
        let mut counter = FrontendCounter::default();
        assert_eq!(counter.feed(&garbage), 0, "{garbage:?}");
        assert_eq!(counter.phase, Phase::Uncounted, "{garbage:?}");
        assert_eq!(counter.feed(&typed(b'Q', b"SELECT 1\0")), 0);
    }
}

#[test]
fn arbitrary_bytes_never_panic() {
    // A fixed xorshift sequence: the same bytes and read sizes on every run.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..200 {
        let mut counter = FrontendCounter::default();
        let mut bytes = startup();
        // Mostly plausible message types, so that parsing goes on for a while.
        bytes.extend((0..4096).map(|i| match next() % 8 {
            0 if i % 3 == 0 => b'Q',
            1 => 0,
            _ => next().to_le_bytes()[0],
        }));
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let take = (next() % 64 + 1).min(rest.len() as u64) as usize;
            counter.feed(&rest[..take]);
            rest = &rest[take..];
        }
    }
}

#[tokio::test]
async fn bytes_pass_unchanged_both_ways_and_are_counted() {
    let upstream = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let upstream_addr = upstream.local_addr().expect("address");
    let echo = tokio::spawn(async move {
        let (mut socket, _) = upstream.accept().await.expect("accept");
        let (mut read, mut write) = socket.split();
        tokio::io::copy(&mut read, &mut write).await.expect("echo");
    });
    let link = StoreLink::start(upstream_addr).await.expect("start");
    let mut client = TcpStream::connect(link.addr()).await.expect("connect");
    let sent = session();
    for chunk in sent.chunks(7) {
        client.write_all(chunk).await.expect("write");
    }
    let mut echoed = vec![0; sent.len()];
    tokio::time::timeout(DEADLINE, client.read_exact(&mut echoed))
        .await
        .expect("echo in time")
        .expect("read");
    assert_eq!(echoed, sent);
    eventually(DEADLINE, "3 statements", || async {
        link.statements() == 3
    })
    .await;
    assert_eq!(link.connections(), 1);
    client.shutdown().await.expect("half-close");
    tokio::time::timeout(DEADLINE, echo)
        .await
        .expect("upstream sees the half-close")
        .expect("echo task");
}

#[tokio::test]
async fn dropping_the_link_closes_its_connections_and_port() {
    let upstream = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let link = StoreLink::start(upstream.local_addr().expect("address"))
        .await
        .expect("start");
    let addr = link.addr();
    let mut client = TcpStream::connect(addr).await.expect("connect");
    let (mut held, _) = tokio::time::timeout(DEADLINE, upstream.accept())
        .await
        .expect("forwarded in time")
        .expect("accept");
    drop(link);
    let mut byte = [0; 1];
    let read = tokio::time::timeout(DEADLINE, client.read(&mut byte)).await;
    assert!(matches!(read, Ok(Ok(0) | Err(_))), "client: {read:?}");
    let read = tokio::time::timeout(DEADLINE, held.read(&mut byte)).await;
    assert!(matches!(read, Ok(Ok(0) | Err(_))), "upstream: {read:?}");
    let refused = TcpStream::connect(addr)
        .await
        .expect_err("the port is closed");
    assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
}

/// The tests' PostgreSQL (`spillway_testkit::postgres_url`) and its address.
async fn postgres() -> (PgConnectOptions, SocketAddr) {
    let url = spillway_testkit::postgres_url();
    let options = PgConnectOptions::from_str(&url).expect("a PostgreSQL URL");
    let addr = tokio::net::lookup_host((options.get_host(), options.get_port()))
        .await
        .expect("the PostgreSQL host resolves")
        .next()
        .expect("an address");
    (options, addr)
}

#[tokio::test]
async fn postgres_statements_are_counted_and_a_cut_takes_the_database_away() {
    let (options, upstream) = postgres().await;
    let link = StoreLink::start(upstream).await.expect("start");
    let through_link = options
        .host("127.0.0.1")
        .port(link.addr().port())
        .ssl_mode(PgSslMode::Disable);
    let connect = || tokio::time::timeout(DEADLINE, PgConnection::connect_with(&through_link));
    let mut conn = connect().await.expect("in time").expect("connect");
    assert_eq!(link.statements(), 0, "sqlx sends no statement to connect");

    // Parse+Describe+Sync the first time, then Bind+Execute+Close+Sync: one Execute each.
    for _ in 0..5 {
        let one: i32 = sqlx::query_scalar("SELECT 1")
            .fetch_one(&mut conn)
            .await
            .expect("SELECT 1");
        assert_eq!(one, 1);
    }
    eventually(DEADLINE, "5 statements", || async {
        link.statements() == 5
    })
    .await;
    // A Sync-only ping is no statement; a query without arguments is a simple Query.
    conn.ping().await.expect("ping");
    conn.execute("SELECT 1").await.expect("simple query");
    eventually(DEADLINE, "6 statements", || async {
        link.statements() == 6
    })
    .await;

    link.cut().await;
    link.cut().await;
    assert!(!link.is_up());
    let broken = tokio::time::timeout(DEADLINE, conn.execute("SELECT 1")).await;
    assert!(matches!(broken, Ok(Err(_))), "{broken:?}");
    let refused = TcpStream::connect(link.addr())
        .await
        .expect_err("port closed");
    assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
    match connect().await.expect("refused in time") {
        Err(sqlx::Error::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused),
        other => panic!("expected connection refused, got {other:?}"),
    }

    link.restore().await.expect("restore");
    link.restore().await.expect("restore again");
    assert!(link.is_up());
    let mut conn = connect().await.expect("in time").expect("connect again");
    conn.execute("SELECT 1").await.expect("simple query");
    eventually(DEADLINE, "7 statements", || async {
        link.statements() == 7
    })
    .await;
    assert_eq!(link.connections(), 2);
    conn.close().await.expect("close");
}
