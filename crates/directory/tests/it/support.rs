//! Small helpers shared by the directory's black-box tests. The fake store that counts its
//! queries (and can be made slow or failing) is `spillway_testkit::FakeStore`, which the
//! directory's own unit tests use too; polling with a deadline is `spillway_testkit::eventually`.

use std::sync::Arc;
use std::time::Duration;

use spillway_config::CacheConfig;
use spillway_directory::Directory;
use spillway_store::{KeyDigest, Store};

/// A digest no other test run uses (for Redis, which outlives a test).
pub fn random_digest() -> KeyDigest {
    rand::random()
}

pub use spillway_testkit::{digest, key_match, FakeStore};

pub async fn directory(store: &Arc<FakeStore>, config: CacheConfig) -> Arc<Directory> {
    let store: Arc<dyn Store> = store.clone();
    Arc::new(Directory::new(store, config).await.unwrap())
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A fresh directory under the system's temporary directory, removed on drop.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new(label: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "spillway-directory-{label}-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
