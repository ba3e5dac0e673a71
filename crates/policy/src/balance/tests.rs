use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::*;

fn cand(region: &str, weight: u32, outstanding: u32) -> Candidate<'_> {
    Candidate {
        region,
        weight,
        outstanding,
        max_concurrency: 100,
        available: true,
    }
}

#[test]
fn two_equal_weights_pick_the_less_loaded_when_both_sampled() {
    let c = [cand("a", 1, 10), cand("a", 1, 2)];
    let mut rng = StdRng::seed_from_u64(7);
    for _ in 0..100 {
        assert_eq!(pick(&c, None, &mut rng).unwrap().index, 1);
    }
}

#[test]
fn load_is_compared_per_unit_of_weight() {
    // 6 outstanding on weight 3 (2 per unit) beats 3 outstanding on weight 1.
    let c = [cand("a", 1, 3), cand("a", 3, 6)];
    let mut rng = StdRng::seed_from_u64(1);
    for _ in 0..100 {
        assert_eq!(pick(&c, None, &mut rng).unwrap().index, 1);
    }
}

#[test]
fn home_region_is_preferred_while_it_has_room() {
    let c = [cand("b", 1, 0), cand("a", 1, 50), cand("b", 1, 0)];
    let mut rng = StdRng::seed_from_u64(3);
    for _ in 0..100 {
        assert_eq!(
            pick(&c, Some("a"), &mut rng),
            Some(Pick {
                index: 1,
                spilled_over: false
            })
        );
    }
}

#[test]
fn spills_over_when_home_region_is_full_or_unavailable() {
    let mut full = cand("a", 1, 100);
    full.max_concurrency = 100;
    let mut down = cand("a", 5, 0);
    down.available = false;
    let c = [full, down, cand("b", 1, 0)];
    let mut rng = StdRng::seed_from_u64(3);
    assert_eq!(
        pick(&c, Some("a"), &mut rng),
        Some(Pick {
            index: 2,
            spilled_over: true
        })
    );
}

#[test]
fn no_capacity_anywhere_is_none() {
    let mut a = cand("a", 1, 1);
    a.max_concurrency = 1;
    let mut b = cand("b", 1, 0);
    b.available = false;
    let mut rng = StdRng::seed_from_u64(0);
    assert_eq!(pick(&[a, b], Some("a"), &mut rng), None);
    assert_eq!(pick(&[], None, &mut rng), None);
}

#[test]
fn idle_backends_share_traffic_by_weight() {
    // With equal load, the pair's first member wins ties, so traffic follows the first sample,
    // which is proportional to weight.
    let c = [cand("a", 1, 0), cand("a", 3, 0)];
    let mut rng = StdRng::seed_from_u64(42);
    let n = 20_000;
    let heavy = (0..n)
        .filter(|_| pick(&c, None, &mut rng).unwrap().index == 1)
        .count();
    let share = heavy as f64 / n as f64;
    assert!(
        (0.72..0.78).contains(&share),
        "share of weight-3 backend: {share}"
    );
}

fn arb_candidate() -> impl Strategy<Value = (String, u32, u32, u32, bool)> {
    (
        prop_oneof![
            Just("a".to_owned()),
            Just("b".to_owned()),
            Just("c".to_owned())
        ],
        1u32..10,
        0u32..20,
        1u32..20,
        any::<bool>(),
    )
}

proptest! {
    #[test]
    fn never_picks_an_ineligible_backend_and_prefers_home(
        raw in prop::collection::vec(arb_candidate(), 0..8),
        home in prop_oneof![Just(None), Just(Some("a")), Just(Some("b"))],
        seed in any::<u64>(),
    ) {
        let c: Vec<Candidate<'_>> = raw.iter().map(|(r, w, o, m, a)| Candidate {
            region: r, weight: *w, outstanding: *o, max_concurrency: *m, available: *a,
        }).collect();
        let mut rng = StdRng::seed_from_u64(seed);
        let any_eligible = c.iter().any(|c| c.eligible());
        let home_eligible = home.is_some_and(|h| c.iter().any(|c| c.eligible() && c.region == h));
        match pick(&c, home, &mut rng) {
            None => prop_assert!(!any_eligible),
            Some(p) => {
                prop_assert!(c[p.index].eligible());
                prop_assert_eq!(p.spilled_over, home.is_some() && !home_eligible);
                if home_eligible {
                    prop_assert_eq!(Some(c[p.index].region), home);
                }
            }
        }
    }
}
