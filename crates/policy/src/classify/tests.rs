use super::*;
use proptest::prelude::*;

#[test]
fn defaults_follow_the_documented_table() {
    let r = Rules::default();
    let c = |s| classify(Outcome::Response(s), &r);
    assert_eq!(c(200), Class::Success);
    assert_eq!(c(429), Class::Capacity);
    assert_eq!(c(503), Class::Capacity);
    assert_eq!(c(502), Class::Transient);
    assert_eq!(c(504), Class::Transient);
    assert_eq!(c(500), Class::ServerError);
    assert_eq!(c(400), Class::ClientError);
    assert_eq!(c(404), Class::ClientError);
    assert_eq!(c(401), Class::UpstreamAuth);
    assert_eq!(c(403), Class::UpstreamAuth);
    assert_eq!(classify(Outcome::ConnectFailed, &r), Class::Transient);
    assert_eq!(classify(Outcome::ResetBeforeResponse, &r), Class::Transient);
    assert_eq!(classify(Outcome::TimedOut, &r), Class::Timeout);
}

#[test]
fn a_backend_refusing_the_gateways_credential_is_the_backends_failure() {
    // 401 and 403 blame the gateway's credential for that backend, not the caller.
    let r = Rules::default();
    for status in [401, 403] {
        let class = classify(Outcome::Response(status), &r);
        assert_eq!(class, Class::UpstreamAuth);
        assert_eq!(class.as_str(), "upstream_auth");
        assert!(class.is_backend_failure());
        assert!(!class.is_overload());
    }
}

#[test]
fn only_capacity_and_timeouts_are_overload() {
    let all = [
        Class::Success,
        Class::Capacity,
        Class::Transient,
        Class::Timeout,
        Class::UpstreamAuth,
        Class::ClientError,
        Class::ServerError,
    ];
    let overload: Vec<Class> = all.into_iter().filter(|c| c.is_overload()).collect();
    assert_eq!(overload, [Class::Capacity, Class::Timeout]);
    let names: std::collections::HashSet<&str> = all.iter().map(|c| c.as_str()).collect();
    assert_eq!(names.len(), all.len());
}

#[test]
fn a_retry_safe_backend_makes_500_transient() {
    let r = Rules {
        retry_500: true,
        ..Rules::default()
    };
    assert_eq!(classify(Outcome::Response(500), &r), Class::Transient);
    assert_eq!(classify(Outcome::Response(501), &r), Class::ServerError);
}

#[test]
fn a_backend_specific_overload_code_is_capacity() {
    let r = Rules {
        capacity: vec![429, 503, 529],
        ..Rules::default()
    };
    assert_eq!(classify(Outcome::Response(529), &r), Class::Capacity);
}

#[test]
fn pushback_prefers_milliseconds_and_caps_the_wait() {
    let p = Pushback::parse(Some("2"), Some("1500"), Some("false"));
    assert_eq!(p.retry_after, Some(Duration::from_millis(1500)));
    assert_eq!(p.should_retry, Some(false));
    let p = Pushback::parse(Some("7"), None, Some("TRUE"));
    assert_eq!(p.retry_after, Some(Duration::from_secs(7)));
    assert_eq!(p.should_retry, Some(true));
    let p = Pushback::parse(Some("999999"), None, None);
    assert_eq!(p.retry_after, Some(MAX_RETRY_AFTER));
    let p = Pushback::parse(
        Some("Wed, 21 Oct 2015 07:28:00 GMT"),
        Some("-5"),
        Some("maybe"),
    );
    assert_eq!(p, Pushback::default());
}

proptest! {
    #[test]
    fn every_status_has_exactly_one_class_and_other_4xx_are_client_errors(
        status in 100u16..1000,
        retry_500 in any::<bool>(),
    ) {
        let r = Rules { retry_500, ..Rules::default() };
        let class = classify(Outcome::Response(status), &r);
        let auth = status == 401 || status == 403;
        if (400..500).contains(&status) && status != 429 && !auth {
            prop_assert_eq!(class, Class::ClientError);
        }
        prop_assert_eq!(class == Class::UpstreamAuth, auth);
        if status < 400 {
            prop_assert_eq!(class, Class::Success);
        }
        prop_assert_eq!(class.is_backend_failure(), status >= 500 || status == 429 || auth);
    }

    #[test]
    fn pushback_never_panics_and_stays_capped(
        a in "\\PC{0,20}", b in "\\PC{0,20}", c in "\\PC{0,20}",
    ) {
        let p = Pushback::parse(Some(&a), Some(&b), Some(&c));
        if let Some(d) = p.retry_after {
            prop_assert!(d <= MAX_RETRY_AFTER);
        }
    }
}

#[test]
fn naive_rules_retry_every_5xx_and_relay_every_4xx() {
    let r = Rules::naive();
    for s in 500..=599 {
        assert_eq!(classify(Outcome::Response(s), &r), Class::Transient, "{s}");
    }
    for s in [400, 401, 403, 404, 429] {
        assert_eq!(
            classify(Outcome::Response(s), &r),
            Class::ClientError,
            "{s}"
        );
    }
}
