//! Staged rollouts of a model's new backends, as the request path meets them.
//!
//! A model with `[models.rollout]` has two versions of backends in one pool: its current ones
//! (`Side::Old`) and the new ones (`Side::New`). The decisions are `spillway_policy::rollout`'s
//! (which share the new version takes, when a step is promoted, when an excess halts it); this
//! module applies them. A call's first attempt goes to the new version with the step's share
//! (`takes_new` on a random draw), and every retry to the old one while the rollout runs, so a
//! new version that fails sends its callers to the version known to work, never to itself again.
//! Each attempt's outcome is counted on its side: error statuses and timeouts by the attempt loop
//! when they happen, successes when their body ends (with the time to the first byte, and whether
//! the stream broke), by the relay. `Rollouts` evaluates every rollout each second, so a halt
//! moves the new version's traffic back to the old at most a second after the evidence is in,
//! keeps each rollout's state across reloads (a rollout whose plan and new backends are unchanged
//! is the same one), and saves it in the data directory (`rollouts.json`) across restarts.
//! `RolloutMode::Replace` is the demonstration of a deployment without stages: the new version
//! takes every request at once, and nothing is compared.

mod admin;
mod saved;

pub(crate) use admin::routes;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use foldhash::HashMap;
use serde_json::{json, Value};
use spillway_config::{ModelConfig, RolloutMode};
use spillway_policy::rollout::{Ending, Observation, Signal, Status, Verdict};
use spillway_policy::{takes_new, Outcome, Rollout};
use tracing::{error, info, warn};

pub use spillway_policy::rollout::Side;

/// The whole of traffic, in basis points.
const FULL: u32 = 10_000;
/// How often every rollout is judged.
pub(crate) const EVALUATE_EVERY: Duration = Duration::from_secs(1);

/// One model's rollout.
pub struct RolloutCell {
    pub model: Arc<str>,
    /// What identifies this rollout: its plan and its new backends, hashed.
    fingerprint: String,
    plan: Plan,
}

impl std::fmt::Debug for RolloutCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RolloutCell")
            .field("model", &self.model)
            .field("fingerprint", &self.fingerprint)
            .field("share", &self.share())
            .finish()
    }
}

enum Plan {
    Staged(Box<Mutex<Rollout>>),
    Replace,
}

impl RolloutCell {
    fn new(model: &ModelConfig, fingerprint: String, state: Option<&saved::Kept>) -> RolloutCell {
        let spec = model.rollout.as_ref().expect("a model with a rollout");
        let now = crate::clock::now();
        let plan = match spec.mode {
            RolloutMode::Replace => Plan::Replace,
            RolloutMode::Staged => {
                let policy = spec.policy.clone();
                let resumed =
                    state.and_then(|s| Rollout::resume(policy.clone(), &s.state, now).ok());
                let rollout = resumed
                    .or_else(|| Rollout::try_new(policy, now).ok())
                    .expect("the config check accepted the rollout's settings");
                Plan::Staged(Box::new(Mutex::new(rollout)))
            }
        };
        RolloutCell {
            model: Arc::from(model.name.as_str()),
            fingerprint,
            plan,
        }
    }

    fn staged(&self) -> Option<std::sync::MutexGuard<'_, Rollout>> {
        match &self.plan {
            Plan::Staged(r) => Some(r.lock().unwrap_or_else(|e| e.into_inner())),
            Plan::Replace => None,
        }
    }

    /// The new version's share of first attempts now, in basis points.
    pub fn share(&self) -> u32 {
        self.staged().map_or(FULL, |r| r.share())
    }

    /// The side a call's first attempt goes to.
    pub fn first_side(&self) -> Side {
        if takes_new(self.share(), rand::random()) {
            Side::New
        } else {
            Side::Old
        }
    }

    /// Whether a call for the new version goes to the old one when the new one has no room: in
    /// a staged rollout, yes; in `replace` mode the old version is as good as gone.
    pub fn spills_to_old(&self) -> bool {
        matches!(self.plan, Plan::Staged(_))
    }

    /// The side a retry goes to: the old version while a staged rollout has not taken all
    /// traffic, else the new one.
    pub fn retry_side(&self) -> Side {
        if self.share() >= FULL {
            Side::New
        } else {
            Side::Old
        }
    }

    /// Counts an attempt that ended before a body was relayed: an error status or no answer. A
    /// connection never made is not counted: nothing reached the version. No first token: an
    /// error's quick head says nothing of how fast the version generates.
    pub fn attempt_failed(&self, side: Side, outcome: Outcome) {
        let ending = match outcome {
            Outcome::Response(status) if status >= 400 => Ending::Status(status),
            // No status at all: counted with the server errors, as a proxy would answer it.
            Outcome::ResetBeforeResponse => Ending::Status(502),
            Outcome::TimedOut => Ending::TimedOut,
            Outcome::Response(_) | Outcome::ConnectFailed => return,
        };
        self.record(side, ending, None);
    }

    /// Counts a relayed answer when its body ended: complete, or a stream that broke.
    pub fn body_ended(&self, side: Side, status: u16, ttft: Option<Duration>, broke: bool) {
        let ending = if broke {
            Ending::BrokenStream
        } else {
            Ending::Status(status)
        };
        self.record(side, ending, ttft);
    }

    fn record(&self, side: Side, ending: Ending, ttft: Option<Duration>) {
        if let Some(mut r) = self.staged() {
            r.record(side, Observation { ending, ttft });
        }
    }

    /// Judges the step; logs and counts what changed. Whether the state changed.
    fn evaluate(&self, now: Instant, anomalies: &AtomicU64) -> bool {
        let Some(mut r) = self.staged() else {
            return false;
        };
        let verdict = r.evaluate(now);
        self.told(&verdict, anomalies);
        verdict != Verdict::Hold
    }

    fn told(&self, verdict: &Verdict, anomalies: &AtomicU64) {
        let model = &*self.model;
        match verdict {
            Verdict::Hold => {}
            Verdict::Promote { to_step } => {
                info!(
                    model,
                    step = to_step,
                    share_percent = self.share() as f64 / 100.0,
                    "rollout promoted"
                )
            }
            Verdict::Complete => {
                info!(model, "rollout complete: the new version takes all traffic")
            }
            Verdict::Halt(evidence) => {
                error!(model, "ROLLOUT HALTED: the new version's traffic goes back to the old one: {evidence}");
                anomalies.fetch_add(1, Ordering::Relaxed);
                let signal = evidence.signal;
                metrics::counter!(HALTS, "model" => model.to_owned(), "signal" => signal_label(signal)).increment(1);
            }
        }
    }

    /// What the admin API shows of it.
    pub fn view(&self, now: Instant) -> Value {
        let share = self.share() as f64 / 100.0;
        let Some(r) = self.staged() else {
            return json!({ "model": &*self.model, "mode": "replace", "share_percent": share });
        };
        let side = |s: Side| {
            let t = r.tally(s);
            json!({ "requests": t.requests() })
        };
        json!({
            "model": &*self.model,
            "mode": "staged",
            "share_percent": share,
            "state": r.state(),
            "steps": r.config().steps,
            "in_state_for_seconds": now.saturating_duration_since(r.since()).as_secs_f64(),
            "new": side(Side::New),
            "old": side(Side::Old),
            "fingerprint": self.fingerprint,
        })
    }
}

fn signal_label(signal: Signal) -> String {
    match signal.status() {
        Some(status) => format!("{}_{status}", signal.as_str()),
        None => signal.as_str().to_owned(),
    }
}

const HALTS: &str = "spillway_rollout_halts_total";

/// What a hand on a rollout asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Steer {
    Promote,
    Abort,
    Restart,
}

/// Every model's rollout, across reloads and restarts.
pub(crate) struct Rollouts {
    dir: std::path::PathBuf,
    /// The rollouts of the running config, by model.
    cells: Mutex<HashMap<String, Arc<RolloutCell>>>,
    /// What was saved, for rollouts not started yet in this process.
    kept: Mutex<HashMap<String, saved::Kept>>,
    /// Why the saved states could not be read at start, if they could not: then the rollouts of
    /// the config the gateway starts with start aborted, as they may have been halted before.
    unreadable: Mutex<Option<String>>,
    /// Shared with the config's changes: a halt is an anomaly of the running config.
    anomalies: Arc<AtomicU64>,
}

impl Rollouts {
    /// The rollouts saved in `dir`, to resume.
    pub(crate) fn load(dir: &std::path::Path, anomalies: Arc<AtomicU64>) -> Rollouts {
        let (kept, unreadable) = match saved::read(dir) {
            Ok(kept) => (kept, None),
            Err(e) => {
                error!(
                    "rollout states unreadable: every rollout starts aborted (its new version \
                     takes no traffic) until `spillway rollout restart MODEL`: {e}"
                );
                (HashMap::default(), Some(e))
            }
        };
        Rollouts {
            dir: dir.to_path_buf(),
            cells: Mutex::default(),
            kept: Mutex::new(kept),
            unreadable: Mutex::new(unreadable),
            anomalies,
        }
    }

    /// The rollout of `model`, if it has one: the running one when its plan and new backends
    /// are unchanged, else the one saved for them, else a new one at its first step.
    pub(crate) fn cell_for(&self, model: &ModelConfig) -> Option<Arc<RolloutCell>> {
        let spec = model.rollout.as_ref()?;
        let fingerprint = saved::fingerprint(spec, model);
        let running = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(cell) = running
            .get(&model.name)
            .filter(|c| c.fingerprint == fingerprint)
        {
            return Some(cell.clone());
        }
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let state = kept
            .get(&model.name)
            .filter(|k| k.fingerprint == fingerprint);
        match (state, kept.get(&model.name)) {
            (Some(_), _) => info!(model = %model.name, "rollout resumed from its saved state"),
            (None, Some(other)) if !matches!(other.state.status, Status::Running { .. }) => warn!(
                model = %model.name,
                "the saved rollout of this model was stopped ({:?}); this one differs from it (its \
                 plan or new backends), so it starts at its first step",
                other.state.status
            ),
            _ => {}
        }
        let cell = RolloutCell::new(model, fingerprint, state);
        let unreadable = self.unreadable.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(why), None) = (&*unreadable, state) {
            // It may have been halted before the restart: what cannot be known is not risked.
            if let Some(mut r) = cell.staged() {
                r.abort(
                    crate::clock::now(),
                    format!("its saved state was unreadable: {why}"),
                );
            }
        }
        Some(Arc::new(cell))
    }

    /// Makes `cells` the running rollouts (after a config is swapped in), and saves them.
    pub(crate) fn adopt(&self, cells: impl IntoIterator<Item = Arc<RolloutCell>>) {
        // Rollouts added from now on were configured in this process's life: they are new.
        self.unreadable
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        *self.cells.lock().unwrap_or_else(|e| e.into_inner()) = cells
            .into_iter()
            .map(|c| (c.model.to_string(), c))
            .collect();
        self.save();
    }

    /// Judges every running rollout, and saves them when one changed.
    pub(crate) fn evaluate(&self, now: Instant) {
        let cells: Vec<_> = self.running();
        let changed = cells.iter().fold(false, |changed, c| {
            c.evaluate(now, &self.anomalies) | changed
        });
        if changed {
            self.save();
        }
    }

    fn running(&self) -> Vec<Arc<RolloutCell>> {
        self.cells
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// What the admin API shows of every running rollout.
    pub(crate) fn views(&self, now: Instant) -> Vec<Value> {
        let mut cells = self.running();
        cells.sort_by(|a, b| a.model.cmp(&b.model));
        cells.iter().map(|c| c.view(now)).collect()
    }

    /// Promotes, aborts or restarts `model`'s rollout by hand; `None` when it has none that can
    /// be steered (none, or one in replace mode), else its view.
    pub(crate) fn steer(
        &self,
        model: &str,
        steer: Steer,
        now: Instant,
    ) -> Option<Result<Value, String>> {
        let cell = self
            .cells
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(model)
            .cloned()?;
        let mut r = cell.staged()?;
        let done = match steer {
            Steer::Promote => {
                let verdict = r.promote(now);
                let moved = verdict != Verdict::Hold;
                drop(r);
                cell.told(&verdict, &self.anomalies);
                moved.then_some(()).ok_or(
                    "only a running rollout can be promoted (restart a halted or aborted one)",
                )
            }
            Steer::Abort => {
                let stopped = r.abort(now, "aborted through the admin API");
                drop(r);
                if stopped {
                    warn!(
                        model,
                        "rollout aborted by hand: the new version takes no traffic"
                    );
                }
                stopped
                    .then_some(())
                    .ok_or("the rollout is already halted or aborted")
            }
            Steer::Restart => {
                r.restart(now);
                drop(r);
                info!(model, "rollout restarted at its first step");
                Ok(())
            }
        };
        self.save();
        Some(done.map(|()| cell.view(now)).map_err(str::to_owned))
    }

    fn save(&self) {
        let cells = self.running();
        let states: Vec<_> = cells
            .iter()
            .filter_map(|c| {
                Some((
                    c.model.to_string(),
                    c.fingerprint.clone(),
                    c.staged()?.state(),
                ))
            })
            .collect();
        if let Err(e) = saved::write(&self.dir, &states) {
            warn!(dir = %self.dir.display(), "rollout states not saved: {e}");
        }
    }

    /// The gauges of every running rollout, for the metrics page.
    pub(crate) fn render(&self, page: &mut String) {
        use std::fmt::Write;
        let cells = self.running();
        if cells.is_empty() {
            return;
        }
        page.push_str("# HELP spillway_rollout_share_percent The share of a model's first attempts its rollout's new version takes.\n# TYPE spillway_rollout_share_percent gauge\n");
        for c in &cells {
            let _ = writeln!(
                page,
                "spillway_rollout_share_percent{{model=\"{}\"}} {}",
                c.model,
                c.share() as f64 / 100.0
            );
        }
        page.push_str("# HELP spillway_rollout_status The state of a model's rollout (1 for the current one).\n# TYPE spillway_rollout_status gauge\n");
        for c in &cells {
            let status = match c.staged().map(|r| r.status().clone()) {
                None => "replace",
                Some(Status::Running { .. }) => "running",
                Some(Status::Halted { .. }) => "halted",
                Some(Status::Aborted { .. }) => "aborted",
                Some(Status::Completed) => "completed",
            };
            let _ = writeln!(
                page,
                "spillway_rollout_status{{model=\"{}\",status=\"{status}\"}} 1",
                c.model
            );
        }
    }
}

/// Judges every rollout of `rollouts` each [`EVALUATE_EVERY`], for as long as it runs.
pub(crate) async fn judge(rollouts: &Rollouts) {
    let mut tick = tokio::time::interval(EVALUATE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        rollouts.evaluate(crate::clock::now());
    }
}

pub(crate) fn describe() {
    metrics::describe_counter!(
        HALTS,
        "Rollouts halted by their comparator, by model and the signal in excess."
    );
}
