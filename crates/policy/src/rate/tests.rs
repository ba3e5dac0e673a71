use super::*;
use proptest::prelude::*;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn limit(per_minute: u64, burst: Option<u64>) -> RateLimit {
    RateLimit::try_new(per_minute, burst).expect("valid limit")
}

fn retry_after(d: RateDecision) -> Duration {
    match d {
        RateDecision::Limited { retry_after, .. } => retry_after,
        other => panic!("expected Limited, got {other:?}"),
    }
}

#[test]
fn settings_reject_zero_and_nonsense() {
    use RateLimitError::*;
    assert_eq!(RateLimit::try_new(0, None), Err(ZeroPerMinute));
    assert_eq!(RateLimit::try_new(10, Some(0)), Err(ZeroBurst));
    assert_eq!(
        RateLimit::try_new(MAX_PER_MINUTE + 1, None),
        Err(PerMinuteTooHigh)
    );
    assert_eq!(RateLimit::try_new(1, Some(1441)), Err(BurstTooHigh));
    assert!(RateLimit::try_new(1, Some(1440)).is_ok());
    assert!(RateLimit::try_new(MAX_PER_MINUTE, None).is_ok());
}

#[test]
fn the_burst_defaults_to_a_minutes_allowance() {
    let l = limit(60, None);
    assert_eq!((l.per_minute(), l.burst()), (60, 60));
    let t0 = Instant::now();
    let mut g = Gcra::new(l, t0);
    assert_eq!(g.quota(t0).remaining, 60);
    assert!(g.check(t0, 60).is_admitted());
    assert_eq!(
        g.quota(t0),
        Quota {
            limit: 60,
            remaining: 0,
            reset: secs(60)
        }
    );
}

#[test]
fn a_refusal_says_exactly_when_the_same_cost_passes() {
    let t0 = Instant::now();
    let mut g = Gcra::new(limit(60, Some(10)), t0);
    assert!(g.check(t0, 10).is_admitted());
    let d = g.check(t0, 3);
    assert_eq!(retry_after(d), secs(3));
    assert_eq!(d.quota().remaining, 0);
    assert!(!g
        .check(t0 + secs(3) - Duration::from_nanos(1), 3)
        .is_admitted());
    assert!(g.check(t0 + secs(3), 3).is_admitted());
}

#[test]
fn a_cost_above_the_burst_is_too_large_not_limited() {
    let t0 = Instant::now();
    let mut g = Gcra::new(limit(1000, Some(100)), t0);
    assert!(matches!(g.check(t0, 101), RateDecision::TooLarge(q) if q.remaining == 100));
    assert!(g.check(t0, 100).is_admitted());
}

#[test]
fn admissions_within_a_minute_reach_burst_plus_rate_minus_one() {
    let t0 = Instant::now();
    let mut g = Gcra::new(limit(60, None), t0);
    let mut admitted = 0;
    for ms in (0..60_000).step_by(100) {
        while g.check(t0 + Duration::from_millis(ms), 1).is_admitted() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 60 + 60 - 1);
}

#[test]
fn refund_gives_back_but_never_above_the_burst() {
    let t0 = Instant::now();
    let mut g = Gcra::new(limit(60, None), t0);
    assert!(g.check(t0, 50).is_admitted());
    g.refund(t0, 20);
    assert_eq!(g.quota(t0).remaining, 30);
    g.refund(t0, 1_000);
    assert_eq!(g.quota(t0).remaining, 60);
    assert_eq!(g.quota(t0).reset, Duration::ZERO);
}

#[test]
fn a_charge_above_the_reservation_puts_the_tenant_in_debt() {
    let t0 = Instant::now();
    let mut g = Gcra::new(limit(60, None), t0);
    assert!(g.check(t0, 60).is_admitted());
    g.charge(t0, 120);
    assert_eq!(g.quota(t0).reset, secs(180));
    // Two minutes of debt, then one second for the unit itself.
    assert_eq!(retry_after(g.check(t0, 1)), secs(121));
}

#[test]
fn huge_charges_neither_panic_nor_wait_beyond_two_days() {
    let t0 = Instant::now();
    let mut g = Gcra::new(limit(MAX_PER_MINUTE, None), t0);
    for _ in 0..4 {
        g.charge(t0, u64::MAX);
    }
    let d = g.check(t0, MAX_PER_MINUTE);
    assert!(retry_after(d) <= secs(2 * 86_400));
    let mut g = Gcra::new(limit(1, Some(1440)), t0);
    g.charge(t0, u64::MAX);
    assert!(retry_after(g.check(t0, 1440)) <= secs(2 * 86_400));
    g.refund(t0, u64::MAX);
    assert!(g.check(t0, 1440).is_admitted());
}

#[test]
fn time_going_backwards_is_taken_as_the_latest_time() {
    let t0 = Instant::now();
    let mut g = Gcra::new(limit(60, Some(1)), t0 + secs(10));
    assert!(g.check(t0 + secs(10), 1).is_admitted());
    // One second to drain, counted from the latest time seen, plus the ten seconds before it.
    assert_eq!(retry_after(g.check(t0, 1)), secs(11));
}

#[test]
fn a_share_divides_rate_and_burst() {
    let l = limit(1000, Some(500)).share(3);
    assert_eq!((l.per_minute(), l.burst()), (333, 166));
    let tiny = limit(2, None).share(5);
    assert_eq!((tiny.per_minute(), tiny.burst()), (1, 1));
    assert_eq!(limit(7, None).share(0), limit(7, None));
    let long = limit(3, Some(4320)).share(2);
    assert_eq!((long.per_minute(), long.burst()), (1, 1440));
}

fn tenant(now: Instant) -> TenantLimiter {
    TenantLimiter::new(now, Some(limit(2, None)), Some(limit(100, None)))
}

#[test]
fn a_request_is_admitted_only_when_both_dimensions_admit_it() {
    let t0 = Instant::now();
    let mut t = tenant(t0);
    let r = t.admit(t0, 80).expect("admitted");
    assert_eq!(r.headers.requests.map(|q| q.remaining), Some(1));
    assert_eq!(r.headers.tokens.map(|q| q.remaining), Some(20));
    let refusal = t.admit(t0, 30).expect_err("tokens short");
    assert_eq!(refusal.which, Dimension::Tokens);
    assert_eq!(refusal.retry_after, Some(Duration::from_millis(6_000)));
    // Nothing was taken from the request dimension.
    assert_eq!(refusal.headers.requests.map(|q| q.remaining), Some(1));
    assert!(t.admit(t0, 20).is_ok());
    let refusal = t.admit(t0, 0).expect_err("requests short");
    assert_eq!(refusal.which, Dimension::Requests);
    assert_eq!(refusal.retry_after, Some(secs(30)));
}

#[test]
fn the_longer_wait_of_the_two_dimensions_is_the_retry_after() {
    let t0 = Instant::now();
    let mut t = tenant(t0);
    assert!(t.admit(t0, 100).is_ok());
    assert!(t.admit(t0, 0).is_ok());
    let refusal = t.admit(t0, 100).expect_err("both short");
    assert_eq!(refusal.which, Dimension::Tokens);
    assert_eq!(refusal.retry_after, Some(secs(60)));
    assert!(t.admit(t0 + secs(60), 100).is_ok());
}

#[test]
fn a_request_above_the_token_burst_is_refused_without_a_retry_time() {
    let t0 = Instant::now();
    let mut t = tenant(t0);
    let refusal = t.admit(t0, 101).expect_err("too large");
    assert_eq!(
        (refusal.which, refusal.retry_after),
        (Dimension::Tokens, None)
    );
    assert_eq!(t.headers(t0).requests.map(|q| q.remaining), Some(2));
}

#[test]
fn reconcile_refunds_or_charges_the_difference_and_undo_gives_all_back() {
    let t0 = Instant::now();
    let mut t = tenant(t0);
    let r = t.admit(t0, 50).expect("admitted");
    t.reconcile(t0, r.tokens, 10);
    assert_eq!(t.headers(t0).tokens.map(|q| q.remaining), Some(90));
    t.reconcile(t0, 10, 100);
    assert_eq!(t.headers(t0).tokens.map(|q| q.remaining), Some(0));
    let mut t = tenant(t0);
    let r = t.admit(t0, 50).expect("admitted");
    t.undo(t0, r.tokens);
    assert_eq!(t.headers(t0), tenant(t0).headers(t0));
}

#[test]
fn a_dimension_without_a_limit_never_refuses() {
    let t0 = Instant::now();
    let mut t = TenantLimiter::new(t0, Some(limit(1, None)), None);
    let r = t.admit(t0, u64::MAX).expect("admitted");
    assert_eq!(r.headers.tokens, None);
    t.reconcile(t0, 0, u64::MAX);
    t.set_limits(t0, None, Some(limit(10, None)));
    assert!(t.admit(t0, 10).is_ok());
    assert_eq!(t.headers(t0).requests, None);
}

#[derive(Debug, Clone)]
enum Op {
    Check(u64),
    Refund(u64),
    Charge(u64),
}

/// Found by the property below: charges past the burst leave a debt, and until it is paid even a
/// check that costs nothing waits, for exactly as long as the debt takes to refill.
#[test]
fn a_check_of_nothing_waits_out_a_debt_left_by_charges() {
    let t0 = Instant::now();
    let mut g = Gcra::new(limit(1, Some(1)), t0);
    g.charge(t0, 2);
    let RateDecision::Limited { quota, retry_after } = g.check(t0, 0) else {
        panic!("a debt refuses even a check of nothing");
    };
    assert_eq!(quota.remaining, 0);
    assert!(!retry_after.is_zero());
    assert!(g.clone().check(t0 + retry_after, 0).is_admitted());
    assert!(!g
        .clone()
        .check(t0 + retry_after - Duration::from_nanos(1), 0)
        .is_admitted());
}

fn ops() -> impl Strategy<Value = Vec<(u64, Op)>> {
    let op = prop_oneof![
        6 => (0u64..40).prop_map(Op::Check),
        1 => (0u64..20).prop_map(Op::Refund),
        1 => (0u64..5).prop_map(Op::Charge),
    ];
    proptest::collection::vec((0u64..5_000, op), 1..200)
}

proptest! {
    /// The exact bound, for any i <= j with j an admission at t_j:
    /// sum over events i..=j of (admitted + charged - refunded) x UNIT
    ///     <= burst x UNIT + (t_j - t_i) in ns x per_minute.
    /// Hence admissions within any window shorter than a minute total at most
    /// burst + per_minute - 1 when nothing is refunded.
    #[test]
    fn net_usage_over_any_window_stays_within_burst_plus_refill(
        per_minute in 1u64..120,
        burst in 1u64..120,
        ops in ops(),
    ) {
        let t0 = Instant::now();
        let mut g = Gcra::new(limit(per_minute, Some(burst)), t0);
        let mut now = t0;
        // (time, net units, admission?)
        let mut events: Vec<(Instant, i128, bool)> = Vec::new();
        for (step_ms, op) in ops {
            now += Duration::from_millis(step_ms);
            let event = match op {
                Op::Check(c) => match g.check(now, c) {
                    RateDecision::Admitted(_) => (now, i128::from(c), true),
                    _ => (now, 0, false),
                },
                Op::Refund(a) => { g.refund(now, a); (now, -i128::from(a), false) }
                Op::Charge(a) => { g.charge(now, a); (now, i128::from(a), false) }
            };
            events.push(event);
        }
        for (j, &(tj, _, admitted)) in events.iter().enumerate() {
            if !admitted { continue; }
            let mut sum = 0i128;
            for i in (0..=j).rev() {
                let (ti, units, _) = events[i];
                sum += units;
                let refill = (tj - ti).as_nanos() * u128::from(per_minute);
                let bound = i128::from(burst) * UNIT as i128 + refill as i128;
                prop_assert!(sum * UNIT as i128 <= bound, "i {} j {} sum {}", i, j, sum);
            }
        }
    }

    #[test]
    fn checks_alone_admit_at_most_burst_plus_rate_minus_one_per_minute(
        per_minute in 1u64..120,
        burst in 1u64..120,
        steps in proptest::collection::vec((0u64..3_000, 0u64..30), 1..300),
    ) {
        let t0 = Instant::now();
        let mut g = Gcra::new(limit(per_minute, Some(burst)), t0);
        let mut now = t0;
        let mut admitted: Vec<(Instant, u64)> = Vec::new();
        for (step_ms, cost) in steps {
            now += Duration::from_millis(step_ms);
            if g.check(now, cost).is_admitted() {
                admitted.push((now, cost));
            }
        }
        for (i, &(start, _)) in admitted.iter().enumerate() {
            let total: u64 = admitted[i..]
                .iter()
                .take_while(|(t, _)| *t < start + secs(60))
                .map(|(_, c)| c)
                .sum();
            prop_assert!(total < burst + per_minute);
        }
    }

    /// A refusal changes nothing; a `Limited` answer is exact: the same cost passes at
    /// `now + retry_after` and not a nanosecond before.
    #[test]
    fn refusals_change_nothing_and_retry_after_is_exact(
        per_minute in 1u64..10_000,
        burst in 1u64..200,
        ops in ops(),
    ) {
        let t0 = Instant::now();
        let mut g = Gcra::new(limit(per_minute, Some(burst.min(per_minute * 1440))), t0);
        let mut now = t0;
        for (step_ms, op) in ops {
            now += Duration::from_millis(step_ms);
            match op {
                Op::Check(c) => {
                    let before = g.clone();
                    match g.check(now, c) {
                        RateDecision::Admitted(q) => prop_assert_eq!(q, g.quota(now)),
                        RateDecision::TooLarge(q) => {
                            prop_assert!(c > g.limit().burst());
                            prop_assert_eq!(q, before.quota(now));
                            prop_assert_eq!(g.quota(now), before.quota(now));
                        }
                        RateDecision::Limited { quota, retry_after } => {
                            prop_assert_eq!(quota, before.quota(now));
                            prop_assert_eq!(g.quota(now), before.quota(now));
                            // Less than the cost remains, or, for a check of nothing while
                            // charges left a debt, nothing does.
                            prop_assert!(quota.remaining < c.max(1));
                            prop_assert!(!retry_after.is_zero());
                            prop_assert!(g.clone().check(now + retry_after, c).is_admitted());
                            let earlier = now + retry_after - Duration::from_nanos(1);
                            prop_assert!(!g.clone().check(earlier, c).is_admitted());
                        }
                    }
                }
                Op::Refund(a) => g.refund(now, a),
                Op::Charge(a) => g.charge(now, a),
            }
            let q = g.quota(now);
            prop_assert!(q.remaining <= g.limit().burst());
            // `remaining` is exact: that much passes now, one more does not. (In debt it is 0
            // and even a cost of 0 waits.)
            prop_assert!(q.remaining == 0 || g.peek(now, q.remaining).is_admitted());
            prop_assert!(!g.peek(now, q.remaining + 1).is_admitted());
        }
    }

    /// Left alone, the quota only recovers: remaining never falls, reset never grows, and the
    /// bucket is full once the reset has passed.
    #[test]
    fn remaining_recovers_monotonically(
        per_minute in 1u64..1_000,
        ops in ops(),
        probes in proptest::collection::vec(0u64..10_000, 1..50),
    ) {
        let t0 = Instant::now();
        let l = limit(per_minute, None);
        let mut g = Gcra::new(l, t0);
        for (_, op) in ops {
            match op {
                Op::Check(c) => { g.check(t0, c); }
                Op::Refund(a) => g.refund(t0, a),
                Op::Charge(a) => g.charge(t0, a),
            }
        }
        let mut now = t0;
        let mut last = g.quota(now);
        for step in probes {
            now += Duration::from_millis(step);
            let q = g.quota(now);
            prop_assert!(q.remaining >= last.remaining);
            prop_assert!(q.reset <= last.reset);
            last = q;
        }
        let full = g.quota(t0 + g.quota(t0).reset);
        prop_assert_eq!((full.remaining, full.reset), (l.burst(), Duration::ZERO));
    }

    /// A tenant refused on either dimension is charged on neither.
    #[test]
    fn tenant_admission_is_all_or_nothing(
        rpm in 1u64..20,
        tpm in 1u64..500,
        steps in proptest::collection::vec((0u64..5_000, 0u64..200), 1..200),
    ) {
        let t0 = Instant::now();
        let mut t = TenantLimiter::new(t0, Some(limit(rpm, None)), Some(limit(tpm, None)));
        let mut now = t0;
        for (step_ms, tokens) in steps {
            now += Duration::from_millis(step_ms);
            let before = t.headers(now);
            match t.admit(now, tokens) {
                Ok(r) => prop_assert_eq!(r.headers, t.headers(now)),
                Err(refusal) => {
                    prop_assert_eq!(refusal.headers, before);
                    prop_assert_eq!(t.headers(now), before);
                    prop_assert_eq!(refusal.retry_after.is_none(), tokens > tpm);
                    if let Some(wait) = refusal.retry_after {
                        prop_assert!(t.clone().admit(now + wait, tokens).is_ok());
                    }
                }
            }
        }
    }
}
