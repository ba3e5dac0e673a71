//! Affinity: keeping a key on one backend, within a bound on its load.
//!
//! Why affinity at all: an inference engine keeps the KV cache of the prompts it has just seen,
//! so a conversation or a shared system prompt that returns to the same backend skips most of
//! its prefill. Sending the same key to the same backend is worth a little imbalance, but not
//! an overloaded backend: one hot key must not pin all its traffic to one place.
//!
//! Why weighted rendezvous (highest random weight, HRW) hashing and not a hash ring: every
//! backend gets a score from the pair (key, backend id) and the key goes to the highest score
//! (Thaler and Ravishankar, 1998). With the score `-weight / ln(u)`, `u` uniform in (0, 1) from
//! a hash of the pair, a backend is first for a share of keys proportional to its weight (the
//! highest score is the earliest of exponential clocks that run at rate `weight`). It needs no
//! virtual nodes and no ring to rebuild, so weights are exact rather than approximated by
//! replicas; when a backend leaves, only the keys it ranked first move (each to its own
//! next-ranked backend, so they spread evenly rather than onto one ring neighbour); and the
//! backends arrive here as a fresh slice on every request, so a stateless ranking fits. The cost
//! is one hash per backend per request, which for a pool of tens of backends is nothing beside
//! an LLM call.
//!
//! Why bounded loads, after Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with Bounded
//! Loads" (SODA 2018): a backend may take the key only while its load after taking it stays
//! within `ceil(load_factor x (tier's outstanding + 1) x weight / tier's weight)` (with equal
//! weights, `ceil(load_factor x (outstanding + 1) / backends)`). The key walks down its ranking
//! to the first backend within the bound. No backend ever exceeds `load_factor` times its fair
//! share, however skewed the keys, and one always fits when `load_factor >= 1` (if none did,
//! every load would exceed its share, so their sum would exceed itself), and keys move only as
//! far as the bound requires. Loads here are spillway's `outstanding`, the requests it routes,
//! which are what the bound can hold.
//!
//! Why the bound travels with the pick ([`super::Pick::load_bound`]): the loads are read before
//! the choice, and a caller on another thread may take the same backend in between, so a bound
//! judged on the loads alone holds one pick at a time but not a burst of concurrent ones (two
//! pickers that both see room for one more both take it). The caller takes its unit with a
//! compare-and-swap against the bound, not only against the backend's limit, and picks again
//! from fresh loads when that fails. Loads read before the swap are no larger than at the swap
//! while nothing finishes, so the bound then holds at every moment of a burst.

use super::{AffinityOutcome, Candidate, Choice};

/// A typical load factor: no backend more than 25 % above its share of the tier's load.
pub const DEFAULT_LOAD_FACTOR: f64 = 1.25;

/// The splitmix64 step (Steele, Lea and Flood, "Fast Splittable Pseudorandom Number
/// Generators", 2014): adds the golden-ratio increment and mixes, a bijection on `u64` whose
/// every output bit depends on every input bit.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A hash of `bytes` that is the same on every build, platform and process (unlike std's
/// `DefaultHasher`): FNV-1a, then [`splitmix64`] so that similar names get unrelated hashes.
/// For backend ids and affinity keys, which every gateway instance must compute alike.
pub fn stable_hash(bytes: &[u8]) -> u64 {
    splitmix64(fnv1a(bytes))
}

/// The weighted rendezvous score of backend `id` with `weight` for `key`: the higher, the
/// earlier the backend ranks for the key. Zero for a weight of 0.
pub fn hrw_score(key: u64, id: u64, weight: u32) -> f64 {
    let h = splitmix64(splitmix64(key) ^ id);
    // The top 53 bits, centred in their interval: u is in (0, 1), never 0 or 1.
    let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    -f64::from(weight) / u.ln()
}

/// The first backend within the bound in `key`'s ranking of the candidates that pass `in_tier`:
/// which it is, whether it is the key's first-ranked backend of all those in `scope` (the tier's
/// regions, whether or not they could take a request now), and its bound (see [`Choice`]).
pub(super) fn choose(
    candidates: &[Candidate<'_>],
    in_tier: &impl Fn(&Candidate<'_>) -> bool,
    scope: &impl Fn(&Candidate<'_>) -> bool,
    key: u64,
    load_factor: f64,
) -> Option<Choice> {
    // `max` also turns a NaN into 1.
    let load_factor = load_factor.max(1.0);
    let (outstanding, weight) = candidates
        .iter()
        .filter(|c| in_tier(c))
        .fold((0u64, 0u64), |(o, w), c| {
            (o + u64::from(c.outstanding), w + u64::from(c.weight))
        });
    if weight == 0 {
        return None;
    }
    // Load after taking the key <= ceil(share), for an integer load, is load < share.
    let share = |c: &Candidate<'_>| {
        load_factor * (outstanding + 1) as f64 * f64::from(c.weight) / weight as f64
    };
    let within = |c: &Candidate<'_>| in_tier(c) && f64::from(c.outstanding) < share(c);
    // Walking the ranking to the first within the bound is taking the best score among them.
    // One always is (see the module documentation); the fallback only guards rounding, and
    // then only the backend's own limit holds it.
    let (index, load_bound) = match best(candidates, key, within) {
        // For an integer load, load < share is load < ceil(share); the cast saturates.
        Some(i) => (i, Some(share(&candidates[i]).ceil() as u32)),
        None => (best(candidates, key, in_tier)?, None),
    };
    let first = best(candidates, key, |c| scope(c) && c.weight > 0);
    let affinity = if first == Some(index) {
        AffinityOutcome::Hit
    } else {
        AffinityOutcome::Overflow
    };
    Some(Choice {
        index,
        affinity,
        load_bound,
    })
}

/// The candidate passing `keep` that ranks first for `key` (the earlier one on a tie).
fn best(
    candidates: &[Candidate<'_>],
    key: u64,
    keep: impl Fn(&Candidate<'_>) -> bool,
) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, c) in candidates.iter().enumerate() {
        if !keep(c) {
            continue;
        }
        let score = hrw_score(key, c.id, c.weight);
        if best.is_none_or(|(_, s)| score > s) {
            best = Some((i, score));
        }
    }
    best.map(|(i, _)| i)
}

/// 64-bit FNV-1a (Fowler, Noll and Vo).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests;
