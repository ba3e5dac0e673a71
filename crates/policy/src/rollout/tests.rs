use std::time::{Duration, Instant};

use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::*;

mod simulation;

const SECOND: Duration = Duration::from_secs(1);

fn ok() -> Observation {
    Observation {
        ending: Ending::Status(200),
        ttft: Some(Duration::from_millis(300)),
    }
}

fn status(status: u16) -> Observation {
    Observation {
        ending: Ending::Status(status),
        ttft: None,
    }
}

#[test]
fn defaults_are_the_documented_ones() {
    let c = RolloutConfig::default();
    assert_eq!(c.steps, [1.0, 5.0, 25.0, 50.0, 100.0]);
    assert_eq!(c.min_step_duration, Duration::from_secs(60));
    assert_eq!(c.min_step_requests, 100);
    assert_eq!(c.alpha, 0.0001);
    assert_eq!(c.min_excess_events, 5);
    assert_eq!(c.min_ratio, 2.0);
    assert_eq!(c.ttft_quantile, 0.95);
    assert_eq!(c.check(), Ok(()));
}

#[test]
fn the_check_names_what_is_wrong() {
    let with = |f: fn(&mut RolloutConfig)| {
        let mut c = RolloutConfig::default();
        f(&mut c);
        c.check()
    };
    use RolloutConfigError as E;
    assert_eq!(with(|c| c.steps.clear()), Err(E::NoSteps));
    assert_eq!(with(|c| c.steps = vec![0.0, 100.0]), Err(E::StepOutOfRange));
    assert_eq!(
        with(|c| c.steps = vec![50.0, 100.5]),
        Err(E::StepOutOfRange)
    );
    assert_eq!(
        with(|c| c.steps = vec![f64::NAN, 100.0]),
        Err(E::StepOutOfRange)
    );
    assert_eq!(with(|c| c.steps = vec![0.005, 100.0]), Err(E::StepTooFine));
    assert_eq!(
        with(|c| c.steps = vec![5.0, 5.0, 100.0]),
        Err(E::StepsNotIncreasing)
    );
    assert_eq!(
        with(|c| c.steps = vec![10.0, 1.0, 100.0]),
        Err(E::StepsNotIncreasing)
    );
    assert_eq!(with(|c| c.steps = vec![1.0, 50.0]), Err(E::LastStepNotFull));
    assert_eq!(with(|c| c.min_step_requests = 0), Err(E::ZeroStepRequests));
    assert_eq!(with(|c| c.alpha = 0.0), Err(E::AlphaOutOfRange));
    assert_eq!(with(|c| c.alpha = 1.0), Err(E::AlphaOutOfRange));
    assert_eq!(with(|c| c.min_excess_events = 0), Err(E::ZeroExcessEvents));
    assert_eq!(with(|c| c.min_ratio = 0.5), Err(E::RatioBelowOne));
    assert_eq!(with(|c| c.min_ratio = f64::INFINITY), Err(E::RatioBelowOne));
    assert_eq!(with(|c| c.ttft_quantile = 1.0), Err(E::QuantileOutOfRange));
    // A single step of all traffic, and steps in basis points, are fine.
    assert_eq!(with(|c| c.steps = vec![100.0]), Ok(()));
    assert_eq!(with(|c| c.steps = vec![0.01, 0.5, 100.0]), Ok(()));
    let t0 = Instant::now();
    let bad = RolloutConfig {
        alpha: 2.0,
        ..RolloutConfig::default()
    };
    assert_eq!(Rollout::try_new(bad, t0).unwrap_err(), E::AlphaOutOfRange);
}

#[test]
fn no_promotion_before_the_minimum_time_and_requests() {
    let t0 = Instant::now();
    let mut rollout = Rollout::try_new(RolloutConfig::default(), t0).unwrap();
    // The old version's requests do not count.
    for _ in 0..10_000 {
        rollout.record(Side::Old, ok());
    }
    for _ in 0..99 {
        rollout.record(Side::New, ok());
    }
    assert_eq!(rollout.evaluate(t0 + 600 * SECOND), Verdict::Hold);
    rollout.record(Side::New, ok());
    assert_eq!(
        rollout.evaluate(t0 + 600 * SECOND),
        Verdict::Promote { to_step: 1 }
    );
    assert_eq!(rollout.share(), 500);
    // The next step's window starts empty, and its time at the promotion.
    assert_eq!(rollout.tally(Side::Old).requests(), 0);
    assert_eq!(rollout.tally(Side::New).requests(), 0);
    let promoted = t0 + 600 * SECOND;
    assert_eq!(rollout.since(), promoted);
    for _ in 0..1_000 {
        rollout.record(Side::New, ok());
    }
    assert_eq!(
        rollout.evaluate(promoted + Duration::from_millis(59_999)),
        Verdict::Hold
    );
    assert_eq!(
        rollout.evaluate(promoted + 60 * SECOND),
        Verdict::Promote { to_step: 2 }
    );
}

#[test]
fn a_halt_takes_all_traffic_away_and_stands_until_a_restart() {
    let t0 = Instant::now();
    let mut rollout = Rollout::try_new(RolloutConfig::default(), t0).unwrap();
    for _ in 0..1_000 {
        rollout.record(Side::Old, ok());
    }
    for _ in 0..5 {
        rollout.record(Side::New, status(422));
    }
    let at = t0 + SECOND;
    let Verdict::Halt(evidence) = rollout.evaluate(at) else {
        panic!("no halt");
    };
    assert_eq!(evidence.signal, Signal::ClientError(422));
    // Five 422s of five requests against none of a thousand: p = (5 / 1005)^5.
    let p = (5.0f64 / 1005.0).powi(5);
    assert!((evidence.p_value - p).abs() < 1e-9 * p);
    assert_eq!(
        evidence.counts,
        Counts {
            new_events: 5,
            new_requests: 5,
            old_events: 0,
            old_requests: 1_000,
        }
    );
    assert_eq!(rollout.share(), 0);
    assert_eq!(
        rollout.status(),
        &Status::Halted {
            step: 0,
            reason: evidence.clone(),
        }
    );
    assert_eq!(rollout.since(), at);
    assert!(evidence
        .to_string()
        .starts_with("client_error 422: 100.0 %"));
    // Nothing moves it: not time, not requests, not a promotion or an abort.
    rollout.record(Side::New, ok());
    assert_eq!(rollout.tally(Side::New).requests(), 5);
    assert_eq!(rollout.evaluate(t0 + 3_600 * SECOND), Verdict::Hold);
    assert_eq!(rollout.promote(t0 + 3_600 * SECOND), Verdict::Hold);
    assert!(!rollout.abort(t0 + 3_600 * SECOND, "too late"));
    assert_eq!(rollout.share(), 0);
    rollout.restart(t0 + 3_600 * SECOND);
    assert_eq!(rollout.status(), &Status::Running { step: 0 });
    assert_eq!(rollout.share(), 100);
    assert_eq!(rollout.tally(Side::New).requests(), 0);
}

#[test]
fn a_lone_failure_is_not_enough() {
    // Two 500s of a new version against none: p = 1e-4 < alpha, but fewer than five events.
    let t0 = Instant::now();
    let mut rollout = Rollout::try_new(RolloutConfig::default(), t0).unwrap();
    for _ in 0..9_900 {
        rollout.record(Side::Old, ok());
    }
    for _ in 0..98 {
        rollout.record(Side::New, ok());
    }
    rollout.record(Side::New, status(500));
    rollout.record(Side::New, status(500));
    assert_eq!(rollout.evaluate(t0 + SECOND), Verdict::Hold);
    let mut eager = Rollout::try_new(
        RolloutConfig {
            min_excess_events: 1,
            ..RolloutConfig::default()
        },
        t0,
    )
    .unwrap();
    for _ in 0..9_900 {
        eager.record(Side::Old, ok());
    }
    eager.record(Side::New, status(500));
    eager.record(Side::New, status(500));
    assert!(matches!(eager.evaluate(t0 + SECOND), Verdict::Halt(_)));
}

#[test]
fn a_small_difference_significant_only_by_its_counts_does_not_halt() {
    // 1.3 % against 1.0 % over 200_000 requests each: z of about 9, a ratio of 1.3.
    let config = RolloutConfig {
        steps: vec![50.0, 100.0],
        ..RolloutConfig::default()
    };
    let t0 = Instant::now();
    let mut rollout = Rollout::try_new(config.clone(), t0).unwrap();
    let mut strict = Rollout::try_new(
        RolloutConfig {
            min_ratio: 1.0,
            ..config
        },
        t0,
    )
    .unwrap();
    for i in 0..200_000u32 {
        let old = if i % 100 == 0 { status(500) } else { ok() };
        let new = if i % 1_000 < 13 { status(500) } else { ok() };
        for r in [&mut rollout, &mut strict] {
            r.record(Side::Old, old);
            r.record(Side::New, new);
        }
    }
    assert_eq!(rollout.evaluate(t0 + SECOND), Verdict::Hold);
    let Verdict::Halt(e) = strict.evaluate(t0 + SECOND) else {
        panic!("no halt without the ratio");
    };
    assert_eq!(e.signal, Signal::ServerError);
    assert!(e.p_value < 1e-15);
}

#[test]
fn manual_promotion_and_abort() {
    let t0 = Instant::now();
    let mut rollout = Rollout::try_new(RolloutConfig::default(), t0).unwrap();
    rollout.record(Side::New, ok());
    assert_eq!(rollout.promote(t0), Verdict::Promote { to_step: 1 });
    assert_eq!(rollout.tally(Side::New).requests(), 0);
    for to_step in 2..5 {
        assert_eq!(rollout.promote(t0), Verdict::Promote { to_step });
    }
    assert_eq!(rollout.share(), 10_000);
    assert_eq!(rollout.promote(t0), Verdict::Complete);
    assert_eq!(rollout.promote(t0), Verdict::Hold);
    // A completed rollout can still be rolled back by hand.
    assert!(rollout.abort(t0 + SECOND, "latency complaints"));
    assert_eq!(
        rollout.status(),
        &Status::Aborted {
            step: 4,
            reason: "latency complaints".into(),
        }
    );
    assert_eq!(rollout.share(), 0);
    assert_eq!(rollout.evaluate(t0 + 3_600 * SECOND), Verdict::Hold);
}

/// Drives a rollout to its last step with a step at 50 % whose old version never answers 400.
fn at_the_last_step(config: RolloutConfig, t0: Instant) -> Rollout {
    let mut rollout = Rollout::try_new(config, t0).unwrap();
    for _ in 0..3 {
        rollout.promote(t0);
    }
    for _ in 0..5_000 {
        rollout.record(Side::Old, ok());
        rollout.record(Side::New, ok());
    }
    assert_eq!(
        rollout.evaluate(t0 + 60 * SECOND),
        Verdict::Promote { to_step: 4 }
    );
    rollout
}

#[test]
fn the_last_step_compares_with_the_old_version_of_the_step_before() {
    let t0 = Instant::now();
    let mut rollout = at_the_last_step(RolloutConfig::default(), t0);
    for _ in 0..100 {
        rollout.record(Side::New, ok());
    }
    for _ in 0..5 {
        rollout.record(Side::New, status(400));
    }
    let Verdict::Halt(e) = rollout.evaluate(t0 + 61 * SECOND) else {
        panic!("no halt at the last step");
    };
    assert_eq!(e.counts.old_requests, 5_000);
    assert!(matches!(rollout.status(), Status::Halted { step: 4, .. }));
}

#[test]
fn a_last_step_resumed_without_an_old_window_refuses_to_judge() {
    let t0 = Instant::now();
    let rollout = at_the_last_step(RolloutConfig::default(), t0);
    let mut resumed = Rollout::resume(RolloutConfig::default(), &rollout.state(), t0).unwrap();
    assert_eq!(resumed.status(), &Status::Running { step: 4 });
    for _ in 0..100 {
        resumed.record(Side::New, status(400));
    }
    assert_eq!(resumed.evaluate(t0 + 59 * SECOND), Verdict::Hold);
    assert_eq!(resumed.evaluate(t0 + 60 * SECOND), Verdict::Complete);
}

#[test]
fn the_state_round_trips_and_a_resumed_step_starts_its_time_again() {
    let t0 = Instant::now();
    let mut rollout = Rollout::try_new(RolloutConfig::default(), t0).unwrap();
    rollout.promote(t0);
    rollout.promote(t0);
    let state = rollout.state();
    assert_eq!(
        state,
        RolloutState {
            status: Status::Running { step: 2 },
            step_share: 2_500,
        }
    );
    let later = t0 + 3_600 * SECOND;
    let mut resumed = Rollout::resume(RolloutConfig::default(), &state, later).unwrap();
    assert_eq!(resumed.state(), state);
    assert_eq!(resumed.share(), 2_500);
    assert_eq!(resumed.since(), later);
    for _ in 0..1_000 {
        resumed.record(Side::New, ok());
    }
    assert_eq!(resumed.evaluate(later + 59 * SECOND), Verdict::Hold);
    assert_eq!(
        resumed.evaluate(later + 60 * SECOND),
        Verdict::Promote { to_step: 3 }
    );
    // Terminal states come back as they were.
    resumed.abort(later, "by hand");
    let aborted = Rollout::resume(RolloutConfig::default(), &resumed.state(), later).unwrap();
    assert_eq!(aborted.status(), resumed.status());
    assert_eq!(aborted.share(), 0);
}

#[test]
fn a_state_resumed_under_changed_steps_never_takes_more_traffic() {
    let t0 = Instant::now();
    let saved = RolloutState {
        status: Status::Running { step: 2 },
        step_share: 2_500,
    };
    let config = RolloutConfig {
        steps: vec![2.0, 10.0, 50.0, 100.0],
        ..RolloutConfig::default()
    };
    let resumed = Rollout::resume(config.clone(), &saved, t0).unwrap();
    assert_eq!(resumed.status(), &Status::Running { step: 1 });
    assert_eq!(resumed.share(), 1_000);
    let below_all = RolloutState {
        status: Status::Running { step: 0 },
        step_share: 100,
    };
    let resumed = Rollout::resume(config, &below_all, t0).unwrap();
    assert_eq!(resumed.status(), &Status::Running { step: 0 });
}

#[cfg(feature = "serde")]
#[test]
fn the_state_is_stored_as_plain_json() {
    let evidence = Evidence {
        signal: Signal::ClientError(400),
        p_value: 1e-10,
        new_rate: 0.02,
        old_rate: 0.0,
        counts: Counts {
            new_events: 5,
            new_requests: 250,
            old_events: 0,
            old_requests: 24_750,
        },
        ttft_threshold: None,
    };
    for status in [
        Status::Running { step: 1 },
        Status::Halted {
            step: 0,
            reason: evidence,
        },
        Status::Aborted {
            step: 3,
            reason: "by hand".into(),
        },
        Status::Completed,
    ] {
        let state = RolloutState {
            status,
            step_share: 100,
        };
        let json = serde_json::to_string(&state).unwrap();
        assert_eq!(serde_json::from_str::<RolloutState>(&json).unwrap(), state);
    }
    let json = serde_json::to_value(RolloutState {
        status: Status::Running { step: 1 },
        step_share: 500,
    })
    .unwrap();
    assert_eq!(
        json,
        serde_json::json!({"status": "running", "step": 1, "step_share": 500})
    );
}

#[test]
fn takes_new_is_exact_at_one_percent() {
    // The draws taken are exactly those below ceil(share x 2^64 / 10_000).
    let cut = (1u128 << 64).div_ceil(100);
    assert!(takes_new(100, (cut - 1) as u64));
    assert!(!takes_new(100, cut as u64));
    assert!(!takes_new(0, 0));
    assert!(takes_new(10_000, u64::MAX));
    let mut rng = SmallRng::seed_from_u64(3);
    let taken = (0..1_000_000)
        .filter(|_| takes_new(100, rng.random()))
        .count();
    // 10_000 expected, with a standard deviation of 99.5.
    assert!((9_600..=10_400).contains(&taken), "{taken}");
}

proptest! {
    #[test]
    fn takes_new_cuts_the_draws_at_the_share(share in 0u32..=10_000, draw: u64, more in 0u32..10_000) {
        let cut = (u128::from(share) << 64).div_ceil(10_000);
        prop_assert_eq!(takes_new(share, draw), u128::from(draw) < cut);
        // A draw taken at one share is taken at every larger one.
        prop_assert!(!takes_new(share, draw) || takes_new(share + more, draw));
    }

    /// Whatever is recorded, evaluated, promoted or aborted, in any order: the share is the
    /// status's, a step promoted by evaluation held its time and requests, and the state
    /// resumes to the same status and share.
    #[test]
    fn the_share_always_follows_the_status(
        ops in prop::collection::vec((0u8..8, 0u64..40_000, 0u16..600), 1..300),
    ) {
        let t0 = Instant::now();
        let config = RolloutConfig {
            min_step_duration: Duration::from_secs(10),
            min_step_requests: 20,
            ..RolloutConfig::default()
        };
        let mut rollout = Rollout::try_new(config.clone(), t0).unwrap();
        let mut now = t0;
        for (op, wait_ms, code) in ops {
            now += Duration::from_millis(wait_ms);
            let observation = Observation {
                ending: Ending::Status(code.max(100)),
                ttft: Some(Duration::from_millis(u64::from(code))),
            };
            let (step_began, new_requests) = (rollout.since(), rollout.tally(Side::New).requests());
            match op {
                0..=2 => rollout.record(Side::Old, observation),
                3 | 4 => rollout.record(Side::New, observation),
                5 => {
                    let verdict = rollout.evaluate(now);
                    if matches!(verdict, Verdict::Promote { .. } | Verdict::Complete) {
                        prop_assert!(now.duration_since(step_began) >= config.min_step_duration);
                        prop_assert!(new_requests >= config.min_step_requests);
                    }
                }
                6 => {
                    rollout.promote(now);
                }
                _ => {
                    if code % 10 == 0 {
                        rollout.abort(now, "by hand");
                    } else if code % 10 == 1 {
                        rollout.restart(now);
                    }
                }
            }
            let share = match rollout.status() {
                Status::Running { step } => config.share_of(*step),
                Status::Completed => 10_000,
                Status::Halted { .. } | Status::Aborted { .. } => 0,
            };
            prop_assert_eq!(rollout.share(), share);
            let resumed = Rollout::resume(config.clone(), &rollout.state(), now).unwrap();
            prop_assert_eq!(resumed.status(), rollout.status());
            prop_assert_eq!(resumed.share(), rollout.share());
        }
    }
}
