//! Reading a request body whole, under its size cap, its deadline and the body budget: at once
//! when it came with its head, else awaited.

use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};

use bytes::Bytes;
use http_body::Body as _;
use http_body_util::Limited;

use super::held::{self, Filling};
use super::{BodyBudget, BodyHold, BodyLimits};
use crate::error::{ApiError, ErrorKind};

/// Reads the whole body: refused with 413 as soon as it passes the cap (at once when its
/// declared length does, before `100 Continue` invites it), with 408 when it has not arrived
/// by the deadline, with 429 when the tenant's bodies would pass its share of the budget, and
/// with 503 when all bodies would pass the budget. The bytes hold their place in the budget
/// until the last reference to them is dropped (`held.rs`).
pub async fn read_body(
    body: axum::body::Body,
    limits: BodyLimits,
    budget: &'static BodyBudget,
    tenant: &Arc<AtomicU64>,
) -> Result<Bytes, ApiError> {
    let mut reading = BodyRead::begin(body, limits.cap, budget, tenant)?;
    if !reading.ended_now()? {
        reading.arrive(limits).await?;
    }
    reading.into_bytes()
}

/// A body being read, as [`read_body`] reads it, in steps: a body that came whole with its
/// head (most do) is read at once ([`BodyRead::ended_now`]), with no timer set for its deadline;
/// only one still arriving is awaited ([`BodyRead::arrive`]).
struct BodyRead {
    body: Limited<axum::body::Body>,
    cap: usize,
    hold: BodyHold,
    parts: Parts,
}

impl BodyRead {
    /// Starts reading `body` under `cap`, holding its declared length in `budget` and in
    /// `tenant`'s share at once: refused before a byte is read when either is too small.
    fn begin(
        body: axum::body::Body,
        cap: usize,
        budget: &'static BodyBudget,
        tenant: &Arc<AtomicU64>,
    ) -> Result<BodyRead, ApiError> {
        if body.size_hint().lower() > cap as u64 {
            return Err(too_large(cap));
        }
        let mut hold = BodyHold::empty(budget, tenant);
        // A declared length is held in the budget at once, before a byte is read (or `100
        // Continue` invites them), and read into one buffer of that size: what is counted is
        // what is allocated, never twice the body while it is put together.
        let declared = body.size_hint().exact();
        if let Some(n) = declared {
            hold.grow(n)?;
        }
        Ok(BodyRead {
            body: Limited::new(body, cap),
            cap,
            hold,
            parts: Parts::new(declared),
        })
    }

    /// Takes the frames that are there without waiting: true when the body ended.
    fn ended_now(&mut self) -> Result<bool, ApiError> {
        let mut cx = Context::from_waker(Waker::noop());
        match self.poll_frames(&mut cx) {
            Poll::Ready(ended) => ended.map(|()| true),
            Poll::Pending => Ok(false),
        }
    }

    /// Waits for the rest of the body, until `limits.deadline` (408 past it).
    async fn arrive(&mut self, limits: BodyLimits) -> Result<(), ApiError> {
        let deadline = tokio::time::Instant::from_std(limits.deadline);
        let frames = std::future::poll_fn(|cx| self.poll_frames(cx));
        match tokio::time::timeout_at(deadline, frames).await {
            Ok(ended) => ended,
            Err(_) => Err(ApiError::new(
                ErrorKind::BodyReadTimeout,
                format!(
                    "the request body did not arrive whole within {:?}",
                    limits.timeout
                ),
            )),
        }
    }

    /// Takes frames until the body ends (ready) or none is there (pending).
    fn poll_frames(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ApiError>> {
        loop {
            let frame = match ready!(Pin::new(&mut self.body).poll_frame(cx)) {
                Some(frame) => frame,
                None => return Poll::Ready(Ok(())),
            };
            let frame = frame.map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    too_large(self.cap)
                } else {
                    ApiError::new(
                        ErrorKind::MalformedRequest,
                        format!("could not read the request body: {e}"),
                    )
                }
            });
            let Ok(data) = frame?.into_data() else {
                continue;
            };
            if self.parts.declared.is_none() {
                self.hold.grow(data.len() as u64)?;
            }
            self.parts.push(data);
        }
    }

    /// The body, once it ended, holding its place in the budget.
    fn into_bytes(self) -> Result<Bytes, ApiError> {
        let BodyRead {
            mut hold, parts, ..
        } = self;
        if parts.needs_copy() {
            // The chunks are put together in a copy of them all: both exist for a moment.
            let total = hold.bytes;
            hold.grow(total)?;
            let whole = parts.put_together();
            hold.shrink(total);
            return Ok(whole.finish(hold));
        }
        Ok(parts.finish(hold))
    }
}

fn too_large(cap: usize) -> ApiError {
    ApiError::new(
        ErrorKind::BodyTooLarge,
        format!("request body is larger than the limit of {cap} bytes"),
    )
}

/// A body's frames as they arrive: the first kept as it is (most bodies are one frame), later
/// ones copied into one buffer of the declared length, or kept until the body ends when no
/// length was declared.
struct Parts {
    first: Option<Bytes>,
    rest: Option<Filling>,
    chunks: Vec<Bytes>,
    declared: Option<u64>,
}

impl Parts {
    fn new(declared: Option<u64>) -> Parts {
        Parts {
            first: None,
            rest: None,
            chunks: Vec::new(),
            declared,
        }
    }

    fn push(&mut self, data: Bytes) {
        let Some(first) = &self.first else {
            self.first = Some(data);
            return;
        };
        match self.declared {
            Some(n) => {
                let buf = self.rest.get_or_insert_with(|| {
                    let mut buf = Filling::new(n as usize);
                    buf.extend(first);
                    buf
                });
                buf.extend(&data);
                self.first = Some(Bytes::new());
            }
            None => self.chunks.push(data),
        }
    }

    /// Whether the frames are in pieces that must be copied into one.
    fn needs_copy(&self) -> bool {
        !self.chunks.is_empty()
    }

    /// The pieces copied into one buffer (and dropped).
    fn put_together(self) -> Filling {
        let first = self.first.unwrap_or_default();
        let total = first.len() + self.chunks.iter().map(Bytes::len).sum::<usize>();
        let mut all = Filling::new(total);
        all.extend(&first);
        for chunk in &self.chunks {
            all.extend(chunk);
        }
        all
    }

    /// The body, holding `hold`, once no pieces need copying ([`Parts::needs_copy`]).
    fn finish(self, hold: BodyHold) -> Bytes {
        debug_assert!(!self.needs_copy());
        match self.rest {
            Some(buf) => buf.finish(hold),
            None => held::frame(self.first.unwrap_or_default(), hold),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    use super::super::tests::limits;
    use super::*;

    #[tokio::test]
    async fn a_declared_length_over_the_cap_is_refused_before_the_body_is_read() {
        let budget = BodyBudget::new(1000, 1000);
        // Declares 11 bytes and never sends one: a refusal that waited for the body would hang.
        struct Declared;
        impl http_body::Body for Declared {
            type Data = Bytes;
            type Error = std::io::Error;
            fn poll_frame(
                self: std::pin::Pin<&mut Self>,
                _: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>>
            {
                std::task::Poll::Pending
            }
            fn size_hint(&self) -> http_body::SizeHint {
                http_body::SizeHint::with_exact(11)
            }
        }
        let body = axum::body::Body::new(Declared);
        let e = read_body(body, limits(10), budget, &Arc::default())
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::BodyTooLarge);
    }

    #[tokio::test]
    async fn bodies_in_many_frames_are_put_together_whole_with_or_without_a_declared_length() {
        let frames = || {
            futures_util::stream::iter(
                ["{\"model\":", "\"m\",", "\"x\":1}"]
                    .map(|f| Ok::<_, std::io::Error>(Bytes::from_static(f.as_bytes()))),
            )
        };
        let budget = BodyBudget::new(1000, 1000);
        let tenant: Arc<AtomicU64> = Arc::default();
        let chunked = axum::body::Body::from_stream(frames());
        let bytes = read_body(chunked, limits(100), budget, &tenant)
            .await
            .unwrap();
        assert_eq!(&bytes[..], br#"{"model":"m","x":1}"#);
        assert_eq!(
            budget.usage().0,
            19,
            "the copy's share is given back once it is made"
        );
        drop(bytes);
        struct Declared<S>(S, u64);
        impl<S: futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Unpin> http_body::Body
            for Declared<S>
        {
            type Data = Bytes;
            type Error = std::io::Error;
            fn poll_frame(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>>
            {
                std::pin::Pin::new(&mut self.0)
                    .poll_next(cx)
                    .map(|f| f.map(|r| r.map(http_body::Frame::data)))
            }
            fn size_hint(&self) -> http_body::SizeHint {
                http_body::SizeHint::with_exact(self.1)
            }
        }
        let declared = axum::body::Body::new(Declared(frames(), 19));
        let bytes = read_body(declared, limits(100), budget, &tenant)
            .await
            .unwrap();
        assert_eq!(&bytes[..], br#"{"model":"m","x":1}"#);
        assert_eq!(budget.usage().0, 19);
        drop(bytes);
        assert_eq!((budget.usage().0, tenant.load(Ordering::Relaxed)), (0, 0));
    }

    /// Outside any runtime, so a timer or a wait would panic: a body that came whole is taken
    /// at once.
    #[test]
    fn a_body_that_came_whole_is_read_at_once_without_a_timer() {
        let budget = BodyBudget::new(1000, 1000);
        let tenant: Arc<AtomicU64> = Arc::default();
        let body = axum::body::Body::from(&br#"{"model":"m"}"#[..]);
        let mut reading = BodyRead::begin(body, 100, budget, &tenant).unwrap();
        assert!(reading.ended_now().unwrap());
        let bytes = reading.into_bytes().unwrap();
        assert_eq!(&bytes[..], br#"{"model":"m"}"#);
        assert_eq!(budget.usage().0, 13);
        drop(bytes);
        assert_eq!(budget.usage().0, 0);
    }

    /// A body with no declared length that came whole but over the cap is refused as it is
    /// taken at once, as it would be awaited: its bytes never held.
    #[test]
    fn a_body_that_came_whole_over_the_cap_is_refused_at_once() {
        let budget = BodyBudget::new(1000, 1000);
        let tenant: Arc<AtomicU64> = Arc::default();
        let frame = futures_util::stream::iter([Ok::<_, std::io::Error>(Bytes::from_static(
            b"01234567890",
        ))]);
        let body = axum::body::Body::from_stream(frame);
        let mut reading = BodyRead::begin(body, 10, budget, &tenant).unwrap();
        let e = reading.ended_now().unwrap_err();
        assert_eq!(e.kind, ErrorKind::BodyTooLarge);
        drop(reading);
        assert_eq!((budget.usage().0, tenant.load(Ordering::Relaxed)), (0, 0));
    }

    #[tokio::test]
    async fn a_body_still_arriving_is_taken_as_far_as_it_came_then_awaited() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
        let frames = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|f| (Ok::<_, std::io::Error>(f), rx))
        });
        let budget = BodyBudget::new(1000, 1000);
        let tenant: Arc<AtomicU64> = Arc::default();
        let body = axum::body::Body::from_stream(frames);
        let mut reading = BodyRead::begin(body, 100, budget, &tenant).unwrap();
        tx.send(Bytes::from_static(b"{\"model\":")).await.unwrap();
        assert!(!reading.ended_now().unwrap(), "the body has not ended");
        assert_eq!(budget.usage().0, 9, "the frame that came is taken and held");
        let rest = tokio::spawn(async move {
            tx.send(Bytes::from_static(b"\"m\"}")).await.unwrap();
        });
        reading.arrive(limits(100)).await.unwrap();
        rest.await.unwrap();
        assert_eq!(&reading.into_bytes().unwrap()[..], br#"{"model":"m"}"#);
    }

    #[tokio::test]
    async fn a_body_that_never_ends_times_out_with_408() {
        let budget = BodyBudget::new(1000, 1000);
        let timeout = Duration::from_millis(50);
        let limits = BodyLimits {
            cap: 100,
            deadline: Instant::now() + timeout,
            timeout,
        };
        let body = axum::body::Body::from_stream(futures_util::stream::pending::<
            Result<Bytes, std::io::Error>,
        >());
        let e = read_body(body, limits, budget, &Arc::default())
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::BodyReadTimeout);
        assert_eq!(e.status(), http::StatusCode::REQUEST_TIMEOUT);
    }
}
