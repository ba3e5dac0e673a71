//! Choosing a backend: tiers by region and saturation, then a strategy within the tier.
//!
//! Why two choices and not least-loaded: picking the least-loaded backend from a snapshot makes
//! every gateway thread (and every gateway instance) pile onto the same backend until its counters
//! catch up. Sampling two at random and taking the less loaded of the pair keeps nearly all of the
//! benefit of least-loaded while spreading simultaneous decisions (Mitzenmacher, "The Power of Two
//! Choices in Randomized Load Balancing"). That is [`Strategy::LeastLoad`]; [`Strategy::Affinity`]
//! keeps a key (a session, a shared prompt prefix) on one backend so its KV cache is reused,
//! within a bound on load ([`affinity`]); [`Strategy::RoundRobin`] is the naive baseline that
//! benchmarks compare the others with.
//!
//! Load is read from the engine itself when its metrics are known ([`EngineView`]): an inference
//! engine's queue holds work from every gateway and from direct callers, so spillway's own count
//! of requests in flight underrates it. A fresh reading counts what the engine runs and queues,
//! plus what spillway has sent since the reading, per request slot (`limit`), plus the share of
//! KV cache in use: a backend whose cache is nearly full will soon preempt or queue even with
//! free slots.
//!
//! Why tiers, each a complete attempt before the next: (a) the preferred region while it has a
//! backend that is not saturated, then (b) any region that has one, then (c) the preferred region
//! even saturated, then (d) any region. A caller near region A is served in A while A has room;
//! when A is full the request spills over rather than failing. A saturated backend (its queue
//! past [`Saturation::max_queue`], its KV cache past [`Saturation::max_kv_usage`]) is avoided
//! while something else has room, but it is still used when nothing else does: the engine queues
//! the request itself, which beats refusing it, and a backend is only refused outright when it is
//! unavailable or at spillway's own `limit`. A region preference is kept even in the saturated
//! tiers, since a saturated home backend still answers with less network delay.
//!
//! Why a stale reading counts as saturated, never as idle (the rule of the llm-d / Gateway API
//! inference scheduler's saturation detector, which treats a pod whose metrics are older than its
//! staleness bound as having no capacity): an old reading of an empty queue says nothing about
//! the queue now, and the likeliest reason a metrics endpoint stops answering is that the engine
//! is overwhelmed or gone. Trusting it would send the most traffic to the backend we know least
//! about. Ranking it as saturated rather than ejecting it keeps a backend whose metrics endpoint
//! alone is down in use when nothing better has room, so healthy traffic is never shed for it.

use rand::Rng;

pub mod affinity;

/// One backend as the balancer sees it at the moment of the decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate<'a> {
    pub region: &'a str,
    /// Relative share of traffic, at least 1 (a weight of 0 is never picked).
    pub weight: u32,
    /// Requests spillway has sent to it and not yet finished.
    pub outstanding: u32,
    /// Spillway's cap: it takes no request while `outstanding >= limit`.
    pub limit: u32,
    /// False while it is skipped (ejected, cooling down, or already tried for this request).
    pub available: bool,
    /// Stable identity for affinity hashing (a hash of the backend's name, for example
    /// [`affinity::stable_hash`]), so every gateway instance maps a key to the same backend.
    pub id: u64,
    /// What the engine last reported about its own load.
    pub engine: EngineView,
}

/// The engine's own view of its load, as far as the gateway knows it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EngineView {
    /// No engine metrics for this backend: its load is spillway's `outstanding`.
    Unknown,
    /// The last reading is older than the staleness bound: saturated, never idle.
    Stale,
    /// A reading within the staleness bound.
    Fresh {
        /// Requests the engine is running.
        running: u32,
        /// Requests queued in the engine.
        waiting: u32,
        /// Requests spillway sent it since the reading was taken (not yet in the reading).
        sent_since: u32,
        /// Share of the KV cache in use, 0 to 1, when the engine reports it. A value that is not
        /// a finite number is taken as not reported.
        kv_usage: Option<f64>,
    },
}

/// When a backend with a fresh reading counts as saturated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Saturation {
    /// Saturated while the engine queues more than this many requests.
    pub max_queue: u32,
    /// Saturated while at least this share of its KV cache is in use.
    pub max_kv_usage: f64,
}

impl Default for Saturation {
    /// spillway's defaults (`[engine_metrics]`): a queue above 2, KV cache at 95 %. The Gateway
    /// API inference extension uses 5 and 80 %; an LLM engine under steady load runs with most
    /// of its KV cache in use by design, so 80 % would mark busy engines that still have room.
    fn default() -> Self {
        Saturation {
            max_queue: 2,
            max_kv_usage: 0.95,
        }
    }
}

/// How to choose within a tier.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Strategy {
    /// Weighted power-of-two-choices on the load score.
    LeastLoad,
    /// Weighted rendezvous hashing of `key` with bounded loads; `load_factor` (at least 1,
    /// [`affinity::DEFAULT_LOAD_FACTOR`] typical) is how far above the tier's mean a backend may
    /// be loaded and still take the key. See [`affinity`].
    Affinity { key: u64, load_factor: f64 },
    /// The `turn mod n`-th of the tier's `n` eligible backends in slice order (a baseline for
    /// benchmarks; `turn` is a counter the caller advances).
    RoundRobin { turn: u64 },
}

/// The balancer's choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pick {
    /// Index into the candidate slice.
    pub index: usize,
    /// True when a preferred region was given and the choice is outside it.
    pub spilled_over: bool,
    /// True when no backend with room was unsaturated, so the choice is a saturated one.
    pub saturated: bool,
    /// What became of the affinity key, if one was given.
    pub affinity: AffinityOutcome,
    /// The most requests the chosen backend may have outstanding once it takes this one, under
    /// the strategy's load bound (affinity's; see [`affinity`]): the caller takes its unit only
    /// while the backend's load is below it (and below its `limit`), and picks again otherwise,
    /// since the loads the choice was made from may have grown since they were read. `None`
    /// when only the backend's `limit` applies.
    pub load_bound: Option<u32>,
}

/// A strategy's choice within a tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Choice {
    /// Index into the candidate slice.
    pub index: usize,
    pub affinity: AffinityOutcome,
    /// [`Pick::load_bound`].
    pub load_bound: Option<u32>,
}

impl Choice {
    /// A choice with no affinity asked and no bound but the backend's limit.
    fn plain(index: usize) -> Choice {
        Choice {
            index,
            affinity: AffinityOutcome::NotAsked,
            load_bound: None,
        }
    }
}

/// What became of an affinity key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AffinityOutcome {
    /// The strategy was not [`Strategy::Affinity`].
    NotAsked,
    /// The choice is the key's first-ranked backend in the tier's regions.
    Hit,
    /// The key's first-ranked backend was over the load bound, saturated, full or unavailable,
    /// and another was chosen.
    Overflow,
}

impl AffinityOutcome {
    /// A short stable name, for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            AffinityOutcome::NotAsked => "not_asked",
            AffinityOutcome::Hit => "hit",
            AffinityOutcome::Overflow => "overflow",
        }
    }
}

/// Chooses a backend among `candidates`, preferring those in `preferred_region` and those not
/// saturated, in the tiers of the module documentation, with `strategy` within a tier.
///
/// Returns `None` only when no candidate is available with room under its `limit`: the caller
/// then has no capacity to offer and must say so (503), not queue without bound. Saturation
/// alone never makes it `None`.
pub fn pick<R: Rng + ?Sized>(
    candidates: &[Candidate<'_>],
    preferred_region: Option<&str>,
    strategy: Strategy,
    saturation: Saturation,
    rng: &mut R,
) -> Option<Pick> {
    let tiers = [
        (preferred_region, false),
        (None, false),
        (preferred_region, true),
        (None, true),
    ];
    for (i, &(region, saturated)) in tiers.iter().enumerate() {
        // The preferred-region tiers (0 and 2) exist only when a region is preferred.
        if i % 2 == 0 && region.is_none() {
            continue;
        }
        let scope = |c: &Candidate<'_>| region.is_none_or(|r| c.region == r);
        let in_tier =
            |c: &Candidate<'_>| c.eligible() && c.saturated(saturation) == saturated && scope(c);
        if let Some(choice) = choose(candidates, &in_tier, &scope, strategy, rng) {
            let index = choice.index;
            return Some(Pick {
                index,
                spilled_over: preferred_region.is_some_and(|r| candidates[index].region != r),
                saturated,
                affinity: choice.affinity,
                load_bound: choice.load_bound,
            });
        }
    }
    None
}

impl Candidate<'_> {
    fn eligible(&self) -> bool {
        self.available && self.outstanding < self.limit && self.weight > 0
    }

    fn saturated(&self, saturation: Saturation) -> bool {
        match self.engine {
            EngineView::Unknown => false,
            EngineView::Stale => true,
            EngineView::Fresh {
                waiting,
                sent_since,
                ..
            } => {
                // An engine that was already queueing queues what was sent since the reading
                // too; one that was not probably gave it free slots.
                let queued = if waiting > 0 {
                    waiting.saturating_add(sent_since)
                } else {
                    0
                };
                queued > saturation.max_queue
                    || self
                        .kv_reading()
                        .is_some_and(|kv| kv >= saturation.max_kv_usage)
            }
        }
    }

    /// The KV cache share the engine reported, if it is a number.
    fn kv_reading(&self) -> Option<f64> {
        match self.engine {
            EngineView::Fresh {
                kv_usage: Some(kv), ..
            } if kv.is_finite() => Some(kv.max(0.0)),
            _ => None,
        }
    }

    fn kv_usage(&self) -> f64 {
        self.kv_reading().unwrap_or(0.0)
    }

    /// Requests counted against the backend's slots.
    fn requests(&self) -> u64 {
        match self.engine {
            EngineView::Unknown | EngineView::Stale => u64::from(self.outstanding),
            EngineView::Fresh {
                running,
                waiting,
                sent_since,
                ..
            } => u64::from(running) + u64::from(waiting) + u64::from(sent_since),
        }
    }

    /// The load score per unit of weight is the less, the better: `requests / limit + kv_usage`,
    /// divided by the weight, with a stale reading after every other. Compared exactly by
    /// cross-multiplication when no KV cache share is involved.
    fn lighter_than(&self, other: &Candidate<'_>) -> bool {
        let (stale, other_stale) = (
            self.engine == EngineView::Stale,
            other.engine == EngineView::Stale,
        );
        if stale != other_stale {
            return other_stale;
        }
        let (kv, other_kv) = (self.kv_usage(), other.kv_usage());
        if kv == 0.0 && other_kv == 0.0 {
            let side = |c: &Candidate<'_>| u128::from(c.limit) * u128::from(c.weight);
            return u128::from(self.requests()) * side(other)
                < u128::from(other.requests()) * side(self);
        }
        self.score() < other.score()
    }

    fn score(&self) -> f64 {
        (self.requests() as f64 / f64::from(self.limit.max(1)) + self.kv_usage())
            / f64::from(self.weight.max(1))
    }
}

/// Applies `strategy` among the candidates that pass `in_tier`. `scope` is the tier's region
/// filter alone, which affinity needs to tell a hit from an overflow.
fn choose<R: Rng + ?Sized>(
    candidates: &[Candidate<'_>],
    in_tier: &impl Fn(&Candidate<'_>) -> bool,
    scope: &impl Fn(&Candidate<'_>) -> bool,
    strategy: Strategy,
    rng: &mut R,
) -> Option<Choice> {
    match strategy {
        Strategy::LeastLoad => two_choices(candidates, in_tier, rng).map(Choice::plain),
        Strategy::RoundRobin { turn } => round_robin(candidates, in_tier, turn).map(Choice::plain),
        Strategy::Affinity { key, load_factor } => {
            affinity::choose(candidates, in_tier, scope, key, load_factor)
        }
    }
}

/// The `turn mod n`-th of the `n` candidates that pass `keep`, in slice order.
fn round_robin(
    candidates: &[Candidate<'_>],
    keep: &impl Fn(&Candidate<'_>) -> bool,
    turn: u64,
) -> Option<usize> {
    let count = candidates.iter().filter(|c| keep(c)).count() as u64;
    if count == 0 {
        return None;
    }
    let nth = (turn % count) as usize;
    candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| keep(c))
        .nth(nth)
        .map(|(i, _)| i)
}

/// Weighted power-of-two-choices among the candidates that pass `keep`.
fn two_choices<R: Rng + ?Sized>(
    candidates: &[Candidate<'_>],
    keep: &impl Fn(&Candidate<'_>) -> bool,
    rng: &mut R,
) -> Option<usize> {
    let total: u64 = candidates
        .iter()
        .filter(|c| keep(c))
        .map(|c| u64::from(c.weight))
        .sum();
    let first = weighted_sample(candidates, keep, total, None, rng)?;
    let rest = total - u64::from(candidates[first].weight);
    let Some(second) = weighted_sample(candidates, keep, rest, Some(first), rng) else {
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
