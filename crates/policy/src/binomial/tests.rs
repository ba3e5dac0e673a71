use proptest::prelude::*;

use super::*;

fn close(actual: f64, expected: f64, relative: f64) -> bool {
    (actual - expected).abs() <= relative * expected.abs()
}

/// `P(X >= x)` by summing every term, each from a binomial coefficient computed exactly.
fn direct_sum(n: u64, x: u64, p: f64) -> f64 {
    let mut choose: u128 = 1;
    let mut total = 0.0;
    for i in 0..=n {
        if i >= x {
            total += choose as f64 * p.powi(i as i32) * (1.0 - p).powi((n - i) as i32);
        }
        choose = choose * u128::from(n - i) / u128::from(i + 1);
    }
    total
}

#[test]
fn ln_gamma_matches_factorials_and_half_integers() {
    // Γ(n) = (n - 1)!, and ln Γ(1) = ln Γ(2) = 0.
    assert!(ln_gamma(1.0).abs() < 1e-15 && ln_gamma(2.0).abs() < 1e-15);
    let mut factorial = 1.0_f64;
    for n in 3..=30u32 {
        factorial *= f64::from(n - 1);
        assert!(
            close(ln_gamma(f64::from(n)), factorial.ln(), 1e-13),
            "Γ({n})"
        );
    }
    // Γ(1/2) = √π.
    assert!(close(
        ln_gamma(0.5),
        std::f64::consts::PI.sqrt().ln(),
        1e-14
    ));
    // ln Γ(10^6 + 1) = ln(10^6!), from Stirling's series to the 1/(360 n^3) term.
    let n = 1e6_f64;
    let stirling = n * n.ln() - n + 0.5 * (2.0 * std::f64::consts::PI * n).ln() + 1.0 / (12.0 * n);
    assert!(close(ln_gamma(n + 1.0), stirling, 1e-15));
}

#[test]
fn ln_choose_agrees_on_both_paths() {
    // 64 and above go through ln_gamma, below through the direct sum.
    for (n, k) in [
        (200u64, 63u64),
        (200, 64),
        (200, 100),
        (10_000, 63),
        (10_000, 64),
    ] {
        let direct: f64 = (0..k)
            .map(|i| ((n - i) as f64).ln() - ((i + 1) as f64).ln())
            .sum();
        assert!(close(ln_choose(n, k), direct, 1e-12), "C({n}, {k})");
    }
    assert_eq!(ln_choose(7, 0), 0.0);
    assert_eq!(ln_choose(7, 7), 0.0);
    assert!(close(ln_choose(52, 5), 2_598_960f64.ln(), 1e-14));
}

/// Values computed exactly with rational arithmetic (Python's `fractions`, and integer sums for
/// the large cases), rounded to 17 digits. The tolerances are the module's stated precision:
/// about 1e-12 for small counts, 1e-8 at a million trials.
#[test]
fn tails_match_exact_values() {
    let cases: [(u64, u64, f64, f64, f64); 15] = [
        (10, 5, 0.5, 6.230_468_75e-1, 1e-14),
        (10, 10, 0.5, 9.765_625e-4, 1e-13),
        (20, 5, 0.1, 4.317_449_528_446_338_4e-2, 1e-12),
        (100, 5, 0.01, 3.432_321_587_754_515e-3, 1e-12),
        (1000, 330, 0.3, 2.158_184_429_584_525e-2, 1e-11),
        (1000, 250, 0.3, 9.998_014_526_737_67e-1, 1e-12),
        (50, 1, 0.001, 4.879_437_180_296_865e-2, 1e-12),
        (200, 0, 1.0 / 3.0, 1.0, 0.0),
        (5000, 80, 0.01, 5.165_193_510_754_186_6e-5, 1e-11),
        (1_000_000, 501_500, 0.5, 1.354_327_653_029_878_4e-3, 1e-8),
        (1_000_000, 502_500, 0.5, 2.881_270_818_870_302e-7, 1e-8),
        (1_000_000, 500_000, 0.5, 5.003_989_421_806_658e-1, 1e-9),
        (1_000_000, 499_000, 0.5, 9.773_038_320_453_279e-1, 1e-9),
        (1_000_000, 10_300, 0.01, 1.363_115_039_531_693_7e-3, 1e-8),
        (300_000, 3_600, 0.01, 7.185_791_052_830_705e-27, 1e-8),
    ];
    for (n, x, p, expected, relative) in cases {
        let got = upper_tail(n, x, p);
        assert!(
            close(got, expected, relative),
            "P(Bin({n}, {p}) >= {x}) = {got:e}, expected {expected:e}"
        );
    }
    assert!(close(
        upper_tail(1_000_000, 10_500, 0.01),
        3.158_565_879_247_228_4e-7,
        1e-8
    ));
}

#[test]
fn edges_of_the_tail() {
    assert_eq!(upper_tail(0, 0, 0.5), 1.0);
    assert_eq!(upper_tail(5, 6, 0.5), 0.0);
    assert_eq!(upper_tail(5, 1, 0.0), 0.0);
    assert_eq!(upper_tail(5, 5, 1.0), 1.0);
    // Far beyond the mode the tail underflows to 0 rather than becoming NaN.
    let far = upper_tail(1_000_000, 1_000_000, 0.01);
    assert!(far == 0.0, "{far}");
}

#[test]
fn the_rate_test_is_the_binomial_tail_at_the_exposure_share() {
    // 5 events in 100 requests against none in 9_900: (100 / 10_000)^5.
    assert!(close(rate_excess_p(5, 100, 0, 9_900), 1e-10, 1e-9));
    // Equal exposures, 10 against 10: P(Bin(20, 1/2) >= 10).
    assert!(close(
        rate_excess_p(10, 500, 10, 500),
        direct_sum(20, 10, 0.5),
        1e-13
    ));
    // Nothing to compare with, or nothing on the side tested: no evidence.
    assert_eq!(rate_excess_p(50, 100, 0, 0), 1.0);
    assert_eq!(rate_excess_p(0, 0, 3, 100), 1.0);
    assert_eq!(rate_excess_p(0, 100, 3, 100), 1.0);
}

proptest! {
    #[test]
    fn tails_match_a_direct_sum_for_small_counts(n in 0u64..100, x in 0u64..110, p in 0.001f64..0.999) {
        let expected = direct_sum(n, x, p);
        let got = upper_tail(n, x, p);
        prop_assert!((got - expected).abs() <= 1e-12 * expected.max(1e-300) + 1e-300,
            "n {} x {} p {}: {:e} vs {:e}", n, x, p, got, expected);
    }

    #[test]
    fn a_tail_is_a_probability_that_falls_with_x(n in 0u64..5_000, x in 0u64..5_000, p in 0.0f64..1.0) {
        let here = upper_tail(n, x, p);
        let next = upper_tail(n, x + 1, p);
        prop_assert!((0.0..=1.0).contains(&here));
        prop_assert!(next <= here + 1e-12);
    }

    #[test]
    fn more_events_on_the_tested_side_is_more_evidence(
        x_a in 0u64..500, n_a in 1u64..100_000, x_b in 0u64..500, n_b in 1u64..100_000,
    ) {
        let p = rate_excess_p(x_a, n_a, x_b, n_b);
        prop_assert!(rate_excess_p(x_a + 1, n_a, x_b, n_b) <= p + 1e-12);
        prop_assert!(rate_excess_p(x_a, n_a, x_b + 1, n_b) >= p - 1e-12);
    }
}
