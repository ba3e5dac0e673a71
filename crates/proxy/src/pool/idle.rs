//! A backend's kept-alive upstream connections while no request uses them.
//!
//! A connection is taken for one request and put back when that request's response body has
//! been read to its end (`upstream::UpstreamBody`), so the next request finds it at once: no
//! lookup by host, no task that waits for the connection to become idle, no future built to
//! connect in case no connection is free. The most recently used comes out first (it is the one
//! least likely to have been closed by the backend); the oldest go first when the list is full
//! or they have been idle for longer than `upstream.pool_idle_timeout`, which a sweep enforces
//! while the backend has idle connections and no traffic takes them.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::upstream::h1::{Conn, Keep};

#[derive(Default)]
pub(crate) struct IdleConns {
    /// Oldest first; each with when it became idle.
    list: Mutex<VecDeque<(Conn, Instant)>>,
    /// A sweep is running (set and cleared under the list's lock).
    sweeping: AtomicBool,
}

impl IdleConns {
    /// The most recently idle connection that is still open, if one was idle for less than
    /// `keep.idle_timeout`; the others, past it, are closed.
    pub(crate) fn take(&self, now: Instant, keep: Keep) -> Option<Conn> {
        loop {
            let mut conn = {
                let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
                let (conn, since) = list.pop_back()?;
                if now.saturating_duration_since(since) >= keep.idle_timeout {
                    // The newest is too old: so are all before it.
                    list.clear();
                    return None;
                }
                conn
            };
            // Asked outside the lock: a `recv` at most.
            if conn.is_open() {
                return Some(conn);
            }
        }
    }

    /// Keeps `conn` for the next request, unless nothing is kept; the oldest is closed when the
    /// list is full.
    pub(crate) fn put(self: &Arc<Self>, conn: Conn, now: Instant, keep: Keep) {
        if keep.max == 0 {
            return;
        }
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        while list.len() >= keep.max {
            list.pop_front();
        }
        list.push_back((conn, now));
        // Read and set under the lock, as the sweep clears it: no atomic swap per request.
        if !self.sweeping.load(Ordering::Relaxed) {
            self.sweeping.store(true, Ordering::Relaxed);
            tokio::spawn(sweep(Arc::downgrade(self), keep.idle_timeout));
        }
    }

    /// Closes the connections idle for `idle_timeout` or longer, and those the backend closed;
    /// when the next of the others passes it, if any are left.
    fn expire(&self, now: Instant, idle_timeout: Duration) -> Option<Instant> {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        list.retain_mut(|(conn, since)| {
            now.saturating_duration_since(*since) < idle_timeout && conn.is_open()
        });
        match list.front() {
            Some((_, since)) => Some(*since + idle_timeout),
            None => {
                self.sweeping.store(false, Ordering::Relaxed);
                None
            }
        }
    }

    /// Idle connections now.
    pub(crate) fn len(&self) -> usize {
        self.list.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl std::fmt::Debug for IdleConns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdleConns")
            .field("len", &self.len())
            .finish()
    }
}

/// Closes `idle`'s connections as they pass the idle timeout, until none is left (the next
/// `put` starts another sweep) or the backend is gone.
async fn sweep(idle: Weak<IdleConns>, idle_timeout: Duration) {
    let mut next = crate::clock::now() + idle_timeout;
    loop {
        tokio::time::sleep_until(next.into()).await;
        let Some(idle) = idle.upgrade() else { return };
        let now = crate::clock::now();
        match idle.expire(now, idle_timeout) {
            Some(at) => next = at.max(now + Duration::from_millis(10)),
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection whose other end is `far` (dropping it closes the connection).
    fn conn() -> (Conn, tokio::io::DuplexStream) {
        let (near, far) = tokio::io::duplex(1024);
        (Conn::new(Box::new(near)), far)
    }

    const KEEP: Keep = Keep {
        max: 2,
        idle_timeout: Duration::from_secs(10),
    };

    #[tokio::test(start_paused = true)]
    async fn the_newest_comes_out_first_and_a_full_list_closes_the_oldest() {
        use tokio::io::AsyncReadExt;
        let idle = Arc::new(IdleConns::default());
        let (a, mut fa) = conn();
        let (b, _fb) = conn();
        let (c, fc) = conn();
        let t = crate::clock::now();
        idle.put(a, t, KEEP);
        idle.put(b, t, KEEP);
        idle.put(c, t, KEEP);
        assert_eq!(idle.len(), 2, "the cap");
        // a, the oldest, was closed: its far end reads the end.
        let end = tokio::time::timeout(Duration::from_secs(5), fa.read(&mut [0u8; 1])).await;
        assert_eq!(end.expect("a is still open").unwrap(), 0);
        // The newest is c: its far end going away closes it (b's would stay open).
        let mut newest = idle.take(t, KEEP).unwrap();
        let mut left = idle.take(t, KEEP).unwrap();
        assert!(idle.take(t, KEEP).is_none());
        drop(fc);
        assert!(!newest.is_open(), "the newest is c");
        assert!(left.is_open(), "b is left, open");
    }

    #[tokio::test(start_paused = true)]
    async fn connections_past_the_idle_timeout_or_closed_are_not_taken() {
        let idle = Arc::new(IdleConns::default());
        let (a, fa) = conn();
        let (b, _fb) = conn();
        let t = crate::clock::now();
        idle.put(a, t, KEEP);
        idle.put(b, t + Duration::from_secs(5), KEEP);
        assert!(idle.take(t + Duration::from_secs(15), KEEP).is_none());
        assert_eq!(idle.len(), 0, "both past the timeout are closed");

        let (b, fb) = conn();
        idle.put(b, t, KEEP);
        drop(fb);
        // Closed by its far end: the list skips it.
        assert!(idle.take(t, KEEP).is_none());
        drop(fa);
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_backends_idle_connections_are_closed_by_the_sweep() {
        let idle = Arc::new(IdleConns::default());
        let (a, _fa) = conn();
        let (b, _fb) = conn();
        idle.put(a, crate::clock::now(), KEEP);
        tokio::time::sleep(Duration::from_secs(5)).await;
        idle.put(b, crate::clock::now(), KEEP);
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(idle.len(), 2);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(idle.len(), 1, "a closed once past the idle timeout");
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(idle.len(), 0, "then b");
        assert!(!idle.sweeping.load(Ordering::Relaxed), "the sweep ended");
        // A later connection starts another sweep.
        let (c, _fc) = conn();
        idle.put(c, crate::clock::now(), KEEP);
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert_eq!(idle.len(), 0);
    }

    /// A plain TCP connection, asked as its own kind is (`Io::quiet_and_open`): kept while its
    /// far end is quiet; not taken once that end sends something unasked or closes it.
    #[tokio::test]
    async fn a_tcp_connection_is_taken_while_quiet_and_not_once_closed_or_spoken_on() {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let tcp = || async {
            let near = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (far, _) = listener.accept().await.unwrap();
            (Conn::new(Box::new(near)), far)
        };
        let idle = Arc::new(IdleConns::default());
        let (quiet, _far) = tcp().await;
        idle.put(quiet, crate::clock::now(), KEEP);
        assert!(
            idle.take(crate::clock::now(), KEEP).is_some(),
            "quiet and open"
        );

        for spoke in [false, true] {
            let (conn, mut far) = tcp().await;
            if spoke {
                far.write_all(b"x").await.unwrap();
            } else {
                drop(far);
            }
            // Kept and asked again until the runtime has seen what came: then it is not taken.
            let mut conn = Some(conn);
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while let Some(c) = conn.take() {
                idle.put(c, crate::clock::now(), KEEP);
                conn = idle.take(crate::clock::now(), KEEP);
                if conn.is_some() {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "still taken (spoke: {spoke})"
                    );
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            assert_eq!(idle.len(), 0);
        }
    }

    #[tokio::test]
    async fn nothing_is_kept_when_the_cap_is_zero() {
        let idle = Arc::new(IdleConns::default());
        let (a, _fa) = conn();
        idle.put(a, crate::clock::now(), Keep { max: 0, ..KEEP });
        assert_eq!(idle.len(), 0);
    }
}
