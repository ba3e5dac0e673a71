//! Unit and property tests of the freshness decisions, on a manual clock (a base `Instant` plus
//! offsets) and with the random number given or generated.

use super::*;
use proptest::prelude::*;

const TTL: Duration = Duration::from_secs(30);
const STALE: Duration = Duration::from_secs(600);

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn an_answer_goes_fresh_then_stale_then_expired() {
    let t0 = Instant::now();
    let w = window_for_age(t0, Duration::ZERO, TTL, 0.0, STALE, 0.5).unwrap();
    assert_eq!(judge(w, t0, true), State::Fresh);
    assert_eq!(judge(w, t0 + secs(29), true), State::Fresh);
    assert_eq!(judge(w, t0 + secs(30), true), State::Stale);
    assert_eq!(judge(w, t0 + secs(629), true), State::Stale);
    assert_eq!(judge(w, t0 + secs(630), true), State::Expired);
}

#[test]
fn an_answer_from_before_a_flush_is_revalidated_but_kept_as_a_fallback() {
    let t0 = Instant::now();
    let w = window_for_age(t0, Duration::ZERO, TTL, 0.0, STALE, 0.0).unwrap();
    assert_eq!(judge(w, t0, false), State::Revalidate);
    assert_eq!(judge(w, t0 + secs(100), false), State::Revalidate);
    assert_eq!(judge(w, t0 + secs(630), false), State::Expired);
}

#[test]
fn jitter_shortens_by_at_most_its_fraction() {
    assert_eq!(jittered_ttl(TTL, 0.2, 0.0), TTL);
    assert_eq!(jittered_ttl(TTL, 0.2, 0.5), secs(27));
    assert_eq!(jittered_ttl(TTL, 0.0, 0.9), TTL);
    // Out-of-range inputs are clamped, never trusted.
    assert_eq!(jittered_ttl(TTL, 5.0, 1.0), Duration::ZERO);
    assert_eq!(jittered_ttl(TTL, 0.2, f64::NAN), TTL);
    assert_eq!(jittered_ttl(TTL, -1.0, 0.5), TTL);
}

#[test]
fn an_old_shared_answer_keeps_only_what_is_left_of_its_windows() {
    let t0 = Instant::now();
    let w = window_for_age(t0, secs(10), TTL, 0.0, STALE, 0.0).unwrap();
    assert_eq!(w.fresh_until, t0 + secs(20));
    assert_eq!(w.stale_until, t0 + secs(620));
    let w = window_for_age(t0, secs(100), TTL, 0.0, STALE, 0.0).unwrap();
    assert_eq!(judge(w, t0, true), State::Stale);
    assert_eq!(window_for_age(t0, secs(630), TTL, 0.0, STALE, 0.0), None);
}

#[test]
fn a_restored_answer_too_old_to_serve_is_dropped() {
    let t0 = Instant::now();
    assert_eq!(restored_window(t0, secs(630), TTL, STALE, 0.5), None);
    assert_eq!(restored_window(t0, secs(10_000), TTL, STALE, 0.5), None);
    let w = restored_window(t0, secs(629), TTL, STALE, 0.5).unwrap();
    assert_eq!(w.fresh_until, t0 + secs(15));
    // Usable at least while fresh, even when less than that was left of its stale window.
    assert_eq!(w.stale_until, t0 + secs(15));
    let w = restored_window(t0, secs(60), TTL, STALE, 0.0).unwrap();
    assert_eq!(w.fresh_until, t0);
    assert_eq!(w.stale_until, t0 + secs(570));
}

#[test]
fn negative_answers_expire_by_their_age() {
    let t0 = Instant::now();
    assert_eq!(negative_until(t0, secs(0), TTL), Some(t0 + TTL));
    assert_eq!(negative_until(t0, secs(20), TTL), Some(t0 + secs(10)));
    assert_eq!(negative_until(t0, secs(30), TTL), None);
    assert_eq!(negative_until(t0, secs(31), TTL), None);
}

#[test]
fn failed_refreshes_back_off_to_a_cap() {
    assert_eq!(refresh_retry_delay(0), secs(1));
    assert_eq!(refresh_retry_delay(1), secs(1));
    assert_eq!(refresh_retry_delay(2), secs(2));
    assert_eq!(refresh_retry_delay(5), secs(16));
    assert_eq!(refresh_retry_delay(6), REFRESH_RETRY_MAX);
    assert_eq!(refresh_retry_delay(u32::MAX), REFRESH_RETRY_MAX);
}

#[test]
fn ages_from_a_clock_ahead_of_ours_count_as_zero() {
    assert_eq!(age_ms(1_000, 400), Duration::from_millis(600));
    assert_eq!(age_ms(1_000, 5_000), Duration::ZERO);
}

proptest! {
    #[test]
    fn jittered_ttl_stays_within_its_band(
        ttl_ms in 1u64..10_000_000, jitter in 0.0f64..1.0, u in 0.0f64..1.0,
    ) {
        let ttl = Duration::from_millis(ttl_ms);
        let got = jittered_ttl(ttl, jitter, u);
        prop_assert!(got <= ttl);
        prop_assert!(got >= ttl.mul_f64(1.0 - jitter) - Duration::from_nanos(1));
    }

    #[test]
    fn a_window_is_ordered_and_its_states_come_in_order(
        age_s in 0u64..2_000, jitter in 0.0f64..1.0, u in 0.0f64..1.0,
        probes in proptest::collection::vec(0u64..2_000_000, 1..20),
    ) {
        let t0 = Instant::now();
        let Some(w) = window_for_age(t0, secs(age_s), TTL, jitter, STALE, u) else {
            prop_assert!(secs(age_s) >= jittered_ttl(TTL, jitter, u) + STALE);
            return Ok(());
        };
        prop_assert!(t0 <= w.fresh_until && w.fresh_until <= w.stale_until);
        let mut probes = probes;
        probes.sort_unstable();
        let rank = |s: State| match s { State::Fresh => 0, State::Stale => 1, _ => 2 };
        let mut last = 0;
        for p in probes {
            let state = judge(w, t0 + Duration::from_millis(p), true);
            prop_assert!(state != State::Revalidate);
            prop_assert!(rank(state) >= last, "states went backwards");
            last = rank(state);
        }
    }

    #[test]
    fn restored_windows_are_usable_at_once_and_fresh_within_ttl(
        age_ms in 0u64..700_000, u in 0.0f64..1.0,
    ) {
        let t0 = Instant::now();
        let age = Duration::from_millis(age_ms);
        match restored_window(t0, age, TTL, STALE, u) {
            None => prop_assert!(age >= TTL + STALE),
            Some(w) => {
                prop_assert!(age < TTL + STALE);
                prop_assert!(w.fresh_until >= t0 && w.fresh_until <= t0 + TTL);
                prop_assert!(w.stale_until >= w.fresh_until);
                prop_assert!(w.stale_until > t0, "a restored entry is usable at once");
                prop_assert!(w.stale_until <= t0 + TTL + STALE);
            }
        }
    }

    #[test]
    fn restored_refreshes_are_spread_over_the_ttl(seed in any::<u64>()) {
        // 1,000 entries restored at once, with `u` from a seeded generator: each tenth of the
        // TTL receives roughly a tenth of the refreshes, none most of them.
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let t0 = Instant::now();
        let mut buckets = [0u32; 10];
        for _ in 0..1_000 {
            let w = restored_window(t0, secs(5), TTL, STALE, rng.random()).unwrap();
            let at = (w.fresh_until - t0).as_secs_f64() / TTL.as_secs_f64();
            buckets[((at * 10.0) as usize).min(9)] += 1;
        }
        for b in buckets {
            prop_assert!((40..=170).contains(&b), "uneven spread: {buckets:?}");
        }
    }
}

#[test]
fn a_flush_spreads_re_reads_over_its_window() {
    let at = Instant::now();
    assert_eq!(flush_due(at, secs(30), 0.0), at);
    assert_eq!(flush_due(at, secs(30), 0.5), at + secs(15));
    assert_eq!(flush_due(at, Duration::ZERO, 0.9), at);
    // Out-of-range shares are clamped, never past the window.
    assert_eq!(flush_due(at, secs(30), 7.0), at + secs(30));
    assert_eq!(flush_due(at, secs(30), f64::NAN), at);
}
