//! The gateway's own files: read under a size cap, written whole or not at all.
//!
//! The config file, the last-known-good config and the rollout states are read by the running
//! gateway, so a runaway file must not take its memory: every read stops past its cap and says
//! so. The files it writes itself are written to a temporary file, flushed and renamed over the
//! old one, so a crash mid-write leaves the previous one whole, never a torn one.

use std::io::{Read, Write};
use std::path::Path;

/// The bytes of the file at `path`, or why not: an I/O error, or larger than `max` bytes.
pub(crate) fn read_capped(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(max + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::other(format!("larger than {max} bytes")));
    }
    Ok(bytes)
}

/// Like [`read_capped`], `None` when there is no file; errors name the path.
pub(crate) fn read_if_there(path: &Path, max: u64) -> Result<Option<Vec<u8>>, String> {
    match read_capped(path, max) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Writes `bytes` as `dir/name`, creating `dir`: whole or not at all.
pub(crate) fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!("{name}.tmp"));
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, dir.join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_past_its_cap_is_refused_and_a_missing_one_is_none() {
        let dir = std::env::temp_dir().join(format!("spillway-files-{}", rand::random::<u64>()));
        write_atomically(&dir, "f", b"12345").unwrap();
        assert_eq!(read_capped(&dir.join("f"), 5).unwrap(), b"12345");
        let e = read_capped(&dir.join("f"), 4).unwrap_err();
        assert!(e.to_string().contains("larger than 4 bytes"), "{e}");
        assert_eq!(read_if_there(&dir.join("none"), 4), Ok(None));
        assert!(!dir.join("f.tmp").exists());
        std::fs::remove_dir_all(&dir).ok();
    }
}
