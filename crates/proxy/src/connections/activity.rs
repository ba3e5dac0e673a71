//! What one client connection is doing, and so when it has held its place long enough.
//!
//! A connection is either busy (a request on it is being served: from its head until the last
//! byte of its response) or not. One that is not busy is idle until the first byte of a new
//! request's head arrives, and then reading that head. Each state has its own deadline:
//! `idle_timeout` from the moment it became idle, `header_read_timeout` from the head's first
//! byte. A busy connection has none here: its body read has `body_read_timeout` (in
//! `request::read_body`) and its response the upstream timeouts.
//!
//! HTTP/2 multiplexes requests on one connection and its frames (pings, settings, window
//! updates) arrive at any time, so for it bytes read never start a head: it is idle exactly
//! while no stream is open.
//!
//! Nothing on the request path wakes the watchdog: a request's start and end only update this
//! state, and the watchdog looks again when `verdict` says (an HTTP/1 connection looks at it only
//! while it awaits a head, `h1/mod.rs`). It looks at least every half
//! `header_read_timeout` while idle and every `idle_timeout` while busy, which is often enough
//! to enforce both deadlines exactly, at a timer per connection per interval rather than per
//! request.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The connection's two timeouts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadlines {
    pub idle: Duration,
    pub header_read: Duration,
}

/// One connection's activity, shared by its reader (bytes in), its service (requests begun and
/// ended) and its watchdog.
///
/// An HTTP/1 connection's reader, service and watchdog run in its one task, one after another:
/// its state is read and written with plain loads and stores, no lock, and a request served
/// holds the activity by reference ([`Serving`]). HTTP/2's streams are tasks of their own, on any
/// thread: they change and read the state under `lock`, and a stream holds the activity by
/// reference count ([`Busy`]).
#[derive(Debug)]
pub(crate) struct Activity {
    lock: Mutex<()>,
    /// Requests being served.
    busy: AtomicUsize,
    /// When it last became idle, in nanoseconds after `base`.
    idle_since: AtomicU64,
    /// When the head being read began, in nanoseconds after `base`, plus one; 0 when none has.
    head_since: AtomicU64,
    base: Instant,
    http2: AtomicBool,
    /// Idle with no head begun: the only state in which bytes read change anything, kept apart
    /// so that a read on a busy connection costs one load.
    awaiting_head: AtomicBool,
    deadlines: Deadlines,
}

/// What the watchdog should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nothing is due yet: look again at this instant.
    Until(Instant),
    /// The connection has been idle for `idle_timeout`.
    Idle,
    /// The head of a request took longer than `header_read_timeout`.
    SlowHead,
}

impl Activity {
    pub(crate) fn new(now: Instant, deadlines: Deadlines) -> Arc<Activity> {
        Arc::new(Activity {
            lock: Mutex::new(()),
            busy: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            head_since: AtomicU64::new(0),
            base: now,
            http2: AtomicBool::new(false),
            awaiting_head: AtomicBool::new(true),
            deadlines,
        })
    }

    /// The lock, taken on HTTP/2 only.
    fn hold(&self) -> Option<MutexGuard<'_, ()>> {
        let lock = || self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.is_http2().then(lock)
    }

    fn nanos(&self, at: Instant) -> u64 {
        let after = at.saturating_duration_since(self.base).as_nanos();
        u64::try_from(after).unwrap_or(u64::MAX - 1)
    }

    fn instant(&self, nanos: u64) -> Instant {
        self.base + Duration::from_nanos(nanos)
    }

    fn head_since(&self) -> Option<Instant> {
        match self.head_since.load(Ordering::Relaxed) {
            0 => None,
            plus_one => Some(self.instant(plus_one - 1)),
        }
    }

    /// The connection speaks HTTP/2 (its first bytes were the preface).
    pub(crate) fn set_http2(&self) {
        self.http2.store(true, Ordering::Relaxed);
    }

    pub(crate) fn is_http2(&self) -> bool {
        self.http2.load(Ordering::Relaxed)
    }

    /// Whether bytes read now would begin a request's head (idle HTTP/1, no head begun).
    pub(crate) fn awaits_head(&self) -> bool {
        self.awaiting_head.load(Ordering::Relaxed) && !self.is_http2()
    }

    /// Bytes arrived: on an idle HTTP/1 connection, a request's head has begun.
    pub(crate) fn bytes_read(&self, now: Instant) {
        if !self.awaits_head() {
            return;
        }
        if self.busy.load(Ordering::Relaxed) == 0 && self.head_since.load(Ordering::Relaxed) == 0 {
            self.head_since
                .store(self.nanos(now) + 1, Ordering::Relaxed);
            self.awaiting_head.store(false, Ordering::Relaxed);
        }
    }

    /// Whether a request is being served.
    #[cfg(test)]
    pub(crate) fn is_busy(&self) -> bool {
        let _held = self.hold();
        self.busy.load(Ordering::Relaxed) > 0
    }

    /// A request's head was read; it is served until the returned guard drops. For HTTP/2's
    /// streams, which may end on another task.
    pub(crate) fn begin(self: &Arc<Self>) -> Busy {
        self.begun();
        Busy(self.clone())
    }

    /// [`Activity::begin`] for an HTTP/1 request, served and ended in the connection's task.
    pub(crate) fn serving(&self) -> Serving<'_> {
        self.begun();
        Serving(self)
    }

    fn begun(&self) {
        let _held = self.hold();
        let busy = self.busy.load(Ordering::Relaxed);
        self.busy.store(busy + 1, Ordering::Relaxed);
        self.head_since.store(0, Ordering::Relaxed);
        self.awaiting_head.store(false, Ordering::Relaxed);
    }

    fn end(&self, now: Instant) {
        let _held = self.hold();
        let busy = self.busy.load(Ordering::Relaxed) - 1;
        self.busy.store(busy, Ordering::Relaxed);
        if busy == 0 {
            self.idle_since.store(self.nanos(now), Ordering::Relaxed);
            self.awaiting_head.store(true, Ordering::Relaxed);
        }
    }

    /// Whether the connection has outstayed a deadline at `now`, or when to look again.
    pub(crate) fn verdict(&self, now: Instant) -> Verdict {
        let _held = self.hold();
        if self.busy.load(Ordering::Relaxed) > 0 {
            // It becomes idle no earlier than now: a look within `idle` sees that in time.
            return Verdict::Until(now + self.deadlines.idle);
        }
        if let Some(head) = self.head_since() {
            let due = head + self.deadlines.header_read;
            return if now >= due {
                Verdict::SlowHead
            } else {
                Verdict::Until(due)
            };
        }
        let idle_since = self.instant(self.idle_since.load(Ordering::Relaxed));
        let due = idle_since + self.deadlines.idle;
        if now >= due {
            return Verdict::Idle;
        }
        // A head may begin at any moment; looking again within half its timeout sees it in time.
        Verdict::Until(due.min(now + self.deadlines.header_read / 2))
    }
}

/// An HTTP/2 request being served on a connection; dropped when its response has ended.
#[derive(Debug)]
pub(crate) struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.end(crate::clock::now());
    }
}

/// An HTTP/1 request being served on a connection; dropped, in the connection's task, when its
/// response has been written.
#[derive(Debug)]
pub(crate) struct Serving<'a>(&'a Activity);

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        self.0.end(crate::clock::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Deadlines = Deadlines {
        idle: Duration::from_secs(75),
        header_read: Duration::from_secs(30),
    };

    #[test]
    fn an_idle_connection_is_due_at_the_idle_timeout() {
        let t0 = Instant::now();
        let a = Activity::new(t0, D);
        // Looked at often enough to see a head begin, until the idle timeout is due.
        assert_eq!(a.verdict(t0), Verdict::Until(t0 + D.header_read / 2));
        let late = t0 + D.idle - Duration::from_secs(1);
        assert_eq!(a.verdict(late), Verdict::Until(t0 + D.idle));
        assert_eq!(a.verdict(t0 + D.idle), Verdict::Idle);
    }

    #[test]
    fn a_head_begun_is_due_at_the_header_timeout_from_its_first_byte() {
        let t0 = Instant::now();
        let a = Activity::new(t0, D);
        let first = t0 + Duration::from_secs(50);
        a.bytes_read(first);
        a.bytes_read(first + Duration::from_secs(10));
        assert!(a.head_since().is_some());
        assert_eq!(a.verdict(first), Verdict::Until(first + D.header_read));
        assert_eq!(a.verdict(first + D.header_read), Verdict::SlowHead);
    }

    #[test]
    fn a_busy_connection_is_never_due_and_is_idle_again_when_its_last_request_ends() {
        let t0 = Instant::now();
        let a = Activity::new(t0, D);
        a.bytes_read(t0);
        let one = a.begin();
        let two = a.begin();
        assert!(a.head_since().is_none());
        let hour = t0 + Duration::from_secs(3600);
        assert_eq!(a.verdict(hour), Verdict::Until(hour + D.idle));
        drop(one);
        assert_eq!(a.verdict(hour), Verdict::Until(hour + D.idle));
        drop(two);
        let ended = Instant::now();
        let almost = ended + D.idle - Duration::from_secs(1);
        let Verdict::Until(due) = a.verdict(almost) else {
            panic!("an idle connection is not due before its idle timeout");
        };
        assert!(
            due > t0 + D.idle,
            "idle counts from the end of the last request"
        );
        assert_eq!(a.verdict(ended + D.idle), Verdict::Idle);
    }

    #[test]
    fn an_http1_request_served_keeps_the_connection_busy_until_its_guard_drops() {
        let t0 = Instant::now();
        let a = Activity::new(t0, D);
        a.bytes_read(t0);
        let served = a.serving();
        assert!(a.is_busy() && a.head_since().is_none() && !a.awaits_head());
        let hour = t0 + Duration::from_secs(3600);
        assert_eq!(a.verdict(hour), Verdict::Until(hour + D.idle));
        drop(served);
        assert!(!a.is_busy() && a.awaits_head());
        // The next head begins with its first byte.
        a.bytes_read(hour);
        assert_eq!(a.verdict(hour), Verdict::Until(hour + D.header_read));
    }

    #[test]
    fn http2_streams_on_many_threads_leave_the_connection_idle_when_the_last_ends() {
        let a = Activity::new(Instant::now(), D);
        a.set_http2();
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..2000 {
                        let busy = a.begin();
                        assert!(a.is_busy());
                        drop(busy);
                    }
                });
            }
        });
        assert!(!a.is_busy());
        let now = Instant::now();
        assert_eq!(a.verdict(now + D.idle), Verdict::Idle);
    }

    #[test]
    fn bytes_on_an_http2_connection_never_start_a_head() {
        let t0 = Instant::now();
        let a = Activity::new(t0, D);
        a.set_http2();
        a.bytes_read(t0);
        assert!(a.head_since().is_none());
        let later = t0 + D.header_read;
        assert_eq!(a.verdict(later), Verdict::Until(later + D.header_read / 2));
    }

    #[test]
    fn a_head_begun_between_two_looks_is_seen_before_its_deadline() {
        let t0 = Instant::now();
        let a = Activity::new(t0, D);
        let Verdict::Until(next) = a.verdict(t0) else {
            panic!("nothing is due at once");
        };
        // The head begins just after that look; the next look comes before its deadline.
        a.bytes_read(t0 + Duration::from_millis(1));
        assert!(next < t0 + Duration::from_millis(1) + D.header_read);
        assert_eq!(
            a.verdict(next),
            Verdict::Until(t0 + Duration::from_millis(1) + D.header_read)
        );
    }
}
