use super::*;
use bytes::Bytes;
use http::{HeaderValue, Request};
use tokio::io::{AsyncReadExt, DuplexStream};

/// A connection whose far end is the returned stream.
fn pair() -> (Conn, DuplexStream) {
    let (near, far) = tokio::io::duplex(64 * 1024);
    (Conn::new(Box::new(near)), far)
}

fn post(body: &'static str) -> Request<Bytes> {
    let mut req = Request::new(Bytes::from_static(body.as_bytes()));
    *req.method_mut() = Method::POST;
    *req.uri_mut() = "/v1/chat/completions?x=1".parse().unwrap();
    let h = req.headers_mut();
    h.insert(header::HOST, HeaderValue::from_static("b:8000"));
    // Framing from the headers is never written: the body's own is.
    h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("999"));
    h.insert(
        header::TRANSFER_ENCODING,
        HeaderValue::from_static("chunked"),
    );
    req
}

/// Sends `req` on a connection whose far end answers `answer` (after reading the request):
/// the head, and what the far end read.
async fn exchange(req: Request<Bytes>, answer: &'static [u8]) -> (Result<Head, Error>, String) {
    let (mut conn, mut far) = pair();
    let sent = tokio::spawn(async move {
        let mut read = vec![0u8; 4096];
        let n = far.read(&mut read).await.unwrap();
        far.write_all(answer).await.unwrap();
        drop(far);
        String::from_utf8(read[..n].to_vec()).unwrap()
    });
    let head = conn.send(&Outgoing::of(&req)).await;
    (head, sent.await.unwrap())
}

#[tokio::test]
async fn a_request_is_written_with_its_bodys_own_length() {
    let (head, written) = exchange(
        post("{\"a\":1}"),
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}",
    )
    .await;
    assert_eq!(
        written,
        "POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: b:8000\r\ncontent-length: 7\r\n\r\n{\"a\":1}"
    );
    let head = head.unwrap();
    assert_eq!(head.response.status(), 200);
    assert_eq!(head.framing, Framing::Length(2));
    assert!(head.reusable);
}

/// The answer's lines are written to the client as they came: a value is taken for exactly the
/// bytes an `http::HeaderValue` may hold, and the head is refused for any other (by httparse,
/// which the reader relies on for it).
#[tokio::test]
async fn an_answers_value_is_refused_for_exactly_the_bytes_a_header_value_may_not_hold() {
    for b in (0..=255u8).filter(|b| !matches!(b, b'\r' | b'\n')) {
        let mut answer = b"HTTP/1.1 200 OK\r\nx-any: a".to_vec();
        answer.extend_from_slice(&[b, b'z']);
        answer.extend_from_slice(b"\r\ncontent-length: 0\r\n\r\n");
        let (head, _) = exchange(post("{}"), answer.leak()).await;
        let valid = HeaderValue::from_bytes(&[b'a', b, b'z']).is_ok();
        match head {
            Ok(head) => {
                assert!(valid, "byte {b} was taken");
                let value = head.response.lines.get(&HeaderName::from_static("x-any"));
                assert_eq!(value, Some(&[b'a', b, b'z'][..]), "byte {b}");
            }
            Err(Error::Head(_)) => assert!(!valid, "byte {b} was refused"),
            Err(e) => panic!("byte {b}: {e}"),
        }
    }
}

/// A backend's hop-by-hop headers, and those its `Connection` names (in any case, over several
/// headers, before or after it), never enter the answer's lines; the rest keep their order
/// and every value.
#[tokio::test]
async fn an_answers_hop_by_hop_headers_stay_behind_as_its_head_is_read() {
    let (head, _) = exchange(
        post("{}"),
        b"HTTP/1.1 200 OK\r\nX-Early: 1\r\nContent-Type: application/json\r\n\
          Connection: keep-alive, X-Early\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\n\
          Trailer: x\r\nUpgrade: h2c\r\nProxy-Connection: keep-alive\r\n\
          connection: x-late\r\nX-Late: 2\r\nx-ratelimit-remaining-tokens: 9\r\n\
          x-ratelimit-remaining-tokens: 8\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    )
    .await;
    let head = head.unwrap();
    assert_eq!(head.framing, Framing::Chunked);
    let left: Vec<_> = head
        .response
        .lines
        .iter()
        .map(|(n, v)| (n.as_str(), std::str::from_utf8(v).unwrap()))
        .collect();
    assert_eq!(
        left,
        [
            ("content-type", "application/json"),
            ("x-ratelimit-remaining-tokens", "9"),
            ("x-ratelimit-remaining-tokens", "8"),
        ]
    );
}

/// An answer of more headers than the list noted while reading keeps in place (16) keeps
/// every one but those that stay behind, in order, each value where it lay.
#[tokio::test]
async fn an_answer_of_many_headers_keeps_every_one_that_crosses() {
    let mut answer = b"HTTP/1.1 200 OK\r\nConnection: x-3\r\n".to_vec();
    for i in 0..40 {
        answer.extend_from_slice(format!("x-{i}: value {i}\r\n").as_bytes());
    }
    answer.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n");
    let (head, _) = exchange(post("{}"), answer.leak()).await;
    let left: Vec<_> = head
        .unwrap()
        .response
        .lines
        .iter()
        .map(|(n, v)| format!("{}: {}", n, std::str::from_utf8(v).unwrap()))
        .collect();
    let crossed: Vec<_> = (0..40)
        .filter(|&i| i != 3)
        .map(|i| format!("x-{i}: value {i}"))
        .collect();
    assert_eq!(left, crossed);
}

/// The framing and reuse each kind of head gets.
#[tokio::test]
async fn each_head_gets_its_framing_and_only_exact_ones_keep_the_connection() {
    for (answer, framing, reusable) in [
        (
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"[..],
            Framing::Chunked,
            true,
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
            Framing::Chunked,
            true,
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n",
            Framing::Chunked,
            false,
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
            Framing::UntilClose,
            false,
        ),
        (b"HTTP/1.1 200 OK\r\n\r\n", Framing::UntilClose, false),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\n",
            Framing::Length(5),
            false,
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\n\r\n",
            Framing::Length(5),
            true,
        ),
        (
            b"HTTP/1.0 200 OK\r\ncontent-length: 5\r\n\r\n",
            Framing::Length(5),
            false,
        ),
        (
            b"HTTP/1.0 200 OK\r\ncontent-length: 5\r\nconnection: keep-alive\r\n\r\n",
            Framing::Length(5),
            true,
        ),
        // A body a 204 must not have may follow it: not read as the next answer.
        (
            b"HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n",
            Framing::Length(0),
            false,
        ),
        (
            b"HTTP/1.1 204 No Content\r\ntransfer-encoding: chunked\r\n\r\n",
            Framing::Length(0),
            false,
        ),
        (b"HTTP/1.1 204 No Content\r\n\r\n", Framing::Length(0), true),
        (
            b"HTTP/1.1 304 Not Modified\r\ncontent-length: 5\r\n\r\n",
            Framing::Length(0),
            true,
        ),
        // Transfer-Encoding in HTTP/1.0 is faulty framing (RFC 9112 6.1).
        (
            b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ntransfer-encoding: chunked\r\n\r\n",
            Framing::Chunked,
            false,
        ),
        (
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 429 Too Many\r\ncontent-length: 0\r\n\r\n",
            Framing::Length(0),
            true,
        ),
    ] {
        let (head, _) = exchange(post("{}"), answer).await;
        let head = head.unwrap_or_else(|e| panic!("{}: {e}", String::from_utf8_lossy(answer)));
        assert_eq!(head.framing, framing, "{}", String::from_utf8_lossy(answer));
        assert_eq!(
            head.reusable,
            reusable,
            "{}",
            String::from_utf8_lossy(answer)
        );
        if framing == Framing::Chunked {
            assert_eq!(head.response.lines.get(&header::CONTENT_LENGTH), None);
        }
    }
}

#[tokio::test]
async fn a_head_that_is_not_one_fails_and_says_why() {
    let many: &'static [u8] = Box::leak(
        format!(
            "HTTP/1.1 200 OK\r\n{}\r\n",
            "x: 1\r\n".repeat(MAX_HEADERS + 1)
        )
        .into_bytes()
        .into_boxed_slice(),
    );
    let large: &'static [u8] = Box::leak(
        format!("HTTP/1.1 200 OK\r\nx: {}\r\n\r\n", "p".repeat(MAX_BUFFER))
            .into_bytes()
            .into_boxed_slice(),
    );
    let nominating: &'static [u8] = Box::leak(
        format!(
            "HTTP/1.1 200 OK\r\nconnection: {}\r\ncontent-length: 0\r\n\r\n",
            ["x-a"; crate::upstream::hop::MAX_NOMINATED + 1].join(",")
        )
        .into_bytes()
        .into_boxed_slice(),
    );
    for (answer, expected) in [
        (&b"SSH-2.0-OpenSSH\r\n\r\n"[..], "not an HTTP/1 response"),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            "invalid content-length",
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999\r\n\r\n",
            "invalid content-length",
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
            "conflicting content-length",
        ),
        (
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\n\r\n",
            "unrequested protocol switch",
        ),
        (many, "too many headers"),
        (nominating, "Connection names too many headers"),
    ] {
        let (head, _) = exchange(post("{}"), answer).await;
        let error = head.err().expect("an error").to_string();
        assert!(error.contains(expected), "{error}");
    }
    let (head, _) = exchange(post("{}"), large).await;
    assert!(matches!(head, Err(Error::HeadTooLarge)));
}

#[tokio::test]
async fn a_close_before_any_byte_is_told_apart_from_one_mid_head() {
    let (head, _) = exchange(post("{}"), b"").await;
    assert!(head.err().unwrap().before_response());
    let (head, _) = exchange(post("{}"), b"HTTP/1.1 200").await;
    assert!(!head.err().unwrap().before_response());
    let (head, _) = exchange(post("{}"), b"HTTP/1.1 100 Continue\r\n\r\n").await;
    assert!(
        !head.err().unwrap().before_response(),
        "an interim answer is an answer"
    );
}

#[tokio::test]
async fn an_idle_connection_is_open_until_closed_or_sent_unasked_bytes() {
    let (mut conn, far) = pair();
    assert!(conn.is_open());
    drop(far);
    assert!(!conn.is_open());
    let (mut conn, mut far) = pair();
    far.write_all(b"HTTP/1.1 200 OK\r\n").await.unwrap();
    assert!(!conn.is_open());
}

/// A backend on `far` that reads a little of a large body, answers 413 and reads no more: the
/// connection `near` hears the answer while it cannot write the rest, and is not kept.
async fn early_answer_is_heard<F>(near: Box<dyn Io>, mut far: F, body: usize)
where
    F: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let mut conn = Conn::new(near);
    let backend = tokio::spawn(async move {
        let mut some = [0u8; 512];
        far.read_exact(&mut some).await.unwrap();
        far.write_all(b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 0\r\n\r\n")
            .await
            .unwrap();
        far // held open, unread
    });
    let mut req = post("");
    *req.body_mut() = Bytes::from(vec![b'x'; body]);
    let req = Outgoing::of(&req);
    let head = tokio::time::timeout(std::time::Duration::from_secs(10), conn.send(&req))
        .await
        .expect("the answer is heard while the body cannot be written")
        .unwrap();
    assert_eq!(head.response.status(), 413);
    assert!(!head.reusable);
    drop(backend.await.unwrap());
}

#[tokio::test]
async fn an_answer_before_the_whole_request_was_read_is_returned_and_the_connection_not_kept() {
    let (near, far) = tokio::io::duplex(1024);
    early_answer_is_heard(Box::new(near), far, 256 * 1024).await;
    // And over TCP, with a body larger than what the two ends' socket buffers on loopback take.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let near = tokio::net::TcpStream::connect(listener.local_addr().unwrap());
    let (near, far) = tokio::join!(near, listener.accept());
    early_answer_is_heard(Box::new(near.unwrap()), far.unwrap().0, 64 << 20).await;
}

/// A connection's exchanges share its one timer, each held to its own deadline: one later than
/// the last moves the timer out (an answer after the first deadline but before its own is read),
/// one earlier moves it in (no answer by it is a timeout, not a wait for the later one).
#[tokio::test(start_paused = true)]
async fn each_exchange_is_held_to_its_own_deadline_on_the_connections_one_timer() {
    use std::time::Duration;
    use tokio::time::Instant;
    let (mut conn, mut far) = pair();
    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
    let backend = tokio::spawn(async move {
        let mut read = vec![0u8; 4096];
        // The first is answered at once, the second 15 s after it came, the third never.
        assert!(far.read(&mut read).await.unwrap() > 0);
        far.write_all(answer).await.unwrap();
        assert!(far.read(&mut read).await.unwrap() > 0);
        tokio::time::sleep(Duration::from_secs(15)).await;
        far.write_all(answer).await.unwrap();
        assert!(far.read(&mut read).await.unwrap() > 0);
        far
    });
    let req = post("{}");
    let req = Outgoing::of(&req);
    let first = Instant::now();
    let head = conn.send_until(&req, first + Duration::from_secs(10)).await;
    assert_eq!(head.unwrap().response.status(), 200);
    let second = Instant::now();
    let head = conn
        .send_until(&req, second + Duration::from_secs(20))
        .await;
    assert_eq!(
        head.expect("answered by its own deadline")
            .response
            .status(),
        200
    );
    assert!(Instant::now() >= first + Duration::from_secs(15));
    let third = Instant::now();
    let head = conn.send_until(&req, third + Duration::from_secs(1)).await;
    assert!(matches!(head, Err(Error::TimedOut)), "{:?}", head.err());
    assert!(Instant::now() < second + Duration::from_secs(20));
    drop(backend.await.unwrap());
}

/// A kept connection is taken by another client connection's task for its next exchange, with
/// the timer the last one registered: an exchange in a new task is woken by its own deadline,
/// whether the timer is left at the last exchange's earlier one or moved in for it.
#[tokio::test(start_paused = true)]
async fn a_kept_connections_timer_wakes_the_task_that_uses_it_now() {
    times_out_in_another_task(10, 20).await;
    times_out_in_another_task(100, 5).await;
}

/// An exchange answered at once with a deadline `first` seconds out, then one in another task,
/// never answered, with a deadline `next` seconds out from the same start.
async fn times_out_in_another_task(first: u64, next: u64) {
    use std::time::Duration;
    use tokio::time::Instant;
    let (mut conn, mut far) = pair();
    let backend = tokio::spawn(async move {
        let mut read = vec![0u8; 4096];
        assert!(far.read(&mut read).await.unwrap() > 0);
        far.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            .await
            .unwrap();
        while far.read(&mut read).await.unwrap() > 0 {}
    });
    let start = Instant::now();
    let req = Outgoing::of(&post("{}"));
    let head = conn
        .send_until(&req, start + Duration::from_secs(first))
        .await;
    assert_eq!(head.unwrap().response.status(), 200);
    let deadline = start + Duration::from_secs(next);
    let exchange = tokio::spawn(async move {
        let head = conn.send_until(&req, deadline).await;
        drop(conn);
        head
    });
    // A task its deadline did not wake would wait out this minute instead.
    let head = tokio::time::timeout(Duration::from_secs(60), exchange)
        .await
        .expect("woken by its own deadline")
        .unwrap();
    assert!(matches!(head, Err(Error::TimedOut)), "{:?}", head.err());
    assert!(Instant::now() >= deadline);
    backend.await.unwrap();
}

#[tokio::test]
async fn a_write_that_fails_after_bytes_went_out_is_not_a_stale_connection() {
    let (near, mut far) = tokio::io::duplex(1024);
    let mut conn = Conn::new(Box::new(near));
    tokio::spawn(async move {
        let mut some = [0u8; 512];
        far.read_exact(&mut some).await.unwrap();
        drop(far);
    });
    let mut req = post("");
    *req.body_mut() = Bytes::from(vec![b'x'; 256 * 1024]);
    let error = conn
        .send(&Outgoing::of(&req))
        .await
        .err()
        .expect("the write fails");
    assert!(!error.before_response(), "{error}");
}

#[tokio::test]
async fn the_read_buffer_stays_within_its_cap_across_an_interim_answer() {
    let interim = format!(
        "HTTP/1.1 103 Early Hints\r\nlink: {}\r\n\r\n",
        "l".repeat(3000)
    );
    let last = format!(
        "HTTP/1.1 200 OK\r\nx: {}\r\ncontent-length: 0\r\n\r\n",
        "p".repeat(12 * 1024)
    );
    let (mut conn, mut far) = pair();
    let sent = tokio::spawn(async move {
        let mut read = vec![0u8; 4096];
        let _ = far.read(&mut read).await.unwrap();
        // 100 bytes, then the interim answer's end and part of the final head, then the rest:
        // a buffer holding data at an offset when it needs room (`reserve` would double it).
        let all = format!("{interim}{last}").into_bytes();
        for piece in [&all[..100], &all[100..9000], &all[9000..]] {
            far.write_all(piece).await.unwrap();
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        }
        far
    });
    let head = conn.send(&Outgoing::of(&post("{}"))).await.unwrap();
    assert_eq!(head.response.status(), 200);
    assert!(
        conn.0.buf.capacity() <= MAX_BUFFER,
        "{}",
        conn.0.buf.capacity()
    );
    drop(sent.await.unwrap());
}

/// A buffer read into while its front is taken a little at a time (frames split off and dropped,
/// so its bytes move back within one allocation) never grows past its cap, where
/// `BytesMut::reserve` would double the allocation.
#[test]
fn a_capped_read_buffer_never_grows_past_its_cap() {
    const MAX: usize = 64 * 1024;
    let mut io = tokio::io::repeat(b'x');
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let mut buf = BytesMut::new();
    for round in 0..500 {
        if buf.len() > MAX - 16 * 1024 {
            drop(buf.split_to(4 * 1024));
        }
        match poll_read_capped(Pin::new(&mut io), &mut cx, &mut buf, MAX) {
            Poll::Ready(Ok(n)) => assert!(n > 0),
            other => panic!("round {round}: {other:?}"),
        }
        assert!(buf.capacity() <= MAX, "round {round}: {}", buf.capacity());
    }
}

/// Small messages read one after another while the ones before are still held (a request's
/// head and body are slices of the buffer they were read into) go into the room the first
/// read's allocation has left, not into a new allocation each, until less than
/// `SMALLEST_READ` is left.
#[test]
fn small_messages_share_one_allocation_while_it_has_room() {
    /// Gives its number of bytes of `x` a read, at most the room there is.
    struct Pieces(usize);
    impl tokio::io::AsyncRead for Pieces {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            let n = self.0.min(buf.remaining());
            buf.put_slice(&vec![b'x'; n]);
            Poll::Ready(Ok(()))
        }
    }
    let mut io = Pieces(600);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let mut buf = BytesMut::new();
    let mut held: Vec<bytes::Bytes> = Vec::new();
    let mut allocations = 0;
    for _ in 0..40 {
        match poll_read_capped(Pin::new(&mut io), &mut cx, &mut buf, MAX_BUFFER) {
            Poll::Ready(Ok(600)) => {}
            other => panic!("{other:?}"),
        }
        // Read where the last message ended: the same allocation.
        let follows = held
            .last()
            .is_some_and(|last| last.as_ptr().wrapping_add(last.len()) == buf.as_ptr());
        if !follows {
            allocations += 1;
        }
        held.push(buf.split_to(600).freeze());
    }
    // 40 reads of 600 bytes: an allocation of READ_SIZE (8 KiB) takes 11 of them before less
    // than SMALLEST_READ (2 KiB) is left, so four allocations, not forty.
    assert_eq!((READ_SIZE, SMALLEST_READ), (8 * 1024, 2 * 1024));
    assert_eq!(allocations, 4, "{allocations} allocations for 40 reads");
    assert!(held
        .iter()
        .all(|m| m.len() == 600 && m.iter().all(|&b| b == b'x')));
}
