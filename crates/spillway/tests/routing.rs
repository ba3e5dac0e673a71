//! Routing across regions: home-region preference, spillover, skipping unreachable backends.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use spillway_testkit::http::{client, get_json};
use support::*;

async fn served(m: &Proc) -> u64 {
    get_json(&m.url("/stats")).await["served"].as_u64().unwrap()
}

#[tokio::test]
async fn home_region_serves_while_healthy_and_spills_over_when_down() {
    let home = mock(&["--model", "m", "--ttft", "0ms", "--tokens-per-sec", "0"]);
    let away = mock(&["--model", "m", "--ttft", "0ms", "--tokens-per-sec", "0"]);
    let cfg = format!(
        "home_region = \"region-a\"\n{}",
        model(
            "m",
            &[
                ("a", "region-a", home.url("/v1")),
                ("b", "region-b", away.url("/v1"))
            ]
        )
    );
    // `home_region` belongs to [server], which the harness writes first.
    let gw = gateway(&cfg);
    let c = client();
    for _ in 0..10 {
        let r = c
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(KEY)
            .json(&chat_body("m", false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    assert_eq!((served(&home).await, served(&away).await), (10, 0));
    // A caller may name its region.
    let r = chat_with_header(
        &gw,
        &chat_body("m", false),
        Some(("x-spillway-region", "region-b")),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(served(&away).await, 1);

    drop(home); // region-a goes down: connections are refused.
    for _ in 0..10 {
        let r = c
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(KEY)
            .json(&chat_body("m", false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    assert_eq!(served(&away).await, 11);
    let metrics = c
        .get(gw.admin_url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // The series exists from the start at 0: the spillovers must have counted.
    assert!(
        sample_sum(
            &metrics,
            "spillway_spillovers_total{model=\"m\",backend=\"b\"}"
        ) > 0.0,
        "{metrics}"
    );
    // The unreachable backend is skipped for a cooldown rather than tried by every request.
    let connect_errors: f64 = metrics
        .lines()
        .filter(|l| {
            l.starts_with("spillway_upstream_errors_total{") && l.contains("reason=\"connect\"")
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert!(
        (1.0..10.0).contains(&connect_errors),
        "connect errors: {connect_errors}"
    );
}

#[tokio::test]
async fn weights_share_traffic_between_idle_backends() {
    let light = mock(&["--model", "m", "--ttft", "0ms", "--tokens-per-sec", "0"]);
    let heavy = mock(&["--model", "m", "--ttft", "0ms", "--tokens-per-sec", "0"]);
    let cfg = format!(
        "[[models]]\nname = \"m\"\n[[models.backends]]\nname = \"l\"\nurl = \"{}\"\nweight = 1\n[[models.backends]]\nname = \"h\"\nurl = \"{}\"\nweight = 4\n",
        light.url("/v1"),
        heavy.url("/v1")
    );
    let gw = gateway(&cfg);
    let c = client();
    for _ in 0..200 {
        let r = c
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(KEY)
            .json(&chat_body("m", false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let (l, h) = (served(&light).await, served(&heavy).await);
    assert_eq!(l + h, 200);
    // Expected 40 / 160; sequential requests leave both idle, so the split follows the weights.
    assert!((15..=70).contains(&l), "light {l}, heavy {h}");
}
