use super::*;
use proptest::prelude::*;

fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn aimd(max_limit: u32) -> Aimd {
    Aimd::new(AimdConfig::with_max_limit(max_limit))
}

/// Overloads spaced by the cooldown for 6 s, which takes any limit up to 100 to its floor.
fn cut_to_floor(a: &mut Aimd, now: &mut Instant) {
    for _ in 0..60 {
        a.on_overload(*now);
        *now += MIN_COOLDOWN;
    }
}

#[test]
fn defaults_start_at_the_configured_maximum() {
    let c = AimdConfig::with_max_limit(64);
    assert_eq!(c.min_limit, 1);
    assert_eq!(c.max_limit, 64);
    assert_eq!(c.initial_limit, 64);
    assert_eq!(c.backoff_ratio, 0.9);
    assert_eq!(c.recovery, secs(1));
    assert_eq!(c.floor_window, secs(60));
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
    let mut now = Instant::now();
    let mut a = Aimd::new(AimdConfig {
        min_limit: 3,
        ..AimdConfig::with_max_limit(100)
    });
    cut_to_floor(&mut a, &mut now);
    assert_eq!(a.limit(), 3);
}

#[test]
fn successes_at_full_use_add_one_per_limits_worth() {
    let t0 = Instant::now();
    let mut a = aimd(100);
    a.on_overload(t0);
    assert_eq!(a.limit(), 90);
    for _ in 0..89 {
        a.on_success(t0, 90);
    }
    assert_eq!(a.limit(), 90);
    a.on_success(t0, 90);
    assert_eq!(a.limit(), 91);
}

#[test]
fn successes_with_the_limit_half_used_still_count() {
    let t0 = Instant::now();
    let mut a = aimd(100);
    a.on_overload(t0);
    for _ in 0..90 {
        a.on_success(t0, 45);
    }
    assert_eq!(a.limit(), 91);
}

#[test]
fn successes_at_low_use_do_not_raise_the_limit() {
    let t0 = Instant::now();
    let mut a = aimd(100);
    a.on_overload(t0);
    for _ in 0..10_000 {
        a.on_success(t0, 44);
    }
    assert_eq!(a.limit(), 90);
}

#[test]
fn the_limit_never_grows_past_the_maximum() {
    let t0 = Instant::now();
    let mut a = aimd(10);
    for _ in 0..1000 {
        a.on_success(t0, 10);
    }
    assert_eq!(a.limit(), 10);
    a.on_overload(t0);
    for _ in 0..1000 {
        a.on_success(t0, 10);
    }
    assert_eq!(a.limit(), 10);
    assert_eq!(a.tick(t0 + secs(100)), 10);
}

#[test]
fn a_healthy_backend_with_jittery_head_times_keeps_its_limit() {
    // A local llama.cpp with 4 slots: responses arrive after anything from 2 ms to 3 s, at any
    // use. Successes carry no latency to misjudge, so none of them lowers the limit.
    let mut now = Instant::now();
    let mut a = aimd(4);
    for i in 0..10_000u64 {
        now += ms(2 + (i * 7919) % 3_000);
        a.on_success(now, (i % 5) as u32);
        assert_eq!(a.tick(now), 4, "after success {i}");
    }
}

#[test]
fn an_idle_backend_recovers_its_limit() {
    let t0 = Instant::now();
    let mut now = t0;
    let mut a = aimd(4);
    cut_to_floor(&mut a, &mut now);
    assert_eq!(a.limit(), 1);
    // No traffic at all afterwards: only the proxy's lazy ticks.
    let last_cut = now - MIN_COOLDOWN;
    assert_eq!(a.next_recovery(), Some(last_cut + secs(1)));
    assert_eq!(a.tick(last_cut + ms(999)), 1);
    assert_eq!(a.tick(last_cut + secs(1)), 3);
    assert_eq!(a.next_recovery(), Some(last_cut + secs(2)));
    assert_eq!(a.tick(last_cut + secs(2)), 4);
    assert_eq!(a.next_recovery(), None);
    // A single late tick applies every period that passed.
    let mut b = aimd(100);
    let mut now = t0;
    cut_to_floor(&mut b, &mut now);
    assert_eq!(b.limit(), 1);
    assert_eq!(b.tick(now + secs(3)), 88);
    assert_eq!(b.tick(now + secs(7)), 100);
}

#[test]
fn a_cut_restarts_the_recovery_period() {
    let t0 = Instant::now();
    let mut a = aimd(100);
    a.on_overload(t0);
    a.on_overload(t0 + ms(900));
    assert_eq!(a.limit(), 81);
    assert_eq!(a.tick(t0 + ms(1_500)), 81);
    assert_eq!(a.tick(t0 + ms(1_900)), 91);
}

#[test]
fn the_limit_never_falls_below_what_the_engine_runs() {
    let t0 = Instant::now();
    let mut a = aimd(8);
    // The engine runs 4 at once: the limit may not go below that, however many overloads.
    a.on_engine(t0, 4, 0, 5);
    let mut now = t0;
    cut_to_floor(&mut a, &mut now);
    assert_eq!(a.limit(), 4);
    assert_eq!(a.floor(now), 4);
    // A higher reading raises a limit that sits below it at once.
    a.on_engine(now, 6, 0, 5);
    assert_eq!(a.limit(), 6);
    // The floor is never above the maximum.
    a.on_engine(now, 50, 0, 5);
    assert_eq!((a.floor(now), a.limit()), (8, 8));
}

#[test]
fn the_floor_forgets_readings_older_than_its_window() {
    let t0 = Instant::now();
    let mut a = aimd(8);
    a.on_engine(t0, 6, 0, 5);
    assert_eq!(a.floor(t0 + secs(59)), 6);
    assert_eq!(a.floor(t0 + secs(61)), 1);
    // Past the window a cut may go below the old peak again.
    let mut now = t0 + secs(61);
    cut_to_floor(&mut a, &mut now);
    assert_eq!(a.limit(), 1);
}

#[test]
fn a_growing_engine_queue_cuts_and_a_steady_one_does_not() {
    let t0 = Instant::now();
    let mut a = aimd(100);
    // A long queue that holds steady: the engine keeps up with it.
    for i in 0..20 {
        a.on_engine(t0 + ms(200 * i), 8, 30, 5);
    }
    assert_eq!(a.limit(), 100);
    // Growing, but within max_queue: not an overload either.
    let mut b = aimd(100);
    for (i, waiting) in (0..=5).enumerate() {
        b.on_engine(t0 + ms(200 * i as u64), 8, waiting, 5);
    }
    assert_eq!(b.limit(), 100);
    // Past max_queue and growing: a cut per reading (spaced beyond the cooldown).
    let t = t0 + secs(4);
    a.on_engine(t, 8, 31, 5);
    assert_eq!(a.limit(), 90);
    a.on_engine(t + ms(200), 8, 35, 5);
    assert_eq!(a.limit(), 81);
    // Shrinking again: no further cut.
    a.on_engine(t + ms(400), 8, 20, 5);
    assert_eq!(a.limit(), 81);
    // The first reading has nothing to grow from.
    let mut c = aimd(100);
    c.on_engine(t0, 8, 500, 5);
    assert_eq!(c.limit(), 100);
}

#[test]
fn settings_out_of_range_are_brought_into_it() {
    let a = Aimd::new(AimdConfig {
        min_limit: 0,
        max_limit: 0,
        initial_limit: 7,
        recovery: Duration::ZERO,
        floor_window: Duration::MAX,
        ..AimdConfig::with_max_limit(0)
    });
    assert_eq!(a.config().min_limit, 1);
    assert_eq!(a.config().max_limit, 1);
    assert_eq!(a.config().recovery, ms(1));
    assert!(a.config().floor_window <= secs(365 * 24 * 3600));
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
        in_flight: u32,
    },
    Overload,
    Engine {
        running: u32,
        waiting: u32,
        max_queue: u32,
    },
    Tick,
}

fn arb_config() -> impl Strategy<Value = AimdConfig> {
    // Small ranges as often as large ones, so that the ends are reached within a few events.
    let span = prop_oneof![0u32..8, 0u32..300];
    (
        1u32..20,
        span,
        0u32..300,
        0.0f64..1.2,
        0u64..3_000,
        0u64..120,
    )
        .prop_map(
            |(min_limit, span, initial_limit, backoff_ratio, recovery, window)| AimdConfig {
                min_limit,
                max_limit: min_limit + span,
                initial_limit,
                backoff_ratio,
                recovery: ms(recovery),
                floor_window: secs(window),
            },
        )
}

fn arb_event(overloads: bool) -> impl Strategy<Value = Event> {
    let weight = if overloads { 1 } else { 0 };
    // Without overloads, readings of an engine whose queue stays empty.
    let waiting = if overloads { 0u32..40 } else { 0u32..1 };
    let engine =
        (0u32..400, waiting, 0u32..10).prop_map(|(running, waiting, max_queue)| Event::Engine {
            running,
            waiting,
            max_queue,
        });
    prop_oneof![
        2 => (0u64..5_000).prop_map(|m| Event::Wait(ms(m))),
        3 => (0u32..400).prop_map(|in_flight| Event::Success { in_flight }),
        weight => Just(Event::Overload),
        1 => engine,
        1 => Just(Event::Tick),
    ]
}

fn apply(a: &mut Aimd, now: &mut Instant, event: &Event) {
    match *event {
        Event::Wait(d) => *now += d,
        Event::Success { in_flight } => a.on_success(*now, in_flight),
        Event::Overload => a.on_overload(*now),
        Event::Engine {
            running,
            waiting,
            max_queue,
        } => a.on_engine(*now, running, waiting, max_queue),
        Event::Tick => {
            a.tick(*now);
        }
    }
}

proptest! {
    #[test]
    fn the_limit_stays_between_the_floor_and_the_maximum(
        config in arb_config(),
        events in prop::collection::vec(arb_event(true), 0..300),
    ) {
        let mut a = Aimd::new(config);
        let (min, max) = (a.config().min_limit, a.config().max_limit);
        let mut now = Instant::now();
        prop_assert!((min..=max).contains(&a.limit()));
        for e in &events {
            apply(&mut a, &mut now, e);
            let floor = a.floor(now);
            prop_assert!(floor >= min);
            prop_assert!((floor..=max).contains(&a.limit()), "{} under {floor} after {e:?}", a.limit());
        }
    }

    #[test]
    fn without_overload_signals_the_limit_never_falls(
        config in arb_config(),
        events in prop::collection::vec(arb_event(false), 0..300),
    ) {
        let mut a = Aimd::new(config);
        let mut now = Instant::now();
        for e in &events {
            let before = a.limit();
            apply(&mut a, &mut now, e);
            prop_assert!(a.limit() >= before, "{} -> {} on {e:?}", before, a.limit());
        }
    }

    #[test]
    fn an_overload_never_raises_the_limit_beyond_recovery(
        config in arb_config(),
        events in prop::collection::vec(arb_event(true), 0..300),
    ) {
        let mut a = Aimd::new(config);
        let mut now = Instant::now();
        for e in &events {
            // Recovery due now is applied first; the cut itself never raises.
            let due = a.clone().tick(now);
            apply(&mut a, &mut now, e);
            if matches!(e, Event::Overload) {
                prop_assert!(a.limit() <= due, "{} after {} was due", a.limit(), due);
            }
        }
    }

    #[test]
    fn repeated_overloads_reach_the_floor(
        config in arb_config(),
        events in prop::collection::vec(arb_event(true), 0..100),
    ) {
        let mut a = Aimd::new(config);
        let mut now = Instant::now();
        for e in &events {
            apply(&mut a, &mut now, e);
        }
        // Spaced by the cooldown, faster than any recovery period longer than 100 ms; shorter
        // periods recover between cuts, so only the bound is checked for them. The floor may
        // still fall meanwhile, as old readings leave its window.
        let mut reached = false;
        for _ in 0..5_000 {
            now += MIN_COOLDOWN;
            a.on_overload(now);
            prop_assert!(a.limit() >= a.floor(now));
            if a.limit() == a.floor(now) {
                reached = true;
                break;
            }
        }
        if a.config().recovery > MIN_COOLDOWN {
            prop_assert!(reached, "{} above the floor {}", a.limit(), a.floor(now));
        }
    }

    #[test]
    fn an_idle_backend_always_returns_to_the_maximum(
        config in arb_config(),
        events in prop::collection::vec(arb_event(true), 0..100),
    ) {
        let mut a = Aimd::new(config);
        let mut now = Instant::now();
        for e in &events {
            apply(&mut a, &mut now, e);
        }
        a.tick(now);
        let max = a.config().max_limit;
        // 33 periods reach the maximum from anywhere.
        let due = now + a.config().recovery * 33;
        prop_assert_eq!(a.tick(due), max);
        prop_assert_eq!(a.next_recovery(), None);
    }

    #[test]
    fn next_recovery_is_when_tick_first_raises_the_limit(
        config in arb_config(),
        events in prop::collection::vec(arb_event(true), 1..100),
    ) {
        let mut a = Aimd::new(config);
        let mut now = Instant::now();
        for e in &events {
            apply(&mut a, &mut now, e);
        }
        let before = a.tick(now);
        match a.next_recovery() {
            None => prop_assert_eq!(before, a.config().max_limit),
            Some(at) => {
                prop_assert!(at > now);
                let just_before = at - Duration::from_nanos(1);
                prop_assert_eq!(a.clone().tick(just_before), before);
                prop_assert!(a.tick(at) > before);
            }
        }
    }
}
