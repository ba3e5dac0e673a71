//! Rollout states in the data directory (`rollouts.json`), so a restart resumes each rollout at
//! the step it had reached (with its hold time started again: see `spillway_policy::rollout`),
//! and a halted one stays halted. Written to a temporary file and renamed, as the last-known-good
//! config is.

use std::io::Write;
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
    let file = match std::fs::File::open(&at) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(HashMap::default()),
        Err(e) => return Err(format!("{}: {e}", at.display())),
    };
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(file, MAX_BYTES + 1), &mut bytes)
        .map_err(|e| format!("{}: {e}", at.display()))?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(format!("{}: larger than {MAX_BYTES} bytes", at.display()));
    }
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
    std::fs::create_dir_all(dir)?;
    let bytes = serde_json::to_vec_pretty(&kept).map_err(std::io::Error::other)?;
    let tmp = dir.join(format!("{FILE}.tmp"));
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(&bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, dir.join(FILE))
}
