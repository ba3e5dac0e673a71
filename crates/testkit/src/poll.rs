//! Waiting for a condition: poll it until it holds, within a deadline.
//!
//! A test that sleeps a fixed time and then assumes a condition waits too long on a fast
//! machine and fails on a busy one (two cores shared by several builds). Polling costs only as
//! long as the condition takes to become true; the deadline is there only to turn a condition
//! that never holds into a failure that names it. The condition is checked once more when the
//! deadline is reached, so a condition that became true during the last sleep still counts.
//!
//! Deadlines are wall-clock time (`std::time::Instant`), even in async tests: the conditions
//! are other processes and sockets, which take real time, and a test on tokio's paused clock
//! would otherwise see its deadline pass in an instant while they had no time at all.

use std::future::Future;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// How often a condition is checked again.
pub const POLL_EVERY: Duration = Duration::from_millis(10);

/// Awaits `check` every [`POLL_EVERY`] until it returns true.
///
/// # Panics
/// When `within` passes first, with a message naming `what`.
pub async fn eventually<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if check().await {
            return;
        }
        let now = Instant::now();
        if now >= deadline {
            panic!("timed out after {within:?} waiting for: {what}");
        }
        tokio::time::sleep(POLL_EVERY.min(deadline - now)).await;
    }
}

/// [`eventually`] for a thread that is not in an async runtime: blocks it between checks.
///
/// # Panics
/// When `within` passes first, with a message naming `what`.
pub fn eventually_blocking(within: Duration, what: &str, mut check: impl FnMut() -> bool) {
    if poll_blocking(within, || check().then_some(())).is_none() {
        panic!("timed out after {within:?} waiting for: {what}");
    }
}

/// The exit status of `child` once it has exited, or `None` if it is still running after
/// `within` (it is left running: the caller decides whether that is a failure).
pub fn wait_exit(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    poll_blocking(within, || {
        child
            .try_wait()
            .expect("the status of a child of this process")
    })
}

/// Calls `attempt` every [`POLL_EVERY`] until it returns a value or `within` passes.
fn poll_blocking<T>(within: Duration, mut attempt: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(found) = attempt() {
            return Some(found);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        std::thread::sleep(POLL_EVERY.min(deadline - now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn eventually_returns_once_the_condition_holds() {
        let checks = AtomicU32::new(0);
        eventually(Duration::from_secs(30), "the third check", || async {
            checks.fetch_add(1, Ordering::Relaxed) + 1 == 3
        })
        .await;
        assert_eq!(checks.load(Ordering::Relaxed), 3);
    }

    #[tokio::test]
    #[should_panic(expected = "waiting for: a condition that never holds")]
    async fn eventually_fails_naming_the_condition() {
        eventually(Duration::ZERO, "a condition that never holds", || async {
            false
        })
        .await;
    }

    #[test]
    fn eventually_blocking_checks_until_it_holds_and_fails_naming_it() {
        let mut checks = 0;
        eventually_blocking(Duration::from_secs(30), "the second check", || {
            checks += 1;
            checks == 2
        });
        assert_eq!(checks, 2);
        let failed = std::panic::catch_unwind(|| {
            eventually_blocking(Duration::ZERO, "never", || false);
        });
        let message = failed.expect_err("it panics");
        let message = message
            .downcast_ref::<String>()
            .expect("a formatted message");
        assert!(message.contains("waiting for: never"), "{message}");
    }

    #[test]
    fn wait_exit_returns_the_status_or_none_while_the_child_runs() {
        let mut done = Command::new("true").spawn().expect("spawn true");
        let status = wait_exit(&mut done, Duration::from_secs(30));
        assert!(status.is_some_and(|s| s.success()), "{status:?}");

        // `cat` with an open stdin runs until it is killed.
        let mut running = Command::new("cat")
            .stdin(Stdio::piped())
            .spawn()
            .expect("spawn cat");
        assert_eq!(wait_exit(&mut running, Duration::ZERO), None);
        running.kill().expect("kill cat");
        assert!(wait_exit(&mut running, Duration::from_secs(30)).is_some());
    }
}
