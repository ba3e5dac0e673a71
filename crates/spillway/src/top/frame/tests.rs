use std::collections::BTreeMap;

use spillway_proxy::top::BackendTop;

use super::*;
use crate::top::rates::{ModelRow, TenantRow, Totals};

fn per(total: u64, per_second: Option<f64>) -> Counter {
    Counter { total, per_second }
}

fn tenant(name: &str, offered: f64, shed: &[(&str, f64)]) -> TenantRow {
    TenantRow {
        tenant: name.to_owned(),
        offered: per(1, Some(offered)),
        admitted: per(1, Some(offered)),
        queued: 3,
        shed_total: per(1, Some(shed.iter().map(|(_, r)| r).sum())),
        shed: shed
            .iter()
            .map(|(why, r)| ((*why).to_owned(), per(1, Some(*r))))
            .collect::<BTreeMap<_, _>>(),
        client_retries: per(1, Some(0.5)),
        upstream_attempts: per(1, Some(offered * 1.5)),
        upstream_retries: per(1, Some(offered * 0.5)),
        amplification: Some(1.5),
    }
}

fn view(tenants: Vec<TenantRow>) -> View {
    View {
        admin_url: "http://127.0.0.1:9090".to_owned(),
        uptime_seconds: 3725.0,
        interval_seconds: Some(2.0),
        amplification: Some(1.0512),
        amplification_since_start: Some(1.2),
        totals: Totals {
            offered: per(10, Some(12.0)),
            admitted: per(10, Some(10.0)),
            queued: 3,
            shed: per(0, Some(2.0)),
            client_retries: per(0, Some(0.0)),
            upstream_attempts: per(0, Some(12.6)),
            upstream_retries: per(0, Some(0.6)),
        },
        tenants,
        models: vec![ModelRow {
            model: "mock-small".to_owned(),
            offered: per(1, Some(12.0)),
            upstream_attempts: per(1, Some(12.6)),
            upstream_retries: per(1, Some(0.6)),
            amplification: Some(1.05),
            amplification_since_start: None,
        }],
        backends: vec![BackendTop {
            model: "mock-small".to_owned(),
            backend: "a-backend-with-a-very-long-name".to_owned(),
            region: "region-a".to_owned(),
            state: "ejected".to_owned(),
            outstanding: 2,
            limit: 8,
            max_concurrency: 64,
            engine: "fresh".to_owned(),
            engine_running: Some(2),
            engine_waiting: None,
        }],
    }
}

#[test]
fn rates_are_short_and_right_sized() {
    let r = |x| rate(per(0, Some(x)));
    assert_eq!(rate(per(5, None)), "-");
    assert_eq!(r(0.0), "0");
    assert_eq!(r(0.25), "0.2");
    assert_eq!(r(9.96), "10.0");
    assert_eq!(r(12.4), "12");
    assert_eq!(r(9_999.0), "9999");
    assert_eq!(r(12_345.0), "12.3k");
    assert_eq!(r(25_000_000.0), "25.0M");
    assert_eq!(ratio(Some(1.0512)), "1.05x");
    assert_eq!(ratio(None), "-");
}

#[test]
fn uptimes_show_their_two_largest_units() {
    assert_eq!(uptime(45.9), "45s");
    assert_eq!(uptime(185.0), "3m05s");
    assert_eq!(uptime(3725.0), "1h02m");
    assert_eq!(uptime(273_600.0), "3d04h");
}

#[test]
fn text_is_cut_to_its_width_with_a_mark() {
    assert_eq!(fit("tenant", 6), "tenant");
    assert_eq!(fit("tenant-a", 6), "tenan~");
    assert_eq!(fit("ünïcödé", 4), "ünï~");
    assert_eq!(fit("x", 0), "");
}

#[test]
fn every_line_fits_the_width_and_columns_line_up() {
    let v = view(vec![
        tenant(
            "a-tenant-whose-name-is-longer-than-its-column",
            1234.0,
            &[("queue_full", 3.0)],
        ),
        tenant("b", 2.0, &[]),
    ]);
    for width in [40, 80, 132] {
        for line in render(&v, width, None) {
            assert!(line.chars().count() <= width, "{width}: {line:?}");
        }
    }
    let lines = render(&v, 200, None);
    let heading = lines.iter().position(|l| l.starts_with("TENANT")).unwrap();
    let (head, first) = (&lines[heading], &lines[heading + 1]);
    // Each right-aligned number ends where its heading ends.
    let end_of = |line: &str, word: &str| line.find(word).unwrap() + word.len();
    assert_eq!(end_of(head, "OFFERED/s"), end_of(first, "1234"));
    assert_eq!(end_of(head, "AMPL"), end_of(first, "1.50x"));
    assert!(first.starts_with("a-tenant-whose-~ "), "{first}");
    assert!(first.ends_with("queue_full 3.0"), "{first}");
    let backend = lines.iter().find(|l| l.contains("a-backend")).unwrap();
    assert!(
        backend.contains("a-backend-with-~ region-a   ejected"),
        "{backend}"
    );
    assert!(
        lines[0].contains("amplification 1.05x (since start 1.20x)"),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("up 1h02m"), "{}", lines[0]);
}

#[test]
fn shed_reasons_are_listed_largest_first_without_zeros() {
    let t = tenant(
        "t",
        10.0,
        &[
            ("queue_full", 1.0),
            ("rate_limited_requests", 6.0),
            ("throttled", 0.0),
        ],
    );
    assert_eq!(
        shed_reasons(&t),
        "rate_limited_requests 6.0, queue_full 1.0"
    );
}

#[test]
fn a_short_terminal_keeps_the_tenants_that_drive_the_load() {
    let tenants: Vec<TenantRow> = (0..30)
        .map(|i| tenant(&format!("t{i:02}"), 100.0 - f64::from(i), &[]))
        .collect();
    let lines = render(&view(tenants), 120, Some(16));
    assert_eq!(lines.len(), 16);
    let shown: Vec<&String> = lines.iter().filter(|l| l.starts_with('t')).collect();
    assert_eq!(shown.first().map(|l| &l[..3]), Some("t00"));
    let more = lines
        .iter()
        .find(|l| l.starts_with("..."))
        .expect("a line for the rest");
    assert_eq!(*more, format!("... {} more tenants", 30 - shown.len()));
    assert!(
        lines.iter().any(|l| l.starts_with("MODEL ")),
        "the models stay: {lines:#?}"
    );
    assert!(
        lines.iter().any(|l| l.contains("a-backend")),
        "the backends stay: {lines:#?}"
    );
}

#[test]
fn a_very_short_terminal_keeps_a_few_tenants_before_the_tables_below() {
    let tenants: Vec<TenantRow> = (0..9)
        .map(|i| tenant(&format!("t{i:02}"), 100.0 - f64::from(i), &[]))
        .collect();
    let lines = render(&view(tenants), 120, Some(11));
    assert_eq!(lines.len(), 11);
    let shown: Vec<&String> = lines.iter().filter(|l| l.starts_with('t')).collect();
    assert_eq!(shown.len(), MIN_TENANT_ROWS - 1, "{lines:#?}");
    assert_eq!(lines[4 + MIN_TENANT_ROWS - 1], "... 5 more tenants");
    let two = vec![tenant("a", 2.0, &[]), tenant("b", 1.0, &[])];
    let lines = render(&view(two), 120, Some(100));
    assert!(lines.iter().all(|l| !l.starts_with("...")), "{lines:#?}");
}
