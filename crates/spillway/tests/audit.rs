//! `spillway audit` as a CI pipeline runs it: exit status 0, 1 or 2, `--fail-on`, the text
//! lines and the `--json` document.

use std::process::{Command, Output};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_spillway")
}

fn audit(args: &[&str]) -> Output {
    Command::new(bin())
        .arg("audit")
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .unwrap()
}

const FIXTURES: &str = "crates/audit/tests/fixtures";

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn the_shipped_manifests_pass_and_say_so() {
    let o = audit(&["deploy/kubernetes/", "--fail-on", "info"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert_eq!(stdout(&o), "", "no finding, not even info");
    assert!(String::from_utf8_lossy(&o.stderr).contains("no findings"));
}

#[test]
fn fail_on_sets_the_severity_that_fails_the_run() {
    // A medium finding: passes the default (high), fails at medium and below.
    let medium = format!("{FIXTURES}/rollout-all-at-once.yaml");
    assert_eq!(audit(&[&medium]).status.code(), Some(0));
    assert_eq!(
        audit(&[&medium, "--fail-on", "medium"]).status.code(),
        Some(1)
    );
    assert_eq!(audit(&[&medium, "--fail-on", "low"]).status.code(), Some(1));
    assert_eq!(
        audit(&[&medium, "--fail-on", "critical"]).status.code(),
        Some(0)
    );
    // A critical one fails the default.
    let critical = format!("{FIXTURES}/retry-without-budget.toml");
    let o = audit(&["--config", &critical]);
    assert_eq!(o.status.code(), Some(1));
    let text = stdout(&o);
    assert_eq!(text.lines().count(), 1, "one line per finding: {text}");
    let line = text.lines().next().unwrap();
    for part in [
        "critical",
        "retry-without-budget.toml",
        "retry.naive",
        "[retry-without-budget; IL-0248: ",
    ] {
        assert!(line.contains(part), "{part:?} missing from {line}");
    }
    // An info finding fails only --fail-on info.
    let info = format!("{FIXTURES}/config-not-found.yaml");
    assert_eq!(audit(&[&info, "--fail-on", "low"]).status.code(), Some(0));
    assert_eq!(audit(&[&info, "--fail-on", "info"]).status.code(), Some(1));
}

#[test]
fn json_carries_each_finding_with_its_rule_and_each_configs_budget() {
    let f = format!("{FIXTURES}/memory-limit-below-budget.yaml");
    let o = audit(&[&f, "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON document");
    let found = doc["findings"].as_array().unwrap();
    assert_eq!(found.len(), 1, "{doc:#}");
    let finding = &found[0];
    assert_eq!(finding["rule"], "memory-limit-below-budget");
    assert_eq!(finding["severity"], "high");
    assert_eq!(finding["incident"], "IL-0110");
    assert_eq!(finding["object"], "Deployment/spillway");
    assert_eq!(
        finding["key"],
        "spec.template.spec.containers[0].resources.limits.memory"
    );
    assert!(finding["file"]
        .as_str()
        .unwrap()
        .ends_with("memory-limit-below-budget.yaml"));
    assert!(!finding["lesson"].as_str().unwrap().is_empty());
    assert_eq!(doc["counts"]["high"], 1);
    assert_eq!(doc["fail_on"], "high");
    assert_eq!(doc["failed"], true);
    let config = &doc["configs"][0];
    assert_eq!(config["object"], "ConfigMap/spillway data[spillway.toml]");
    let parts = &config["memory_budget"];
    let sum: u64 = [
        "bodies",
        "connections",
        "in_flight",
        "kept_connections",
        "key_cache",
        "idle",
    ]
    .iter()
    .map(|k| parts[k].as_u64().unwrap())
    .sum();
    assert_eq!(config["memory_budget_bytes"].as_u64(), Some(sum));
    assert!(sum > 64 << 20, "the 64Mi limit is below it");
}

#[test]
fn input_that_cannot_be_audited_exits_2_with_one_line() {
    let dir = std::env::temp_dir().join(format!("spillway-audit-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, "kind: Deployment\nspec: [\n").unwrap();
    let invalid = dir.join("invalid.toml");
    std::fs::write(&invalid, "[server]\nlisten = \"nope\"\n").unwrap();
    for args in [
        vec![bad.to_str().unwrap().to_owned()],
        vec!["--config".to_owned(), invalid.to_str().unwrap().to_owned()],
        vec![dir.join("absent.yaml").to_str().unwrap().to_owned()],
        vec![],
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = audit(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
        assert!(err.starts_with("spillway audit: "), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
