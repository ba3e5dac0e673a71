use proptest::prelude::{any, prop, prop_assert, prop_assert_eq, prop_assert_ne, proptest};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::super::{pick, EngineView, Pick, Saturation, Strategy};
use super::*;

fn backend(id: u64, weight: u32, outstanding: u32) -> Candidate<'static> {
    Candidate {
        region: "a",
        weight,
        outstanding,
        limit: 1_000,
        available: true,
        id,
        engine: EngineView::Unknown,
    }
}

fn affine(c: &[Candidate<'_>], key: u64, load_factor: f64) -> Option<Pick> {
    let strategy = Strategy::Affinity { key, load_factor };
    // Affinity draws no random numbers; any seed gives the same answer.
    pick(
        c,
        None,
        strategy,
        Saturation::default(),
        &mut StdRng::seed_from_u64(0),
    )
}

/// The bound of the module documentation, computed independently: the load after taking the
/// key may be at most `ceil(load_factor x (outstanding + 1) x weight / total weight)`.
fn bound(c: &[Candidate<'_>], i: usize, load_factor: f64) -> u64 {
    let outstanding: u64 = c.iter().map(|c| u64::from(c.outstanding)).sum();
    let weight: u64 = c.iter().map(|c| u64::from(c.weight)).sum();
    let share = load_factor.max(1.0) * (outstanding + 1) as f64 * f64::from(c[i].weight);
    (share / weight as f64).ceil() as u64
}

#[test]
fn splitmix64_matches_the_reference_sequence() {
    // The first two outputs of the reference generator seeded with 0.
    assert_eq!(splitmix64(0), 0xe220_a839_7b1d_cdaf);
    assert_eq!(splitmix64(0x9e37_79b9_7f4a_7c15), 0x6e78_9e6a_a1b9_65f4);
}

#[test]
fn fnv1a_matches_the_published_test_vectors() {
    assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    assert_eq!(stable_hash(b"gpu-1"), splitmix64(fnv1a(b"gpu-1")));
    assert_ne!(stable_hash(b"gpu-1"), stable_hash(b"gpu-2"));
}

#[test]
fn a_heavier_backend_is_first_for_a_proportional_share_of_keys() {
    let c = [backend(11, 1, 0), backend(22, 3, 0)];
    let n = 20_000u64;
    let heavy = (0..n)
        .filter(|&key| {
            affine(&c, stable_hash(&key.to_le_bytes()), 1.25)
                .unwrap()
                .index
                == 1
        })
        .count();
    let share = heavy as f64 / n as f64;
    assert!((0.73..0.77).contains(&share), "share of weight 3: {share}");
}

#[test]
fn a_key_over_the_bound_overflows_to_its_next_ranked_backend() {
    let c = [backend(1, 1, 0), backend(2, 1, 0), backend(3, 1, 0)];
    let key = 42;
    let first = affine(&c, key, 1.0).unwrap();
    assert_eq!(first.affinity, AffinityOutcome::Hit);
    // Load the first-ranked backend past its share: 4 of 4 outstanding, bound ceil(5 / 3) = 2.
    let mut loaded = c;
    loaded[first.index].outstanding = 4;
    let moved = affine(&loaded, key, 1.0).unwrap();
    assert_ne!(moved.index, first.index);
    assert_eq!(moved.affinity, AffinityOutcome::Overflow);
    // The next-ranked: the best of the other two.
    let rest: Vec<usize> = (0..3).filter(|&i| i != first.index).collect();
    let next = if hrw_score(key, c[rest[0]].id, 1) > hrw_score(key, c[rest[1]].id, 1) {
        rest[0]
    } else {
        rest[1]
    };
    assert_eq!(moved.index, next);
}

#[test]
fn a_key_whose_backend_is_unavailable_overflows() {
    let mut c = [backend(1, 1, 0), backend(2, 1, 0)];
    let first = affine(&c, 7, 1.25).unwrap().index;
    c[first].available = false;
    let p = affine(&c, 7, 1.25).unwrap();
    assert_eq!(
        (p.index, p.affinity),
        (1 - first, AffinityOutcome::Overflow)
    );
}

#[test]
fn a_load_factor_below_one_is_taken_as_one() {
    let c = [backend(1, 1, 3), backend(2, 1, 0), backend(3, 1, 1)];
    for key in 0..200 {
        assert_eq!(affine(&c, key, 0.2), affine(&c, key, 1.0));
        assert_eq!(affine(&c, key, f64::NAN), affine(&c, key, 1.0));
    }
}

fn pool(weights: &[u32], loads: &[u32]) -> Vec<Candidate<'static>> {
    weights
        .iter()
        .zip(loads)
        .enumerate()
        .map(|(i, (&w, &o))| backend(splitmix64(i as u64), w, o))
        .collect()
}

proptest! {
    #[test]
    fn no_chosen_backend_exceeds_the_bound(
        backends in prop::collection::vec((1u32..5, 0u32..50), 1..10),
        key in any::<u64>(),
        load_factor in 0.5f64..3.0,
    ) {
        let (weights, loads): (Vec<u32>, Vec<u32>) = backends.into_iter().unzip();
        let c = pool(&weights, &loads);
        let p = affine(&c, key, load_factor).unwrap();
        let after = u64::from(c[p.index].outstanding) + 1;
        prop_assert!(after <= bound(&c, p.index, load_factor),
            "{} after the pick, bound {}", after, bound(&c, p.index, load_factor));
        // The pick carries that bound, for the caller to take its unit under.
        prop_assert_eq!(p.load_bound.map(u64::from), Some(bound(&c, p.index, load_factor)));
        // With equal weights the bound is ceil(load_factor x (outstanding + 1) / backends).
        let equal = pool(&vec![1; c.len()], &loads);
        let p = affine(&equal, key, load_factor).unwrap();
        let total: u64 = loads.iter().map(|&o| u64::from(o)).sum();
        let mean = (load_factor.max(1.0) * (total + 1) as f64 / c.len() as f64).ceil() as u64;
        let after = u64::from(equal[p.index].outstanding) + 1;
        prop_assert!(after <= mean, "{} after the pick, bound {}", after, mean);
    }

    #[test]
    fn the_same_key_maps_to_the_same_backend_while_loads_are_equal(
        n in 1usize..12,
        load in 0u32..100,
        other_load in 0u32..100,
        key in any::<u64>(),
        load_factor in 1.0f64..2.0,
    ) {
        let c = pool(&vec![1; n], &vec![load; n]);
        let p = affine(&c, key, load_factor).unwrap();
        prop_assert_eq!(p.affinity, AffinityOutcome::Hit);
        // Another equal load, and the same backend again: its first-ranked.
        let d = pool(&vec![1; n], &vec![other_load; n]);
        let q = affine(&d, key, load_factor).unwrap();
        prop_assert_eq!((q.index, q.affinity), (p.index, p.affinity));
    }

    #[test]
    fn removing_a_backend_only_moves_the_keys_that_were_on_it(
        n in 2usize..10,
        removed in 0usize..10,
        keys in prop::collection::vec(any::<u64>(), 1..100),
        weights in prop::collection::vec(1u32..5, 10),
    ) {
        let removed = removed % n;
        let all = pool(&weights[..n], &vec![0; n]);
        let mut rest = all.clone();
        rest.remove(removed);
        for key in keys {
            let before = all[affine(&all, key, 1.25).unwrap().index].id;
            let after = rest[affine(&rest, key, 1.25).unwrap().index].id;
            if before != all[removed].id {
                prop_assert_eq!(after, before, "key {} moved off a backend still there", key);
            }
        }
    }

    #[test]
    fn one_dominant_key_spreads_within_the_bound(
        n in 2usize..8,
        requests in 1u32..300,
        key in any::<u64>(),
        load_factor in 1.0f64..2.0,
    ) {
        // Every request has the same key and none finishes.
        let mut c = pool(&vec![1; n], &vec![0; n]);
        let mut overflows = 0;
        for _ in 0..requests {
            let p = affine(&c, key, load_factor).unwrap();
            if p.affinity == AffinityOutcome::Overflow {
                overflows += 1;
            }
            c[p.index].outstanding += 1;
        }
        let most = c.iter().map(|c| c.outstanding).max().unwrap();
        let cap = (load_factor * f64::from(requests) / n as f64).ceil() as u32;
        prop_assert!(most <= cap, "{} on one backend, cap {}", most, cap);
        if requests > cap {
            prop_assert!(c.iter().filter(|c| c.outstanding > 0).count() >= 2);
            prop_assert_ne!(overflows, 0);
        }
    }
}
