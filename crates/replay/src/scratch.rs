//! Scratch directories: where a run writes its gateway's config and SQLite store.
//!
//! Each run gets a directory of its own under the system's temporary directory, named by this
//! process and the time, and removed when the run drops it, so runs never see each other's
//! files and a replay leaves nothing behind.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::ReplayError;

/// A directory of this process's own, removed when dropped.
pub(crate) struct Scratch {
    pub(crate) path: PathBuf,
}

impl Scratch {
    pub(crate) fn create(mode: impl std::fmt::Display) -> Result<Scratch, ReplayError> {
        let path = std::env::temp_dir().join(format!(
            "spillway-replay-{}-{mode}-{}",
            std::process::id(),
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default()
        ));
        std::fs::create_dir(&path).map_err(|source| ReplayError::Scratch {
            what: path.display().to_string(),
            source,
        })?;
        Ok(Scratch { path })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
