use super::*;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::SeedableRng;

const LONG: Duration = Duration::from_secs(3600);

fn rng() -> StdRng {
    StdRng::seed_from_u64(7)
}

#[test]
fn ceiling_doubles_up_to_the_cap() {
    let b = Backoff {
        base: Duration::from_millis(50),
        cap: Duration::from_secs(2),
    };
    let ms: Vec<u128> = (0..8).map(|n| b.ceiling(n).as_millis()).collect();
    assert_eq!(ms, [50, 100, 200, 400, 800, 1600, 2000, 2000]);
    assert_eq!(b.ceiling(u32::MAX), Duration::from_secs(2));
}

#[test]
fn final_outcomes_are_never_retried() {
    let p = RetryPolicy::default();
    for class in [Class::Success, Class::ClientError] {
        let d = p.decide(class, Pushback::default(), 1, LONG, &mut rng());
        assert_eq!(d, Decision::Stop(Stop::Final));
    }
}

#[test]
fn a_plain_server_error_is_not_retried_unless_the_upstream_says_so() {
    let p = RetryPolicy::default();
    let d = p.decide(Class::ServerError, Pushback::default(), 1, LONG, &mut rng());
    assert_eq!(d, Decision::Stop(Stop::NotRetryable));
    let yes = Pushback {
        should_retry: Some(true),
        ..Pushback::default()
    };
    let d = p.decide(Class::ServerError, yes, 1, LONG, &mut rng());
    assert!(matches!(d, Decision::Retry { .. }), "{d:?}");
}

#[test]
fn should_retry_false_stops_even_a_transient_failure() {
    let no = Pushback {
        should_retry: Some(false),
        ..Pushback::default()
    };
    let d = RetryPolicy::default().decide(Class::Transient, no, 1, LONG, &mut rng());
    assert_eq!(d, Decision::Stop(Stop::NotRetryable));
}

#[test]
fn capacity_moves_elsewhere_without_waiting_for_the_full_backend() {
    let p = RetryPolicy::default();
    let wait = Pushback {
        retry_after: Some(Duration::from_secs(30)),
        ..Pushback::default()
    };
    match p.decide(
        Class::Capacity,
        wait,
        1,
        Duration::from_secs(10),
        &mut rng(),
    ) {
        Decision::Retry {
            after,
            same_backend_ok,
        } => {
            assert!(!same_backend_ok);
            assert!(after <= p.capacity.ceiling(0));
        }
        d => panic!("{d:?}"),
    }
}

#[test]
fn a_refused_gateway_credential_moves_to_another_backend_at_once() {
    let p = RetryPolicy::default();
    // The backend's pushback speaks for the credential it refused, not for the next backend.
    for pushback in [
        Pushback::default(),
        Pushback {
            retry_after: Some(Duration::from_secs(30)),
            should_retry: Some(false),
        },
    ] {
        for attempts in 1..3 {
            let d = p.decide(Class::UpstreamAuth, pushback, attempts, LONG, &mut rng());
            assert_eq!(
                d,
                Decision::Retry {
                    after: Duration::ZERO,
                    same_backend_ok: false
                }
            );
        }
    }
    let d = p.decide(
        Class::UpstreamAuth,
        Pushback::default(),
        3,
        LONG,
        &mut rng(),
    );
    assert_eq!(d, Decision::Stop(Stop::AttemptsExhausted));
    let d = p.decide(
        Class::UpstreamAuth,
        Pushback::default(),
        1,
        Duration::ZERO,
        &mut rng(),
    );
    assert_eq!(d, Decision::Stop(Stop::Deadline));
}

#[test]
fn a_retry_after_beyond_the_deadline_stops() {
    let wait = Pushback {
        retry_after: Some(Duration::from_secs(30)),
        ..Pushback::default()
    };
    let d = RetryPolicy::default().decide(
        Class::Transient,
        wait,
        1,
        Duration::from_secs(10),
        &mut rng(),
    );
    assert_eq!(d, Decision::Stop(Stop::Deadline));
}

#[test]
fn attempts_are_capped_at_five_whatever_the_setting() {
    let p = RetryPolicy {
        max_attempts: 50,
        ..RetryPolicy::default()
    };
    let d = p.decide(Class::Transient, Pushback::default(), 5, LONG, &mut rng());
    assert_eq!(d, Decision::Stop(Stop::AttemptsExhausted));
    assert_eq!(p.clamped().max_attempts, MAX_ATTEMPTS_CAP);
}

fn class() -> impl Strategy<Value = Class> {
    prop_oneof![
        Just(Class::Success),
        Just(Class::Capacity),
        Just(Class::Transient),
        Just(Class::Timeout),
        Just(Class::UpstreamAuth),
        Just(Class::ClientError),
        Just(Class::ServerError),
    ]
}

proptest! {
    #[test]
    fn delays_stay_within_zero_and_the_cap(
        base_ms in 0u64..10_000, cap_ms in 0u64..60_000, n in 0u32..100, seed in any::<u64>(),
    ) {
        let b = Backoff { base: Duration::from_millis(base_ms), cap: Duration::from_millis(cap_ms) };
        let d = b.delay(n, &mut StdRng::seed_from_u64(seed));
        prop_assert!(d <= b.cap);
        prop_assert!(d <= b.ceiling(n));
    }

    #[test]
    fn any_decision_respects_attempts_deadline_and_client_errors(
        class in class(),
        attempts in 1u32..10,
        max_attempts in 0u32..10,
        left_ms in 0u64..20_000,
        retry_after_ms in proptest::option::of(0u64..60_000),
        should_retry in proptest::option::of(any::<bool>()),
        seed in any::<u64>(),
    ) {
        let p = RetryPolicy { max_attempts, ..RetryPolicy::default() };
        let push = Pushback { retry_after: retry_after_ms.map(Duration::from_millis), should_retry };
        let left = Duration::from_millis(left_ms);
        let d = p.decide(class, push, attempts, left, &mut StdRng::seed_from_u64(seed));
        if let Decision::Retry { after, same_backend_ok } = d {
            prop_assert!(attempts < max_attempts.clamp(1, MAX_ATTEMPTS_CAP));
            prop_assert!(after < left);
            prop_assert!(class != Class::ClientError && class != Class::Success);
            let auth = class == Class::UpstreamAuth;
            prop_assert!(should_retry != Some(false) || auth);
            prop_assert_eq!(same_backend_ok, class != Class::Capacity && !auth);
            let cap = if class == Class::Capacity { p.capacity.cap } else { p.transient.cap };
            prop_assert!(after <= cap.max(push.retry_after.unwrap_or_default()));
            if auth {
                prop_assert_eq!(after, Duration::ZERO);
            }
        }
    }
}

#[test]
fn the_naive_policy_retries_at_once_whatever_the_backend_says() {
    let p = RetryPolicy::naive(5);
    let told = Pushback::parse(Some("30"), None, Some("false"));
    let d = p.decide(Class::Transient, told, 1, LONG, &mut rng());
    assert_eq!(
        d,
        Decision::Retry {
            after: Duration::ZERO,
            same_backend_ok: true
        }
    );
    let d = p.decide(Class::Transient, told, 5, LONG, &mut rng());
    assert_eq!(d, Decision::Stop(Stop::AttemptsExhausted));
}
