//! How far a mode's run is: a live bar on a terminal, one plain line per phase otherwise.
//!
//! A replay with the incident's own lengths runs for minutes per mode, and its figures come
//! only at the end; the reader needs to know which phase it is in and how long is left. On a
//! terminal (stderr is a TTY) an `indicatif` bar shows the phase and the time left, refreshed a
//! few times a second; anywhere else (CI logs, a file) a redrawn bar would be noise, so each
//! phase gets one line when it starts. The scenarios' own progress lines go through [`line`],
//! which prints them above the bar while one is shown.

use std::io::IsTerminal as _;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::plan::Mode;
use crate::tally::Schedule;

/// How often the bar is redrawn.
const REFRESH: Duration = Duration::from_millis(200);

/// The bar shown now, if any: the one mode running draws it, and [`line`] prints above it.
static SHOWN: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// Prints `text` on stderr, above the progress bar if one is shown.
pub(crate) fn line(text: &str) {
    match &*SHOWN.lock().unwrap_or_else(PoisonError::into_inner) {
        Some(bar) => bar.println(text),
        None => eprintln!("{text}"),
    }
}

/// Where a run is at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Position {
    /// In phase `index` (from 0) of `count`.
    Phase {
        index: usize,
        count: usize,
        left_in_phase: Duration,
        left_in_run: Duration,
    },
    /// Every phase has ended; the requests in flight are finishing.
    Draining,
}

/// Where a run on `schedule` is at `now`.
pub(crate) fn position(schedule: &Schedule, now: Instant) -> Position {
    let index = schedule.slot(now);
    if index >= schedule.drain() {
        return Position::Draining;
    }
    Position::Phase {
        index,
        count: schedule.drain(),
        left_in_phase: schedule.end_of(index).saturating_duration_since(now),
        left_in_run: schedule.end().saturating_duration_since(now),
    }
}

/// The words for `position`, with the phases' names.
pub(crate) fn describe(position: &Position, phases: &[&str]) -> String {
    match *position {
        Position::Phase {
            index,
            count,
            left_in_phase,
            left_in_run,
        } => format!(
            "phase {}/{count} {}: {} left in it, {} left in the run",
            index + 1,
            phases.get(index).copied().unwrap_or("?"),
            seconds(left_in_phase),
            seconds(left_in_run)
        ),
        Position::Draining => "phases done; the requests in flight are finishing".to_owned(),
    }
}

/// A duration rounded up to whole seconds, as humantime writes it.
fn seconds(d: Duration) -> String {
    let whole = Duration::from_secs(d.as_millis().div_ceil(1000) as u64);
    humantime::format_duration(whole).to_string()
}

/// A progress display running beside a mode's schedule; [`Progress::stop`] ends it.
pub(crate) struct Progress {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Progress {
    pub(crate) fn start(
        mode: Mode,
        phases: &'static [&'static str],
        schedule: Schedule,
    ) -> Progress {
        let (stop, stopped) = oneshot::channel();
        let task = if std::io::stderr().is_terminal() {
            tokio::spawn(bar(mode, phases, schedule, stopped))
        } else {
            tokio::spawn(lines(mode, phases, schedule, stopped))
        };
        Progress { stop, task }
    }

    pub(crate) async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// One line as each phase starts, and one when the last has ended.
async fn lines(
    mode: Mode,
    phases: &'static [&'static str],
    schedule: Schedule,
    mut stopped: oneshot::Receiver<()>,
) {
    for i in 0..=schedule.drain() {
        let at = if i == 0 {
            schedule.start()
        } else {
            schedule.end_of(i - 1)
        };
        tokio::select! {
            _ = &mut stopped => return,
            () = tokio::time::sleep_until(at) => {}
        }
        let now = Instant::now().max(at);
        line(&format!(
            "replay: {mode}: {}",
            describe(&position(&schedule, now), phases)
        ));
    }
}

/// A bar over the run's phases, redrawn every [`REFRESH`] until stopped.
async fn bar(
    mode: Mode,
    phases: &'static [&'static str],
    schedule: Schedule,
    mut stopped: oneshot::Receiver<()>,
) {
    let total = schedule.end().saturating_duration_since(schedule.start());
    let bar = ProgressBar::new(total.as_millis() as u64);
    let style = ProgressStyle::with_template("replay: {prefix}: [{bar:30}] {msg}")
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_prefix(mode.to_string());
    *SHOWN.lock().unwrap_or_else(PoisonError::into_inner) = Some(bar.clone());
    let mut ticks = tokio::time::interval(REFRESH);
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            _ = ticks.tick() => {}
        }
        let now = Instant::now();
        let done = now.saturating_duration_since(schedule.start()).min(total);
        bar.set_position(done.as_millis() as u64);
        bar.set_message(describe(&position(&schedule, now), phases));
    }
    *SHOWN.lock().unwrap_or_else(PoisonError::into_inner) = None;
    bar.finish_and_clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_position_names_the_phase_and_the_time_left_then_the_drain() {
        let start = Instant::now();
        let s = Schedule::new(start, &[10, 20].map(Duration::from_secs));
        let phases = ["steady", "fault"];
        let at = |ms: u64| describe(&position(&s, start + Duration::from_millis(ms)), &phases);
        assert_eq!(
            at(0),
            "phase 1/2 steady: 10s left in it, 30s left in the run"
        );
        assert_eq!(
            at(9_500),
            "phase 1/2 steady: 1s left in it, 21s left in the run"
        );
        assert_eq!(
            at(10_000),
            "phase 2/2 fault: 20s left in it, 20s left in the run"
        );
        assert_eq!(
            at(30_000),
            "phases done; the requests in flight are finishing"
        );
    }
}
