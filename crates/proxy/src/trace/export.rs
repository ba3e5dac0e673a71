//! The export of ended spans: a bounded queue in front of one exporter thread.
//!
//! A span ends on the request path; all that happens there is a `try_send` into a queue of at
//! most `telemetry.export_queue` spans. When the queue is full (the collector is slow, down or
//! far away) the span is dropped and counted in `spillway_trace_spans_dropped_total`: tracing
//! never holds memory without a bound nor slows a request. A thread of its own, with a
//! single-threaded runtime, takes batches of at most `export_batch` spans, waiting at most
//! `export_interval` for a batch to fill, and sends each once over OTLP: a failed export is
//! counted, logged at most once a minute and not retried, so a collector in trouble gets no
//! more load from spillway than its spans.

use std::sync::Mutex;
use std::time::Duration;

use metrics::{counter, describe_counter};
use opentelemetry::Context;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::warn;

pub(crate) const SPANS_EXPORTED: &str = "spillway_trace_spans_exported_total";
pub(crate) const SPANS_DROPPED: &str = "spillway_trace_spans_dropped_total";
pub(crate) const EXPORTS_FAILED: &str = "spillway_trace_exports_failed_total";

/// How often a failing export is logged at most.
const LOG_EVERY: Duration = Duration::from_secs(60);

pub(crate) fn describe() {
    describe_counter!(SPANS_EXPORTED, "Spans sent to the OTLP collector.");
    describe_counter!(
        SPANS_DROPPED,
        "Spans dropped, by reason: queue_full (the export queue was at telemetry.export_queue) or export_failed (the collector did not take them)."
    );
    describe_counter!(
        EXPORTS_FAILED,
        "OTLP export requests that failed (not retried)."
    );
}

enum Message {
    Span(Box<SpanData>),
    /// Export what is queued, then answer.
    Flush(std::sync::mpsc::SyncSender<()>),
}

/// How the queue is bounded and drained.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub queue: usize,
    pub batch: usize,
    pub interval: Duration,
    /// How long a flush waits for what is queued to be exported (one export, bounded by the
    /// exporter's timeout).
    pub flush_wait: Duration,
}

/// The span processor: ended spans into the bounded queue.
#[derive(Debug)]
pub(crate) struct Queue {
    tx: Mutex<Option<mpsc::Sender<Message>>>,
    flush_wait: Duration,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Message")
    }
}

impl Queue {
    /// Starts the exporter thread for `exporter`.
    pub(crate) fn start<E: SpanExporter + 'static>(
        exporter: E,
        bounds: Bounds,
    ) -> std::io::Result<Queue> {
        let (tx, rx) = mpsc::channel(bounds.queue);
        let thread = std::thread::Builder::new()
            .name("spillway-otlp".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                match runtime {
                    Ok(rt) => rt.block_on(drain(rx, exporter, bounds)),
                    Err(e) => warn!("traces are not exported: no runtime for the exporter: {e}"),
                }
            })?;
        Ok(Queue {
            tx: Mutex::new(Some(tx)),
            flush_wait: bounds.flush_wait,
            thread: Mutex::new(Some(thread)),
        })
    }

    fn sender(&self) -> Option<mpsc::Sender<Message>> {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let sent = tx
            .as_ref()
            .is_some_and(|tx| tx.try_send(Message::Span(Box::new(span))).is_ok());
        if !sent {
            counter!(SPANS_DROPPED, "reason" => "queue_full").increment(1);
        }
    }

    /// Never blocks on a full queue and waits at most `flush_wait`: a flush asked for while
    /// the collector does not answer fails rather than hangs its caller.
    fn force_flush(&self) -> OTelSdkResult {
        let Some(tx) = self.sender() else {
            return Err(OTelSdkError::AlreadyShutdown);
        };
        let (done, wait) = std::sync::mpsc::sync_channel(1);
        tx.try_send(Message::Flush(done)).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => {
                OTelSdkError::InternalFailure("the export queue is full".into())
            }
            mpsc::error::TrySendError::Closed(_) => OTelSdkError::AlreadyShutdown,
        })?;
        wait.recv_timeout(self.flush_wait).map_err(|e| match e {
            std::sync::mpsc::RecvTimeoutError::Timeout => OTelSdkError::Timeout(self.flush_wait),
            std::sync::mpsc::RecvTimeoutError::Disconnected => {
                OTelSdkError::InternalFailure("the exporter stopped".into())
            }
        })
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        // Closing the queue ends the thread once it has exported what is queued.
        let closed = self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        if closed.is_none() {
            return Err(OTelSdkError::AlreadyShutdown);
        }
        drop(closed);
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(thread) = thread else {
            return Ok(());
        };
        // A join has no timeout: wait for the thread's end on another thread.
        let (done, ended) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = thread.join();
            let _ = done.send(());
        });
        ended
            .recv_timeout(timeout)
            .map_err(|_| OTelSdkError::Timeout(timeout))
    }
}

/// The exporter thread's loop: batches out of the queue, each sent once.
async fn drain<E: SpanExporter>(mut rx: mpsc::Receiver<Message>, exporter: E, bounds: Bounds) {
    let mut batch: Vec<SpanData> = Vec::with_capacity(bounds.batch);
    let mut due: Option<Instant> = None;
    let mut logged: Option<Instant> = None;
    loop {
        let message = match due {
            Some(at) => tokio::time::timeout_at(at, rx.recv()).await.ok(),
            None => Some(rx.recv().await),
        };
        let flush = match message {
            Some(Some(Message::Span(span))) => {
                batch.push(*span);
                due.get_or_insert_with(|| Instant::now() + bounds.interval);
                batch.len() >= bounds.batch
            }
            Some(Some(Message::Flush(done))) => {
                send(&exporter, &mut batch, &mut logged).await;
                due = None;
                let _ = done.send(());
                continue;
            }
            // The queue was closed: export what is left and stop.
            Some(None) => {
                send(&exporter, &mut batch, &mut logged).await;
                let _ = exporter.shutdown();
                return;
            }
            // The batch waited its interval.
            None => true,
        };
        if flush {
            send(&exporter, &mut batch, &mut logged).await;
            due = None;
        }
    }
}

async fn send<E: SpanExporter>(
    exporter: &E,
    batch: &mut Vec<SpanData>,
    logged: &mut Option<Instant>,
) {
    if batch.is_empty() {
        return;
    }
    let spans = std::mem::take(batch);
    let n = spans.len() as u64;
    match exporter.export(spans).await {
        Ok(()) => counter!(SPANS_EXPORTED).increment(n),
        Err(e) => {
            counter!(EXPORTS_FAILED).increment(1);
            counter!(SPANS_DROPPED, "reason" => "export_failed").increment(n);
            let now = Instant::now();
            if logged.is_none_or(|at| now >= at + LOG_EVERY) {
                *logged = Some(now);
                warn!("{n} spans not exported (not retried): {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status};
    use opentelemetry::InstrumentationScope;

    use super::*;

    /// A collector that takes the connection and never answers.
    #[derive(Debug)]
    struct Silent;

    impl SpanExporter for Silent {
        async fn export(&self, _batch: Vec<SpanData>) -> OTelSdkResult {
            std::future::pending().await
        }
    }

    fn span() -> SpanData {
        SpanData {
            span_context: SpanContext::empty_context(),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: "s".into(),
            start_time: SystemTime::UNIX_EPOCH,
            end_time: SystemTime::UNIX_EPOCH,
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: Status::Unset,
            instrumentation_scope: InstrumentationScope::default(),
        }
    }

    #[test]
    fn a_flush_while_the_collector_never_answers_fails_instead_of_hanging() {
        let queue = Queue::start(
            Silent,
            Bounds {
                queue: 2,
                batch: 1,
                interval: Duration::from_millis(1),
                flush_wait: Duration::from_millis(50),
            },
        )
        .unwrap();
        // The first span's export never ends; the next fill the queue behind it.
        for _ in 0..4 {
            queue.on_end(span());
        }
        let flushed = queue.force_flush();
        assert!(
            matches!(
                flushed,
                Err(OTelSdkError::Timeout(_)) | Err(OTelSdkError::InternalFailure(_))
            ),
            "{flushed:?}"
        );
    }
}
