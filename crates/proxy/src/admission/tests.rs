use super::*;

fn config(max_in_flight: usize) -> AdmissionConfig {
    AdmissionConfig {
        max_in_flight,
        max_buffered_body_bytes: 1 << 20,
        max_buffered_body_bytes_per_tenant: 1 << 18,
        default_completion_tokens: 100,
        max_queued: 16,
        max_queued_per_tenant: 4,
        queue_wait: Duration::from_secs(1),
        redis: None,
        redis_env: None,
        redis_timeout: Duration::from_millis(50),
        instances: 1,
        naive: false,
    }
}

fn tenant(name: &str, limits: TenantLimits) -> Tenant {
    Tenant {
        name: Arc::from(name),
        allowed_models: None,
        enabled: true,
        limits,
        pool: None,
        default_model: None,
    }
}

fn summary(max_tokens: Option<u64>) -> RequestSummary {
    RequestSummary {
        model: "m".into(),
        max_tokens,
        choices: 1,
        ..RequestSummary::default()
    }
}

/// Both steps of admission, as a request passes them: entered at its head, admitted after its
/// body.
async fn admit(a: &Admission, t: &Tenant, ask: Ask<'_>) -> Result<Ticket, ApiError> {
    let entered = a.enter(t)?;
    a.limits(t, entered, ask).await
}

fn ask(s: &RequestSummary) -> Ask<'_> {
    Ask {
        summary: s,
        body_len: 400,
        completes: true,
        tokens: true,
    }
}

#[tokio::test]
async fn a_tenant_over_its_requests_per_minute_gets_429_with_the_openai_headers() {
    let a = Admission::new(&config(100), true, std::iter::empty(), None);
    let t = tenant(
        "a",
        TenantLimits {
            requests_per_min: Some(2),
            ..TenantLimits::default()
        },
    );
    let s = summary(Some(10));
    let first = admit(&a, &t, ask(&s)).await.unwrap();
    assert_eq!(first.rate_headers().requests.unwrap().remaining, 1);
    let _second = admit(&a, &t, ask(&s)).await.unwrap();
    let e = admit(&a, &t, ask(&s)).await.err().unwrap();
    assert_eq!(e.kind, ErrorKind::RequestRateLimited);
    assert_eq!(e.status(), http::StatusCode::TOO_MANY_REQUESTS);
    let after = e.retry_after.unwrap();
    assert!(
        after > Duration::from_secs(29) && after <= Duration::from_secs(30),
        "{after:?}"
    );
    assert_eq!(
        e.headers
            .as_deref()
            .unwrap()
            .get(&http::HeaderName::from_static("x-ratelimit-limit-requests")),
        Some(&b"2"[..])
    );
    assert_eq!(
        e.headers
            .as_deref()
            .unwrap()
            .get(&http::HeaderName::from_static(
                "x-ratelimit-remaining-requests"
            )),
        Some(&b"0"[..])
    );
    assert!(e.retry_may_help());
    // Another tenant is not affected.
    assert!(admit(&a, &tenant("b", t.limits), ask(&s)).await.is_ok());
}

#[tokio::test]
async fn concurrency_is_held_until_the_admission_is_dropped() {
    let a = Admission::new(&config(100), true, std::iter::empty(), None);
    let t = tenant(
        "a",
        TenantLimits {
            max_concurrency: Some(1),
            ..TenantLimits::default()
        },
    );
    let s = summary(None);
    let held = admit(&a, &t, ask(&s)).await.unwrap();
    let e = admit(&a, &t, ask(&s)).await.err().unwrap();
    assert_eq!(e.kind, ErrorKind::ConcurrencyLimited);
    assert_eq!(a.in_flight().0, 1, "a refusal holds no place");
    drop(held);
    assert_eq!(a.in_flight().0, 0);
    // Entered at its head and dropped before admission (its body refused): both places back.
    drop(a.enter(&t).unwrap());
    assert_eq!(a.in_flight().0, 0);
    assert!(admit(&a, &t, ask(&s)).await.is_ok());
}

#[tokio::test]
async fn the_global_cap_refuses_every_tenant_with_503() {
    let a = Admission::new(&config(2), true, std::iter::empty(), None);
    let s = summary(None);
    let t = tenant("a", TenantLimits::default());
    let _one = admit(&a, &t, ask(&s)).await.unwrap();
    let _two = admit(&a, &tenant("b", TenantLimits::default()), ask(&s))
        .await
        .unwrap();
    let e = admit(&a, &tenant("c", TenantLimits::default()), ask(&s))
        .await
        .err()
        .unwrap();
    assert_eq!(e.kind, ErrorKind::GatewayOverloaded);
    assert_eq!(e.status(), http::StatusCode::SERVICE_UNAVAILABLE);
    assert!(e.retry_after.is_some());
}

#[tokio::test]
async fn tokens_are_estimated_reserved_and_reconciled_with_the_report() {
    let a = Admission::new(&config(100), true, std::iter::empty(), None);
    let t = tenant(
        "a",
        TenantLimits {
            tokens_per_min: Some(1000),
            ..TenantLimits::default()
        },
    );
    // 400 bytes of body is about 100 prompt tokens, plus 300 allowed completion tokens.
    let s = summary(Some(300));
    let mut admitted = admit(&a, &t, ask(&s)).await.unwrap();
    assert_eq!(admitted.rate_headers().tokens.unwrap().remaining, 600);
    admitted.settle(Some(150));
    drop(admitted);
    let next = admit(&a, &t, ask(&s)).await.unwrap();
    // 1000 - 150 - 400, give or take the refill of a few microseconds.
    let left = next.rate_headers().tokens.unwrap().remaining;
    assert!((450..=451).contains(&left), "{left}");
    // Dropped unsettled (the request failed): its 400 tokens come back.
    drop(next);
    let again = admit(&a, &t, ask(&s)).await.unwrap();
    let left = again.rate_headers().tokens.unwrap().remaining;
    assert!((450..=452).contains(&left), "{left}");
}

#[tokio::test]
async fn a_request_larger_than_the_token_limit_is_refused_without_a_retry_time() {
    let a = Admission::new(&config(100), true, std::iter::empty(), None);
    let t = tenant(
        "a",
        TenantLimits {
            tokens_per_min: Some(500),
            ..TenantLimits::default()
        },
    );
    let s = summary(Some(1000));
    let e = admit(&a, &t, ask(&s)).await.err().unwrap();
    assert_eq!(e.kind, ErrorKind::TokensOverLimit);
    assert!(e.retry_after.is_none());
    assert!(!e.retry_may_help());
    assert_eq!(
        e.headers
            .as_deref()
            .unwrap()
            .get(&http::HeaderName::from_static("x-ratelimit-limit-tokens")),
        Some(&b"500"[..])
    );
}

#[tokio::test]
async fn changed_limits_apply_to_the_next_request() {
    let a = Admission::new(&config(100), true, std::iter::empty(), None);
    let s = summary(None);
    let strict = tenant(
        "a",
        TenantLimits {
            requests_per_min: Some(1),
            ..TenantLimits::default()
        },
    );
    let _first = admit(&a, &strict, ask(&s)).await.unwrap();
    assert!(admit(&a, &strict, ask(&s)).await.is_err());
    let relaxed = tenant("a", TenantLimits::default());
    let unlimited = admit(&a, &relaxed, ask(&s)).await.unwrap();
    let quotas = unlimited.rate_headers();
    assert!(quotas.requests.is_none() && quotas.tokens.is_none());
    // Limited again: what it sent under the limit before still counts against it.
    assert!(admit(&a, &strict, ask(&s)).await.is_err());
}

mod queue {
    use super::super::queue::{PoolQueue, Shed};
    use spillway_policy::{Priority, QueueBounds};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    fn queue(total: usize, per_tenant: usize, wait_ms: u64) -> Arc<PoolQueue> {
        PoolQueue::new(
            QueueBounds { total, per_tenant },
            Duration::from_millis(wait_ms),
        )
    }

    type Entered = Result<(super::super::queue::Seat, Duration), Shed>;

    /// A request of `line` entering `q` (of `seats` seats) in a task of its own.
    fn entering(
        q: &Arc<PoolQueue>,
        seats: usize,
        class: Priority,
        line: &str,
    ) -> tokio::task::JoinHandle<Entered> {
        let (q, line) = (q.clone(), Arc::<str>::from(line));
        tokio::spawn(async move { q.enter(Instant::now(), seats, class, &line, || ()).await })
    }

    /// Until a request of `class` waits in `q`.
    async fn until_waiting(q: &PoolQueue, class: Priority) {
        let at = Priority::ALL.iter().position(|&p| p == class).unwrap();
        while q.figures().0[at] == 0 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_freed_seat_goes_to_the_waiter_and_a_gone_waiter_passes_it_on() {
        let q = queue(8, 8, 5_000);
        let (held, waited) = q
            .enter(Instant::now(), 1, Priority::Standard, &"a".into(), || ())
            .await
            .unwrap();
        assert_eq!(waited, Duration::ZERO);
        // A waiter whose client goes away leaves nothing behind.
        let gone = tokio::time::timeout(
            Duration::from_millis(20),
            q.enter(Instant::now(), 1, Priority::Standard, &"b".into(), || ()),
        )
        .await;
        assert!(gone.is_err());
        assert_eq!(q.figures().0, [0, 0, 0]);
        let next = entering(&q, 1, Priority::Standard, "c");
        until_waiting(&q, Priority::Standard).await;
        drop(held);
        let (seat, waited) = next.await.unwrap().unwrap();
        assert!(waited > Duration::ZERO);
        assert_eq!(q.figures().1, 1, "the seat moved, it was not duplicated");
        drop(seat);
        assert_eq!(q.figures().1, 0);
    }

    #[tokio::test]
    async fn a_seat_taken_at_once_never_passes_a_waiter() {
        let q = queue(8, 8, 5_000);
        let held = q.try_enter(Instant::now(), 1).expect("a free seat");
        assert!(q.try_enter(Instant::now(), 1).is_none(), "no seat is free");
        let waiter = entering(&q, 1, Priority::Standard, "b");
        until_waiting(&q, Priority::Standard).await;
        // The freed seat goes to the one waiting, not to a request asking at once after.
        drop(held);
        assert!(q.try_enter(Instant::now(), 1).is_none());
        let (seat, _) = waiter.await.unwrap().unwrap();
        // Nor does a seat added to the pool: it goes to the waiter first, when there is one.
        let second = entering(&q, 1, Priority::Standard, "c");
        until_waiting(&q, Priority::Standard).await;
        assert!(q.try_enter(Instant::now(), 2).is_none());
        let (other, _) = second.await.unwrap().unwrap();
        assert_eq!(q.figures(), ([0, 0, 0], 2, 2));
        drop((seat, other));
        assert!(q.try_enter(Instant::now(), 2).is_some());
    }

    #[tokio::test]
    async fn waiters_time_out_and_queues_are_bounded_per_tenant() {
        let q = queue(8, 1, 50);
        let _held = q
            .enter(Instant::now(), 1, Priority::Standard, &"a".into(), || ())
            .await
            .unwrap();
        let waiting = entering(&q, 1, Priority::Standard, "b");
        until_waiting(&q, Priority::Standard).await;
        let full = q
            .enter(Instant::now(), 1, Priority::Standard, &"b".into(), || ())
            .await
            .err();
        assert_eq!(full, Some(Shed::TenantQueueFull));
        assert_eq!(waiting.await.unwrap().err(), Some(Shed::Timeout));
        assert_eq!(q.figures(), ([0, 0, 0], 1, 1));
    }

    #[tokio::test]
    async fn a_full_queue_sheds_its_lowest_class_for_a_higher_one() {
        let q = queue(1, 1, 5_000);
        let held = q
            .enter(Instant::now(), 1, Priority::Critical, &"a".into(), || ())
            .await
            .unwrap();
        let batch = entering(&q, 1, Priority::Batch, "b");
        until_waiting(&q, Priority::Batch).await;
        let critical = entering(&q, 1, Priority::Critical, "c");
        assert_eq!(batch.await.unwrap().err(), Some(Shed::Evicted));
        drop(held);
        assert!(critical.await.unwrap().is_ok());
    }
}

#[tokio::test]
async fn a_reloaded_admission_keeps_the_requests_in_flight_and_each_tenant_s_state() {
    let a = Admission::new(&config(2), true, std::iter::empty(), None);
    let t = tenant("a", TenantLimits::default());
    let held = a.enter(&t).unwrap();
    let next = a.reloaded(&config(2), true, std::iter::empty());
    // The request admitted under the old config still counts against the new one's cap.
    assert_eq!(next.in_flight().0, 1);
    let _second = next.enter(&t).unwrap();
    assert!(
        next.enter(&t).is_err(),
        "the cap of 2 holds across the reload"
    );
    drop(held);
    assert_eq!(next.in_flight().0, 1);
}
