//! The last-known-good config, kept in the data directory.
//!
//! IL-0235's follow-ups include keeping validated routing information for when fresh information
//! cannot be had. Here that is the last config that served for `reload.last_known_good_after`
//! without an anomaly: its text and its hash in one file, `last-known-good.json`, written to a
//! temporary file, flushed and renamed over the old one, so a crash mid-write leaves the previous
//! one whole. It is read back only through the same checks as any config, and only when its text
//! still has the hash it was saved with.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::Loaded;

/// The file's name in the data directory.
pub const FILE: &str = "last-known-good.json";

/// Saved files larger than this are not read back: the config and its JSON escaping.
const MAX_BYTES: u64 = 2 * super::MAX_CONFIG_BYTES;

/// What is saved.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Saved {
    /// The SHA-256 of `text`, in hex.
    pub hash: String,
    /// When it was saved, in seconds since the Unix epoch.
    pub saved_at: f64,
    /// The file it was read from, if any.
    pub source: Option<String>,
    /// The config itself, as it was read.
    pub text: String,
}

/// Where the last-known-good config of `dir` is.
pub fn path(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

/// Saves `text` (whose hash is `hash`) as the last-known-good config in `dir`.
pub(crate) fn save(
    dir: &Path,
    text: &str,
    hash: &str,
    source: Option<&str>,
) -> std::io::Result<()> {
    let saved = Saved {
        hash: hash.to_owned(),
        saved_at: SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
        source: source.map(str::to_owned),
        text: text.to_owned(),
    };
    let bytes = serde_json::to_vec_pretty(&saved).map_err(std::io::Error::other)?;
    crate::files::write_atomically(dir, FILE, &bytes)
}

/// What is saved in `dir`, unchecked; `None` when nothing is.
pub fn read(dir: &Path) -> Result<Option<Saved>, String> {
    let at = path(dir);
    let Some(bytes) = crate::files::read_if_there(&at, MAX_BYTES)? else {
        return Ok(None);
    };
    let saved: Saved = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{}: not a saved config: {e}", at.display()))?;
    if super::hash(saved.text.as_bytes()) != saved.hash {
        return Err(format!(
            "{}: the config does not have the hash it was saved with",
            at.display()
        ));
    }
    Ok(Some(saved))
}

/// The last-known-good config of `dir`, checked as any config is; `None` when none is saved.
pub fn load(dir: &Path) -> Result<Option<(Loaded, Saved)>, String> {
    let Some(saved) = read(dir)? else {
        return Ok(None);
    };
    let loaded = Loaded::from_text(saved.text.clone()).map_err(|e| {
        format!(
            "{}: the saved config no longer passes its checks: {e}",
            path(dir).display()
        )
    })?;
    Ok(Some((loaded, saved)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str =
        "[[models]]\nname = \"m\"\n[[models.backends]]\nname = \"a\"\nkind = \"mock\"\n";

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "spillway-saved-{}-{}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&d).expect("temp dir");
        d
    }

    #[test]
    fn a_saved_config_loads_back_with_its_hash() {
        let d = dir();
        assert!(load(&d).expect("nothing saved is not an error").is_none());
        let hash = super::super::hash(TEXT.as_bytes());
        save(&d, TEXT, &hash, Some("/etc/spillway.toml")).expect("saved");
        let (loaded, saved) = load(&d).expect("readable").expect("saved");
        assert_eq!(loaded.hash, hash);
        assert_eq!(saved.source.as_deref(), Some("/etc/spillway.toml"));
        assert_eq!(loaded.config.models[0].name, "m");
        std::fs::remove_dir_all(&d).ok();
    }

    #[test]
    fn a_tampered_or_broken_file_is_refused_not_served() {
        let d = dir();
        let hash = super::super::hash(TEXT.as_bytes());
        save(&d, TEXT, &hash, None).expect("saved");
        let edited = std::fs::read_to_string(path(&d))
            .expect("readable")
            .replace("name = \\\"m\\\"", "name = \\\"n\\\"");
        std::fs::write(path(&d), edited).expect("written");
        let e = load(&d).expect_err("a text that lost its hash is refused");
        assert!(e.contains("does not have the hash"), "{e}");
        std::fs::write(path(&d), "{ not json").expect("written");
        let e = load(&d).expect_err("garbage is refused");
        assert!(e.contains("not a saved config"), "{e}");
        std::fs::remove_dir_all(&d).ok();
    }
}
