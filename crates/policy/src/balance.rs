//! Choosing a backend: weighted power-of-two-choices within a region preference.
//!
//! Why two choices and not least-loaded: picking the least-loaded backend from a snapshot makes
//! every gateway thread (and every gateway instance) pile onto the same backend until its counters
//! catch up. Sampling two at random and taking the less loaded of the pair keeps nearly all of the
//! benefit of least-loaded while spreading simultaneous decisions (Mitzenmacher, "The Power of Two
//! Choices in Randomized Load Balancing").
//!
//! Why a region preference with spillover: a caller near region A should be served in A while A
//! has room; when every A backend is full or unreachable the request spills over to the other
//! regions rather than failing, and the caller is told in metrics that it did.

use rand::Rng;

/// One backend as the balancer sees it at the moment of the decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate<'a> {
    pub region: &'a str,
    /// Relative share of traffic, at least 1.
    pub weight: u32,
    /// Requests sent to it and not yet finished.
    pub outstanding: u32,
    /// It takes no request while `outstanding >= max_concurrency`.
    pub max_concurrency: u32,
    /// False while it is skipped (unreachable recently, or already tried for this request).
    pub available: bool,
}

impl Candidate<'_> {
    fn eligible(&self) -> bool {
        self.available && self.outstanding < self.max_concurrency && self.weight > 0
    }

    /// Load per unit of weight; the less, the better. Compared by cross-multiplication so no
    /// floating point is needed.
    fn lighter_than(&self, other: &Candidate<'_>) -> bool {
        u64::from(self.outstanding) * u64::from(other.weight)
            < u64::from(other.outstanding) * u64::from(self.weight)
    }
}

/// The balancer's choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pick {
    /// Index into the candidate slice.
    pub index: usize,
    /// True when a preferred region was given and the choice is outside it.
    pub spilled_over: bool,
}

/// Chooses a backend among `candidates`, preferring those in `preferred_region`.
///
/// Returns `None` when no candidate is available with room to spare: the caller then has no
/// capacity to offer and must say so (503), not queue without bound.
pub fn pick<R: Rng + ?Sized>(
    candidates: &[Candidate<'_>],
    preferred_region: Option<&str>,
    rng: &mut R,
) -> Option<Pick> {
    if let Some(region) = preferred_region {
        let home = |c: &Candidate<'_>| c.eligible() && c.region == region;
        if let Some(index) = two_choices(candidates, home, rng) {
            return Some(Pick {
                index,
                spilled_over: false,
            });
        }
    }
    let index = two_choices(candidates, |c| c.eligible(), rng)?;
    Some(Pick {
        index,
        spilled_over: preferred_region.is_some(),
    })
}

/// Weighted power-of-two-choices among the candidates that pass `keep`.
fn two_choices<R: Rng + ?Sized>(
    candidates: &[Candidate<'_>],
    keep: impl Fn(&Candidate<'_>) -> bool,
    rng: &mut R,
) -> Option<usize> {
    let total: u64 = candidates
        .iter()
        .filter(|c| keep(c))
        .map(|c| u64::from(c.weight))
        .sum();
    let first = weighted_sample(candidates, &keep, total, None, rng)?;
    let rest = total - u64::from(candidates[first].weight);
    let Some(second) = weighted_sample(candidates, &keep, rest, Some(first), rng) else {
        return Some(first);
    };
    if candidates[second].lighter_than(&candidates[first]) {
        Some(second)
    } else {
        Some(first)
    }
}

/// Samples one candidate with probability proportional to its weight, skipping `skip`.
fn weighted_sample<R: Rng + ?Sized>(
    candidates: &[Candidate<'_>],
    keep: &impl Fn(&Candidate<'_>) -> bool,
    total: u64,
    skip: Option<usize>,
    rng: &mut R,
) -> Option<usize> {
    if total == 0 {
        return None;
    }
    let mut ticket = rng.random_range(0..total);
    for (i, c) in candidates.iter().enumerate() {
        if Some(i) == skip || !keep(c) {
            continue;
        }
        let w = u64::from(c.weight);
        if ticket < w {
            return Some(i);
        }
        ticket -= w;
    }
    None
}

#[cfg(test)]
mod tests;
