use super::*;
use proptest::prelude::*;

fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

fn aimd(max_limit: u32) -> Aimd {
    Aimd::new(AimdConfig::with_max_limit(max_limit))
}

/// Successes at full use until the limit has grown by one.
fn grow_once(a: &mut Aimd, now: Instant) {
    let start = a.limit();
    for _ in 0..=start {
        a.on_success(now, None, a.limit());
    }
    assert_eq!(a.limit(), start + 1);
}

#[test]
fn defaults_start_at_the_configured_maximum() {
    let c = AimdConfig::with_max_limit(64);
    assert_eq!(c.min_limit, 1);
    assert_eq!(c.max_limit, 64);
    assert_eq!(c.initial_limit, 64);
    assert_eq!(c.backoff_ratio, 0.9);
    assert_eq!(c.latency_tolerance, 2.0);
    assert_eq!(c.baseline_window, Duration::from_secs(60));
    assert_eq!(MIN_COOLDOWN, ms(100));
    assert_eq!(Aimd::new(c).limit(), 64);
}

#[test]
fn an_overload_cuts_by_the_backoff_ratio() {
    let t0 = Instant::now();
    let mut a = aimd(100);
    a.on_overload(t0);
    assert_eq!(a.limit(), 90);
    a.on_overload(t0 + ms(100));
    assert_eq!(a.limit(), 81);
}

#[test]
fn a_burst_of_overloads_cuts_once_per_cooldown() {
    let t0 = Instant::now();
    let mut a = aimd(100);
    for i in 0..50 {
        a.on_overload(t0 + ms(i));
    }
    assert_eq!(a.limit(), 90);
    a.on_overload(t0 + ms(100));
    assert_eq!(a.limit(), 81);
}

#[test]
fn the_cooldown_is_the_baseline_first_byte_when_that_is_longer() {
    let t0 = Instant::now();
    let mut a = aimd(100);
    a.on_success(t0, Some(ms(1000)), 100);
    a.on_overload(t0);
    a.on_overload(t0 + ms(500));
    assert_eq!(a.limit(), 90);
    a.on_overload(t0 + ms(1000));
    assert_eq!(a.limit(), 81);
}

#[test]
fn each_cut_lowers_the_limit_by_at_least_one() {
    let t0 = Instant::now();
    let mut a = Aimd::new(AimdConfig {
        backoff_ratio: 1.0,
        ..AimdConfig::with_max_limit(5)
    });
    a.on_overload(t0);
    assert_eq!(a.limit(), 4);
    let mut a = aimd(2);
    a.on_overload(t0);
    assert_eq!(a.limit(), 1);
}

#[test]
fn repeated_overloads_stop_at_the_minimum() {
    let t0 = Instant::now();
    let mut a = Aimd::new(AimdConfig {
        min_limit: 3,
        ..AimdConfig::with_max_limit(100)
    });
    for i in 0..100 {
        a.on_overload(t0 + ms(100 * i));
    }
    assert_eq!(a.limit(), 3);
}

#[test]
fn successes_at_full_use_add_one_per_limits_worth() {
    let t0 = Instant::now();
    let mut a = aimd(100);
    a.on_overload(t0);
    assert_eq!(a.limit(), 90);
    for _ in 0..89 {
        a.on_success(t0, None, 90);
    }
    assert_eq!(a.limit(), 90);
    a.on_success(t0, None, 90);
    assert_eq!(a.limit(), 91);
}

#[test]
fn successes_with_the_limit_half_used_still_count() {
    let t0 = Instant::now();
    let mut a = aimd(100);
    a.on_overload(t0);
    for _ in 0..90 {
        a.on_success(t0, None, 45);
    }
    assert_eq!(a.limit(), 91);
}

#[test]
fn successes_at_low_use_do_not_raise_the_limit() {
    let t0 = Instant::now();
    let mut a = aimd(100);
    a.on_overload(t0);
    for _ in 0..10_000 {
        a.on_success(t0, None, 44);
    }
    assert_eq!(a.limit(), 90);
}

#[test]
fn the_limit_never_grows_past_the_maximum() {
    let t0 = Instant::now();
    let mut a = aimd(10);
    for _ in 0..1000 {
        a.on_success(t0, None, 10);
    }
    assert_eq!(a.limit(), 10);
    a.on_overload(t0);
    grow_once(&mut a, t0);
    assert_eq!(a.limit(), 10);
}

#[test]
fn a_slow_first_byte_counts_as_overload() {
    let t0 = Instant::now();
    let mut a = aimd(100);
    a.on_success(t0, Some(ms(100)), 100);
    a.on_success(t0 + ms(10), Some(ms(201)), 100);
    assert_eq!(a.limit(), 90);
}

#[test]
fn a_first_byte_within_tolerance_is_a_success() {
    let t0 = Instant::now();
    let mut a = aimd(100);
    a.on_overload(t0);
    a.on_success(t0, Some(ms(100)), 90);
    for i in 0..89 {
        a.on_success(t0 + ms(i), Some(ms(200)), 90);
    }
    assert_eq!(a.limit(), 91);
}

#[test]
fn long_unjudged_responses_never_cut() {
    // A non-streamed response's latency follows its output length: the caller passes None.
    let t0 = Instant::now();
    let mut a = aimd(100);
    a.on_success(t0, Some(ms(100)), 100);
    for i in 0..100 {
        a.on_success(t0 + ms(i), None, 100);
    }
    assert_eq!(a.limit(), 100);
}

#[test]
fn the_baseline_forgets_samples_older_than_its_window() {
    let t0 = Instant::now();
    let mut a = aimd(100);
    a.on_success(t0, Some(ms(100)), 100);
    // Within the window a 300 ms head is slow...
    let mut b = a.clone();
    b.on_success(t0 + Duration::from_secs(59), Some(ms(300)), 100);
    assert_eq!(b.limit(), 90);
    // ...after it, the backend is judged against its new speed.
    a.on_success(t0 + Duration::from_secs(61), Some(ms(300)), 100);
    a.on_success(t0 + Duration::from_secs(62), Some(ms(500)), 100);
    assert_eq!(a.limit(), 100);
}

#[test]
fn settings_out_of_range_are_brought_into_it() {
    let a = Aimd::new(AimdConfig {
        min_limit: 0,
        max_limit: 0,
        initial_limit: 7,
        ..AimdConfig::with_max_limit(0)
    });
    assert_eq!(a.config().min_limit, 1);
    assert_eq!(a.config().max_limit, 1);
    assert_eq!(a.limit(), 1);
    let a = Aimd::new(AimdConfig {
        initial_limit: 0,
        min_limit: 4,
        ..AimdConfig::with_max_limit(10)
    });
    assert_eq!(a.limit(), 4);
}

/// One event in a backend's life.
#[derive(Debug, Clone)]
enum Event {
    Wait(Duration),
    Success {
        latency: Option<Duration>,
        in_flight: u32,
    },
    Overload,
}

fn arb_config() -> impl Strategy<Value = AimdConfig> {
    // Small ranges as often as large ones, so that the ends are reached within a few events.
    let span = prop_oneof![0u32..8, 0u32..300];
    (
        1u32..20,
        span,
        0u32..300,
        0.0f64..1.2,
        0.5f64..4.0,
        0u64..120,
    )
        .prop_map(
            |(min_limit, span, initial_limit, backoff_ratio, latency_tolerance, window)| {
                AimdConfig {
                    min_limit,
                    max_limit: min_limit + span,
                    initial_limit,
                    backoff_ratio,
                    latency_tolerance,
                    baseline_window: Duration::from_secs(window),
                }
            },
        )
}

fn arb_event(latency: std::ops::Range<u64>, overloads: bool) -> impl Strategy<Value = Event> {
    let success =
        (prop::option::of(latency), 0u32..400).prop_map(|(l, in_flight)| Event::Success {
            latency: l.map(ms),
            in_flight,
        });
    let weight = if overloads { 1 } else { 0 };
    prop_oneof![
        2 => (0u64..5_000).prop_map(|m| Event::Wait(ms(m))),
        3 => success,
        weight => Just(Event::Overload),
    ]
}

fn apply(a: &mut Aimd, now: &mut Instant, event: &Event) {
    match *event {
        Event::Wait(d) => *now += d,
        Event::Success { latency, in_flight } => a.on_success(*now, latency, in_flight),
        Event::Overload => a.on_overload(*now),
    }
}

proptest! {
    #[test]
    fn the_limit_stays_within_its_range(
        config in arb_config(),
        events in prop::collection::vec(arb_event(1..3_000, true), 0..300),
    ) {
        let mut a = Aimd::new(config);
        let (min, max) = (a.config().min_limit, a.config().max_limit);
        let mut now = Instant::now();
        prop_assert!((min..=max).contains(&a.limit()));
        for e in &events {
            apply(&mut a, &mut now, e);
            prop_assert!((min..=max).contains(&a.limit()), "{} after {e:?}", a.limit());
        }
    }

    #[test]
    fn successes_within_tolerance_never_lower_the_limit(
        config in arb_config(),
        events in prop::collection::vec(arb_event(100..201, false), 0..300),
    ) {
        // Every sample is within twice any other, so none is slow at a tolerance of 2.
        let mut a = Aimd::new(AimdConfig { latency_tolerance: 2.0, ..config });
        let mut now = Instant::now();
        for e in &events {
            let before = a.limit();
            apply(&mut a, &mut now, e);
            prop_assert!(a.limit() >= before, "{} -> {} on {e:?}", before, a.limit());
        }
    }

    #[test]
    fn an_overload_never_raises_the_limit(
        config in arb_config(),
        events in prop::collection::vec(arb_event(1..3_000, true), 0..300),
    ) {
        let mut a = Aimd::new(config);
        let mut now = Instant::now();
        for e in &events {
            let before = a.limit();
            apply(&mut a, &mut now, e);
            if matches!(e, Event::Overload) {
                prop_assert!(a.limit() <= before);
            }
        }
    }

    #[test]
    fn repeated_overloads_reach_the_minimum(
        config in arb_config(),
        events in prop::collection::vec(arb_event(1..3_000, true), 0..100),
    ) {
        let mut a = Aimd::new(config);
        let mut now = Instant::now();
        for e in &events {
            apply(&mut a, &mut now, e);
        }
        // Spaced by more than any cooldown (latencies stay under 3 s).
        for _ in 0..1_000 {
            now += Duration::from_secs(3);
            a.on_overload(now);
        }
        prop_assert_eq!(a.limit(), a.config().min_limit);
    }

    #[test]
    fn enough_successes_at_full_use_reach_the_maximum(
        config in arb_config(),
        events in prop::collection::vec(arb_event(1..3_000, true), 0..100),
    ) {
        let mut a = Aimd::new(config);
        let mut now = Instant::now();
        for e in &events {
            apply(&mut a, &mut now, e);
        }
        let max = a.config().max_limit;
        // About max^2 / 2 successes from the minimum; bounded so a failure cannot hang.
        for _ in 0..(max as usize + 2) * (max as usize + 2) {
            if a.limit() == max {
                break;
            }
            a.on_success(now, None, a.limit());
        }
        prop_assert_eq!(a.limit(), max);
    }
}
