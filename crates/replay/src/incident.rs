//! The skeleton every scenario goes through: its modes run one after the other, one report of
//! them all, the table printed, the figures written, and with `--out` the pictures drawn.
//!
//! A replay is worth its comparison: the same incident against the protected gateway and the
//! naive one, side by side. So a mode that fails (a gateway that would not start, a control
//! request that failed) is reported as not completed, and the other mode still runs; the
//! replay then ends with an error naming the first that failed, after the table and the JSON
//! of what did complete. That order, written once here, is the same for every scenario: a
//! scenario says how to run one mode and how to lay out its figures ([`Incident`]), and
//! [`replay`] does the rest. Each mode's run also returns its [`Timeline`] (every scenario
//! records one with `timeline::Recording`), which the pictures of `--out` are drawn from.

use std::path::PathBuf;

use serde::Serialize;

use crate::error::ReplayError;
use crate::pictures;
use crate::plan::Mode;
use crate::progress;
use crate::timeline::Timeline;

/// One incident scenario, with its checked plan.
pub(crate) trait Incident {
    /// The scenario's subcommand, which titles its pictures.
    const SCENARIO: &'static str;
    /// One mode's run, as the report records it.
    type Run: RunOutcome;
    /// Everything the replay measured: what the `--json` file holds.
    type Report: Serialize;

    /// The modes to run, in order.
    fn modes(&self) -> &[Mode];

    /// Where to write the report as JSON, if asked.
    fn json(&self) -> Option<&PathBuf>;

    /// Where to write the pictures and their page, if asked.
    fn out(&self) -> Option<&PathBuf>;

    /// Runs the incident once against a gateway in `mode`, and returns its figures and its
    /// timeline; every process it started is stopped before it returns, whatever happened.
    async fn run_mode(&self, mode: Mode) -> Result<(Self::Run, Timeline), ReplayError>;

    /// Frees what the modes shared, once every mode has run and before the report is published.
    async fn release(&self) {}

    /// The report of every mode's run.
    fn report(&self, runs: Vec<Self::Run>) -> Self::Report;

    /// The side-by-side table of a report in which at least one run completed.
    fn table(report: &Self::Report) -> String;
}

/// What the skeleton needs to know of a mode's run.
pub(crate) trait RunOutcome {
    /// A run of `mode` that did not complete, for `error`.
    fn failed(mode: Mode, error: String) -> Self;
    fn mode(&self) -> Mode;
    /// Whether every phase ran.
    fn is_complete(&self) -> bool;
    /// Why the run did not complete, if it said.
    fn error(&self) -> Option<&str>;
}

/// Runs every mode of `incident`, prints the table (when a run completed), writes the JSON and
/// the pictures if asked, and ends with the first run that did not complete as the replay's
/// error.
pub(crate) async fn replay<I: Incident>(incident: &I) -> Result<(), ReplayError> {
    if let Some(dir) = incident.out() {
        pictures::prepare(dir)?;
    }
    let mut runs = Vec::with_capacity(incident.modes().len());
    let mut timelines = Vec::with_capacity(incident.modes().len());
    for &mode in incident.modes() {
        match incident.run_mode(mode).await {
            Ok((run, timeline)) => {
                runs.push(run);
                timelines.push(timeline);
            }
            Err(e) => {
                say(mode, &format!("did not complete: {e}"));
                runs.push(I::Run::failed(mode, e.to_string()));
            }
        }
    }
    incident.release().await;
    let any_completed = runs.iter().any(RunOutcome::is_complete);
    let failures: Vec<(Mode, String)> = runs
        .iter()
        .filter(|r| !r.is_complete())
        .map(|r| (r.mode(), r.error().unwrap_or("unknown").to_owned()))
        .collect();
    let report = incident.report(runs);
    let table = any_completed.then(|| I::table(&report));
    if let Some(table) = &table {
        print!("{table}");
    }
    if let Some(path) = incident.json() {
        write_json(&report, path)?;
    }
    if let Some(dir) = incident.out() {
        let written = pictures::write(dir, I::SCENARIO, table.as_deref(), &timelines, &failures)?;
        if let Some(page) = written.last() {
            progress::line(&format!(
                "replay: pictures written; open {}",
                page.display()
            ));
        }
    }
    match failures.into_iter().next() {
        Some((mode, message)) => Err(ReplayError::mode_failed(mode, &message)),
        None => Ok(()),
    }
}

/// A progress line on stderr.
pub(crate) fn say(mode: Mode, message: &str) {
    progress::line(&format!("replay: {mode}: {message}"));
}

fn write_json<R: Serialize>(report: &R, path: &PathBuf) -> Result<(), ReplayError> {
    let bytes = serde_json::to_vec_pretty(report).map_err(std::io::Error::other);
    bytes
        .and_then(|bytes| std::fs::write(path, bytes))
        .map_err(|source| ReplayError::Output {
            path: path.clone(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    #[derive(Debug, Serialize)]
    struct Run {
        mode: Mode,
        error: Option<String>,
    }

    impl RunOutcome for Run {
        fn failed(mode: Mode, error: String) -> Run {
            Run {
                mode,
                error: Some(error),
            }
        }
        fn mode(&self) -> Mode {
            self.mode
        }
        fn is_complete(&self) -> bool {
            self.error.is_none()
        }
        fn error(&self) -> Option<&str> {
            self.error.as_deref()
        }
    }

    /// Fails the modes in `failing`, and notes what the skeleton asked of it, in order.
    struct Fake {
        modes: Vec<Mode>,
        failing: Vec<Mode>,
        json: Option<PathBuf>,
        out: Option<PathBuf>,
        asked: RefCell<Vec<String>>,
    }

    impl Incident for Fake {
        const SCENARIO: &'static str = "fake";
        type Run = Run;
        type Report = Vec<Run>;

        fn modes(&self) -> &[Mode] {
            &self.modes
        }
        fn json(&self) -> Option<&PathBuf> {
            self.json.as_ref()
        }
        fn out(&self) -> Option<&PathBuf> {
            self.out.as_ref()
        }
        async fn run_mode(&self, mode: Mode) -> Result<(Run, Timeline), ReplayError> {
            self.asked.borrow_mut().push(format!("run {mode}"));
            if self.failing.contains(&mode) {
                return Err(ReplayError::Startup {
                    what: format!("{mode} gateway"),
                    detail: "exited".to_owned(),
                });
            }
            Ok((
                Run { mode, error: None },
                crate::timeline::example(mode, true),
            ))
        }
        async fn release(&self) {
            self.asked.borrow_mut().push("release".to_owned());
        }
        fn report(&self, runs: Vec<Run>) -> Vec<Run> {
            self.asked
                .borrow_mut()
                .push(format!("report of {}", runs.len()));
            runs
        }
        fn table(report: &Vec<Run>) -> String {
            format!("{} runs\n", report.len())
        }
    }

    fn fake(failing: &[Mode], json: Option<PathBuf>) -> Fake {
        Fake {
            modes: vec![Mode::Protected, Mode::Naive],
            failing: failing.to_vec(),
            json,
            out: None,
            asked: RefCell::new(Vec::new()),
        }
    }

    #[tokio::test]
    async fn a_failed_mode_is_reported_the_next_still_runs_and_the_replay_names_it() {
        let path = std::env::temp_dir().join(format!(
            "spillway-replay-incident-test-{}.json",
            std::process::id()
        ));
        let incident = fake(&[Mode::Protected], Some(path.clone()));
        let outcome = replay(&incident).await;
        assert_eq!(
            *incident.asked.borrow(),
            ["run protected", "run naive", "release", "report of 2"]
        );
        match outcome {
            Err(ReplayError::ModeFailed { mode, message }) => {
                assert_eq!(mode, "protected");
                assert_eq!(message, "protected gateway did not start: exited");
            }
            other => panic!("{other:?}"),
        }
        let written = std::fs::read_to_string(&path).expect("the JSON was written");
        let _ = std::fs::remove_file(&path);
        let json: serde_json::Value = serde_json::from_str(&written).unwrap();
        assert_eq!(json[0]["mode"], "protected");
        assert_eq!(json[0]["error"], "protected gateway did not start: exited");
        assert_eq!(json[1]["mode"], "naive");
        assert!(json[1]["error"].is_null());
    }

    #[tokio::test]
    async fn a_replay_whose_modes_all_complete_succeeds() {
        let incident = fake(&[], None);
        replay(&incident).await.expect("every mode completed");
        assert_eq!(incident.asked.borrow().len(), 4);
    }

    #[tokio::test]
    async fn an_unwritable_json_file_is_the_replay_s_error() {
        let dir = std::env::temp_dir().join("spillway-replay-no-such-dir-for-incident-tests");
        let incident = fake(&[], Some(dir.join("figures.json")));
        match replay(&incident).await {
            Err(ReplayError::Output { path, .. }) => assert!(path.ends_with("figures.json")),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn out_draws_the_completed_modes_and_names_the_failed_one_on_the_page() {
        let dir = std::env::temp_dir().join(format!(
            "spillway-replay-incident-out-{}",
            std::process::id()
        ));
        let mut incident = fake(&[Mode::Protected], None);
        incident.out = Some(dir.clone());
        assert!(matches!(
            replay(&incident).await,
            Err(ReplayError::ModeFailed { .. })
        ));
        let html = std::fs::read_to_string(dir.join(pictures::INDEX)).unwrap();
        assert!(dir.join("naive.svg").is_file());
        assert!(!dir.join("protected.svg").exists());
        assert!(html.contains("src=\"naive.svg\""), "{html}");
        assert!(
            html.contains("The protected run did not complete"),
            "{html}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn an_out_directory_that_cannot_be_made_fails_before_any_mode_runs() {
        let file = std::env::temp_dir().join(format!(
            "spillway-replay-incident-not-a-dir-{}",
            std::process::id()
        ));
        std::fs::write(&file, b"").unwrap();
        let mut incident = fake(&[], None);
        incident.out = Some(file.join("pictures"));
        let outcome = replay(&incident).await;
        let _ = std::fs::remove_file(&file);
        assert!(
            matches!(outcome, Err(ReplayError::Output { .. })),
            "{outcome:?}"
        );
        assert!(incident.asked.borrow().is_empty(), "{:?}", incident.asked);
    }
}
