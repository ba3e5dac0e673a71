use super::*;
use proptest::prelude::*;

fn config(ratio: f64, min_per_sec: f64) -> BudgetConfig {
    BudgetConfig {
        ratio,
        min_per_sec,
        window: Duration::from_secs(10),
        max_retrying_share: 1.0,
        min_retrying: 1,
    }
}

#[test]
fn defaults_are_the_documented_ones() {
    let c = BudgetConfig::default();
    assert_eq!(c.ratio, 0.1);
    assert_eq!(c.min_per_sec, 1.0);
    assert_eq!(c.window, Duration::from_secs(10));
    assert_eq!(c.max_retrying_share, 0.2);
    assert_eq!(c.min_retrying, 8);
}

#[test]
fn refusals_have_distinct_names_and_reasons() {
    assert_eq!(Refusal::RateSpent.as_str(), "rate_spent");
    assert_eq!(Refusal::TooManyRetrying.as_str(), "too_many_retrying");
    assert_ne!(
        Refusal::RateSpent.describe(),
        Refusal::TooManyRetrying.describe()
    );
    for r in [Refusal::RateSpent, Refusal::TooManyRetrying] {
        assert!(!r.describe().is_empty() && !r.describe().contains('\n'));
    }
}

#[test]
fn retries_stay_under_the_ratio_of_requests() {
    let t0 = Instant::now();
    let mut b = RetryBudget::new(config(0.1, 0.0), t0);
    for _ in 0..100 {
        b.deposit(t0);
    }
    let granted = (0..100)
        .filter(|_| b.try_withdraw(t0, 100, 0).is_ok())
        .count();
    assert_eq!(granted, 10);
    assert!(b.is_spent(t0));
}

#[test]
fn the_floor_allows_a_few_retries_without_traffic() {
    let t0 = Instant::now();
    let mut b = RetryBudget::new(config(0.1, 0.5), t0);
    let granted = (0..100)
        .filter(|_| b.try_withdraw(t0, 1000, 0).is_ok())
        .count();
    assert_eq!(granted, 5); // 0.5/s over a 10 s window
}

#[test]
fn the_budget_refills_as_the_window_slides() {
    let t0 = Instant::now();
    let mut b = RetryBudget::new(config(0.1, 0.0), t0);
    for _ in 0..10 {
        b.deposit(t0);
    }
    assert!(b.try_withdraw(t0, 10, 0).is_ok());
    assert_eq!(b.try_withdraw(t0, 10, 0), Err(Refusal::RateSpent));
    let later = t0 + Duration::from_secs(11);
    assert_eq!(b.totals(later), (0, 0));
    for _ in 0..10 {
        b.deposit(later);
    }
    assert!(b.try_withdraw(later, 10, 0).is_ok());
}

#[test]
fn only_a_share_of_in_flight_requests_may_retry_at_once() {
    let t0 = Instant::now();
    let mut b = RetryBudget::new(
        BudgetConfig {
            max_retrying_share: 0.2,
            ..config(1.0, 0.0)
        },
        t0,
    );
    for _ in 0..100 {
        b.deposit(t0);
    }
    assert!(b.try_withdraw(t0, 20, 3).is_ok());
    assert_eq!(b.try_withdraw(t0, 20, 4), Err(Refusal::TooManyRetrying));
    // At least one retry may run even with one request in flight.
    assert!(b.try_withdraw(t0, 1, 0).is_ok());
    // Even when the floor is set to 0.
    let mut b = RetryBudget::new(
        BudgetConfig {
            max_retrying_share: 0.2,
            min_retrying: 0,
            ..config(1.0, 0.0)
        },
        t0,
    );
    b.deposit(t0);
    assert!(b.try_withdraw(t0, 1, 0).is_ok());
}

#[test]
fn at_least_min_retrying_may_retry_whatever_the_share() {
    let t0 = Instant::now();
    let config = BudgetConfig {
        min_retrying: 4,
        ..BudgetConfig::default()
    };
    let mut b = RetryBudget::new(config, t0);
    for _ in 0..5 {
        b.deposit(t0);
    }
    // Five in flight: the share (0.2) alone would allow one retry at a time; the floor four.
    for retrying in 0..4 {
        assert_eq!(b.try_withdraw(t0, 5, retrying), Ok(()));
    }
    assert_eq!(b.try_withdraw(t0, 5, 4), Err(Refusal::TooManyRetrying));
    // Past the floor the share decides: 50 in flight allow 10 at once.
    assert_eq!(b.try_withdraw(t0, 50, 9), Ok(()));
    assert_eq!(b.try_withdraw(t0, 50, 10), Err(Refusal::TooManyRetrying));
}

#[test]
fn simultaneous_failures_after_a_crash_fail_over_within_the_budget() {
    // A llama.cpp backend with 4 slots crashes with all four busy; one more request is in
    // flight elsewhere. Every one of the four fails at the same moment and may retry at once.
    let t0 = Instant::now();
    let mut b = RetryBudget::new(BudgetConfig::default(), t0);
    for _ in 0..5 {
        b.deposit(t0);
    }
    let granted: Vec<_> = (0..4)
        .map(|retrying| b.try_withdraw(t0, 5, retrying))
        .collect();
    assert_eq!(granted, [Ok(()); 4]);
    // The rate still bounds every retry: the window holds 0.1 x 5 + 1/s x 10 s = 10.5 retries,
    // so after crashes that spent them, even a lone retry is refused, with the rate as reason.
    for _ in 0..6 {
        assert_eq!(b.try_withdraw(t0, 5, 0), Ok(()));
    }
    assert_eq!(b.totals(t0), (5, 10));
    assert_eq!(b.try_withdraw(t0, 5, 0), Err(Refusal::RateSpent));
    assert!(b.is_spent(t0));
}

proptest! {
    /// G1: for any arrival pattern and any demand for retries, retries over the run stay under
    /// ratio x requests plus the floor for every window the run spans.
    #[test]
    fn attempts_never_exceed_requests_times_one_plus_ratio_plus_floor(
        ratio in 0.0f64..1.0,
        min_per_sec in 0.0f64..5.0,
        min_retrying in 0u32..20,
        retrying in 0u64..10,
        events in proptest::collection::vec((0u64..3_000, any::<bool>()), 1..400),
    ) {
        let t0 = Instant::now();
        let window = Duration::from_secs(10);
        let config = BudgetConfig { ratio, min_per_sec, window, max_retrying_share: 1.0, min_retrying };
        let mut b = RetryBudget::new(config, t0);
        let mut now = t0;
        let (mut requests, mut retries) = (0u64, 0u64);
        for (step_ms, is_request) in events {
            now += Duration::from_millis(step_ms);
            if is_request {
                b.deposit(now);
                requests += 1;
            } else if b.try_withdraw(now, u64::MAX / 2, retrying).is_ok() {
                retries += 1;
                // The window the budget saw when it granted this one holds the bound.
                let (q, r) = b.totals(now);
                prop_assert!(r as f64 <= ratio * q as f64 + min_per_sec * window.as_secs_f64() + 1e-9);
            }
        }
        let span = now.duration_since(t0).as_secs_f64();
        let windows = (span / window.as_secs_f64()).floor() + 1.0;
        let bound = ratio * requests as f64 + min_per_sec * window.as_secs_f64() * windows;
        prop_assert!(retries as f64 <= bound + 1e-9, "retries {} requests {} bound {}", retries, requests, bound);
    }
}

#[test]
fn an_unlimited_budget_never_refuses() {
    let t0 = Instant::now();
    let mut b = RetryBudget::new(BudgetConfig::unlimited(), t0);
    assert!((0..10_000u64).all(|i| b.try_withdraw(t0, 1, i).is_ok()));
    b.deposit(t0);
    assert!(b.try_withdraw(t0, 0, u64::from(u32::MAX) - 1).is_ok());
    assert!(!b.is_spent(t0));
}
