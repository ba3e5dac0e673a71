//! Rollout states in the data directory (`rollouts.json`), so a restart resumes each rollout at
//! the step it had reached (with its hold time started again: see `spillway_policy::rollout`),
//! and a halted one stays halted. Written to a temporary file and renamed, as the last-known-good
//! config is.

use std::path::Path;

use foldhash::HashMap;
use serde::{Deserialize, Serialize};
use sha2::Digest;
use spillway_config::{ModelConfig, RolloutPlan, Side};
use spillway_policy::RolloutState;

/// The file's name in the data directory.
pub const FILE: &str = "rollouts.json";
/// The file is not read past this size (it holds a few lines per model).
const MAX_BYTES: u64 = 4 * 1024 * 1024;

/// A rollout's saved state, for the rollout its fingerprint names.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Kept {
    pub fingerprint: String,
    pub state: RolloutState,
}

/// What identifies a rollout: its plan and its new backends. A change to either is a new rollout,
/// started at its first step.
pub(super) fn fingerprint(plan: &RolloutPlan, model: &ModelConfig) -> String {
    let new: Vec<_> = model
        .backends
        .iter()
        .filter(|b| b.side == Side::New)
        .collect();
    let digest = sha2::Sha256::digest(format!("{plan:?}{new:?}").as_bytes());
    digest.iter().take(12).map(|b| format!("{b:02x}")).collect()
}

pub(super) fn read(dir: &Path) -> Result<HashMap<String, Kept>, String> {
    let at = dir.join(FILE);
    let Some(bytes) = crate::files::read_if_there(&at, MAX_BYTES)? else {
        return Ok(HashMap::default());
    };
    serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", at.display()))
}

pub(super) fn write(dir: &Path, states: &[(String, String, RolloutState)]) -> std::io::Result<()> {
    let kept: HashMap<&str, Kept> = states
        .iter()
        .map(|(model, fingerprint, state)| {
            let kept = Kept {
                fingerprint: fingerprint.clone(),
                state: state.clone(),
            };
            (model.as_str(), kept)
        })
        .collect();
    if kept.is_empty() && !dir.join(FILE).exists() {
        return Ok(());
    }
    let bytes = serde_json::to_vec_pretty(&kept).map_err(std::io::Error::other)?;
    crate::files::write_atomically(dir, FILE, &bytes)
}
