//! A response as the connection writes it (RFC 9112): the status line, the handler's headers
//! without framing ones, `date`, and the framing the body's size gives (`content-length` when it
//! is known, else chunked; for an HTTP/1.0 client, the connection's close). Body frames are
//! gathered while they are ready and written when none is, or as soon as the body's whole
//! length is there (before its end is asked for, which runs the relay's accounting), so a whole
//! answer is one write with its head and a stream's event is written as soon as it comes.

use std::cell::RefCell;
use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::pin::pin;
use std::task::Poll;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use bytes::{BufMut, Bytes, BytesMut};
use http::header::{self, HeaderValue};
use http::{StatusCode, Version};
use http_body::{Body as _, Frame};

use super::body::Socket;
use crate::answer::Answer;

/// Data frames up to this size (a stream's events, a small answer) are copied next to the head
/// or the chunk framing and written with it; larger ones are written from where they are, with
/// what was gathered before them. Copying larger ones would hold a copy of the frame beside the
/// frame, per response in flight: copying the 8 KiB frames of large answers grew the gateway by
/// 26-28 MiB where 10-12 MiB otherwise (256 clients reading 1 MiB answers).
const COPY_MAX: usize = 4 * 1024;
/// The most bytes gathered for one write: a frame that would pass it is written from where it
/// is. So the buffer never grows past it, and a client that stops reading holds at most this
/// much of it.
const GATHER: usize = 16 * 1024;

/// What the response depends on in its request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Asked {
    /// A `HEAD` request: the head is written, never a body.
    pub head: bool,
    pub version: Version,
    /// The connection closes after this response.
    pub close: bool,
    /// How long the client may take none of the answer before it is given up on.
    pub stall: Duration,
}

enum Framing {
    /// No body may follow (1xx, 204, 304).
    None,
    Length(u64),
    Chunked,
    /// The body ends with the connection (an HTTP/1.0 client, a body of unknown size).
    UntilClose,
}

/// Writes `response` whole; true when the connection may carry another request after it.
/// False when the client left (a write failed, or it closed its side while the body was
/// awaited), the body failed (the client sees it cut short), or the connection is to close.
pub(crate) async fn response(socket: &Socket, response: Answer, asked: Asked) -> bool {
    let Answer {
        status,
        lines,
        body,
        extensions: _,
    } = response;
    let bodiless = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let mut close = asked.close
        || lines
            .get_all(&header::CONNECTION)
            .any(|v| crate::upstream::hop::list_items(v).any(|i| i.eq_ignore_ascii_case(b"close")));
    let framing = if bodiless {
        Framing::None
    } else if let Some(n) = body.size_hint().exact() {
        Framing::Length(n)
    } else if asked.version == Version::HTTP_11 {
        Framing::Chunked
    } else {
        close = true;
        Framing::UntilClose
    };
    let mut out = BytesMut::with_capacity(1024);
    out.put_slice(b"HTTP/1.1 ");
    out.put_slice(status.as_str().as_bytes());
    out.put_u8(b' ');
    out.put_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.put_slice(b"\r\n");
    let mut said_connection = false;
    let mut dated = false;
    for (name, value) in lines.iter() {
        // Framing is the body's, written below; a HEAD answer's length is the handler's to say.
        if (name == header::CONTENT_LENGTH && !asked.head) || name == header::TRANSFER_ENCODING {
            continue;
        }
        said_connection |= name == header::CONNECTION;
        dated |= name == header::DATE;
        line(&mut out, name.as_str().as_bytes(), value);
    }
    if !dated {
        date(&mut out);
    }
    match framing {
        _ if asked.head => {}
        Framing::Length(n) => line(
            &mut out,
            b"content-length",
            itoa::Buffer::new().format(n).as_bytes(),
        ),
        Framing::Chunked => line(&mut out, b"transfer-encoding", b"chunked"),
        Framing::None | Framing::UntilClose => {}
    }
    if close && !said_connection {
        line(&mut out, b"connection", b"close");
    } else if !close && asked.version == Version::HTTP_10 {
        line(&mut out, b"connection", b"keep-alive");
    }
    out.put_slice(b"\r\n");
    // The head is written into `out`: its header values (slices of the backend's read buffer)
    // are not held while a long body streams.
    drop(lines);
    if asked.head || matches!(framing, Framing::None) {
        return write_all(socket, &out, &[], asked.stall).await.is_ok() && !close;
    }
    let ended = body_frames(socket, body, out, &framing, asked.stall).await;
    ended && !close
}

/// What the body gave, or why the writer stops waiting for it.
enum Next {
    Frame(Frame<Bytes>),
    End,
    /// The body failed, or the client closed the connection while the body was awaited.
    Broken,
    /// Nothing ready now: what is gathered is written first.
    Flush,
}

/// Writes the body's frames after `out` (the head); true when the body ended as framed.
async fn body_frames(
    socket: &Socket,
    body: Body,
    mut out: BytesMut,
    framing: &Framing,
    stall: Duration,
) -> bool {
    let chunked = matches!(framing, Framing::Chunked);
    // Bytes the declared length still allows, when there is one.
    let mut left = match framing {
        Framing::Length(n) => Some(*n),
        _ => None,
    };
    let mut body = pin!(body);
    loop {
        let next = poll_fn(|cx| match body.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Next::Frame(frame)),
            Poll::Ready(None) => Poll::Ready(Next::End),
            Poll::Ready(Some(Err(_))) => Poll::Ready(Next::Broken),
            Poll::Pending if !out.is_empty() => Poll::Ready(Next::Flush),
            Poll::Pending => socket.lock().poll_hangup(cx).map(|()| Next::Broken),
        })
        .await;
        let frame = match next {
            Next::Frame(frame) => frame,
            Next::Flush => {
                if write_all(socket, &out, &[], stall).await.is_err() {
                    return false;
                }
                out.clear();
                continue;
            }
            Next::End => {
                if chunked {
                    out.put_slice(b"0\r\n\r\n");
                }
                let whole = left.is_none_or(|n| n == 0);
                return write_all(socket, &out, &[], stall).await.is_ok() && whole;
            }
            // A body cut short: the client sees it end before its framing does.
            Next::Broken => {
                let _ = write_all(socket, &out, &[], stall).await;
                return false;
            }
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        if let Some(n) = &mut left {
            if data.len() as u64 > *n {
                // More than the body said it had: what fits is written, and the connection ends.
                let _ = write_all(socket, &out, &data[..*n as usize], stall).await;
                return false;
            }
            *n -= data.len() as u64;
        }
        if chunked {
            let mut size = [0u8; 16];
            out.put_slice(hex(data.len(), &mut size));
            out.put_slice(b"\r\n");
        }
        // A small frame, and its chunk's closing line, fit within what may be gathered.
        if data.len() <= COPY_MAX && out.len() + data.len() + 2 <= GATHER {
            out.put_slice(&data);
        } else {
            if write_all(socket, &out, &data, stall).await.is_err() {
                return false;
            }
            out.clear();
        }
        if chunked {
            out.put_slice(b"\r\n");
        }
        // The body's whole length is here: the client gets it before the body is asked for its
        // end (what ends it, the relay's reading and accounting, comes after).
        if left == Some(0) && !out.is_empty() {
            if write_all(socket, &out, &[], stall).await.is_err() {
                return false;
            }
            out.clear();
        }
    }
}

fn line(out: &mut BytesMut, name: &[u8], value: &[u8]) {
    out.put_slice(name);
    out.put_slice(b": ");
    out.put_slice(value);
    out.put_slice(b"\r\n");
}

/// `n` in lowercase hexadecimal, as a chunk's size.
fn hex(n: usize, into: &mut [u8; 16]) -> &[u8] {
    let mut at = into.len();
    let mut n = n;
    loop {
        at -= 1;
        into[at] = b"0123456789abcdef"[n & 0xf];
        n >>= 4;
        if n == 0 {
            return &into[at..];
        }
    }
}

/// The `date` header line, its value made once a second.
fn date(out: &mut BytesMut) {
    thread_local! {
        static DATE: RefCell<DateLine> = const { RefCell::new(DateLine::new()) };
    }
    DATE.with_borrow_mut(|date| {
        if let Some(value) = date.at(crate::clock::now(), SystemTime::now) {
            line(out, b"date", value.as_bytes());
        }
    });
}

/// A thread's `date` value, and the monotonic instant its second ends at. The wall clock is read
/// when that instant has passed, once a second (as nginx reads it once a turn of its loop), not
/// at every response: within the second the poll's reading of the monotonic clock tells.
struct DateLine {
    until: Option<Instant>,
    value: Option<HeaderValue>,
}

impl DateLine {
    const fn new() -> DateLine {
        DateLine {
            until: None,
            value: None,
        }
    }

    /// The value at `now` (monotonic), the wall clock read by `wall` when a second has ended.
    fn at(&mut self, now: Instant, wall: impl FnOnce() -> SystemTime) -> Option<&HeaderValue> {
        if self.until.is_none_or(|until| now >= until) {
            let wall = wall();
            let into = wall
                .duration_since(UNIX_EPOCH)
                .map_or(0, |since| since.subsec_nanos());
            let left = Duration::from_secs(1) - Duration::from_nanos(into.into());
            self.until = Some(now + left);
            self.value = HeaderValue::from_str(&httpdate::fmt_http_date(wall)).ok();
        }
        self.value.as_ref()
    }
}

/// Writes `first` then `second`, in one call when the socket takes them; fails when the client
/// takes nothing for `stall` (a client that stops reading holds its connection, its request
/// and what the relay holds for it only that long).
pub(crate) async fn write_all(
    socket: &Socket,
    first: &[u8],
    second: &[u8],
    stall: Duration,
) -> io::Result<()> {
    let (mut a, mut b) = (first, second);
    while !a.is_empty() || !b.is_empty() {
        let written = if a.is_empty() {
            socket.write.try_write(b)
        } else if b.is_empty() {
            socket.write.try_write(a)
        } else {
            socket
                .write
                .try_write_vectored(&[IoSlice::new(a), IoSlice::new(b)])
        };
        match written {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(mut n) => {
                let from_a = n.min(a.len());
                a = &a[from_a..];
                n -= from_a;
                b = &b[n..];
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                tokio::time::timeout(stall, socket.write.writable())
                    .await
                    .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_date_is_read_off_the_wall_clock_once_a_second() {
        let start = Instant::now();
        // 10:00:00.75 on the wall clock at `start`.
        let wall_at =
            |mono: Instant| UNIX_EPOCH + Duration::from_millis(1_700_000_000_750) + (mono - start);
        let mut date = DateLine::new();
        let reads = std::cell::Cell::new(0);
        let mut at = |after_ms: u64| {
            let mono = start + Duration::from_millis(after_ms);
            let value = date.at(mono, || {
                reads.set(reads.get() + 1);
                wall_at(mono)
            });
            value.unwrap().to_str().unwrap().to_owned()
        };
        assert_eq!(at(0), "Tue, 14 Nov 2023 22:13:20 GMT");
        // The rest of that second: no read.
        assert_eq!(at(100), "Tue, 14 Nov 2023 22:13:20 GMT");
        assert_eq!(at(249), "Tue, 14 Nov 2023 22:13:20 GMT");
        // The next second begins 250 ms in: read again, then not until the one after.
        assert_eq!(at(250), "Tue, 14 Nov 2023 22:13:21 GMT");
        assert_eq!(at(1_249), "Tue, 14 Nov 2023 22:13:21 GMT");
        assert_eq!(at(5_000), "Tue, 14 Nov 2023 22:13:25 GMT");
        assert_eq!(reads.get(), 3);
        // A wall clock set back is followed within a second.
        let mono = start + Duration::from_millis(6_300);
        let set_back = date.at(mono, || UNIX_EPOCH + Duration::from_secs(1_600_000_000));
        assert_eq!(set_back.unwrap(), "Sun, 13 Sep 2020 12:26:40 GMT");
    }

    #[test]
    fn chunk_sizes_are_lowercase_hex() {
        let mut b = [0u8; 16];
        assert_eq!(hex(0, &mut b), b"0");
        assert_eq!(hex(10, &mut b), b"a");
        assert_eq!(hex(0x1f2e, &mut b), b"1f2e");
        assert_eq!(hex(usize::MAX, &mut b), b"ffffffffffffffff");
    }

    /// A body of one frame of known length whose end, when it is asked for, notes what the
    /// client has received by then.
    struct EndLooks {
        frame: Option<Bytes>,
        answer: Bytes,
        client: std::net::TcpStream,
        seen: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    }

    impl http_body::Body for EndLooks {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            if let Some(frame) = self.frame.take() {
                return Poll::Ready(Some(Ok(Frame::data(frame))));
            }
            // What has arrived, up to the answer's last byte, waiting at most the read timeout
            // for more.
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.ends_with(&self.answer) {
                match std::io::Read::read(&mut self.client, &mut buf) {
                    Ok(n @ 1..) => got.extend_from_slice(&buf[..n]),
                    _ => break,
                }
            }
            *self.seen.lock().unwrap() = got;
            Poll::Ready(None)
        }

        fn size_hint(&self) -> http_body::SizeHint {
            http_body::SizeHint::with_exact(self.answer.len() as u64)
        }
    }

    /// The body's end is asked for (in the relay, that runs the usage scan and the request's
    /// accounting) only once the client has the whole answer.
    #[tokio::test]
    async fn an_answer_of_known_length_is_written_before_its_end_is_asked_for() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        // Long enough for bytes already sent over loopback to arrive; the body of a writer
        // that has not written waits this long and sees nothing.
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        let (read, write) = tokio::net::TcpStream::from_std(server)
            .unwrap()
            .into_split();
        let socket = super::super::body::Socket::new(read, write);
        let answer = Bytes::from_static(br#"{"usage":{"prompt_tokens":1}}"#);
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let body = EndLooks {
            frame: Some(answer.clone()),
            answer: answer.clone(),
            client,
            seen: seen.clone(),
        };
        let asked = Asked {
            head: false,
            version: Version::HTTP_11,
            close: false,
            stall: Duration::from_secs(5),
        };
        let relayed = Answer::from(http::Response::new(Body::new(body)));
        assert!(response(&socket, relayed, asked).await);
        let seen = seen.lock().unwrap();
        assert!(
            seen.starts_with(b"HTTP/1.1 200 OK\r\n") && seen.ends_with(&answer),
            "the client had {:?} when the end was asked for",
            String::from_utf8_lossy(&seen)
        );
    }
}
