//! Each model's `fallbacks`: the other models its requests go to, in order, when it cannot answer
//! them, and the failures each is for.

use std::collections::HashSet;

use super::Problems;
use crate::raw::RawModel;
use crate::{Fallback, ModelConfig, Trigger};

/// The fallbacks `m` lists. A fallback without `on` is for every trigger.
pub(super) fn check_fallbacks(m: &RawModel, at: &str, p: &mut Problems) -> Vec<Fallback<String>> {
    let mut seen = HashSet::new();
    m.fallbacks
        .iter()
        .enumerate()
        .filter_map(|(i, f)| {
            let at = format!("{at}.fallbacks[{i}]");
            if f.model == m.name {
                p.add(format!("{at}.model"), "a model cannot fall back to itself");
                return None;
            }
            if !seen.insert(f.model.as_str()) {
                p.add(format!("{at}.model"), format!("{:?} is listed twice", f.model));
                return None;
            }
            let on = match &f.on {
                None => Trigger::ALL.to_vec(),
                Some(names) if names.is_empty() => {
                    p.add(format!("{at}.on"), "must name at least one trigger");
                    return None;
                }
                Some(names) => names
                    .iter()
                    .filter_map(|n| {
                        let t = Trigger::parse(n);
                        if t.is_none() {
                            p.add(
                                format!("{at}.on"),
                                format!(
                                    "unknown trigger {n:?}: expected \"capacity\", \"context_window\" or \"unavailable\""
                                ),
                            );
                        }
                        t
                    })
                    .collect(),
            };
            Some(Fallback {
                model: f.model.clone(),
                on,
            })
        })
        .collect()
}

/// Every fallback names a configured model.
pub(super) fn check_fallback_models(models: &[ModelConfig], p: &mut Problems) {
    let names: HashSet<&str> = models.iter().map(|m| m.name.as_str()).collect();
    for m in models {
        for (i, f) in m.fallbacks.iter().enumerate() {
            if !names.contains(f.model.as_str()) {
                p.add(
                    format!("models[{:?}].fallbacks[{i}].model", m.name),
                    format!("no model {:?} is configured", f.model),
                );
            }
        }
    }
}
