//! The cache saved to disk, so that a restart begins warm instead of with a stampede.
//!
//! A restarted (or newly deployed) instance with an empty cache is IL-0136's flush again: every
//! key misses at once. With a snapshot, the answers it held are usable the moment it starts,
//! even if the store is down. Their `fresh_until` is spread uniformly over `[now, now + ttl]`
//! so that their refreshes trickle in over one TTL instead of falling due together; answers
//! older than `ttl + stale_for` are dropped, exactly as they would have expired in memory.
//!
//! The file is JSON: `{"version": 1, "saved_at_ms": .., "entries": {"<hex digest>":
//! {"fetched_at_ms": .., "key_match": {..}}}}`. It is written to a temporary file beside the
//! target and renamed over it, so a reader never sees half a file; on Unix it is readable by
//! its owner only. It holds digests and tenant settings, never a key's secret.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use spillway_store::{KeyDigest, KeyMatch};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::entry::Entry;
use crate::freshness;
use crate::state::State;
use crate::{unix_ms, DirectoryError};

pub const VERSION: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
pub struct SnapshotFile {
    pub version: u32,
    pub saved_at_ms: u64,
    pub entries: BTreeMap<String, SnapshotEntry>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct SnapshotEntry {
    /// Unix ms at which the store query that produced it started.
    pub fetched_at_ms: u64,
    pub key_match: KeyMatch,
}

pub(crate) async fn save(state: &State) -> Result<u64, DirectoryError> {
    let Some(path) = state.config.snapshot.clone() else {
        return Ok(0);
    };
    let now = Instant::now();
    let epoch = state.epoch.load(Ordering::SeqCst);
    // Answers awaiting revalidation after a flush are left out: the flush asked for them to
    // be read again, and a restart should not undo that.
    let entries: BTreeMap<String, SnapshotEntry> = state
        .known
        .iter()
        .filter(|(_, e)| e.epoch == epoch && e.usable(now))
        .map(|(digest, e)| {
            let entry = SnapshotEntry {
                fetched_at_ms: e.fetched_at_ms,
                key_match: (*e.found).clone(),
            };
            (hex::encode(*digest), entry)
        })
        .collect();
    let count = entries.len() as u64;
    let file = SnapshotFile {
        version: VERSION,
        saved_at_ms: unix_ms(),
        entries,
    };
    let target = path.clone();
    tokio::task::spawn_blocking(move || write_atomically(&target, &file))
        .await
        .map_err(|e| failed(&path, format!("writer task: {e}")))?
        .map_err(|e| failed(&path, e))?;
    info!(entries = count, path = %path.display(), "key cache snapshot saved");
    Ok(count)
}

pub(crate) async fn load(state: &State) -> Result<u64, DirectoryError> {
    let Some(path) = state.config.snapshot.clone() else {
        return Ok(0);
    };
    let source = path.clone();
    let read = tokio::task::spawn_blocking(move || read(&source))
        .await
        .map_err(|e| failed(&path, format!("reader task: {e}")))?
        .map_err(|e| failed(&path, e))?;
    let Some(file) = read else {
        info!(path = %path.display(), "no key cache snapshot yet");
        return Ok(0);
    };
    if file.version != VERSION {
        return Err(failed(
            &path,
            format!("version {} is not {VERSION}", file.version),
        ));
    }
    let c = &state.config;
    let now = Instant::now();
    let now_ms = unix_ms();
    let epoch = state.epoch.load(Ordering::SeqCst);
    let seq = state.invalidations.load(Ordering::SeqCst);
    let (mut loaded, mut too_old, mut unreadable) = (0u64, 0u64, 0u64);
    for (hex_digest, saved) in file.entries {
        let Some(digest) = parse_digest(&hex_digest) else {
            unreadable += 1;
            continue;
        };
        let age = freshness::age_ms(now_ms, saved.fetched_at_ms);
        let Some(window) = freshness::restored_window(now, age, c.ttl, c.stale_for, rand::random())
        else {
            too_old += 1;
            continue;
        };
        // An answer already loaded since start is newer than the snapshot's.
        if state.known.contains_key(&digest) {
            continue;
        }
        let entry = Entry::new(
            Arc::new(saved.key_match),
            window,
            saved.fetched_at_ms,
            epoch,
        );
        if state.insert_known(&digest, Arc::new(entry), seq) {
            loaded += 1;
        }
    }
    if unreadable > 0 {
        warn!(
            unreadable,
            "key cache snapshot: entries with a malformed digest skipped"
        );
    }
    if loaded > 0 {
        state.warm.store(true, Ordering::Release);
    }
    info!(loaded, too_old, path = %path.display(), "key cache snapshot loaded");
    Ok(loaded)
}

fn parse_digest(hex_digest: &str) -> Option<KeyDigest> {
    let bytes = hex::decode(hex_digest).ok()?;
    bytes.try_into().ok()
}

fn read(path: &Path) -> Result<Option<SnapshotFile>, String> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| format!("unreadable: {e}"))
}

fn write_atomically(path: &Path, file: &SnapshotFile) -> Result<(), String> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let name = path
        .file_name()
        .map_or_else(|| "snapshot".into(), |n| n.to_string_lossy().into_owned());
    let temp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut out =
            open_private(&temp).map_err(|e| format!("creating {}: {e}", temp.display()))?;
        let json = serde_json::to_vec(file).map_err(|e| e.to_string())?;
        out.write_all(&json).map_err(|e| e.to_string())?;
        out.sync_all().map_err(|e| e.to_string())?;
        fs::rename(&temp, path).map_err(|e| format!("renaming into place: {e}"))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    } else if let Ok(d) = fs::File::open(&dir) {
        // The rename is durable once the directory is synced; best effort.
        let _ = d.sync_all();
    }
    result
}

fn open_private(path: &Path) -> std::io::Result<fs::File> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)
}

fn failed(path: &Path, reason: impl Into<String>) -> DirectoryError {
    DirectoryError::Snapshot {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_round_trip_and_bad_ones_are_refused() {
        let d = [0x5au8; 32];
        assert_eq!(parse_digest(&hex::encode(d)), Some(d));
        assert_eq!(parse_digest("zz"), None);
        assert_eq!(parse_digest("abcd"), None);
    }

    #[test]
    fn a_missing_file_is_no_snapshot_and_garbage_is_an_error() {
        let dir = std::env::temp_dir().join(format!("spillway-snap-unit-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        assert!(read(&dir.join("absent.json")).unwrap().is_none());
        let bad = dir.join("bad.json");
        fs::write(&bad, b"{not json").unwrap();
        assert!(read(&bad).is_err());
        let _ = fs::remove_dir_all(&dir);
    }
}
