use super::*;
use proptest::prelude::*;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

/// Fails `n` times at `now` with the pool's permission; returns the last result.
fn fail(o: &mut Outlier, now: Instant, n: u32) -> Option<Instant> {
    (0..n).map(|_| o.record(now, false, true)).last().flatten()
}

#[test]
fn a_failure_ends_calm_until_it_leaves_the_window_and_a_success_is_recorded() {
    let t0 = Instant::now();
    let mut o = Outlier::new(OutlierConfig::default());
    assert!(o.calm(t0));
    o.record(t0, true, true);
    assert!(o.calm(t0));
    o.record(t0, false, true);
    assert!(!o.calm(t0));
    // Still healthy: only calm is lost, while the failure is in the window.
    assert_eq!(o.health(t0), Health::Healthy);
    assert!(!o.calm(t0 + secs(5)));
    assert!(o.calm(t0 + secs(11)));
    // A failure recorded at a later instant than the one asked about counts too.
    let mut o = Outlier::new(OutlierConfig::default());
    o.record(t0 + secs(3), false, true);
    assert!(!o.calm(t0));
}

#[test]
fn defaults_are_the_documented_ones() {
    let c = OutlierConfig::default();
    assert_eq!(c.consecutive_failures, 5);
    assert_eq!(c.failure_rate, 0.5);
    assert_eq!(c.min_requests, 20);
    assert_eq!(c.window, secs(10));
    assert_eq!(c.base_ejection, secs(5));
    assert_eq!(c.max_ejection, secs(300));
    assert_eq!(DEFAULT_MAX_EJECTED_SHARE, 0.5);
    assert_eq!(DEFAULT_PANIC_THRESHOLD, 0.5);
}

#[test]
fn five_failures_in_a_row_eject_for_the_base_time() {
    let t0 = Instant::now();
    let mut o = Outlier::new(OutlierConfig::default());
    assert_eq!(fail(&mut o, t0, 4), None);
    assert_eq!(o.health(t0), Health::Healthy);
    assert_eq!(o.record(t0, false, true), Some(t0 + secs(5)));
    assert_eq!(
        o.health(t0),
        Health::Ejected {
            until: t0 + secs(5)
        }
    );
    assert_eq!(o.ejections(), 1);
}

#[test]
fn a_success_breaks_the_run_of_failures() {
    let t0 = Instant::now();
    let mut o = Outlier::new(OutlierConfig::default());
    for _ in 0..3 {
        assert_eq!(fail(&mut o, t0, 4), None);
        assert_eq!(o.record(t0, true, true), None);
    }
    assert_eq!(o.health(t0), Health::Healthy);
}

#[test]
fn a_high_failure_rate_ejects_once_enough_outcomes_were_seen() {
    let t0 = Instant::now();
    let mut o = Outlier::new(OutlierConfig::default());
    // Alternate: never two failures in a row, a failure share above one half from the 20th on.
    for i in 0..19 {
        let ok = i % 2 == 1;
        assert_eq!(o.record(t0 + ms(i * 10), ok, true), None, "outcome {i}");
    }
    // 19 outcomes, 10 failures: not enough outcomes yet. The 20th makes 11 of 20.
    assert!(o.record(t0 + ms(200), false, true).is_some());
}

#[test]
fn a_failure_share_at_the_threshold_does_not_eject() {
    let t0 = Instant::now();
    let mut o = Outlier::new(OutlierConfig::default());
    for i in 0..40 {
        assert_eq!(o.record(t0, i % 2 == 0, true), None, "outcome {i}");
    }
}

#[test]
fn outcomes_older_than_the_window_are_forgotten() {
    let t0 = Instant::now();
    let mut o = Outlier::new(OutlierConfig {
        consecutive_failures: 100,
        ..OutlierConfig::default()
    });
    assert_eq!(fail(&mut o, t0, 19), None);
    // 19 failures, but all of them leave the window before these 20 outcomes (7 failures).
    let later = t0 + secs(11);
    for i in 0..20 {
        assert_eq!(o.record(later, i % 3 != 0, true), None, "outcome {i}");
    }
}

#[test]
fn a_refused_ejection_keeps_the_backend_in_rotation_and_counts_the_failure() {
    let t0 = Instant::now();
    let mut o = Outlier::new(OutlierConfig::default());
    for _ in 0..7 {
        assert_eq!(o.record(t0, false, false), None);
    }
    assert_eq!(o.health(t0), Health::Healthy);
    assert!(o.admit(t0));
    // The run of failures was kept: the next one, now allowed, ejects.
    assert!(o.record(t0, false, true).is_some());
}

#[test]
fn an_ejected_backend_is_not_admitted_until_its_time_is_up() {
    let t0 = Instant::now();
    let mut o = Outlier::new(OutlierConfig::default());
    fail(&mut o, t0, 5);
    assert!(!o.admit(t0));
    assert!(!o.admit(t0 + ms(4999)));
    assert_eq!(o.health(t0 + secs(5)), Health::Probing);
    assert!(o.admit(t0 + secs(5)));
}

#[test]
fn probing_admits_one_request_at_a_time() {
    let t0 = Instant::now();
    let mut o = Outlier::new(OutlierConfig::default());
    fail(&mut o, t0, 5);
    let t = t0 + secs(5);
    assert!(o.admit(t));
    assert!(!o.admit(t));
    assert!(!o.admit(t + secs(4)));
    assert_eq!(o.health(t + secs(4)), Health::Probing);
}

#[test]
fn a_successful_probe_readmits() {
    let t0 = Instant::now();
    let mut o = Outlier::new(OutlierConfig::default());
    fail(&mut o, t0, 5);
    let t = t0 + secs(5);
    assert!(o.admit(t));
    assert_eq!(o.record(t + secs(1), true, true), None);
    assert_eq!(o.health(t + secs(1)), Health::Healthy);
    assert!(o.admit(t + secs(1)));
    assert!(o.admit(t + secs(1)));
}

#[test]
fn each_failed_probe_doubles_the_ejection_up_to_the_cap() {
    let t0 = Instant::now();
    let mut o = Outlier::new(OutlierConfig::default());
    let mut t = t0;
    let mut until = fail(&mut o, t, 5).unwrap();
    let mut lengths = vec![until - t];
    for _ in 0..8 {
        t = until;
        assert!(o.admit(t));
        until = o.record(t, false, true).unwrap();
        lengths.push(until - t);
    }
    let expected = [5, 10, 20, 40, 80, 160, 300, 300, 300].map(secs);
    assert_eq!(lengths, expected);
    assert_eq!(o.ejections(), 9);
}

#[test]
fn a_lost_probe_does_not_wedge_the_backend() {
    let t0 = Instant::now();
    let mut o = Outlier::new(OutlierConfig::default());
    fail(&mut o, t0, 5);
    let sent = t0 + secs(5);
    assert!(o.admit(sent));
    // The probe's outcome never arrives. After base_ejection it counts as failed, so the
    // backend is ejected again (for 10 s, from the moment the probe expired)...
    let expired = sent + secs(5);
    assert_eq!(
        o.health(expired),
        Health::Ejected {
            until: expired + secs(10)
        }
    );
    assert!(!o.admit(expired + secs(9)));
    assert_eq!(o.ejections(), 2);
    // ...and then probes again.
    assert!(o.admit(expired + secs(10)));
}

#[test]
fn a_lost_probe_found_late_is_backdated_to_its_expiry() {
    let t0 = Instant::now();
    let mut o = Outlier::new(OutlierConfig::default());
    fail(&mut o, t0, 5);
    assert!(o.admit(t0 + secs(5)));
    // Nobody calls for a minute: the re-ejection (10 s from t0 + 10 s) is long over.
    let t = t0 + secs(60);
    assert_eq!(o.health(t), Health::Probing);
    assert!(o.admit(t));
    assert_eq!(o.ejections(), 2);
}

#[test]
fn a_flapping_backend_keeps_its_long_ejections() {
    let t0 = Instant::now();
    let mut o = Outlier::new(OutlierConfig::default());
    let until = fail(&mut o, t0, 5).unwrap();
    assert!(o.admit(until));
    o.record(until, true, true);
    // Back for a minute, shorter than max_ejection: no decay, the next ejection is longer.
    let t = until + secs(60);
    assert_eq!(fail(&mut o, t, 5), Some(t + secs(10)));
}

#[test]
fn the_multiplier_decays_one_step_per_max_ejection_in_rotation() {
    let t0 = Instant::now();
    let mut o = Outlier::new(OutlierConfig::default());
    let mut t = t0;
    let mut until = fail(&mut o, t, 5).unwrap();
    for _ in 0..3 {
        t = until;
        o.admit(t);
        until = o.record(t, false, true).unwrap();
    }
    assert_eq!(until - t, secs(40));
    o.admit(until);
    o.record(until, true, true);
    // Two full max_ejection periods in rotation: four ejections in a row decay to two, so
    // the next is the third (20 s).
    let t = until + secs(600);
    assert_eq!(fail(&mut o, t, 5), Some(t + secs(20)));
}

#[test]
fn outcomes_during_an_ejection_are_ignored() {
    let t0 = Instant::now();
    let mut o = Outlier::new(OutlierConfig::default());
    let until = fail(&mut o, t0, 5).unwrap();
    assert_eq!(o.record(t0 + secs(1), true, true), None);
    assert_eq!(fail(&mut o, t0 + secs(2), 10), None);
    assert_eq!(o.health(t0 + secs(2)), Health::Ejected { until });
    assert_eq!(o.ejections(), 1);
}

#[test]
fn a_stale_failure_while_probing_without_a_probe_is_ignored() {
    let t0 = Instant::now();
    let mut o = Outlier::new(OutlierConfig::default());
    fail(&mut o, t0, 5);
    // A request sent before the ejection fails after it ended; no probe was let through.
    assert_eq!(o.record(t0 + secs(6), false, true), None);
    assert_eq!(o.health(t0 + secs(6)), Health::Probing);
    assert!(o.admit(t0 + secs(6)));
}

#[test]
fn a_readmitted_backend_starts_with_a_clean_window() {
    let t0 = Instant::now();
    let mut o = Outlier::new(OutlierConfig::default());
    fail(&mut o, t0, 5);
    let t = t0 + secs(5);
    o.admit(t);
    o.record(t, true, true);
    assert_eq!(fail(&mut o, t, 4), None);
    assert!(o.record(t, false, true).is_some());
}

#[test]
fn a_passing_health_check_ends_an_ejection_early() {
    // A 20 s outage: the first ejection (5 s) and two failed probes (10 s, then 20 s).
    let t0 = Instant::now();
    let mut o = Outlier::new(OutlierConfig::default());
    let mut until = fail(&mut o, t0, 5).unwrap();
    for _ in 0..2 {
        assert!(o.admit(until));
        until = o.record(until, false, true).unwrap();
    }
    assert_eq!(until, t0 + secs(35));
    // The backend restarted at t0 + 20 s and answers /health 2 s later, 13 s before `until`.
    let check = t0 + secs(22);
    assert_eq!(o.health_check(check, true, true), None);
    // Probing at once, not healthy: one real request decides.
    assert_eq!(o.health(check), Health::Probing);
    assert!(o.admit(check));
    assert!(!o.admit(check));
    assert_eq!(o.record(check + secs(1), true, true), None);
    assert_eq!(o.health(check + secs(1)), Health::Healthy);
    assert_eq!(o.ejections(), 3);
}

#[test]
fn a_probe_failing_after_a_passing_health_check_ejects_for_longer() {
    let t0 = Instant::now();
    let mut o = Outlier::new(OutlierConfig::default());
    fail(&mut o, t0, 5);
    o.health_check(t0 + secs(1), true, true);
    assert!(o.admit(t0 + secs(1)));
    // /health passed but inference does not work: the probe fails, the next ejection is 10 s.
    assert_eq!(
        o.record(t0 + secs(2), false, true),
        Some(t0 + secs(2) + secs(10))
    );
}

#[test]
fn a_passing_health_check_while_probing_leaves_the_decision_to_a_request() {
    let t0 = Instant::now();
    let mut o = Outlier::new(OutlierConfig::default());
    let until = fail(&mut o, t0, 5).unwrap();
    // Probing, no probe out: still probing after the check.
    assert_eq!(o.health_check(until, true, true), None);
    assert_eq!(o.health(until), Health::Probing);
    // A probe out: the check neither re-admits nor lets a second probe through.
    assert!(o.admit(until));
    assert_eq!(o.health_check(until + secs(1), true, true), None);
    assert_eq!(o.health(until + secs(1)), Health::Probing);
    assert!(!o.admit(until + secs(1)));
    // The probe's failure still counts.
    assert_eq!(
        o.record(until + secs(2), false, true),
        Some(until + secs(2) + secs(10))
    );
}

#[test]
fn a_failing_health_check_counts_like_a_failed_request_while_healthy() {
    let t0 = Instant::now();
    let mut o = Outlier::new(OutlierConfig::default());
    fail(&mut o, t0, 4);
    assert_eq!(o.health_check(t0, false, true), Some(t0 + secs(5)));
}

#[test]
fn a_passing_health_check_does_not_mask_failing_requests() {
    let t0 = Instant::now();
    let mut o = Outlier::new(OutlierConfig::default());
    fail(&mut o, t0, 4);
    assert_eq!(o.health_check(t0, true, true), None);
    assert!(o.record(t0, false, true).is_some());
}

#[test]
fn a_failing_health_check_extends_no_ejection() {
    let t0 = Instant::now();
    let mut o = Outlier::new(OutlierConfig::default());
    let until = fail(&mut o, t0, 5).unwrap();
    assert_eq!(o.health_check(t0 + secs(4), false, true), None);
    assert_eq!(o.health(t0 + secs(4)), Health::Ejected { until });
    // Once probing, a failing check is a failed probe: the next, longer ejection.
    assert_eq!(o.health_check(until, false, true), Some(until + secs(10)));
}

#[test]
fn settings_out_of_range_are_brought_into_it() {
    let o = Outlier::new(OutlierConfig {
        consecutive_failures: 0,
        base_ejection: Duration::ZERO,
        max_ejection: Duration::ZERO,
        window: Duration::MAX,
        ..OutlierConfig::default()
    });
    assert_eq!(o.config().consecutive_failures, 1);
    assert_eq!(o.config().base_ejection, ms(1));
    assert_eq!(o.config().max_ejection, ms(1));
    assert!(o.config().window <= LONGEST);
}

#[test]
fn a_single_backend_is_never_ejected_by_the_pool() {
    assert!(!may_eject(0, 0, 1.0));
    assert!(!may_eject(1, 0, 1.0));
}

#[test]
fn a_small_pool_may_still_eject_one_backend_but_never_all() {
    assert!(may_eject(2, 0, 0.5));
    assert!(!may_eject(2, 1, 0.5));
    assert!(may_eject(2, 0, 0.0));
    assert!(may_eject(3, 0, 0.1));
    assert!(!may_eject(3, 1, 0.1));
    assert!(may_eject(3, 1, 1.0));
    assert!(!may_eject(3, 2, 1.0));
}

#[test]
fn the_ejected_share_caps_ejections_in_a_large_pool() {
    assert!(may_eject(10, 4, 0.5));
    assert!(!may_eject(10, 5, 0.5));
    assert!(may_eject(10, 2, 0.3));
    assert!(!may_eject(10, 3, 0.3));
}

#[test]
fn panic_mode_switches_on_below_the_healthy_share() {
    assert!(!panic_mode(4, 2, 0.5));
    assert!(panic_mode(4, 1, 0.5));
    assert!(panic_mode(3, 1, 0.5));
    assert!(!panic_mode(4, 0, 0.0));
    assert!(!panic_mode(0, 0, 0.5));
    assert!(panic_mode(4, 3, 1.0));
}

/// One step of a simulated backend's life.
#[derive(Debug, Clone)]
enum Op {
    Wait(Duration),
    Admit,
    Record { ok: bool, may_eject: bool },
    Check { ok: bool, may_eject: bool },
}

fn arb_op(failures: bool) -> impl Strategy<Value = Op> {
    let ok = if failures {
        any::<bool>().boxed()
    } else {
        Just(true).boxed()
    };
    prop_oneof![
        (0u64..20_000).prop_map(|m| Op::Wait(ms(m))),
        Just(Op::Admit),
        (ok.clone(), any::<bool>()).prop_map(|(ok, may_eject)| Op::Record { ok, may_eject }),
        (ok, any::<bool>()).prop_map(|(ok, may_eject)| Op::Check { ok, may_eject }),
    ]
}

fn small_config() -> impl Strategy<Value = OutlierConfig> {
    (
        1u32..6,
        0.0f64..1.0,
        0u32..10,
        1u64..20,
        1u64..10,
        1u64..200,
    )
        .prop_map(
            |(consecutive_failures, failure_rate, min_requests, window, base, max)| OutlierConfig {
                consecutive_failures,
                failure_rate,
                min_requests,
                window: secs(window),
                base_ejection: secs(base),
                max_ejection: secs(max),
            },
        )
}

proptest! {
    /// Calm holds what it promises: at any later instant, with nothing recorded meanwhile, the
    /// backend reads healthy, not degraded, and is admitted; and a backend never failed is calm.
    #[test]
    fn a_calm_backend_stays_healthy_and_admitted_until_something_is_recorded(
        config in small_config(),
        ops in prop::collection::vec(arb_op(true), 0..200),
        later in prop::collection::vec(0u64..60_000, 1..8),
    ) {
        let mut o = Outlier::new(config);
        let mut now = Instant::now();
        prop_assert!(o.calm(now));
        for op in ops {
            match op {
                Op::Wait(d) => now += d,
                Op::Admit => {
                    o.admit(now);
                }
                Op::Record { ok, may_eject } => {
                    o.record(now, ok, may_eject);
                }
                Op::Check { ok, may_eject } => {
                    o.health_check(now, ok, may_eject);
                }
            }
            if o.calm(now) {
                for &m in &later {
                    let t = now + ms(m);
                    prop_assert_eq!(o.health(t), Health::Healthy);
                    prop_assert!(!o.degraded(t));
                    prop_assert!(o.clone().admit(t));
                    prop_assert!(o.calm(t));
                }
            }
        }
    }

    #[test]
    fn never_admitted_while_ejected_and_one_probe_at_a_time(
        config in small_config(),
        ops in prop::collection::vec(arb_op(true), 0..300),
    ) {
        let base = config.base_ejection.max(ms(1));
        let mut o = Outlier::new(config);
        let mut now = Instant::now();
        // When the probe admitted in the current probing period was sent, if one is out.
        let mut probe: Option<Instant> = None;
        for op in ops {
            let before = o.health(now);
            if before != Health::Probing {
                probe = None;
            }
            match op {
                Op::Wait(d) => now += d,
                Op::Admit => {
                    let admitted = o.admit(now);
                    match before {
                        Health::Healthy => prop_assert!(admitted),
                        Health::Ejected { .. } => prop_assert!(!admitted),
                        Health::Probing => {
                            if probe.is_some_and(|sent| now < sent + base) {
                                prop_assert!(!admitted, "a second probe while one is out");
                            }
                            if admitted {
                                probe = Some(now);
                            }
                        }
                    }
                }
                Op::Record { ok, may_eject } => {
                    o.record(now, ok, may_eject);
                    probe = None;
                }
                Op::Check { ok, may_eject } => {
                    o.health_check(now, ok, may_eject);
                    // A passing check leaves a probe that is out to decide.
                    if !(ok && before == Health::Probing) {
                        probe = None;
                    }
                    // And it never re-admits an ejected or probing backend by itself.
                    if ok && before != Health::Healthy {
                        prop_assert_eq!(o.health(now), Health::Probing);
                    }
                }
            }
        }
    }

    #[test]
    fn ejections_are_capped_and_never_shorten_without_a_healthy_period(
        config in small_config(),
        ops in prop::collection::vec(arb_op(true), 0..300),
    ) {
        let mut o = Outlier::new(config);
        let (shortest, longest) = (o.config().base_ejection, o.config().max_ejection);
        let mut now = Instant::now();
        let mut last: Option<Duration> = None;
        for op in ops {
            let ejected = match op {
                Op::Wait(d) => {
                    now += d;
                    None
                }
                Op::Admit => {
                    o.admit(now);
                    None
                }
                Op::Record { ok, may_eject } => o.record(now, ok, may_eject),
                Op::Check { ok, may_eject } => o.health_check(now, ok, may_eject),
            };
            match o.health(now) {
                Health::Healthy => last = None,
                Health::Ejected { until } => prop_assert!(until - now <= longest),
                Health::Probing => {}
            }
            if let Some(until) = ejected {
                let length = until - now;
                prop_assert!(length >= shortest && length <= longest, "{length:?}");
                if let Some(previous) = last {
                    prop_assert!(length >= previous, "{length:?} after {previous:?}");
                }
                last = Some(length);
            }
        }
    }

    #[test]
    fn only_successes_never_eject(
        ops in prop::collection::vec(arb_op(false), 0..300),
    ) {
        let mut o = Outlier::new(OutlierConfig::default());
        let mut now = Instant::now();
        for op in ops {
            match op {
                Op::Wait(d) => now += d,
                Op::Admit => prop_assert!(o.admit(now)),
                Op::Record { ok, may_eject } => prop_assert_eq!(o.record(now, ok, may_eject), None),
                Op::Check { ok, may_eject } => {
                    prop_assert_eq!(o.health_check(now, ok, may_eject), None)
                }
            }
            prop_assert_eq!(o.health(now), Health::Healthy);
        }
        prop_assert_eq!(o.ejections(), 0);
    }

    #[test]
    fn may_eject_never_lets_a_pool_lose_all_its_backends(
        pool_size in 1usize..8,
        share in -0.5f64..1.5,
        config in small_config(),
        ops in prop::collection::vec((0usize..8, arb_op(true)), 0..400),
    ) {
        let mut pool: Vec<Outlier> = (0..pool_size).map(|_| Outlier::new(config.clone())).collect();
        let mut now = Instant::now();
        for (i, op) in ops {
            let healthy = pool.iter().filter(|o| o.health(now) == Health::Healthy).count();
            let allowed = may_eject(pool_size, pool_size - healthy, share);
            let o = &mut pool[i % pool_size];
            match op {
                Op::Wait(d) => now += d,
                Op::Admit => {
                    o.admit(now);
                }
                Op::Record { ok, may_eject } => {
                    o.record(now, ok, may_eject && allowed);
                }
                Op::Check { ok, may_eject } => {
                    o.health_check(now, ok, may_eject && allowed);
                }
            }
            let healthy = pool.iter().filter(|o| o.health(now) == Health::Healthy).count();
            prop_assert!(healthy >= 1, "every backend of {pool_size} is out");
            if pool_size == 1 {
                prop_assert_eq!(pool[0].ejections(), 0);
            }
        }
    }

    #[test]
    fn ejecting_while_allowed_always_leaves_one_backend(
        pool_size in 0usize..1000,
        share in -1.0f64..2.0,
    ) {
        let mut ejected = 0;
        while may_eject(pool_size, ejected, share) {
            ejected += 1;
        }
        prop_assert!(ejected < pool_size.max(1));
        prop_assert_eq!(ejected >= 1, pool_size >= 2);
    }
}

#[test]
fn a_backend_held_back_by_the_ejection_cap_is_degraded_until_it_succeeds_or_ages_out() {
    let t0 = Instant::now();
    let mut o = Outlier::new(OutlierConfig::default());
    for _ in 0..4 {
        assert_eq!(o.record(t0, false, false), None);
    }
    assert!(!o.degraded(t0), "four failures are not yet five");
    assert_eq!(o.record(t0, false, false), None);
    assert_eq!(o.health(t0), Health::Healthy);
    assert!(o.degraded(t0));
    // Its failures age out of the window: it gets traffic again, and one more failure is
    // enough to make it degraded again.
    assert!(!o.degraded(t0 + secs(11)));
    fail_held(&mut o, t0 + secs(11), 1);
    assert!(o.degraded(t0 + secs(11)));
    // A success ends it at once.
    o.record(t0 + secs(12), true, false);
    assert!(!o.degraded(t0 + secs(12)));
    // Many earlier successes in the window do not hide a fresh run of failures.
    let mut busy = Outlier::new(OutlierConfig::default());
    for _ in 0..100 {
        busy.record(t0, true, false);
    }
    fail_held(&mut busy, t0 + secs(1), 5);
    assert!(busy.degraded(t0 + secs(1)));
    // An ejected backend is ejected, not degraded.
    let mut e = Outlier::new(OutlierConfig::default());
    fail(&mut e, t0, 5);
    assert!(!e.degraded(t0));
}

fn fail_held(o: &mut Outlier, now: Instant, n: u32) {
    for _ in 0..n {
        o.record(now, false, false);
    }
}

proptest! {
    #[test]
    fn only_successes_never_degrade(steps in proptest::collection::vec(0u64..5_000, 1..100)) {
        let t0 = Instant::now();
        let mut o = Outlier::new(OutlierConfig::default());
        let mut now = t0;
        for s in steps {
            now += ms(s);
            o.record(now, true, true);
            prop_assert!(!o.degraded(now));
        }
    }
}
