//! The shipped alert rules as Prometheus reads them: `promtool check rules` accepts the file,
//! `promtool test rules` passes its unit tests, every alert has a unit test and a runbook page
//! that exists and names it, the example scrape config is valid, and the dashboard has a row
//! per question and takes its data source and job from its variables.

#[path = "prom/mod.rs"]
mod prom;

use std::process::Command;

use prom::*;

fn promtool_ok(args: &[&str]) {
    let Some(tool) = promtool() else { return };
    let dir = repo_root().join("deploy/prometheus");
    let out = Command::new(&tool)
        .args(args)
        .current_dir(&dir)
        .output()
        .expect("run promtool");
    let text = format!(
        "promtool {args:?}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    eprintln!("{text}");
}

#[test]
fn promtool_accepts_the_rules() {
    promtool_ok(&["check", "rules", "alerts.yml"]);
}

#[test]
fn promtool_unit_tests_of_every_alert_pass() {
    promtool_ok(&["test", "rules", "alerts.test.yml"]);
}

#[test]
fn promtool_accepts_the_example_scrape_config() {
    promtool_ok(&["check", "config", "prometheus.yml"]);
}

#[test]
fn every_alert_is_unit_tested_both_firing_and_silent() {
    let rules = std::fs::read_to_string(rules_path()).unwrap();
    let tests =
        std::fs::read_to_string(repo_root().join("deploy/prometheus/alerts.test.yml")).unwrap();
    let alerts = alert_names(&rules);
    assert!(alerts.len() >= 11, "{alerts:?}");
    // Each alert's test cases, as (expects alerts, expects none), from the `alertname:` line and
    // the `exp_alerts:` line after it.
    let lines: Vec<&str> = tests.lines().map(str::trim).collect();
    for alert in &alerts {
        let cases: Vec<bool> = lines
            .iter()
            .enumerate()
            .filter(|(_, l)| l.strip_prefix("alertname:").map(str::trim) == Some(alert.as_str()))
            .map(|(i, _)| lines[i + 1] != "exp_alerts: []")
            .collect();
        assert!(
            cases.contains(&true),
            "{alert}: no unit test where it fires"
        );
        assert!(
            cases.contains(&false),
            "{alert}: no unit test where it stays silent (pending or healthy)"
        );
    }
}

#[test]
fn every_alert_links_a_runbook_page_that_exists_and_names_it() {
    let rules = std::fs::read_to_string(rules_path()).unwrap();
    let alerts = alert_names(&rules);
    let runbooks = values_of(&rules, "runbook_url:");
    assert_eq!(alerts.len(), runbooks.len(), "one runbook_url per alert");
    let index = std::fs::read_to_string(repo_root().join("docs/runbooks/README.md")).unwrap();
    for (alert, url) in alerts.iter().zip(&runbooks) {
        assert!(url.starts_with("docs/runbooks/"), "{alert}: {url}");
        let page = std::fs::read_to_string(repo_root().join(url))
            .unwrap_or_else(|e| panic!("{alert}: runbook {url}: {e}"));
        assert!(page.contains(alert.as_str()), "{url} does not name {alert}");
        for part in [
            "## What it means",
            "## Source or symptom",
            "## What to do",
            "## Replay",
        ] {
            assert!(page.contains(part), "{url} has no `{part}` section");
        }
        let file = url.trim_start_matches("docs/runbooks/");
        assert!(
            index.contains(file),
            "docs/runbooks/README.md does not list {file}"
        );
    }
}

#[test]
fn the_dashboard_has_a_row_per_question_and_every_query_takes_its_variables() {
    let text = std::fs::read_to_string(dashboard_path()).unwrap();
    let d: serde_json::Value = serde_json::from_str(&text).unwrap();
    let vars: Vec<&str> = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(vars, ["datasource", "job"]);
    let panels = d["panels"].as_array().unwrap();
    let rows: Vec<&str> = panels
        .iter()
        .filter(|p| p["type"] == "row")
        .filter_map(|p| p["title"].as_str())
        .collect();
    for question in ["amplified", "load", "backends", "metadata", "memory"] {
        assert!(
            rows.iter().any(|r| r.contains(question)),
            "no row on {question}: {rows:?}"
        );
    }
    for p in panels.iter().filter(|p| p["type"] != "row") {
        let title = &p["title"];
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{title}");
            assert!(expr.contains(r#"job=~"$job""#), "{title}: {expr}");
            // Every range is Grafana's, so it follows the scrape interval and the zoom.
            for (i, _) in expr.match_indices('[') {
                assert!(
                    expr[i..].starts_with("[$__rate_interval]"),
                    "{title}: {expr}"
                );
            }
        }
    }
}
