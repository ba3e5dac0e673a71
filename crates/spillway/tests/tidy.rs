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

/// The list of functions the release link lays out first (`build.rs`) holds symbol names as the
/// linker knows them (mangled, one a line, each once): a demangled name would be
/// passed over without a word, and the list would order nothing.
#[test]
fn the_hot_symbol_list_holds_mangled_names_each_once() {
    let list =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("hot-symbols.txt"))
            .expect("crates/spillway/hot-symbols.txt");
    let names: Vec<&str> = list.lines().collect();
    assert!(names.len() > 100, "only {} names", names.len());
    let mut seen = std::collections::HashSet::new();
    for name in &names {
        // Rust's mangled names (`_ZN...E`, the standard library's `_R...`) and C's plain ones.
        assert!(
            !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_$.".contains(&b)),
            "not a symbol name: {name:?}"
        );
        assert!(seen.insert(name), "listed twice: {name}");
    }
    // The request path's own stages are on it.
    for stage in [
        "7handler6handle",
        "9admission9Admission5admit",
        "7attempt4Loop3run",
    ] {
        assert!(
            names.iter().any(|n| n.contains(stage)),
            "no function of {stage} is listed"
        );
    }
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

/// The module path (`["upstream", "h1", "names"]`) of a source file under `src`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut path: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(path.last().map(String::as_str), Some("mod" | "lib")) {
        path.pop();
    }
    path
}

/// The paths a file's code names through `crate::`, `super::` and `self::` (comments and its
/// inline test module left out), each as a module path from the crate's root, `use` trees
/// (`crate::a::{b, c::d}`) taken apart.
fn named_paths(text: &str, module: &[String]) -> Vec<Vec<String>> {
    let code: String = text
        .split("#[cfg(test)]\nmod tests")
        .next()
        .unwrap()
        .lines()
        .map(|l| l.split("//").next().unwrap())
        .collect::<Vec<_>>()
        .join("\n");
    // Read as bytes: a path is ASCII, and no slice then falls inside a character.
    let code = code.as_bytes();
    let mut found = Vec::new();
    let mut at = 0;
    while at < code.len() {
        let word_before = at > 0 && is_word(code[at - 1]);
        let rest = &code[at..];
        let (base, skip) = if word_before {
            (None, 0)
        } else if rest.starts_with(b"crate::") {
            (Some(Vec::new()), b"crate::".len())
        } else if rest.starts_with(b"self::") {
            (Some(module.to_vec()), b"self::".len())
        } else {
            // `super` from a file is its module's parent (a `mod.rs` is its folder's module).
            let levels = rest
                .chunks(b"super::".len())
                .take_while(|c| *c == b"super::")
                .count();
            let up = module[..module.len().saturating_sub(levels)].to_vec();
            ((levels > 0).then_some(up), levels * b"super::".len())
        };
        match base {
            Some(base) => at += skip + use_tree(&code[at + skip..], base, &mut found),
            None => at += 1,
        }
    }
    found
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Reads a path (or a `use` tree) at the start of `text` below `base` into `found`; returns how
/// many bytes it took.
fn use_tree(text: &[u8], mut path: Vec<String>, found: &mut Vec<Vec<String>>) -> usize {
    let mut at = 0;
    loop {
        let start = at;
        while at < text.len() && is_word(text[at]) {
            at += 1;
        }
        if at > start {
            path.push(String::from_utf8_lossy(&text[start..at]).into_owned());
        }
        if text[at..].starts_with(b"::{") {
            at += 3;
            loop {
                while at < text.len() && matches!(text[at], b' ' | b'\n' | b',') {
                    at += 1;
                }
                if at >= text.len() || text[at] == b'}' {
                    return at + 1;
                }
                // At least a byte a turn, so text that is no path cannot hold the reader.
                at += use_tree(&text[at..], path.clone(), found).max(1);
            }
        }
        if text[at..].starts_with(b"::") && at > start {
            at += 2;
            continue;
        }
        found.push(path);
        return at;
    }
}

/// The modules of crate `name` (its folder under `crates/`) that import each other in a loop, a
/// file that names another through a path importing it; `(files, imports)` read too.
fn import_loops(name: &str) -> (Vec<String>, (usize, usize)) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(name)
        .join("src");
    let mut files = Vec::new();
    rust_sources(&src, &mut files);
    files.retain(|p| {
        let name = p.file_name().unwrap().to_string_lossy();
        !(name == "tests.rs" || name.ends_with("_tests.rs"))
    });
    let modules: Vec<Vec<String>> = files.iter().map(|f| module_of(&src, f)).collect();
    let index_of = |path: &[String]| -> Option<usize> {
        (0..=path.len())
            .rev()
            .find_map(|n| modules.iter().position(|m| m.as_slice() == &path[..n]))
    };
    let edges: Vec<Vec<usize>> = files
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let text = std::fs::read_to_string(f).unwrap();
            let mut to: Vec<usize> = named_paths(&text, &modules[i])
                .iter()
                .filter_map(|p| index_of(p))
                .filter(|&j| j != i && !modules[j].is_empty())
                .collect();
            to.sort_unstable();
            to.dedup();
            to
        })
        .collect();
    // A file is in a loop when it reaches itself.
    let in_loops = (0..files.len())
        .filter(|&start| {
            let mut seen = vec![false; files.len()];
            let mut stack = edges[start].clone();
            while let Some(n) = stack.pop() {
                if n == start {
                    return true;
                }
                if !std::mem::replace(&mut seen[n], true) {
                    stack.extend(&edges[n]);
                }
            }
            false
        })
        .map(|i| modules[i].join("::"))
        .collect();
    let imports = edges.iter().map(Vec::len).sum();
    (in_loops, (files.len(), imports))
}

/// Architecture invariant of ARCHITECTURE.md: no import loops between the files of
/// `crates/proxy` nor of `crates/replay`.
#[test]
fn no_import_loops_between_the_files_of_the_proxy_and_replay_crates() {
    for name in ["proxy", "replay"] {
        let (in_loops, (files, imports)) = import_loops(name);
        assert!(
            files > 20 && imports > 40,
            "read too little of crates/{name}: {files} files, {imports} imports"
        );
        assert!(
            in_loops.is_empty(),
            "these modules of crates/{name} import each other in a loop: {in_loops:#?}"
        );
    }
}
