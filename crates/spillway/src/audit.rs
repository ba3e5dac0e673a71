//! `spillway audit`: the command line of `spillway-audit`, its output and its exit status
//! (0 clean enough, 1 findings at or above `--fail-on`, 2 input that cannot be audited).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use spillway_audit::{Counts, Severity, Sources};

#[derive(Args)]
#[command(after_help = "Rules, their incidents and lessons: docs/audit.md.\n\
Exit status: 0 when no finding is at or above --fail-on, 1 when one is, 2 when an input cannot be read or audited.\n\
Examples:\n  spillway audit deploy/kubernetes/\n  spillway audit --config spillway.toml\n  spillway audit --config spillway.toml k8s/vllm.yaml --json --fail-on medium")]
pub struct AuditArgs {
    /// A spillway config file: audited itself, and the config of the manifests' spillway
    /// containers whose ConfigMap is not among the manifests.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Kubernetes manifests of spillway and of the inference servers behind it: YAML files
    /// (several documents each) or directories of them. A ConfigMap holding `spillway.toml`
    /// is read as the config of the pods that mount it.
    manifests: Vec<PathBuf>,
    /// Print one JSON document (findings, counts, each config's memory budget) instead of text.
    #[arg(long)]
    json: bool,
    /// Exit with status 1 when a finding is at this severity or above.
    #[arg(long, value_enum, default_value_t = FailOn::High)]
    fail_on: FailOn,
}

#[derive(Clone, Copy, ValueEnum)]
enum FailOn {
    Info,
    Low,
    Medium,
    High,
    Critical,
}

impl From<FailOn> for Severity {
    fn from(f: FailOn) -> Severity {
        match f {
            FailOn::Info => Severity::Info,
            FailOn::Low => Severity::Low,
            FailOn::Medium => Severity::Medium,
            FailOn::High => Severity::High,
            FailOn::Critical => Severity::Critical,
        }
    }
}

/// Runs the audit and prints what it found; the exit status says whether it passed.
pub fn run(args: AuditArgs) -> ExitCode {
    if args.config.is_none() && args.manifests.is_empty() {
        eprintln!("spillway audit: nothing to audit: give --config FILE and/or manifests");
        return ExitCode::from(2);
    }
    let found = Sources::load(args.config.as_deref(), &args.manifests)
        .and_then(|s| spillway_audit::audit(&s).map(|f| (s, f)));
    let (sources, findings) = match found {
        Ok(found) => found,
        Err(e) => {
            eprintln!("spillway audit: {e}");
            return ExitCode::from(2);
        }
    };
    let fail_on = Severity::from(args.fail_on);
    let counts = Counts::of(&findings);
    if args.json {
        println!("{:#}", spillway_audit::json(&sources, &findings, fail_on));
    } else {
        print!("{}", spillway_audit::text(&findings));
        eprintln!(
            "spillway audit: {} ({} config(s), {} object(s)); failing on {} and above",
            counts.summary(),
            sources.configs.len(),
            sources.objects.len(),
            fail_on.as_str()
        );
    }
    if counts.at_least(fail_on) > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
