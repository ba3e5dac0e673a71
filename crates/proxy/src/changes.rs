//! What a running gateway knows of where its config comes from: the checked config as read
//! (`Loaded`), what `serve` started with (`Startup`), and the state of its changes (`Changes`):
//! one reload at a time, the last reload's answer, the anomalies seen. The reloads themselves
//! are `reload/`'s; this file is what the gateway holds, below both.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::SystemTime;

use serde::Serialize;
use sha2::Digest;
use spillway_config::{Config, ConfigError};

use crate::live::Source;
use crate::pool::Rebuilt;

/// The largest config file read (a config is a few KiB; this leaves room for thousands of
/// backends while a runaway file cannot take the gateway's memory).
pub const MAX_CONFIG_BYTES: u64 = 4 * 1024 * 1024;

/// A configuration read and checked: what `serve` starts with, and what a reload puts in place.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    /// The file's text, kept to be saved as last-known-good.
    pub text: Arc<str>,
    /// The SHA-256 of the text, in hex.
    pub hash: String,
}

impl Loaded {
    /// Checks `text` as `spillway check-config` does, the environment variables it names
    /// included, and fills in the URLs it names environment variables for.
    pub fn from_text(text: String) -> Result<Loaded, ConfigError> {
        let mut config = Config::from_toml(&text)?;
        let env = |name: &str| std::env::var(name).ok();
        let problems = crate::preflight::preflight(&config, Some(&env));
        if !problems.is_empty() {
            return Err(ConfigError::Invalid(problems));
        }
        // Checked by the preflight just above, so nothing is left to report.
        crate::preflight::resolve_secrets(&mut config, &env);
        Ok(Loaded {
            config,
            hash: hash(text.as_bytes()),
            text: text.into(),
        })
    }

    /// Reads and checks the file at `path` (at most [`MAX_CONFIG_BYTES`]).
    pub fn from_file(path: &Path) -> Result<Loaded, ConfigError> {
        Loaded::from_text(read_config(path)?)
    }
}

/// The text of the config file at `path`, at most [`MAX_CONFIG_BYTES`].
pub(crate) fn read_config(path: &Path) -> Result<String, ConfigError> {
    let read = |source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    };
    let bytes = crate::files::read_capped(path, MAX_CONFIG_BYTES).map_err(read)?;
    String::from_utf8(bytes).map_err(|_| read(std::io::Error::other("not UTF-8 text")))
}

/// The SHA-256 of a config's bytes, in hex, as `sha256sum` prints it.
pub fn hash(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What `serve` starts with.
pub struct Startup {
    pub loaded: Loaded,
    /// The file it was read from; `None` for the built-in quickstart.
    pub path: Option<PathBuf>,
    /// Whether `loaded` is the saved last-known-good config, the file having failed its checks.
    pub last_known_good: bool,
    /// `--listen` and `--admin-listen`, which win over the file's at start and at every reload.
    pub listen: Option<SocketAddr>,
    pub admin_listen: Option<SocketAddr>,
    /// Where the gateway keeps its own state (the last-known-good config).
    pub data_dir: PathBuf,
}

impl Startup {
    /// The config to start with, the command line's listeners applied.
    pub(crate) fn config(&self) -> Config {
        let mut config = self.loaded.config.clone();
        self.apply_overrides(&mut config);
        config
    }

    pub(crate) fn apply_overrides(&self, config: &mut Config) {
        config.server.listen = self.listen.unwrap_or(config.server.listen);
        config.server.admin_listen = self.admin_listen.unwrap_or(config.server.admin_listen);
    }

    pub(crate) fn source(&self) -> Source {
        Source {
            hash: self.loaded.hash.clone(),
            text: self.loaded.text.clone(),
            loaded_at: SystemTime::now(),
            path: self.path.as_ref().map(|p| p.display().to_string()),
            last_known_good: self.last_known_good,
        }
    }
}

/// A running gateway's means of changing its config: one reload at a time.
pub(crate) struct Changes {
    pub(crate) startup: Startup,
    /// Held by the reload under way.
    pub(crate) lock: tokio::sync::Mutex<()>,
    /// The last reload's answer.
    pub(crate) last: Mutex<Option<Outcome>>,
    /// The hash of the file's content as a reload or the watch last read it: the watch acts
    /// only on a content nobody has read yet.
    pub(crate) seen: Mutex<Option<String>>,
    /// Anomalies seen (4xx jumps, halted rollouts): a config is last-known-good only after a
    /// stretch without one.
    anomalies: Arc<AtomicU64>,
}

impl Changes {
    pub(crate) fn new(startup: Startup) -> Changes {
        Changes {
            startup,
            lock: tokio::sync::Mutex::new(()),
            last: Mutex::new(None),
            seen: Mutex::new(None),
            anomalies: Arc::default(),
        }
    }

    /// Notes that the file's content with `hash` was read.
    pub(crate) fn saw(&self, hash: String) {
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(hash);
    }

    /// The hash of the file's content as last read, if it was.
    pub(crate) fn seen(&self) -> Option<String> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn data_dir(&self) -> &Path {
        &self.startup.data_dir
    }

    pub(crate) fn path(&self) -> Option<&Path> {
        self.startup.path.as_deref()
    }

    /// The count of anomalies, for those who see them (halted rollouts, 4xx jumps).
    pub(crate) fn anomaly_counter(&self) -> Arc<AtomicU64> {
        self.anomalies.clone()
    }

    pub(crate) fn anomalies(&self) -> u64 {
        self.anomalies.load(Ordering::Relaxed)
    }

    pub(crate) fn last(&self) -> Option<Outcome> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// How a reload ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Ended {
    /// The new config is in place.
    Applied,
    /// The config is the one running: nothing to do.
    Unchanged,
    /// Nothing changed; `problems` say why.
    Rejected,
}

impl Ended {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Ended::Applied => "applied",
            Ended::Unchanged => "unchanged",
            Ended::Rejected => "rejected",
        }
    }
}

/// A reload's answer, as the admin API and `spillway reload` show it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Outcome {
    pub result: Ended,
    /// The hash of the config that was read (absent when it could not be read).
    pub hash: Option<String>,
    /// The hash of the config running after the reload.
    pub running: String,
    /// Why it was rejected, one line each.
    pub problems: Vec<String>,
    /// Settings that differ but keep their running values until a restart.
    pub restart_required: Vec<String>,
    #[serde(flatten)]
    pub rebuilt: Rebuilt,
}
