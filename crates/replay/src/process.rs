//! Child processes of the replay: started from the current executable, read for their
//! listening address, and killed by their own PID.
//!
//! A replay must leave nothing behind and touch nothing it did not start, so every child is
//! killed by its PID when dropped (an error or an interrupt that unwinds the replay) and stopped
//! explicitly, with a bounded wait, on the normal path. spillway's processes print the address
//! they bound as their first stdout line (they bind port 0), which is read with a deadline; their
//! stderr is drained into a short tail so a child that fails to start can say why in the
//! replay's one-line error.
//!
//! The children are `std::process` ones, their pipes read by a thread each: tokio's process
//! support would put a check for exited children into every wake-up of every runtime in the
//! binary, the gateway's request path included (`bench/README.md`, 2026-12-06 later).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::error::one_line;
use crate::error::ReplayError;

/// Lines of a child's stderr kept for error messages.
const STDERR_TAIL_LINES: usize = 8;
/// How long a killed child may take to be reaped, and an exited one to finish its stderr.
const EXIT_WAIT: Duration = Duration::from_secs(2);
/// The longest line of a child's output kept (a longer one is cut).
const MAX_LINE: usize = 4096;

/// A running child process, killed by its PID when stopped or dropped.
pub(crate) struct ChildProcess {
    name: String,
    /// `None` once it has been stopped.
    child: Option<Child>,
    pid: u32,
    stderr: Tail,
}

/// The last lines a child wrote to stderr, filled by a thread that reads until the pipe closes.
#[derive(Default)]
struct Tail {
    lines: Arc<Mutex<VecDeque<String>>>,
    /// Closed when the reader has seen the pipe close.
    done: Option<oneshot::Receiver<()>>,
}

impl ChildProcess {
    /// Starts the current executable with `args` (and `envs` added to the environment) and
    /// waits up to `deadline` for its first stdout line naming `http://` addresses, which it
    /// returns in order.
    pub(crate) async fn start(
        name: &str,
        args: &[&str],
        envs: &[(&str, &str)],
        deadline: Duration,
    ) -> Result<(ChildProcess, Vec<SocketAddr>), ReplayError> {
        let spawn_error = |source| ReplayError::Spawn {
            what: name.to_owned(),
            source,
        };
        let exe = std::env::current_exe().map_err(spawn_error)?;
        let mut child = Command::new(exe)
            .args(args)
            .envs(envs.iter().copied())
            // The children's own logs are for diagnosis; only warnings are worth their cost here.
            .env("SPILLWAY_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_error)?;
        let pid = child.id();
        let stderr = child.stderr.take().map(Tail::follow).unwrap_or_default();
        let stdout = child.stdout.take();
        let mut process = ChildProcess {
            name: name.to_owned(),
            child: Some(child),
            pid,
            stderr,
        };
        let Some(stdout) = stdout else {
            return Err(process.startup_error("its stdout was not captured").await);
        };
        let first = tokio::time::timeout(deadline, first_address_line(stdout)).await;
        let line = match first {
            Ok(Ok(line)) => line,
            Ok(Err(_)) => return Err(process.startup_error("it exited before listening").await),
            Err(_) => {
                let why = format!(
                    "no listening address on its stdout within {}",
                    humantime::format_duration(deadline)
                );
                return Err(process.startup_error(&why).await);
            }
        };
        let addrs = addresses(&line);
        if addrs.is_empty() {
            let why = format!("cannot read an address from {line:?}");
            return Err(process.startup_error(&why).await);
        }
        Ok((process, addrs))
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// The exit status if the child has already exited.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// Asks the child to stop (SIGTERM, by its PID); whether the signal was sent.
    pub(crate) async fn terminate(&self) -> bool {
        if self.child.is_none() {
            return false;
        }
        let pid = self.pid.to_string();
        let sent = tokio::task::spawn_blocking(move || {
            Command::new("kill")
                .args(["-s", "TERM", &pid])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
        })
        .await;
        matches!(sent, Ok(Ok(status)) if status.success())
    }

    /// An error saying that this child did not start, why, and what it last wrote to stderr.
    /// Kills the child if it is still running.
    pub(crate) async fn startup_error(&mut self, why: &str) -> ReplayError {
        let status = self.kill().await;
        let mut detail = why.to_owned();
        if let Some(status) = status {
            detail += &format!(" ({status})");
        }
        let tail = self.stderr.finish().await;
        if !tail.is_empty() {
            detail += &format!("; its stderr: {tail}");
        }
        ReplayError::Startup {
            what: format!("{} (pid {})", self.name, self.pid),
            detail,
        }
    }

    /// Kills the child by its PID and waits (boundedly) for it to be reaped.
    pub(crate) async fn stop(mut self) {
        self.kill().await;
    }

    /// Kills the child by its PID, if it runs, and waits up to [`EXIT_WAIT`] for its status;
    /// past that a thread of its own reaps it.
    async fn kill(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        let _ = child.kill();
        let reaped = tokio::task::spawn_blocking(move || child.wait());
        match tokio::time::timeout(EXIT_WAIT, reaped).await {
            Ok(Ok(Ok(status))) => Some(status),
            _ => None,
        }
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = child.kill();
        // Reaped apart, so that no zombie is left and the drop does not block.
        if !matches!(child.try_wait(), Ok(Some(_))) {
            let _ = std::thread::Builder::new()
                .name("replay-reap".into())
                .spawn(move || child.wait());
        }
    }
}

/// The first line of `stdout` that names an `http://` address; the rest is read on a thread of
/// its own until the pipe closes, so a child writing more never blocks on a full pipe. An error
/// when the pipe closes first.
async fn first_address_line(
    stdout: impl Read + Send + 'static,
) -> Result<String, oneshot::error::RecvError> {
    let (found, first) = oneshot::channel();
    let _ = std::thread::Builder::new()
        .name("replay-stdout".into())
        .spawn(move || {
            let mut found = Some(found);
            each_line(stdout, |line| {
                if line.contains("http://") {
                    if let Some(found) = found.take() {
                        let _ = found.send(line);
                    }
                }
            });
        });
    first.await
}

/// Calls `f` with each line of `pipe` (invalid UTF-8 replaced, a line longer than [`MAX_LINE`]
/// cut) until it closes or fails.
fn each_line(pipe: impl Read, mut f: impl FnMut(String)) {
    let mut pipe = BufReader::new(pipe);
    let mut line = Vec::new();
    loop {
        line.clear();
        match pipe
            .by_ref()
            .take(MAX_LINE as u64)
            .read_until(b'\n', &mut line)
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let full = line.ends_with(b"\n");
                let text = String::from_utf8_lossy(&line);
                f(text.trim_end_matches(['\r', '\n']).to_owned());
                if !full {
                    // The rest of a cut line is dropped.
                    let mut rest = Vec::new();
                    if matches!(pipe.read_until(b'\n', &mut rest), Ok(0) | Err(_)) {
                        return;
                    }
                }
            }
        }
    }
}

impl Tail {
    fn follow(pipe: impl Read + Send + 'static) -> Tail {
        let lines = Arc::new(Mutex::new(VecDeque::new()));
        let kept = Arc::clone(&lines);
        let (ended, done) = oneshot::channel::<()>();
        let _ = std::thread::Builder::new()
            .name("replay-stderr".into())
            .spawn(move || {
                let _ended = ended;
                each_line(pipe, |line| {
                    let mut kept = kept.lock().unwrap_or_else(PoisonError::into_inner);
                    if kept.len() == STDERR_TAIL_LINES {
                        kept.pop_front();
                    }
                    kept.push_back(line);
                });
            });
        Tail {
            lines,
            done: Some(done),
        }
    }

    /// The kept lines on one line, once the reader has seen the pipe close (or a deadline).
    async fn finish(&mut self) -> String {
        if let Some(done) = self.done.take() {
            let _ = tokio::time::timeout(EXIT_WAIT, done).await;
        }
        let kept = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        let text: Vec<&str> = kept.iter().map(String::as_str).collect();
        one_line(&text.join("\n"))
    }
}

/// Every `http://ADDR` in `line`, in order.
pub(crate) fn addresses(line: &str) -> Vec<SocketAddr> {
    line.split("http://")
        .skip(1)
        .filter_map(|rest| {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '[' | ']')))
                .unwrap_or(rest.len());
            rest[..end].parse().ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_read_from_the_listening_lines() {
        assert_eq!(
            addresses("mock-backend listening on http://127.0.0.1:4242"),
            ["127.0.0.1:4242".parse::<SocketAddr>().unwrap()]
        );
        assert_eq!(
            addresses("spillway listening on http://127.0.0.1:1 (admin on http://[::1]:2)"),
            [
                "127.0.0.1:1".parse::<SocketAddr>().unwrap(),
                "[::1]:2".parse().unwrap()
            ]
        );
        assert!(addresses("no address here").is_empty());
    }

    #[test]
    fn lines_are_read_whole_cut_when_too_long_and_invalid_text_replaced() {
        let mut pipe = b"first\r\n".to_vec();
        pipe.extend(std::iter::repeat_n(b'x', MAX_LINE + 10));
        pipe.extend(b"\nnot \xff utf-8\nlast without a newline");
        let mut lines = Vec::new();
        each_line(&pipe[..], |line| lines.push(line));
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert_eq!(lines[0], "first");
        assert_eq!(lines[1], "x".repeat(MAX_LINE));
        assert_eq!(lines[2], "not \u{fffd} utf-8");
        assert_eq!(lines[3], "last without a newline");
    }

    /// Run by the tests below as a child (this test binary, `--ignored`): it names an address on
    /// stdout, then waits to be killed (bounded, so that nothing is left if the test is not).
    #[test]
    #[ignore = "a child process of the tests below"]
    fn child_that_listens() {
        if std::env::var_os(CHILD).is_none() {
            return;
        }
        eprintln!("about to listen");
        println!("child listening on http://127.0.0.1:9");
        std::thread::sleep(Duration::from_secs(60));
    }

    const CHILD: &str = "SPILLWAY_REPLAY_TEST_CHILD";

    fn alive(pid: u32) -> bool {
        // A killed child that is reaped has no /proc entry; an unreaped one is a zombie.
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            !stat
                .rsplit(')')
                .next()
                .is_some_and(|s| s.trim_start().starts_with('Z'))
        })
    }

    #[tokio::test]
    async fn a_child_is_read_for_its_address_and_killed_when_dropped() {
        let args = [
            "--ignored",
            "--exact",
            "process::tests::child_that_listens",
            "--nocapture",
        ];
        let (child, addrs) =
            ChildProcess::start("child", &args, &[(CHILD, "1")], Duration::from_secs(30))
                .await
                .expect("the child names its address");
        assert_eq!(addrs, ["127.0.0.1:9".parse::<SocketAddr>().unwrap()]);
        let pid = child.pid();
        assert!(alive(pid));
        drop(child);
        spillway_testkit::eventually(
            Duration::from_secs(10),
            "the dropped child is gone",
            || async { !alive(pid) },
        )
        .await;
    }

    #[tokio::test]
    async fn a_child_that_exits_before_listening_is_an_error_with_its_status() {
        // The test binary runs no test by that name, and exits without naming an address.
        let args = ["--exact", "no_such_test"];
        let e = ChildProcess::start("child", &args, &[], Duration::from_secs(30))
            .await
            .err()
            .expect("no address");
        let text = e.to_string();
        assert!(text.contains("exited before listening"), "{text}");
        assert!(text.contains("exit status: 0"), "{text}");
    }
}
