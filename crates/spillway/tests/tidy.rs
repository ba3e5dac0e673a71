//! Repository rules written as tests, so they hold without anyone remembering them.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};

fn rust_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn workspace_sources() -> Vec<PathBuf> {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for krate in std::fs::read_dir(&crates).unwrap() {
        let src = krate.unwrap().path().join("src");
        if src.is_dir() {
            rust_sources(&src, &mut files);
        }
    }
    assert!(files.len() > 10, "found only {files:?}");
    files
}

/// Unit-test files beside a module (`foo/tests.rs`, `tests.rs`) document themselves through the
/// module they test.
fn is_test_file(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n == "tests.rs")
}

#[test]
fn every_module_opens_with_a_doc_comment_saying_why_it_exists() {
    let missing: Vec<_> = workspace_sources()
        .into_iter()
        .filter(|p| !is_test_file(p))
        .filter(|p| {
            !std::fs::read_to_string(p)
                .unwrap()
                .trim_start()
                .starts_with("//!")
        })
        .collect();
    assert!(
        missing.is_empty(),
        "modules without a `//!` doc: {missing:#?}"
    );
}

#[test]
fn policy_crate_never_depends_on_an_async_runtime_or_io() {
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../policy/Cargo.toml"))
            .unwrap();
    let deps: String = manifest
        .split("\n[")
        .filter(|section| section.starts_with("dependencies]"))
        .collect();
    assert!(
        deps.contains("rand"),
        "found the dependencies section: {deps}"
    );
    for forbidden in ["tokio", "hyper", "axum", "reqwest", "spillway-"] {
        assert!(
            !deps.contains(forbidden),
            "policy must stay pure, but it depends on {forbidden}"
        );
    }
}

#[test]
fn source_files_stay_short() {
    let long: Vec<_> = workspace_sources()
        .into_iter()
        .filter(|p| !is_test_file(p))
        .filter_map(|p| {
            let lines = std::fs::read_to_string(&p).unwrap().lines().count();
            (lines > 600).then_some((p, lines))
        })
        .collect();
    assert!(
        long.is_empty(),
        "split these files (over 600 lines): {long:#?}"
    );
}

/// What marks a file as an SQLite database or one of its companions: its name, or the first
/// bytes of a database ("SQLite format 3\0") or of its write-ahead log (two magic numbers).
fn is_database(path: &str, head: &[u8]) -> bool {
    let by_name = [
        ".db",
        ".db-wal",
        ".db-shm",
        ".db-journal",
        ".sqlite",
        ".sqlite3",
    ]
    .iter()
    .any(|ext| path.ends_with(ext));
    let wal_magic = [[0x37, 0x7f, 0x06, 0x82], [0x37, 0x7f, 0x06, 0x83]];
    by_name
        || head.starts_with(b"SQLite format 3\0")
        || wal_magic.iter().any(|m| head.starts_with(m))
}

/// A database left by a run (the default store is `spillway-data/spillway.db` in the working
/// directory, and tests run the binary in their crate's) must never be committed: it is state,
/// not source, and may hold tenants and key digests.
#[test]
fn no_database_file_is_tracked() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let listed = std::process::Command::new("git")
        .arg("-C")
        .arg(&root)
        .args(["ls-files", "-z"])
        .output()
        .expect("git runs");
    assert!(listed.status.success(), "git ls-files failed: {listed:?}");
    let files: Vec<&str> = std::str::from_utf8(&listed.stdout)
        .unwrap()
        .split('\0')
        .filter(|f| !f.is_empty())
        .collect();
    assert!(files.len() > 10, "found only {files:?}");
    let tracked: Vec<&str> = files
        .into_iter()
        .filter(|f| {
            let mut head = [0u8; 16];
            let read = std::fs::File::open(root.join(f))
                .and_then(|mut file| std::io::Read::read(&mut file, &mut head))
                .unwrap_or(0);
            is_database(f, &head[..read])
        })
        .collect();
    assert!(
        tracked.is_empty(),
        "database files are tracked (git rm --cached them): {tracked:#?}"
    );
}

#[test]
fn databases_are_told_by_name_and_by_header() {
    assert!(is_database(
        "crates/spillway/spillway-data/spillway.db",
        b""
    ));
    assert!(is_database("x/spillway.db-wal", b""));
    assert!(is_database("x/spillway.db-shm", b""));
    assert!(is_database("data/keys.bin", b"SQLite format 3\0\x10\x00"));
    assert!(is_database("data/log", &[0x37, 0x7f, 0x06, 0x82, 0, 0]));
    assert!(!is_database(
        "crates/store/migrations/sqlite/0001_init.sql",
        b"CREATE TABLE"
    ));
    assert!(!is_database("docs/database.md", b"# Databases"));
}

/// In spillway-replay, `scenarios/mod.rs` lists the scenarios and the modules beside
/// `scenarios/` are what they share: a shared module that imported the list, or a scenario that
/// reached into another (or back into the list), would make the import loop this layout removed.
#[test]
fn replay_shared_modules_never_import_a_scenario_nor_scenarios_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../replay/src");
    let scenarios = src.join("scenarios");
    let mut files = Vec::new();
    rust_sources(&src, &mut files);
    assert!(
        files.iter().any(|p| p.starts_with(&scenarios)),
        "{files:#?}"
    );
    let offending: Vec<_> = files
        .into_iter()
        .filter(|p| {
            let text = std::fs::read_to_string(p).unwrap();
            let names_the_list = text.contains("crate::scenarios");
            if p.starts_with(&scenarios) {
                names_the_list || text.contains("super::super")
            } else {
                names_the_list
            }
        })
        .collect();
    assert!(
        offending.is_empty(),
        "these replay modules import a scenario or the list of them: {offending:#?}"
    );
}
