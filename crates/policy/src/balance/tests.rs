use proptest::prelude::{any, prop, prop_assert, prop_assert_eq, prop_oneof, proptest, Just};
use proptest::strategy::Strategy as _;
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::*;

const SAT: Saturation = Saturation {
    max_queue: 5,
    max_kv_usage: 0.8,
};

fn cand(region: &str, weight: u32, outstanding: u32) -> Candidate<'_> {
    Candidate {
        region,
        weight,
        outstanding,
        limit: 100,
        available: true,
        id: u64::from(outstanding) << 8 | u64::from(weight),
        engine: EngineView::Unknown,
    }
}

fn fresh(running: u32, waiting: u32, kv_usage: Option<f64>) -> EngineView {
    EngineView::Fresh {
        running,
        waiting,
        sent_since: 0,
        kv_usage,
    }
}

fn least(c: &[Candidate<'_>], home: Option<&str>, rng: &mut StdRng) -> Option<Pick> {
    pick(c, home, Strategy::LeastLoad, SAT, rng)
}

fn index(c: &[Candidate<'_>], home: Option<&str>, rng: &mut StdRng) -> usize {
    least(c, home, rng).unwrap().index
}

#[test]
fn saturation_defaults_are_the_documented_ones() {
    assert_eq!(
        Saturation::default(),
        Saturation {
            max_queue: 2,
            max_kv_usage: 0.95
        }
    );
}

#[test]
fn a_queueing_engine_counts_what_was_sent_since_its_reading() {
    let sat = Saturation::default();
    let fresh = |waiting, sent_since| Candidate {
        engine: EngineView::Fresh {
            running: 2,
            waiting,
            sent_since,
            kv_usage: None,
        },
        ..cand("a", 1, 0)
    };
    // Already queueing: two more sent since the reading make three queued, past the bound.
    assert!(fresh(1, 2).saturated(sat));
    assert!(!fresh(1, 1).saturated(sat));
    // Not queueing at the reading: what was sent since probably took free slots.
    assert!(!fresh(0, 10).saturated(sat));
}

#[test]
fn two_equal_weights_pick_the_less_loaded_when_both_sampled() {
    let c = [cand("a", 1, 10), cand("a", 1, 2)];
    let mut rng = StdRng::seed_from_u64(7);
    for _ in 0..100 {
        assert_eq!(index(&c, None, &mut rng), 1);
    }
}

#[test]
fn load_is_compared_per_unit_of_weight() {
    // 6 outstanding on weight 3 (2 per unit) beats 3 outstanding on weight 1.
    let c = [cand("a", 1, 3), cand("a", 3, 6)];
    let mut rng = StdRng::seed_from_u64(1);
    for _ in 0..100 {
        assert_eq!(index(&c, None, &mut rng), 1);
    }
}

#[test]
fn without_engine_metrics_load_is_outstanding_per_slot() {
    // 3 of 4 slots used is heavier than 5 of 10.
    let mut small = cand("a", 1, 3);
    small.limit = 4;
    let mut large = cand("a", 1, 5);
    large.limit = 10;
    let mut rng = StdRng::seed_from_u64(2);
    for _ in 0..100 {
        assert_eq!(index(&[small, large], None, &mut rng), 1);
    }
}

#[test]
fn a_fresh_reading_counts_the_engines_own_queue() {
    // Spillway sent the first nothing, but other callers fill it: 4 running, 3 waiting, and 1
    // sent since the reading make 8 of 10, against 6 of 10 for the second.
    let mut busy = cand("a", 1, 0);
    busy.limit = 10;
    busy.engine = EngineView::Fresh {
        running: 4,
        waiting: 3,
        sent_since: 1,
        kv_usage: None,
    };
    let mut other = cand("a", 1, 6);
    other.limit = 10;
    let mut rng = StdRng::seed_from_u64(3);
    for _ in 0..100 {
        assert_eq!(index(&[busy, other], None, &mut rng), 1);
    }
}

#[test]
fn kv_cache_usage_adds_to_the_load() {
    // Equal requests; the first has its cache 70 % full, the second 10 %.
    let mut full = cand("a", 1, 0);
    full.engine = fresh(2, 0, Some(0.7));
    let mut empty = cand("a", 1, 0);
    empty.engine = fresh(2, 0, Some(0.1));
    let mut rng = StdRng::seed_from_u64(4);
    for _ in 0..100 {
        assert_eq!(index(&[full, empty], None, &mut rng), 1);
    }
}

#[test]
fn a_queue_past_the_bound_or_a_full_kv_cache_saturates() {
    let c = cand("a", 1, 0);
    let at = |engine| Candidate { engine, ..c };
    assert!(!at(EngineView::Unknown).saturated(SAT));
    assert!(at(EngineView::Stale).saturated(SAT));
    assert!(!at(fresh(50, 5, Some(0.79))).saturated(SAT));
    assert!(at(fresh(0, 6, None)).saturated(SAT));
    assert!(at(fresh(0, 0, Some(0.8))).saturated(SAT));
    // A reading that is not a number is taken as no reading of the cache, and no reading of
    // the cache never saturates, whatever the bound.
    assert!(!at(fresh(0, 0, Some(f64::NAN))).saturated(SAT));
    let zero = Saturation {
        max_kv_usage: 0.0,
        ..SAT
    };
    assert!(!at(fresh(0, 0, None)).saturated(zero));
    assert!(at(fresh(0, 0, Some(0.0))).saturated(zero));
}

#[test]
fn home_region_is_preferred_while_it_has_room() {
    let c = [cand("b", 1, 0), cand("a", 1, 50), cand("b", 1, 0)];
    let mut rng = StdRng::seed_from_u64(3);
    for _ in 0..100 {
        assert_eq!(
            least(&c, Some("a"), &mut rng),
            Some(Pick {
                index: 1,
                spilled_over: false,
                saturated: false,
                affinity: AffinityOutcome::NotAsked,
                load_bound: None,
            })
        );
    }
}

#[test]
fn spills_over_when_home_region_is_full_or_unavailable() {
    let mut full = cand("a", 1, 100);
    full.limit = 100;
    let mut down = cand("a", 5, 0);
    down.available = false;
    let c = [full, down, cand("b", 1, 0)];
    let mut rng = StdRng::seed_from_u64(3);
    assert_eq!(
        least(&c, Some("a"), &mut rng),
        Some(Pick {
            index: 2,
            spilled_over: true,
            saturated: false,
            affinity: AffinityOutcome::NotAsked,
            load_bound: None,
        })
    );
}

#[test]
fn a_saturated_home_spills_to_an_unsaturated_region() {
    let mut home = cand("a", 1, 0);
    home.engine = fresh(1, 9, None);
    let c = [home, cand("b", 1, 20)];
    let p = least(&c, Some("a"), &mut StdRng::seed_from_u64(5)).unwrap();
    assert_eq!((p.index, p.spilled_over, p.saturated), (1, true, false));
}

#[test]
fn saturated_backends_still_serve_when_nothing_else_has_room() {
    // Every backend is saturated: the home region's is used, and said to be saturated.
    let mut home = cand("a", 1, 0);
    home.engine = fresh(1, 9, None);
    let mut away = cand("b", 1, 0);
    away.engine = EngineView::Stale;
    let p = least(&[away, home], Some("a"), &mut StdRng::seed_from_u64(6)).unwrap();
    assert_eq!((p.index, p.spilled_over, p.saturated), (1, false, true));
    // The home region is full as well: the other region's saturated backend is used.
    home.outstanding = home.limit;
    let p = least(&[away, home], Some("a"), &mut StdRng::seed_from_u64(6)).unwrap();
    assert_eq!((p.index, p.spilled_over, p.saturated), (0, true, true));
}

#[test]
fn a_backend_whose_metrics_are_down_still_takes_traffic() {
    // The only backend's metrics endpoint stopped answering: its requests are not refused.
    let mut only = cand("a", 1, 3);
    only.engine = EngineView::Stale;
    let p = least(&[only], None, &mut StdRng::seed_from_u64(0)).unwrap();
    assert_eq!((p.index, p.saturated), (0, true));
}

#[test]
fn a_stale_reading_is_never_taken_for_an_idle_backend() {
    // The stale backend has nothing outstanding, the other is nearly full: the other wins,
    // since it alone is known to have room.
    let mut stale = cand("a", 1, 0);
    stale.engine = EngineView::Stale;
    let busy = cand("a", 1, 99);
    let mut rng = StdRng::seed_from_u64(8);
    for _ in 0..100 {
        assert_eq!(index(&[stale, busy], None, &mut rng), 1);
    }
    // Among saturated backends a stale one ranks after a fresh one however loaded that is.
    let mut queued = cand("a", 1, 0);
    queued.engine = fresh(90, 50, Some(0.99));
    for _ in 0..100 {
        let p = least(&[stale, queued], None, &mut rng).unwrap();
        assert_eq!((p.index, p.saturated), (1, true));
    }
}

#[test]
fn no_capacity_anywhere_is_none() {
    let mut a = cand("a", 1, 1);
    a.limit = 1;
    let mut b = cand("b", 1, 0);
    b.available = false;
    let mut rng = StdRng::seed_from_u64(0);
    assert_eq!(least(&[a, b], Some("a"), &mut rng), None);
    assert_eq!(least(&[], None, &mut rng), None);
}

#[test]
fn idle_backends_share_traffic_by_weight() {
    // With equal load, the pair's first member wins ties, so traffic follows the first sample,
    // which is proportional to weight.
    let c = [cand("a", 1, 0), cand("a", 3, 0)];
    let mut rng = StdRng::seed_from_u64(42);
    let n = 20_000;
    let heavy = (0..n).filter(|_| index(&c, None, &mut rng) == 1).count();
    let share = heavy as f64 / n as f64;
    assert!(
        (0.72..0.78).contains(&share),
        "share of weight-3 backend: {share}"
    );
}

#[test]
fn round_robin_takes_the_tiers_backends_in_turn() {
    let mut down = cand("a", 1, 0);
    down.available = false;
    let c = [cand("a", 1, 0), down, cand("a", 9, 50), cand("a", 1, 0)];
    let mut rng = StdRng::seed_from_u64(0);
    let order: Vec<usize> = (0..7)
        .map(|turn| {
            let strategy = Strategy::RoundRobin { turn };
            pick(&c, None, strategy, SAT, &mut rng).unwrap().index
        })
        .collect();
    assert_eq!(order, [0, 2, 3, 0, 2, 3, 0]);
}

#[test]
fn affinity_outcomes_have_stable_names() {
    assert_eq!(AffinityOutcome::NotAsked.as_str(), "not_asked");
    assert_eq!(AffinityOutcome::Hit.as_str(), "hit");
    assert_eq!(AffinityOutcome::Overflow.as_str(), "overflow");
}

/// Raw material for one candidate: region, weight, outstanding, limit, available, engine.
type Raw = (String, u32, u32, u32, bool, EngineView);

fn arb_engine() -> impl proptest::strategy::Strategy<Value = EngineView> {
    prop_oneof![
        Just(EngineView::Unknown),
        Just(EngineView::Stale),
        (0u32..20, 0u32..12, 0u32..5, prop::option::of(0.0f64..1.0)).prop_map(
            |(running, waiting, sent_since, kv_usage)| EngineView::Fresh {
                running,
                waiting,
                sent_since,
                kv_usage,
            }
        ),
    ]
}

fn arb_candidate() -> impl proptest::strategy::Strategy<Value = Raw> {
    (
        prop_oneof![
            Just("a".to_owned()),
            Just("b".to_owned()),
            Just("c".to_owned())
        ],
        0u32..10,
        0u32..20,
        0u32..20,
        any::<bool>(),
        arb_engine(),
    )
}

fn arb_strategy() -> impl proptest::strategy::Strategy<Value = Strategy> {
    prop_oneof![
        Just(Strategy::LeastLoad),
        any::<u64>().prop_map(|turn| Strategy::RoundRobin { turn }),
        (any::<u64>(), 0.0f64..3.0)
            .prop_map(|(key, load_factor)| Strategy::Affinity { key, load_factor }),
    ]
}

fn build(raw: &[Raw]) -> Vec<Candidate<'_>> {
    raw.iter()
        .enumerate()
        .map(|(i, (r, w, o, l, a, e))| Candidate {
            region: r,
            weight: *w,
            outstanding: *o,
            limit: *l,
            available: *a,
            id: i as u64,
            engine: *e,
        })
        .collect()
}

proptest! {
    /// The tiers in order: nothing with room is ever refused, an unsaturated backend with room
    /// always wins over a saturated one, and the home region wins within the same saturation.
    #[test]
    fn the_first_tier_with_room_is_used_and_nothing_with_room_is_refused(
        raw in prop::collection::vec(arb_candidate(), 0..8),
        home in prop_oneof![Just(None), Just(Some("a")), Just(Some("b"))],
        strategy in arb_strategy(),
        seed in any::<u64>(),
    ) {
        let c = build(&raw);
        let mut rng = StdRng::seed_from_u64(seed);
        let room = |sat: bool, home_only: bool| c.iter().any(|c| {
            c.eligible()
                && c.saturated(SAT) == sat
                && (!home_only || home.is_some_and(|h| c.region == h))
        });
        match pick(&c, home, strategy, SAT, &mut rng) {
            None => prop_assert!(!c.iter().any(|c| c.eligible())),
            Some(p) => {
                let chosen = &c[p.index];
                prop_assert!(chosen.eligible());
                prop_assert_eq!(p.saturated, chosen.saturated(SAT));
                prop_assert_eq!(p.saturated, !room(false, false));
                let in_home = home.is_some_and(|h| chosen.region == h);
                prop_assert_eq!(p.spilled_over, home.is_some() && !in_home);
                prop_assert_eq!(in_home, room(p.saturated, true));
                let asked = matches!(strategy, Strategy::Affinity { .. });
                prop_assert_eq!(p.affinity == AffinityOutcome::NotAsked, !asked);
            }
        }
    }
}
