//! Repository rules written as tests, so they hold without anyone remembering them.

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
