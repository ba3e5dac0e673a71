//! `spillway audit`: a spillway config and the Kubernetes manifests it runs in (and those of the
//! inference servers behind it) checked against the lessons of the incidents spillway comes
//! from, each finding naming its rule, severity, file and key, the lesson and the incident.
//!
//! Why a command and not only documentation: every seed incident was a setting someone could
//! have read before it hurt: a liveness probe that needed the database (IL-0136), a pod without
//! a memory limit (IL-0110), retries without a budget and internal traffic that skipped the
//! limits (IL-0248), a change applied everywhere at once (IL-0235). A CI pipeline can gate on
//! them (`--fail-on`), and a reviewer reads why each one matters where it is reported.
//!
//! The rules live in one table, [`RULES`] (`rules.rs`), one record each with its check; the
//! inputs are read once into [`Sources`] (`sources.rs`), with each spillway container paired
//! with the config it runs (`pods.rs`).

mod load;
mod pods;
mod quantity;
mod report;
mod rules;
mod sources;

pub use report::{json, text, Counts};
pub use rules::{Rule, RULES};
pub use sources::{ConfigSource, Object, Sources};

/// How much a finding matters; `--fail-on` takes the lowest that fails the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    Info,
    Low,
    Medium,
    High,
    Critical,
}

impl Severity {
    pub const ALL: [Severity; 5] = [
        Severity::Info,
        Severity::Low,
        Severity::Medium,
        Severity::High,
        Severity::Critical,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Low => "low",
            Severity::Medium => "medium",
            Severity::High => "high",
            Severity::Critical => "critical",
        }
    }
}

impl std::str::FromStr for Severity {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Severity::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| format!("{s:?} is not one of info, low, medium, high, critical"))
    }
}

/// Where a finding is: the file, the object in it (`Deployment/spillway`, or the ConfigMap a
/// config came from), and the key within that object or config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    pub file: String,
    pub object: Option<String>,
    pub key: String,
    pub message: String,
}

/// One rule's problem found at one place.
#[derive(Debug, Clone)]
pub struct Finding {
    pub rule: &'static Rule,
    pub hit: Hit,
}

/// Input that cannot be audited: a file that cannot be read, YAML or TOML that does not parse,
/// a config spillway would refuse, a value that is not what Kubernetes allows there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {message}")]
pub struct AuditError {
    pub file: String,
    pub message: String,
}

impl AuditError {
    pub(crate) fn new(file: impl Into<String>, message: impl Into<String>) -> Self {
        AuditError {
            file: file.into(),
            message: message.into(),
        }
    }
}

/// Every rule's findings in `sources`, most severe first, then in the order of the inputs.
pub fn audit(sources: &Sources) -> Result<Vec<Finding>, AuditError> {
    let mut found = Vec::new();
    for rule in RULES {
        for hit in (rule.check)(sources)? {
            // Two pods running one config would report its problem twice.
            if !found
                .iter()
                .any(|f: &Finding| std::ptr::eq(f.rule, rule) && f.hit == hit)
            {
                found.push(Finding { rule, hit });
            }
        }
    }
    found.sort_by_key(|f| std::cmp::Reverse(f.rule.severity));
    Ok(found)
}
