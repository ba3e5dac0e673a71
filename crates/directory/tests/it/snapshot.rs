//! Warm restarts: a snapshot saved by one directory serves a new one at once, without the
//! store, with its refreshes spread over the TTL and answers too old to serve dropped.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use spillway_config::CacheConfig;
use spillway_directory::snapshot::{SnapshotEntry, SnapshotFile, VERSION};
use spillway_directory::Outcome;
use tokio::time::Instant;

use crate::support::{digest, directory, key_match, FakeStore, TempDir};

fn with_snapshot(dir: &TempDir, ttl: Duration) -> CacheConfig {
    CacheConfig {
        ttl,
        stale_for: Duration::from_secs(600),
        snapshot: Some(dir.0.join("cache").join("keys.json")),
        ..CacheConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_serves_a_new_directory_without_any_store_query() {
    let tmp = TempDir::new("snapshot");
    let config = with_snapshot(&tmp, Duration::from_secs(86_400));
    let first_store = FakeStore::with_keys(20, "acme");
    let first = directory(&first_store, config.clone()).await;
    for i in 0..20 {
        first.lookup(&digest(i)).await.unwrap();
    }
    dir_has_no_temp_files(&tmp);
    assert_eq!(first.save_snapshot().await.unwrap(), 20);
    dir_has_no_temp_files(&tmp);

    // The new instance's store is down: everything it serves comes from the snapshot.
    let second_store = FakeStore::new();
    second_store.set_failing(true);
    let second = directory(&second_store, config).await;
    assert!(!second.is_warm());
    assert_eq!(second.load_snapshot().await.unwrap(), 20);
    assert!(second.is_warm());
    for i in 0..20 {
        let found = second.lookup(&digest(i)).await.unwrap();
        assert_eq!(found.outcome, Outcome::Fresh);
        assert_eq!(*found.found.unwrap(), key_match(i, "acme"));
    }
    assert_eq!(second_store.lookups(), 0);
}

fn dir_has_no_temp_files(tmp: &TempDir) {
    let Ok(files) = std::fs::read_dir(tmp.0.join("cache")) else {
        return;
    };
    for f in files {
        let name = f.unwrap().file_name().to_string_lossy().into_owned();
        assert!(!name.contains(".tmp-"), "left behind: {name}");
    }
}

#[tokio::test(start_paused = true)]
async fn restored_entries_fall_due_spread_over_the_ttl() {
    let tmp = TempDir::new("spread");
    let ttl = Duration::from_secs(1);
    let store = FakeStore::with_keys(200, "acme");
    let first = directory(&store, with_snapshot(&tmp, ttl)).await;
    for i in 0..200 {
        first.lookup(&digest(i)).await.unwrap();
    }
    first.save_snapshot().await.unwrap();

    let down = FakeStore::new();
    down.set_failing(true);
    let second = directory(&down, with_snapshot(&tmp, ttl)).await;
    let loaded_at = Instant::now();
    assert_eq!(second.load_snapshot().await.unwrap(), 200);
    tokio::time::sleep(ttl / 2).await; // half a TTL later ...
    let (mut fresh, mut stale) = (0, 0);
    for i in 0..200 {
        match second.lookup(&digest(i)).await.unwrap().outcome {
            Outcome::Fresh => fresh += 1,
            Outcome::Stale => stale += 1,
            other => panic!("{other:?}"),
        }
    }
    // ... about half are due: not none, not all (as they would be with one fixed TTL).
    let elapsed = loaded_at.elapsed();
    assert!(
        fresh >= 20 && stale >= 20,
        "fresh {fresh}, stale {stale} after {elapsed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_drops_answers_older_than_ttl_plus_stale_for() {
    let tmp = TempDir::new("old");
    let config = with_snapshot(&tmp, Duration::from_secs(30));
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let mut entries = BTreeMap::new();
    for (i, age_s) in [(0u64, 5u64), (1, 300), (2, 625), (3, 631), (4, 86_400)] {
        let entry = SnapshotEntry {
            fetched_at_ms: now_ms - age_s * 1_000,
            key_match: key_match(i, "acme"),
        };
        entries.insert(hex::encode(digest(i)), entry);
    }
    entries.insert(
        "not-a-digest".into(),
        SnapshotEntry {
            fetched_at_ms: now_ms,
            key_match: key_match(9, "acme"),
        },
    );
    let file = SnapshotFile {
        version: VERSION,
        saved_at_ms: now_ms,
        entries,
    };
    let path = config.snapshot.clone().unwrap();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, serde_json::to_vec(&file).unwrap()).unwrap();

    let store = FakeStore::new();
    store.set_failing(true);
    let dir = directory(&store, config).await;
    assert_eq!(dir.load_snapshot().await.unwrap(), 3);
    for i in 0..3 {
        assert!(
            dir.lookup(&digest(i)).await.unwrap().found.is_some(),
            "key {i}"
        );
    }
    for i in 3..5 {
        assert!(
            dir.lookup(&digest(i)).await.is_err(),
            "key {i} was too old to serve"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_snapshot_path_or_file_is_not_an_error() {
    let store = FakeStore::new();
    let dir = directory(&store, CacheConfig::default()).await;
    assert_eq!(dir.save_snapshot().await.unwrap(), 0);
    assert_eq!(dir.load_snapshot().await.unwrap(), 0);
    let tmp = TempDir::new("absent");
    let dir = directory(&store, with_snapshot(&tmp, Duration::from_secs(30))).await;
    assert_eq!(dir.load_snapshot().await.unwrap(), 0);
    assert!(!dir.is_warm());
}
