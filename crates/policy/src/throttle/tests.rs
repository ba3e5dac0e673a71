use std::time::{Duration, Instant};

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn healthy_backends_are_never_throttled() {
    let t0 = Instant::now();
    let mut t = Throttle::new(ThrottleConfig::default(), t0);
    for i in 0..10_000u64 {
        let now = t0 + ms(i);
        // The worst draw: refused if the probability is above zero at all.
        assert!(t.admit(now, 0.0), "refused at {i}");
        t.sent(now);
        t.accepted(now);
        assert!(!t.is_throttling(now));
    }
}

#[test]
fn half_the_attempts_failing_is_not_throttled_with_k_2() {
    let t0 = Instant::now();
    let mut t = Throttle::new(ThrottleConfig::default(), t0);
    for i in 0..1_000u64 {
        let now = t0 + ms(i);
        assert!(t.admit(now, 0.0));
        t.sent(now);
        if i % 2 == 0 {
            t.accepted(now);
        }
    }
}

/// A storm as IL-0248's callers made it: `logical_per_sec` new requests, each resent at once
/// after every refusal or failure, up to `resends` times; every backend fails while `failing`.
/// Returns (logical requests, attempts sent to backends, logical requests that succeeded).
fn storm(
    logical_per_sec: u64,
    seconds: u64,
    resends: u32,
    failing: impl Fn(Duration) -> bool,
    rng: &mut StdRng,
) -> (u64, u64, u64) {
    let t0 = Instant::now();
    let mut t = Throttle::new(ThrottleConfig::default(), t0);
    let (mut logical, mut sent, mut served) = (0, 0, 0);
    let gap = Duration::from_secs(1) / logical_per_sec as u32;
    let mut at = Duration::ZERO;
    while at < Duration::from_secs(seconds) {
        logical += 1;
        for _ in 0..=resends {
            let now = t0 + at;
            if !t.admit(now, rng.random()) {
                continue;
            }
            t.sent(now);
            sent += 1;
            if !failing(at) {
                t.accepted(now);
                served += 1;
                break;
            }
        }
        at += gap;
    }
    (logical, sent, served)
}

#[test]
fn with_every_backend_failing_callers_resends_do_not_multiply_backend_attempts() {
    let mut rng = StdRng::seed_from_u64(248);
    let (logical, sent, _) = storm(50, 10, 48, |_| true, &mut rng);
    assert_eq!(logical, 500);
    // Without throttling: 49 attempts per logical request (24,500).
    let ratio = sent as f64 / logical as f64;
    assert!(
        ratio <= 1.1,
        "{sent} attempts for {logical} requests ({ratio:.2}x)"
    );
}

#[test]
fn service_recovers_within_seconds_of_the_backends_healing() {
    let mut rng = StdRng::seed_from_u64(7);
    // Failing for 10 s, healthy afterwards; 20 s in all.
    let heal = Duration::from_secs(10);
    let t0 = Instant::now();
    let mut t = Throttle::new(ThrottleConfig::default(), t0);
    let gap = ms(20);
    let mut at = Duration::ZERO;
    let mut first_unserved_after_heal = None;
    while at < Duration::from_secs(20) {
        let mut ok = false;
        for _ in 0..=48 {
            let now = t0 + at;
            if t.admit(now, rng.random()) {
                t.sent(now);
                if at >= heal {
                    t.accepted(now);
                    ok = true;
                    break;
                }
            }
        }
        if at >= heal + Duration::from_secs(2) && !ok {
            first_unserved_after_heal.get_or_insert(at);
        }
        at += gap;
    }
    // Two seconds after the backends heal, every logical request is served (within its resends).
    assert_eq!(first_unserved_after_heal, None);
    assert!(!t.is_throttling(t0 + at));
}

#[test]
fn the_window_forgets_old_failures() {
    let t0 = Instant::now();
    let mut t = Throttle::new(ThrottleConfig::default(), t0);
    for _ in 0..100 {
        t.sent(t0);
    }
    assert!(t.refusal_probability(t0) > 0.9);
    assert!(t.is_throttling(t0 + Duration::from_secs(4)));
    assert!(!t.is_throttling(t0 + Duration::from_secs(6)));
    assert_eq!(t.totals(t0 + Duration::from_secs(6)), (0, 0));
}

#[test]
fn a_few_failures_are_no_sample_to_shed_on() {
    let t0 = Instant::now();
    let mut t = Throttle::new(ThrottleConfig::default(), t0);
    for _ in 0..19 {
        assert!(t.admit(t0, 0.0));
        t.sent(t0);
    }
    assert!(!t.is_throttling(t0));
    t.sent(t0);
    assert!(t.is_throttling(t0));
}

#[test]
fn k_below_one_is_taken_as_one() {
    let t0 = Instant::now();
    let t = Throttle::new(
        ThrottleConfig {
            k: 0.1,
            ..ThrottleConfig::default()
        },
        t0,
    );
    assert_eq!(t.config().k, 1.0);
}

proptest! {
    /// Whatever share of attempts fails, the attempts sent stay within what that share lets
    /// through, `min(1, K x (1 - f))` of those asked for, plus the probes (about the square root
    /// of the asked); with every attempt failing, within the probes alone.
    #[test]
    fn sent_falls_with_the_failure_share(
        seed in any::<u64>(),
        failure_share in 0.0f64..=1.0,
        asked in 1u64..20_000,
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let t0 = Instant::now();
        let window = Duration::from_secs(3600);
        let mut t = Throttle::new(ThrottleConfig { window, ..ThrottleConfig::default() }, t0);
        let mut sent = 0u64;
        for _ in 0..asked {
            if t.admit(t0, rng.random()) {
                t.sent(t0);
                sent += 1;
                if rng.random::<f64>() >= failure_share {
                    t.accepted(t0);
                }
            }
        }
        let share = (2.0 * (1.0 - failure_share)).min(1.0);
        let probes = 10.0 * (asked as f64).sqrt() + 10.0;
        prop_assert!(sent as f64 <= share * asked as f64 + probes,
            "sent {} of {} asked at failure share {}", sent, asked, failure_share);
    }

    /// With no failure at all, nothing is ever refused.
    #[test]
    fn no_failure_no_refusal(seed in any::<u64>(), asked in 1u64..2_000) {
        let mut rng = StdRng::seed_from_u64(seed);
        let t0 = Instant::now();
        let mut t = Throttle::new(ThrottleConfig::default(), t0);
        for i in 0..asked {
            let now = t0 + ms(i);
            prop_assert!(t.admit(now, rng.random()));
            t.sent(now);
            t.accepted(now);
        }
    }
}
