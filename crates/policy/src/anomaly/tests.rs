use std::time::{Duration, Instant};

use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::*;

const SECOND: Duration = Duration::from_secs(1);

/// One backend's detector, and the seeded traffic it is fed.
struct Traffic {
    detector: FourXxDetector,
    t0: Instant,
    rng: SmallRng,
}

impl Traffic {
    fn new(seed: u64) -> Self {
        let t0 = Instant::now();
        Traffic {
            detector: FourXxDetector::try_new(AnomalyConfig::default(), t0).unwrap(),
            t0,
            rng: SmallRng::seed_from_u64(seed),
        }
    }

    /// `rps` requests a second over `seconds`, evenly spread, each a 4xx with probability
    /// `share`, evaluated at the end of every second; the changes, with the second of each.
    fn run(&mut self, seconds: std::ops::Range<u64>, rps: u32, share: f64) -> Vec<(u64, Change)> {
        let mut changes = Vec::new();
        for s in seconds {
            let start = self.t0 + SECOND * s as u32;
            for i in 0..rps {
                let at = start + SECOND * i / rps;
                let is_4xx = self.rng.random::<f64>() < share;
                self.detector.record(at, is_4xx);
            }
            if let Some(change) = self.detector.evaluate(start + SECOND) {
                changes.push((s, change));
            }
        }
        changes
    }
}

const MINUTE: u64 = 60;

#[test]
fn defaults_are_the_documented_ones() {
    let c = AnomalyConfig::default();
    assert_eq!(c.window, Duration::from_secs(60));
    assert_eq!(c.baseline, Duration::from_secs(1_800));
    assert_eq!(
        (c.alpha, c.min_events, c.min_ratio, c.floor),
        (0.001, 10, 3.0, 0.001)
    );
    assert_eq!(c.check(), Ok(()));
}

#[test]
fn the_check_names_what_is_wrong() {
    let with = |f: fn(&mut AnomalyConfig)| {
        let mut c = AnomalyConfig::default();
        f(&mut c);
        c.check()
    };
    use AnomalyConfigError as E;
    assert_eq!(with(|c| c.window = Duration::ZERO), Err(E::WindowTooShort));
    assert_eq!(
        with(|c| c.baseline = Duration::from_secs(100)),
        Err(E::BaselineTooShort)
    );
    assert_eq!(with(|c| c.alpha = 0.0), Err(E::AlphaOutOfRange));
    assert_eq!(with(|c| c.min_events = 0), Err(E::ZeroEvents));
    assert_eq!(with(|c| c.min_ratio = 0.9), Err(E::RatioBelowOne));
    assert_eq!(with(|c| c.floor = 1.0), Err(E::FloorOutOfRange));
    assert_eq!(with(|c| c.floor = f64::NAN), Err(E::FloorOutOfRange));
    assert_eq!(with(|c| c.floor = 0.0), Ok(()));
    let bad = AnomalyConfig {
        alpha: 1.5,
        ..AnomalyConfig::default()
    };
    assert_eq!(
        FourXxDetector::try_new(bad, Instant::now()).unwrap_err(),
        E::AlphaOutOfRange
    );
}

#[test]
fn only_4xx_other_than_429_count() {
    assert!(FourXxDetector::counts(400));
    assert!(FourXxDetector::counts(403));
    assert!(FourXxDetector::counts(499));
    assert!(!FourXxDetector::counts(429));
    assert!(!FourXxDetector::counts(200));
    assert!(!FourXxDetector::counts(500));
}

/// From 0.1 % to 5 % at 100 requests a second: ten 4xx come within about two seconds of the
/// jump, against a baseline of about 180 in 180_000.
#[test]
fn a_jump_from_a_tenth_of_a_percent_to_five_is_found_within_a_window() {
    for seed in 0..10 {
        let mut traffic = Traffic::new(seed);
        assert_eq!(traffic.run(0..35 * MINUTE, 100, 0.001), []);
        let changes = traffic.run(35 * MINUTE..40 * MINUTE, 100, 0.05);
        let [(
            at,
            Change::Anomalous {
                share,
                baseline_share,
                p_value,
            },
        )] = changes[..]
        else {
            panic!("seed {seed}: {changes:?}");
        };
        assert!(at < 35 * MINUTE + 60, "seed {seed}: at {at}");
        // Found early, while most of the window is from before the jump.
        assert!(share >= 3.0 * baseline_share.max(0.001), "{share}");
        assert!(baseline_share < 0.002, "{baseline_share}");
        assert!(p_value < 0.001);
        assert!(traffic.detector.is_anomalous());
        let now = traffic.t0 + SECOND * (40 * MINUTE) as u32;
        assert!((traffic.detector.share(now) - 0.05).abs() < 0.015);
        assert!(traffic.detector.baseline_share(now) < 0.002);
    }
}

/// At 50 requests a second a window expects 30 4xx and would need 90; the module's
/// documentation names the rates at which a steady share can raise an alarm.
#[test]
fn a_steady_one_percent_never_triggers() {
    for seed in 0..3 {
        let mut traffic = Traffic::new(seed);
        assert_eq!(traffic.run(0..6 * 60 * MINUTE, 50, 0.01), [], "seed {seed}");
    }
}

#[test]
fn a_recovery_is_reported_once() {
    for seed in 0..10 {
        let mut traffic = Traffic::new(seed);
        traffic.run(0..35 * MINUTE, 100, 0.001);
        let jump = traffic.run(35 * MINUTE..45 * MINUTE, 100, 0.05);
        assert!(
            matches!(jump[..], [(_, Change::Anomalous { .. })]),
            "{jump:?}"
        );
        let after = traffic.run(45 * MINUTE..120 * MINUTE, 100, 0.001);
        let [(at, Change::Normal { share, .. })] = after[..] else {
            panic!("seed {seed}: {after:?}");
        };
        // Back below sqrt(3) x the baseline once the jump has left the window, a window later.
        assert!(at < 45 * MINUTE + 60, "seed {seed}: at {at}");
        assert!(share < 0.003, "{share}");
        assert!(!traffic.detector.is_anomalous());
    }
}

#[test]
fn a_second_jump_is_judged_against_the_baseline_before_the_first() {
    let mut traffic = Traffic::new(1);
    traffic.run(0..35 * MINUTE, 100, 0.001);
    assert_eq!(traffic.run(35 * MINUTE..45 * MINUTE, 100, 0.05).len(), 1);
    assert_eq!(traffic.run(45 * MINUTE..50 * MINUTE, 100, 0.001).len(), 1);
    // The ten minutes at 5 % are not in the baseline: it is still about 0.1 %.
    let now = traffic.t0 + SECOND * (50 * MINUTE) as u32;
    assert!(traffic.detector.baseline_share(now) < 0.002);
    let again = traffic.run(50 * MINUTE..55 * MINUTE, 100, 0.05);
    assert!(
        matches!(again[..], [(_, Change::Anomalous { .. })]),
        "{again:?}"
    );
}

/// The trade-off of leaving anomalous buckets out of the baseline: a lasting jump is anomalous
/// for about a baseline, then the new normal, reported once, at the new level.
#[test]
fn a_lasting_jump_becomes_the_new_normal_after_about_a_baseline() {
    let mut traffic = Traffic::new(2);
    traffic.run(0..35 * MINUTE, 100, 0.001);
    let changes = traffic.run(35 * MINUTE..155 * MINUTE, 100, 0.05);
    let [(_, Change::Anomalous { .. }), (
        at,
        Change::Normal {
            share,
            baseline_share,
        },
    )] = changes[..]
    else {
        panic!("{changes:?}");
    };
    let lasted = at - 35 * MINUTE;
    assert!((28 * MINUTE..=33 * MINUTE).contains(&lasted), "{lasted} s");
    assert!(
        share > 0.03 && baseline_share > 0.03,
        "{share} {baseline_share}"
    );
}

#[test]
fn low_traffic_never_triggers() {
    // One request each 10 s: six in a window, fewer than the ten 4xx needed, even all 4xx.
    let mut traffic = Traffic::new(3);
    let t0 = traffic.t0;
    let detector = &mut traffic.detector;
    let mut now = t0;
    for i in 0..(4 * 3_600 / 10) {
        now = t0 + SECOND * (i * 10);
        detector.record(now, i > 35 * 6);
        assert_eq!(detector.evaluate(now), None, "at {i}");
    }
    assert!(detector.share(now) > 0.99);
}

#[test]
fn a_clean_backend_is_held_to_the_floor() {
    // No 4xx for 35 minutes at 1_000 a second; then 0.2 % (120 in a window: enough events and
    // a tiny p-value, but below 3 x the 0.1 % floor), then 0.5 %.
    let mut traffic = Traffic::new(4);
    traffic.run(0..35 * MINUTE, 1_000, 0.0);
    assert_eq!(traffic.run(35 * MINUTE..40 * MINUTE, 1_000, 0.002), []);
    let changes = traffic.run(40 * MINUTE..42 * MINUTE, 1_000, 0.005);
    assert!(
        matches!(changes[..], [(_, Change::Anomalous { .. })]),
        "{changes:?}"
    );
}

#[test]
fn silence_changes_nothing() {
    let mut traffic = Traffic::new(5);
    traffic.run(0..35 * MINUTE, 100, 0.001);
    traffic.run(35 * MINUTE..36 * MINUTE, 100, 0.05);
    assert!(traffic.detector.is_anomalous());
    let later = traffic.t0 + SECOND * (50 * MINUTE) as u32;
    assert_eq!(traffic.detector.evaluate(later), None);
    assert!(traffic.detector.is_anomalous());
    assert_eq!(traffic.detector.share(later), 0.0);
}

#[test]
fn no_baseline_no_judgement() {
    // The first minutes of a backend that answers nothing but 4xx: nothing to compare with.
    let t0 = Instant::now();
    let mut d = FourXxDetector::try_new(AnomalyConfig::default(), t0).unwrap();
    for i in 0..600 {
        let now = t0 + Duration::from_millis(100 * i);
        d.record(now, true);
        assert_eq!(d.evaluate(now), None);
    }
    assert_eq!(d.baseline_share(t0 + 59 * SECOND), 0.0);
}

proptest! {
    /// Whatever the traffic: changes alternate, starting with a jump; a jump has at least
    /// `min_events` 4xx in its window and the shares are proportions.
    #[test]
    fn changes_alternate_and_need_their_events(
        steps in prop::collection::vec((0u64..20_000, any::<bool>(), any::<bool>()), 1..500),
    ) {
        let t0 = Instant::now();
        let config = AnomalyConfig {
            window: Duration::from_secs(10),
            baseline: Duration::from_secs(60),
            min_events: 3,
            ..AnomalyConfig::default()
        };
        let mut d = FourXxDetector::try_new(config, t0).unwrap();
        let mut now = t0;
        let mut anomalous = false;
        for (wait_ms, is_4xx, evaluate) in steps {
            now += Duration::from_millis(wait_ms);
            d.record(now, is_4xx);
            if evaluate {
                let four_xx = d.current.totals(now).1;
                match d.evaluate(now) {
                    Some(Change::Anomalous { share, baseline_share, p_value }) => {
                        prop_assert!(!anomalous);
                        prop_assert!(four_xx >= 3);
                        prop_assert!((0.0..=1.0).contains(&share));
                        prop_assert!((0.0..=1.0).contains(&baseline_share));
                        prop_assert!(p_value < 0.001);
                        anomalous = true;
                    }
                    Some(Change::Normal { .. }) => {
                        prop_assert!(anomalous);
                        anomalous = false;
                    }
                    None => {}
                }
            }
            prop_assert_eq!(d.is_anomalous(), anomalous);
            prop_assert!((0.0..=1.0).contains(&d.share(now)));
        }
    }
}
