//! The two ways findings are reported: one line of text per finding, for people and logs, and
//! one JSON document for scripts, with the memory budget computed for each config so a pipeline
//! can size a container from the same formula the audit checks it against.

use serde_json::{json, Value};
use spillway_config::MemoryBudget;

use crate::{Finding, Severity, Sources};

/// Findings counted by severity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts([usize; 5]);

impl Counts {
    pub fn of(findings: &[Finding]) -> Counts {
        let mut c = Counts::default();
        for f in findings {
            c.0[f.rule.severity as usize] += 1;
        }
        c
    }

    pub fn get(&self, s: Severity) -> usize {
        self.0[s as usize]
    }

    /// Findings at `s` or above.
    pub fn at_least(&self, s: Severity) -> usize {
        Severity::ALL
            .iter()
            .filter(|v| **v >= s)
            .map(|v| self.get(*v))
            .sum()
    }

    /// `2 high, 1 medium`, most severe first; `no findings` for none.
    pub fn summary(&self) -> String {
        let parts: Vec<String> = Severity::ALL
            .iter()
            .rev()
            .filter(|s| self.get(**s) > 0)
            .map(|s| format!("{} {}", self.get(*s), s.as_str()))
            .collect();
        if parts.is_empty() {
            "no findings".to_owned()
        } else {
            parts.join(", ")
        }
    }
}

/// One line per finding: severity, where, what, and the rule with its incident and lesson.
pub fn text(findings: &[Finding]) -> String {
    let mut out = String::new();
    for f in findings {
        let object = f
            .hit
            .object
            .as_deref()
            .map(|o| format!("{o} "))
            .unwrap_or_default();
        out.push_str(&format!(
            "{:<8} {}: {object}{}: {} [{}; {}: {}]\n",
            f.rule.severity.as_str(),
            f.hit.file,
            f.hit.key,
            f.hit.message,
            f.rule.id,
            f.rule.incident,
            f.rule.lesson,
        ));
    }
    out
}

/// The findings, the configs read with their memory budgets, and the counts.
pub fn json(sources: &Sources, findings: &[Finding], fail_on: Severity) -> Value {
    let counts = Counts::of(findings);
    let configs: Vec<Value> = sources
        .configs
        .iter()
        .map(|c| {
            let b = MemoryBudget::of(&c.config);
            json!({
                "file": c.file,
                "object": c.object,
                "memory_budget_bytes": b.total(),
                "memory_budget": {
                    "bodies": b.bodies,
                    "connections": b.connections,
                    "in_flight": b.in_flight,
                    "kept_connections": b.kept_connections,
                    "key_cache": b.key_cache,
                    "idle": b.idle,
                },
            })
        })
        .collect();
    let found: Vec<Value> = findings
        .iter()
        .map(|f| {
            json!({
                "rule": f.rule.id,
                "severity": f.rule.severity.as_str(),
                "file": f.hit.file,
                "object": f.hit.object,
                "key": f.hit.key,
                "message": f.hit.message,
                "incident": f.rule.incident,
                "lesson": f.rule.lesson,
            })
        })
        .collect();
    let by_severity: serde_json::Map<String, Value> = Severity::ALL
        .iter()
        .map(|s| (s.as_str().to_owned(), json!(counts.get(*s))))
        .collect();
    json!({
        "findings": found,
        "counts": by_severity,
        "fail_on": fail_on.as_str(),
        "failed": counts.at_least(fail_on) > 0,
        "configs": configs,
    })
}
