//! Each rule finds its problem in its fixture (`tests/fixtures/RULE.yaml` or `RULE.toml`), and
//! nothing else there; the shipped manifests and examples audit clean; docs/audit.md lists the
//! same table; input that cannot be audited is an error, never a clean report.

use std::path::{Path, PathBuf};

use spillway_audit::{audit, Sources, RULES};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The rule ids found in `path`, a config (`.toml`) or manifests (`.yaml`).
fn found_in(path: &Path) -> Vec<&'static str> {
    let sources = if path.extension().is_some_and(|e| e == "toml") {
        Sources::load(Some(path), &[])
    } else {
        Sources::load(None, &[path.to_owned()])
    }
    .unwrap_or_else(|e| panic!("{e}"));
    audit(&sources)
        .unwrap_or_else(|e| panic!("{e}"))
        .iter()
        .map(|f| f.rule.id)
        .collect()
}

/// The `# expect: N` line of a fixture: how many findings it holds.
fn expected(path: &Path) -> usize {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("# expect: "))
        .unwrap_or_else(|| panic!("{} has no `# expect: N` line", path.display()))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn every_rule_finds_its_problem_in_its_fixture_and_nothing_else() {
    for rule in RULES {
        let path = ["yaml", "toml"]
            .iter()
            .map(|ext| fixtures().join(format!("{}.{ext}", rule.id)))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("rule {} has no fixture", rule.id));
        let found = found_in(&path);
        assert!(
            found.iter().all(|id| *id == rule.id),
            "{}: other rules fired too: {found:?}",
            path.display()
        );
        assert_eq!(
            found.len(),
            expected(&path),
            "{}: findings of {}",
            path.display(),
            rule.id
        );
    }
}

#[test]
fn every_fixture_belongs_to_a_rule() {
    for entry in std::fs::read_dir(fixtures()).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_str().unwrap().to_owned();
        assert!(
            RULES.iter().any(|r| r.id == stem),
            "{} is no rule's fixture",
            path.display()
        );
    }
}

#[test]
fn rule_ids_are_unique_and_each_names_a_seed_incident() {
    for (i, r) in RULES.iter().enumerate() {
        assert!(RULES[..i].iter().all(|o| o.id != r.id), "{} twice", r.id);
        assert!(
            ["IL-0110", "IL-0136", "IL-0235", "IL-0248"].contains(&r.incident),
            "{}: {}",
            r.id,
            r.incident
        );
        assert!(!r.lesson.is_empty() && !r.finds.is_empty(), "{}", r.id);
    }
}

#[test]
fn the_shipped_manifests_and_examples_audit_clean() {
    let k8s = repo().join("deploy/kubernetes");
    let sources = Sources::load(None, std::slice::from_ref(&k8s)).unwrap();
    assert_eq!(
        sources.configs.len(),
        1,
        "the ConfigMap's spillway.toml is read"
    );
    assert!(sources.objects.iter().any(|o| o.kind == "Deployment"));
    let found = audit(&sources).unwrap();
    assert!(found.is_empty(), "{}", spillway_audit::text(&found));
    let mut examples = 0;
    for entry in std::fs::read_dir(repo().join("examples")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            examples += 1;
            let found = found_in(&path);
            assert!(found.is_empty(), "{}: {found:?}", path.display());
        }
    }
    assert!(examples >= 3, "found only {examples} examples");
}

#[test]
fn docs_audit_md_lists_every_rule_with_its_severity_and_incident() {
    let doc = std::fs::read_to_string(repo().join("docs/audit.md")).unwrap();
    let rows: Vec<&str> = doc.lines().filter(|l| l.starts_with("| `")).collect();
    for r in RULES {
        let row = format!("| `{}` | {} | {} |", r.id, r.severity.as_str(), r.incident);
        assert!(
            rows.iter().any(|l| l.starts_with(&row)),
            "docs/audit.md has no row starting {row:?}"
        );
    }
    assert_eq!(
        rows.len(),
        RULES.len(),
        "docs/audit.md lists rules the table does not have"
    );
}

#[test]
fn input_that_cannot_be_audited_is_an_error_naming_its_file() {
    let mut sources = Sources::default();
    let e = sources.add_manifest("bad.yaml", "kind: [").unwrap_err();
    assert!(e.to_string().starts_with("bad.yaml: not YAML"), "{e}");
    let e = sources.add_manifest("list.yaml", "- 1\n- 2\n").unwrap_err();
    assert!(e.to_string().contains("not a Kubernetes object"), "{e}");
    let dir = std::env::temp_dir().join(format!("spillway-audit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad_config = dir.join("cm.yaml");
    std::fs::write(
        &bad_config,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: s\ndata:\n  spillway.toml: |\n    [server]\n    listen = \"nope\"\n",
    )
    .unwrap();
    let e = Sources::load(None, &[bad_config]).unwrap_err();
    assert!(
        e.to_string()
            .contains("ConfigMap/s data[spillway.toml]: not a valid spillway config"),
        "{e}"
    );
    let quantity = fixtures().join("memory-limit-below-budget.yaml");
    let text = std::fs::read_to_string(&quantity)
        .unwrap()
        .replace("64Mi", "lots");
    let bad_quantity = dir.join("q.yaml");
    std::fs::write(&bad_quantity, text).unwrap();
    let sources = Sources::load(None, &[bad_quantity]).unwrap();
    let e = audit(&sources).unwrap_err();
    assert!(
        e.to_string()
            .contains("\"lots\" is not a Kubernetes quantity"),
        "{e}"
    );
    let missing = Sources::load(Some(&dir.join("absent.toml")), &[]).unwrap_err();
    assert!(missing.to_string().contains("cannot read"), "{missing}");
    std::fs::remove_dir_all(&dir).unwrap();
}
