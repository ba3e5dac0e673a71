use std::time::{Duration, Instant};

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn defaults_are_the_documented_ones() {
    let c = ThrottleConfig::default();
    assert_eq!((c.k, c.window, c.probes), (2.0, Duration::from_secs(1), 5));
}

#[test]
fn healthy_backends_are_never_throttled() {
    let t0 = Instant::now();
    let mut t = Throttle::new(ThrottleConfig::default(), t0);
    for i in 0..10_000u64 {
        let now = t0 + ms(i);
        assert!(t.admit(now, 0), "refused at {i}");
        t.sent(now);
        t.accepted(now);
        assert!(!t.is_throttling(now));
    }
}

#[test]
fn a_burst_on_an_idle_pool_is_not_refused_for_being_in_flight() {
    // Outcomes are recorded when they are known: a thousand requests admitted at once.
    let t0 = Instant::now();
    let mut t = Throttle::new(ThrottleConfig::default(), t0);
    assert!((0..1000).all(|_| t.admit(t0, 0)));
}

#[test]
fn half_the_attempts_failing_is_not_throttled_with_k_2() {
    let t0 = Instant::now();
    let mut t = Throttle::new(ThrottleConfig::default(), t0);
    for i in 0..1_000u64 {
        let now = t0 + ms(i);
        assert!(t.admit(now, 0));
        t.sent(now);
        if i % 2 == 0 {
            t.accepted(now);
        }
    }
}

#[test]
fn a_few_failures_of_a_quiet_pool_are_within_the_probes() {
    let t0 = Instant::now();
    let mut t = Throttle::new(ThrottleConfig::default(), t0);
    for _ in 0..5 {
        assert!(t.admit(t0, 0));
        t.sent(t0);
    }
    assert!(t.is_throttling(t0));
    // Past the window's allowance: one probe each 200 ms.
    assert!(t.admit(t0, 0));
    t.sent(t0);
    assert!(!t.admit(t0 + ms(100), 0));
    assert!(t.admit(t0 + ms(200), 0));
    // A window later the allowance is back.
    assert!(t.admit(t0 + ms(1100), 0));
}

/// A storm as IL-0248's callers made it: `logical_per_sec` new requests, each resent at once
/// after every refusal or failure, up to 48 times; every backend fails while `failing(at)`.
/// Returns (logical requests, attempts sent to backends, logical requests served, logical
/// requests after `from` that needed more than one ask).
fn storm(
    logical_per_sec: u32,
    length: Duration,
    failing: impl Fn(Duration) -> bool,
    from: Duration,
) -> (u64, u64, u64, u64) {
    let t0 = Instant::now();
    let mut t = Throttle::new(ThrottleConfig::default(), t0);
    let (mut logical, mut sent, mut served, mut resent_after) = (0, 0, 0, 0);
    let gap = Duration::from_secs(1) / logical_per_sec;
    let mut at = Duration::ZERO;
    while at < length {
        logical += 1;
        for ask in 0..=48 {
            let now = t0 + at;
            if !t.admit(now, 0) {
                continue;
            }
            t.sent(now);
            sent += 1;
            if !failing(at) {
                t.accepted(now);
                served += 1;
                if ask > 0 && at >= from {
                    resent_after += 1;
                }
                break;
            }
        }
        at += gap;
    }
    (logical, sent, served, resent_after)
}

#[test]
fn with_every_backend_failing_callers_resends_do_not_multiply_backend_attempts() {
    let (logical, sent, _, _) = storm(50, Duration::from_secs(10), |_| true, Duration::ZERO);
    assert_eq!(logical, 500);
    // Without throttling: 49 attempts per logical request (24,500). With it: the probes, about
    // 5 a window and 5 spaced ones a second.
    assert!(sent <= 10 * 11, "{sent} attempts for {logical} requests");
}

#[test]
fn an_outage_after_healthy_traffic_lets_through_k_windows_of_credit_then_the_probes() {
    let healthy_until = Duration::from_secs(5);
    let (_, sent, served, _) = storm(
        50,
        Duration::from_secs(15),
        |at| at >= healthy_until,
        Duration::ZERO,
    );
    // 250 served while healthy; then at most 2 x one window of them (100) plus 10 probes a
    // second for the 10 s outage.
    assert_eq!(served, 250);
    assert!(sent <= 250 + 100 + 10 * 11, "{sent}");
}

#[test]
fn service_recovers_within_a_fraction_of_a_second_of_the_backends_healing() {
    let heal = Duration::from_secs(10);
    let (_, _, _, resent_after) =
        storm(50, Duration::from_secs(20), |at| at < heal, heal + ms(300));
    // From 300 ms after the backends heal, every logical request is served at its first ask.
    assert_eq!(resent_after, 0);
}

#[test]
fn the_window_forgets_old_failures() {
    let t0 = Instant::now();
    let mut t = Throttle::new(ThrottleConfig::default(), t0);
    for _ in 0..100 {
        t.sent(t0);
    }
    assert!(t.is_throttling(t0 + ms(800)));
    assert!(!t.is_throttling(t0 + ms(1200)));
    assert_eq!(t.totals(t0 + ms(1200)), (0, 0));
}

#[test]
fn k_below_one_is_taken_as_one() {
    let t0 = Instant::now();
    let config = ThrottleConfig {
        k: 0.1,
        ..ThrottleConfig::default()
    };
    assert_eq!(Throttle::new(config, t0).config().k, 1.0);
}

proptest! {
    /// G1 for any pattern of failures and any number of requests asked for: attempts sent over
    /// a window never exceed K x accepted + probes, plus the spaced probes (outcomes recorded one
    /// at a time).
    #[test]
    fn sent_stays_within_k_times_accepted_plus_probes(
        seed in any::<u64>(),
        failure_share in 0.0f64..=1.0,
        asked in 1u64..20_000,
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let t0 = Instant::now();
        let window = Duration::from_secs(3600);
        let mut t = Throttle::new(ThrottleConfig { window, ..ThrottleConfig::default() }, t0);
        let (mut sent, mut accepted) = (0u64, 0u64);
        for _ in 0..asked {
            if t.admit(t0, 0) {
                t.sent(t0);
                sent += 1;
                if rng.random::<f64>() >= failure_share {
                    t.accepted(t0);
                    accepted += 1;
                }
            }
        }
        // One spaced probe at most beyond the allowance: the clock does not move here.
        prop_assert!(sent <= 2 * accepted + 5 + 1, "sent {} accepted {}", sent, accepted);
    }

    /// With no failure at all, nothing is ever refused.
    #[test]
    fn no_failure_no_refusal(asked in 1u64..2_000, step_ms in 0u64..50) {
        let t0 = Instant::now();
        let mut t = Throttle::new(ThrottleConfig::default(), t0);
        for i in 0..asked {
            let now = t0 + ms(i * step_ms);
            prop_assert!(t.admit(now, 0));
            t.sent(now);
            t.accepted(now);
        }
    }
}

#[test]
fn requests_on_their_way_to_failing_backends_count_as_sent() {
    // The backends failed the one request recorded; then concurrent requests are all let
    // through before the next answer is recorded. Without counting them, any number would pass.
    let t0 = Instant::now();
    let mut t = Throttle::new(ThrottleConfig::default(), t0);
    assert!(t.admit(t0, 0));
    t.sent(t0);
    let mut pending = 0;
    while pending < 1000 && t.admit(t0, pending) {
        pending += 1;
    }
    let probes = ThrottleConfig::default().probes;
    assert_eq!(1 + pending, probes + 1, "the probes and one more");
}

#[test]
fn a_concurrent_burst_on_a_cold_or_healthy_pool_is_never_throttled() {
    let t0 = Instant::now();
    let mut t = Throttle::new(ThrottleConfig::default(), t0);
    assert!((0..1000).all(|pending| t.admit(t0, pending)), "cold");
    for _ in 0..10 {
        t.sent(t0);
        t.accepted(t0);
    }
    assert!((0..1000).all(|pending| t.admit(t0, pending)), "healthy");
}
