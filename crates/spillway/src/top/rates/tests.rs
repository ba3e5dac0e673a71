use super::*;

fn tenant(name: &str, offered: u64, attempts: u64, shed: &[(&str, u64)]) -> TenantTop {
    TenantTop {
        tenant: name.to_owned(),
        offered,
        admitted: offered - shed.iter().map(|(_, n)| n).sum::<u64>(),
        queued: 0,
        shed: shed.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
        client_retries: 0,
        upstream_attempts: attempts,
        upstream_retries: attempts.saturating_sub(offered),
    }
}

fn read(uptime: f64, tenants: Vec<TenantTop>) -> Top {
    let models = vec![ModelTop {
        model: "m".to_owned(),
        offered: tenants.iter().map(|t| t.offered).sum(),
        upstream_attempts: tenants.iter().map(|t| t.upstream_attempts).sum(),
        upstream_retries: tenants.iter().map(|t| t.upstream_retries).sum(),
    }];
    Top {
        uptime_seconds: uptime,
        tenants,
        models,
        backends: Vec::new(),
    }
}

fn names(v: &View) -> Vec<&str> {
    v.tenants.iter().map(|t| t.tenant.as_str()).collect()
}

#[test]
fn rates_are_the_differences_over_the_gateways_uptime_between_reads() {
    let before = read(10.0, vec![tenant("a", 100, 100, &[("queue_full", 10)])]);
    let now = read(12.0, vec![tenant("a", 140, 150, &[("queue_full", 20)])]);
    let v = view("u", Some(&before), &now);
    assert_eq!(v.interval_seconds, Some(2.0));
    let a = &v.tenants[0];
    assert_eq!(
        a.offered,
        Counter {
            total: 140,
            per_second: Some(20.0)
        }
    );
    assert_eq!(a.upstream_attempts.per_second, Some(25.0));
    assert_eq!(
        a.shed["queue_full"],
        Counter {
            total: 20,
            per_second: Some(5.0)
        }
    );
    assert_eq!(a.shed_total.per_second, Some(5.0));
    assert_eq!(a.amplification, Some(1.25));
    assert_eq!(v.amplification, Some(1.25));
    assert_eq!(v.amplification_since_start, Some(150.0 / 140.0));
    assert_eq!(v.models[0].amplification, Some(1.25));
    assert_eq!(v.totals.offered.per_second, Some(20.0));
}

#[test]
fn one_read_has_totals_and_no_rates() {
    let v = view("u", None, &read(5.0, vec![tenant("a", 10, 12, &[])]));
    assert_eq!(v.interval_seconds, None);
    assert_eq!(
        v.tenants[0].offered,
        Counter {
            total: 10,
            per_second: None
        }
    );
    assert_eq!(
        v.totals.offered,
        Counter {
            total: 10,
            per_second: None
        }
    );
    assert_eq!(v.amplification, None);
    assert_eq!(v.amplification_since_start, Some(1.2));
}

#[test]
fn a_tenant_new_since_the_earlier_read_counted_from_zero() {
    let before = read(1.0, vec![tenant("a", 10, 10, &[])]);
    let now = read(
        2.0,
        vec![
            tenant("a", 10, 10, &[]),
            tenant("b", 4, 4, &[("throttled", 1)]),
        ],
    );
    let v = view("u", Some(&before), &now);
    let b = v.tenants.iter().find(|t| t.tenant == "b").unwrap();
    assert_eq!(b.offered.per_second, Some(4.0));
    assert_eq!(b.shed["throttled"].per_second, Some(1.0));
}

#[test]
fn a_restarted_gateway_has_rates_over_its_uptime() {
    let before = read(100.0, vec![tenant("a", 1000, 1000, &[])]);
    let now = read(4.0, vec![tenant("a", 8, 8, &[])]);
    let v = view("u", Some(&before), &now);
    assert_eq!(v.interval_seconds, Some(4.0));
    assert_eq!(v.tenants[0].offered.per_second, Some(2.0));
}

#[test]
fn nothing_offered_between_reads_has_no_amplification() {
    let before = read(1.0, vec![tenant("a", 10, 30, &[])]);
    let now = read(2.0, vec![tenant("a", 10, 30, &[])]);
    let v = view("u", Some(&before), &now);
    assert_eq!(v.tenants[0].offered.per_second, Some(0.0));
    assert_eq!(v.amplification, None);
    assert_eq!(v.amplification_since_start, Some(3.0));
}

#[test]
fn tenants_are_sorted_by_offered_rate_then_upstream_attempts_then_name() {
    // "big" has the largest total but has gone quiet; "loud" offers most now; "echo" offers as
    // much as "calm" but its requests take more upstream attempts now (fewer in all); "storm" causes the most
    // upstream attempts but offers less than "loud".
    let before = read(
        0.0,
        vec![
            tenant("big", 10_000, 10_000, &[]),
            tenant("calm", 0, 100, &[]),
            tenant("echo", 0, 0, &[]),
            tenant("loud", 0, 0, &[]),
            tenant("storm", 0, 0, &[]),
            tenant("zero-b", 0, 0, &[]),
            tenant("zero-a", 0, 0, &[]),
        ],
    );
    let now = read(
        1.0,
        vec![
            tenant("big", 10_000, 10_000, &[]),
            tenant("calm", 10, 110, &[]),
            tenant("echo", 10, 30, &[]),
            tenant("loud", 50, 50, &[]),
            tenant("storm", 20, 80, &[]),
            tenant("zero-b", 0, 0, &[]),
            tenant("zero-a", 0, 0, &[]),
        ],
    );
    let v = view("u", Some(&before), &now);
    assert_eq!(
        names(&v),
        ["loud", "storm", "echo", "calm", "big", "zero-a", "zero-b"]
    );
}

#[test]
fn with_one_read_tenants_are_sorted_by_totals() {
    let now = read(
        1.0,
        vec![
            tenant("a", 1, 1, &[]),
            tenant("b", 9, 9, &[]),
            tenant("c", 9, 20, &[]),
        ],
    );
    assert_eq!(names(&view("u", None, &now)), ["c", "b", "a"]);
}
