//! A model's balancing settings: the strategy and what affinity keys on.

use super::Problems;
use crate::raw::RawModel;
use crate::{Balance, BalanceConfig};

/// Characters of the prompt hashed for prefix affinity by default: about 250 tokens, enough
/// to tell system prompts apart and short enough that the first turns of one conversation share it.
pub const DEFAULT_PREFIX_CHARS: usize = 1024;
const MAX_PREFIX_CHARS: usize = 1 << 20;
/// A backend may take 1.25x the average load for affinity's sake (Mirrokni et al. use 1 + e).
pub const DEFAULT_LOAD_FACTOR: f64 = 1.25;

pub(super) fn check_balance(m: &RawModel, at: &str, p: &mut Problems) -> BalanceConfig {
    let strategy = match m.balance.as_deref().unwrap_or("least_load") {
        "least_load" => Balance::LeastLoad,
        "prefix_affinity" => Balance::PrefixAffinity,
        "session_affinity" => Balance::SessionAffinity,
        "round_robin" => Balance::RoundRobin,
        other => {
            p.add(
                format!("{at}.balance"),
                format!(
                    "unknown strategy {other:?}: expected \"least_load\", \"prefix_affinity\", \"session_affinity\" or \"round_robin\""
                ),
            );
            Balance::LeastLoad
        }
    };
    let prefix_chars = m.affinity_prefix_chars.unwrap_or(DEFAULT_PREFIX_CHARS);
    if !(1..=MAX_PREFIX_CHARS).contains(&prefix_chars) {
        p.add(
            format!("{at}.affinity_prefix_chars"),
            format!("must be between 1 and {MAX_PREFIX_CHARS}, got {prefix_chars}"),
        );
    }
    let load_factor = m.affinity_load_factor.unwrap_or(DEFAULT_LOAD_FACTOR);
    if !(1.0..=10.0).contains(&load_factor) {
        p.add(
            format!("{at}.affinity_load_factor"),
            format!("must be between 1 and 10, got {load_factor}"),
        );
    }
    let header = m.session_header.as_deref().unwrap_or("x-session-id");
    let session_header = http::HeaderName::try_from(header).unwrap_or_else(|_| {
        p.add(
            format!("{at}.session_header"),
            format!("{header:?} is not a header name"),
        );
        http::HeaderName::from_static("x-session-id")
    });
    BalanceConfig {
        strategy,
        prefix_chars: prefix_chars.clamp(1, MAX_PREFIX_CHARS),
        load_factor: load_factor.clamp(1.0, 10.0),
        session_header,
        session_from_user: m.session_from_user.unwrap_or(false),
    }
}
