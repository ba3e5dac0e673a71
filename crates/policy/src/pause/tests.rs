use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn the_defaults_are_three_errors_then_a_second() {
    let d = PauseAfterErrors::default();
    assert_eq!(
        d,
        PauseAfterErrors::try_new(3, Duration::from_secs(1)).unwrap()
    );
    assert_eq!((ERRORS_BEFORE_PAUSE, PAUSE), (3, Duration::from_secs(1)));
}

#[test]
fn settings_that_mean_nothing_are_refused() {
    assert_eq!(
        PauseAfterErrors::try_new(0, PAUSE),
        Err(PauseError::ZeroErrors)
    );
    assert_eq!(
        PauseAfterErrors::try_new(3, Duration::ZERO),
        Err(PauseError::ZeroPause)
    );
}

#[test]
fn a_dependency_is_left_alone_only_after_errors_in_a_row() {
    let t0 = Instant::now();
    let mut p = PauseAfterErrors::default();
    assert!(!p.is_paused(t0));
    for n in 1..ERRORS_BEFORE_PAUSE {
        p.failed(t0);
        assert!(!p.is_paused(t0), "paused after {n} errors");
    }
    let last = t0 + ms(10);
    p.failed(last);
    assert_eq!(p.errors_in_a_row(), ERRORS_BEFORE_PAUSE);
    assert!(p.is_paused(last));
    assert!(p.is_paused(last + PAUSE - ms(1)));
    assert!(!p.is_paused(last + PAUSE), "the pause ends after PAUSE");
}

#[test]
fn the_first_call_after_a_pause_that_fails_pauses_again_at_once() {
    let t0 = Instant::now();
    let mut p = PauseAfterErrors::default();
    for _ in 0..ERRORS_BEFORE_PAUSE {
        p.failed(t0);
    }
    let after = t0 + PAUSE;
    assert!(!p.is_paused(after));
    p.failed(after);
    assert!(p.is_paused(after));
    assert!(!p.is_paused(after + PAUSE));
}

#[test]
fn a_success_ends_the_run_and_the_pause() {
    let t0 = Instant::now();
    let mut p = PauseAfterErrors::default();
    for _ in 0..ERRORS_BEFORE_PAUSE {
        p.failed(t0);
    }
    assert!(p.is_paused(t0));
    p.succeeded();
    assert!(!p.is_paused(t0));
    assert_eq!(p.errors_in_a_row(), 0);
    // A new run needs all its errors again.
    for _ in 1..ERRORS_BEFORE_PAUSE {
        p.failed(t0);
    }
    assert!(!p.is_paused(t0));
}

#[test]
fn the_count_saturates() {
    let t0 = Instant::now();
    let mut p = PauseAfterErrors::try_new(u32::MAX, PAUSE).unwrap();
    p.errors_in_a_row = u32::MAX - 1;
    p.failed(t0);
    p.failed(t0);
    assert_eq!(p.errors_in_a_row(), u32::MAX);
    assert!(p.is_paused(t0));
}

proptest! {
    /// Against the rule in words: at any time, the dependency is left alone exactly when the
    /// calls since the last success are at least `errors` failures and the last of them was
    /// less than `pause` ago.
    #[test]
    fn paused_exactly_when_the_trailing_errors_are_enough_and_recent(
        errors in 1u32..6,
        pause_ms in 1u64..5_000,
        steps in prop::collection::vec((any::<bool>(), 0u64..3_000), 0..200),
    ) {
        let pause = ms(pause_ms);
        let t0 = Instant::now();
        let mut p = PauseAfterErrors::try_new(errors, pause).unwrap();
        let (mut now, mut run, mut last_error) = (t0, 0u32, None);
        for (failed, wait) in steps {
            now += ms(wait);
            let expected = run >= errors && last_error.is_some_and(|at| now < at + pause);
            prop_assert_eq!(p.is_paused(now), expected);
            if failed {
                p.failed(now);
                run += 1;
                last_error = Some(now);
            } else {
                p.succeeded();
                run = 0;
            }
            prop_assert_eq!(p.errors_in_a_row(), run);
        }
    }
}
