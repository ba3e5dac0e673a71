use super::*;

fn load(stale_after: Duration) -> EngineLoad {
    let uri = "http://127.0.0.1:1/metrics".parse().unwrap();
    EngineLoad::new(uri, Engine::Auto, None, stale_after)
}

fn sample(running: f64, waiting: f64, kv_usage: Option<f64>) -> Sample {
    Sample {
        running,
        waiting,
        kv_usage,
    }
}

#[test]
fn there_is_no_reading_before_the_first_store() {
    let l = load(Duration::from_secs(2));
    l.note_sent();
    assert_eq!(l.reading(Instant::now()), None);
}

#[test]
fn a_reading_ages_and_goes_stale_after_stale_after() {
    let l = load(Duration::from_secs(2));
    // Readings are timed to the millisecond since the epoch: take one on a millisecond.
    let at = l.epoch + Duration::from_millis(1500);
    l.store(Engine::Vllm, &sample(7.6, 3.0, Some(0.5)), at);
    let fresh = l.reading(at + Duration::from_secs(2)).unwrap();
    assert_eq!(
        fresh,
        Reading {
            running: 8,
            waiting: 3,
            kv_usage: Some(0.5),
            sent_since: 0,
            age: Duration::from_secs(2),
            stale: false,
            engine: Engine::Vllm,
        }
    );
    let old = l.reading(at + Duration::from_millis(2001)).unwrap();
    assert!(old.stale);
}

#[test]
fn attempts_sent_count_until_the_next_reading() {
    let l = load(Duration::from_secs(2));
    let at = Instant::now();
    l.store(Engine::Llamacpp, &sample(1.0, 0.0, None), at);
    for _ in 0..3 {
        l.note_sent();
    }
    assert_eq!(l.reading(at).unwrap().sent_since, 3);
    l.store(Engine::Llamacpp, &sample(4.0, 0.0, None), at);
    let r = l.reading(at).unwrap();
    assert_eq!((r.running, r.sent_since, r.kv_usage), (4, 0, None));
}

#[test]
fn counts_beyond_u32_saturate() {
    let l = load(Duration::from_secs(2));
    let at = Instant::now();
    l.store(Engine::Tgi, &sample(1e12, 0.4, None), at);
    let r = l.reading(at).unwrap();
    assert_eq!((r.running, r.waiting), (u32::MAX, 0));
}

/// A reader overlapping stores never sees the running count of one reading with the queue of
/// another (every store here writes equal numbers).
#[test]
fn readers_never_see_a_torn_reading() {
    let l = Arc::new(load(Duration::from_secs(60)));
    let at = Instant::now();
    l.store(Engine::Vllm, &sample(0.0, 0.0, Some(0.0)), at);
    let writer = {
        let l = l.clone();
        std::thread::spawn(move || {
            for i in 0..200_000u32 {
                let v = f64::from(i % 1000);
                l.store(Engine::Vllm, &sample(v, v, Some(v / 1000.0)), at);
            }
        })
    };
    let mut reads = 0u64;
    while !writer.is_finished() {
        let r = l.reading(at).unwrap();
        assert_eq!(r.running, r.waiting);
        assert_eq!(r.kv_usage, Some(f64::from(r.running) / 1000.0));
        reads += 1;
    }
    writer.join().unwrap();
    assert!(reads > 0);
}
