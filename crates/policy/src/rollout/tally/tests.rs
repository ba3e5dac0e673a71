use std::time::Duration;

use proptest::prelude::*;

use super::*;

fn status(status: u16) -> Observation {
    Observation {
        ending: Ending::Status(status),
        ttft: None,
    }
}

fn ttft(ms: u64) -> Observation {
    Observation {
        ending: Ending::Status(200),
        ttft: Some(Duration::from_millis(ms)),
    }
}

#[test]
fn every_ending_is_in_its_class() {
    let cases = [
        (Ending::Status(200), None),
        (Ending::Status(304), None),
        (Ending::Status(400), Some(Signal::ClientError(400))),
        (Ending::Status(401), Some(Signal::ClientError(401))),
        (Ending::Status(499), Some(Signal::ClientError(499))),
        (Ending::Status(429), Some(Signal::Capacity)),
        (Ending::Status(503), Some(Signal::Capacity)),
        (Ending::Status(500), Some(Signal::ServerError)),
        (Ending::Status(504), Some(Signal::ServerError)),
        (Ending::Status(600), Some(Signal::ServerError)),
        (Ending::TimedOut, Some(Signal::Timeout)),
        (Ending::BrokenStream, Some(Signal::BrokenStream)),
    ];
    for (ending, signal) in cases {
        assert_eq!(Signal::of(ending), signal, "{ending:?}");
    }
}

#[test]
fn signal_names_are_stable() {
    assert_eq!(Signal::ClientError(400).as_str(), "client_error");
    assert_eq!(Signal::ClientError(400).status(), Some(400));
    assert_eq!(Signal::Capacity.as_str(), "capacity");
    assert_eq!(Signal::ServerError.as_str(), "server_error");
    assert_eq!(Signal::Timeout.as_str(), "timeout");
    assert_eq!(Signal::BrokenStream.as_str(), "broken_stream");
    assert_eq!(Signal::SlowFirstToken.as_str(), "slow_first_token");
    assert_eq!(Signal::SlowFirstToken.status(), None);
}

#[test]
fn a_tally_counts_each_class_and_client_errors_per_status() {
    let mut t = Tally::default();
    for s in [200, 400, 400, 404, 429, 503, 500, 502] {
        t.record(status(s));
    }
    t.record(Observation {
        ending: Ending::TimedOut,
        ttft: None,
    });
    t.record(Observation {
        ending: Ending::BrokenStream,
        ttft: Some(Duration::from_millis(30)),
    });
    assert_eq!(t.requests(), 10);
    assert_eq!(t.count(Signal::ClientError(400)), Some(2));
    assert_eq!(t.count(Signal::ClientError(404)), Some(1));
    assert_eq!(t.count(Signal::ClientError(422)), Some(0));
    assert_eq!(t.count(Signal::ClientError(200)), Some(0));
    assert_eq!(t.count(Signal::Capacity), Some(2));
    assert_eq!(t.count(Signal::ServerError), Some(2));
    assert_eq!(t.count(Signal::Timeout), Some(1));
    assert_eq!(t.count(Signal::BrokenStream), Some(1));
    assert_eq!(t.count(Signal::SlowFirstToken), None);
    assert_eq!(t.client_errors().collect::<Vec<_>>(), [(400, 2), (404, 1)]);
    assert_eq!(t.ttft_requests(), 1);
}

#[test]
fn buckets_span_a_millisecond_to_ten_minutes_in_five_percent_steps() {
    assert_eq!(ttft_bucket(Duration::ZERO), 0);
    assert_eq!(ttft_bucket(Duration::from_micros(999)), 0);
    assert_eq!(ttft_bucket(Duration::from_millis(1)), 1);
    assert_eq!(ttft_bucket(Duration::from_secs(600)), TTFT_BUCKETS - 2);
    assert_eq!(ttft_bucket(Duration::from_secs(3600)), TTFT_BUCKETS - 1);
    for bucket in 1..TTFT_BUCKETS - 1 {
        let upper = ttft_bucket_edge(bucket).as_secs_f64();
        let lower = ttft_bucket_edge(bucket - 1).as_secs_f64();
        // Edges are whole nanoseconds, so the ratio is exact to about 1e-6 at 1 ms.
        assert!((upper / lower - 1.05).abs() < 1e-5, "bucket {bucket}");
    }
}

#[test]
fn the_quantile_is_the_upper_edge_of_its_bucket() {
    let mut t = Tally::default();
    assert_eq!(t.ttft_quantile(0.95), None);
    for ms in 1..=100 {
        t.record(ttft(ms * 10));
    }
    let p95 = t.ttft_quantile(0.95).unwrap();
    // The 95th of 100 TTFTs is 950 ms; its bucket's upper edge is within 5 % above it.
    assert!(
        p95 >= Duration::from_millis(950) && p95 <= Duration::from_millis(998),
        "{p95:?}"
    );
    let bucket = t.ttft_quantile_bucket(0.95).unwrap();
    assert!(t.ttft_above(bucket) <= 5);
    assert_eq!(t.ttft_above(TTFT_BUCKETS - 1), 0);
}

proptest! {
    /// However the TTFTs are spread, at most `1 - q` of them lie above the `q` quantile's
    /// bucket, and at least that share lies in it or above.
    #[test]
    fn at_most_the_tail_share_is_above_the_quantile(
        ttfts in prop::collection::vec(0u64..700_000, 1..300),
        q in 0.01f64..0.99,
    ) {
        let mut t = Tally::default();
        for &ms in &ttfts {
            t.record(ttft(ms));
        }
        let bucket = t.ttft_quantile_bucket(q).unwrap();
        let n = ttfts.len() as f64;
        prop_assert!(t.ttft_above(bucket) as f64 <= (1.0 - q) * n + 1e-9);
        if bucket > 0 {
            prop_assert!(t.ttft_above(bucket - 1) as f64 > (1.0 - q) * n - 1e-9);
        }
    }

    #[test]
    fn a_bucket_holds_what_lies_between_its_edges(us in 1_000u64..600_000_000) {
        let d = Duration::from_micros(us);
        let bucket = ttft_bucket(d);
        prop_assert!(d <= ttft_bucket_edge(bucket) + Duration::from_micros(1));
        prop_assert!(d + Duration::from_micros(1) >= ttft_bucket_edge(bucket - 1));
    }
}
