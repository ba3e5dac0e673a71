//! The one error type of a replay, each variant a one-line message for the binary to print.
//!
//! A replay fails for few reasons and each needs a different reader: bad flags (fix the command
//! line), a process that would not start (read the child's last stderr lines, quoted in the
//! message), a control request the scenario depends on (the mock or gateway misbehaved), or an
//! output file that could not be written. Messages never span lines, so `spillway: MESSAGE` on
//! stderr stays one line.

use std::io;
use std::path::PathBuf;

use crate::plan::Mode;

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The flags describe no runnable replay.
    #[error("invalid replay flags: {0}")]
    InvalidArgs(String),
    /// A child process could not be spawned at all.
    #[error("cannot start {what}: {source}")]
    Spawn {
        what: String,
        #[source]
        source: io::Error,
    },
    /// A child process started but did not become usable before its deadline.
    #[error("{what} did not start: {detail}")]
    Startup { what: String, detail: String },
    /// A request the scenario needs (fault switch, counters) failed.
    #[error("{what}: {detail}")]
    Control { what: String, detail: String },
    /// The scenario's scratch files could not be prepared.
    #[error("cannot prepare {what}: {source}")]
    Scratch {
        what: String,
        #[source]
        source: io::Error,
    },
    /// The scenario's database could not be prepared or cleaned up.
    #[error("replay store: {0}")]
    Store(String),
    /// The JSON figures could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Output {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A mode did not complete; the modes that did were still reported.
    #[error("the {mode} run did not complete: {message}")]
    ModeFailed { mode: String, message: String },
    /// SIGINT or SIGTERM arrived; every child process was killed.
    #[error("interrupted; every process the replay started was stopped")]
    Interrupted,
}

impl ReplayError {
    pub(crate) fn mode_failed(mode: Mode, message: &str) -> ReplayError {
        ReplayError::ModeFailed {
            mode: mode.to_string(),
            message: message.to_owned(),
        }
    }
}

/// `text` on one line: line breaks become ` | `, runs of blank lines vanish.
pub(crate) fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_line_text_becomes_one_line() {
        assert_eq!(one_line("a\n\n  b  \nc\n"), "a | b | c");
        assert_eq!(one_line(""), "");
    }
}
