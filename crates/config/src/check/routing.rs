//! Which requests a backend takes: those on the API surfaces it serves ([`crate::Surface`]), and,
//! when it belongs to a dedicated pool, only those of that pool's tenants.

use super::Problems;
use crate::raw::RawBackend;
use crate::{Surface, Surfaces};

/// The surfaces `b` declares, or its kind's default. Azure OpenAI deployments serve neither the
/// Responses API under the deployment path nor the Anthropic Messages API, so those are refused
/// for kind `azure`.
pub(super) fn check_backend_surfaces(b: &RawBackend, at: &str, p: &mut Problems) -> Surfaces {
    let kind = b.kind.as_deref().unwrap_or("openai");
    let Some(names) = &b.surfaces else {
        return Surfaces::default_for(kind);
    };
    let at = format!("{at}.surfaces");
    let mut surfaces = Surfaces::NONE;
    for name in names {
        match Surface::parse(name) {
            Some(s) if surfaces.contains(s) => p.add(&at, format!("{name:?} is listed twice")),
            Some(s @ (Surface::Responses | Surface::Messages)) if kind == "azure" => p.add(
                &at,
                format!(
                    "{name:?}: kind \"azure\" routes by deployment, which serves no {s} surface"
                ),
            ),
            Some(s) => surfaces = surfaces.with(s),
            None => p.add(
                &at,
                format!(
                    "unknown surface {name:?}: expected some of {}",
                    Surface::ALL.map(|s| format!("{:?}", s.as_str())).join(", ")
                ),
            ),
        }
    }
    if names.is_empty() {
        p.add(&at, "must name at least one surface");
    }
    surfaces
}

/// A dedicated pool's name, if the backend names one.
pub(super) fn check_backend_pool(pool: Option<&str>, at: &str, p: &mut Problems) {
    if let Some(pool) = pool {
        let valid = !pool.is_empty()
            && pool.len() <= 64
            && pool
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !valid {
            p.add(
                format!("{at}.pool"),
                "must be 1 to 64 ASCII letters, digits, '-', '_' or '.'",
            );
        }
    }
}
