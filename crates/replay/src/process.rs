//! Child processes of the replay: started from the current executable, read for their
//! listening address, and killed by their own PID.
//!
//! A replay must leave nothing behind and touch nothing it did not start, so every child is
//! spawned with kill-on-drop (an error or an interrupt that unwinds the replay kills it by its
//! PID) and stopped explicitly, with a bounded wait, on the normal path. spillway's processes
//! print the address they bound as their first stdout line (they bind port 0), which is read
//! with a deadline; their stderr is drained into a short tail so a child that fails to start
//! can say why in the replay's one-line error.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

use crate::error::one_line;
use crate::error::ReplayError;

/// Lines of a child's stderr kept for error messages.
const STDERR_TAIL_LINES: usize = 8;
/// How long a killed child may take to be reaped, and an exited one to finish its stderr.
const EXIT_WAIT: Duration = Duration::from_secs(2);

/// A running child process, killed by its PID when stopped or dropped.
pub(crate) struct ChildProcess {
    name: String,
    child: Child,
    pid: u32,
    stderr: Tail,
}

/// The last lines a child wrote to stderr, filled by a task that reads until the pipe closes.
#[derive(Default)]
struct Tail {
    lines: Arc<Mutex<VecDeque<String>>>,
    reader: Option<JoinHandle<()>>,
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
            .kill_on_drop(true)
            .spawn()
            .map_err(spawn_error)?;
        let pid = child.id().unwrap_or_default();
        let stderr = child.stderr.take().map(Tail::follow).unwrap_or_default();
        let stdout = child.stdout.take();
        let mut process = ChildProcess {
            name: name.to_owned(),
            child,
            pid,
            stderr,
        };
        let Some(stdout) = stdout else {
            return Err(process.startup_error("its stdout was not captured").await);
        };
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(deadline, async {
            loop {
                match lines.next_line().await {
                    Ok(Some(line)) if line.contains("http://") => return Some(line),
                    Ok(Some(_)) => continue,
                    Ok(None) | Err(_) => return None,
                }
            }
        })
        .await;
        let line = match first {
            Ok(Some(line)) => line,
            Ok(None) => return Err(process.startup_error("it exited before listening").await),
            Err(_) => {
                let why = format!(
                    "no listening address on its stdout within {}",
                    humantime::format_duration(deadline)
                );
                return Err(process.startup_error(&why).await);
            }
        };
        // Keep reading so that a child writing more to stdout never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
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
        self.child.try_wait().ok().flatten()
    }

    /// An error saying that this child did not start, why, and what it last wrote to stderr.
    /// Kills the child if it is still running.
    pub(crate) async fn startup_error(&mut self, why: &str) -> ReplayError {
        let _ = self.child.start_kill();
        let status = tokio::time::timeout(EXIT_WAIT, self.child.wait()).await;
        let mut detail = why.to_owned();
        if let Ok(Ok(status)) = status {
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
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(EXIT_WAIT, self.child.wait()).await;
    }
}

impl Tail {
    fn follow(pipe: impl AsyncRead + Unpin + Send + 'static) -> Tail {
        let lines = Arc::new(Mutex::new(VecDeque::new()));
        let kept = Arc::clone(&lines);
        let reader = tokio::spawn(async move {
            let mut pipe = BufReader::new(pipe).lines();
            while let Ok(Some(line)) = pipe.next_line().await {
                let mut kept = kept.lock().unwrap_or_else(PoisonError::into_inner);
                if kept.len() == STDERR_TAIL_LINES {
                    kept.pop_front();
                }
                kept.push_back(line);
            }
        });
        Tail {
            lines,
            reader: Some(reader),
        }
    }

    /// The kept lines on one line, once the reader has seen the pipe close (or a deadline).
    async fn finish(&mut self) -> String {
        if let Some(reader) = self.reader.take() {
            let _ = tokio::time::timeout(EXIT_WAIT, reader).await;
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
}
