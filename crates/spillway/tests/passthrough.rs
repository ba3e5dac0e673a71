//! What passes through the gateway besides the body, against real mock-backend processes: the
//! Responses API's stored responses reached on the backend that created them, query strings,
//! the Anthropic headers, and the backend's own request id.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use serde_json::{json, Value};
use spillway_testkit::http::{client, get_json};
use support::*;

const FAST: [&str; 6] = ["--model", "m", "--ttft", "0ms", "--tokens-per-sec", "0"];

async fn call(
    gw: &Proc,
    method: reqwest::Method,
    path: &str,
    key: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = client().request(method, gw.url(path)).bearer_auth(key);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// How many requests each mock received.
async fn received(mocks: &[&Proc]) -> Vec<u64> {
    let mut out = Vec::new();
    for m in mocks {
        out.push(
            get_json(&m.url("/stats")).await["received"]
                .as_u64()
                .unwrap(),
        );
    }
    out
}

#[tokio::test]
async fn a_stored_response_is_reached_on_the_backend_that_created_it() {
    let one = mock(&FAST);
    let two = mock(&FAST);
    let gw = gateway(&model(
        "m",
        &[
            ("one", "region-a", one.url("/v1")),
            ("two", "region-a", two.url("/v1")),
        ],
    ));
    use reqwest::Method;
    for i in 0..6 {
        let (status, created) = call(
            &gw,
            Method::POST,
            "/v1/responses",
            KEY,
            Some(json!({"model": "m", "input": format!("Hello {i}"), "max_output_tokens": 4})),
        )
        .await;
        assert_eq!(status, 200, "{created}");
        let id = created["id"].as_str().unwrap().to_owned();
        let before = received(&[&one, &two]).await;
        // Every call on it goes to its backend alone: the other would not know it.
        let (status, got) = call(&gw, Method::GET, &format!("/v1/responses/{id}"), KEY, None).await;
        assert_eq!(
            (status, got["id"].as_str()),
            (200, Some(id.as_str())),
            "{got}"
        );
        let (status, items) = call(
            &gw,
            Method::GET,
            &format!("/v1/responses/{id}/input_items?order=asc"),
            KEY,
            None,
        )
        .await;
        assert_eq!(status, 200, "{items}");
        assert_eq!(items["object"], "list");
        let mut lasts = Vec::new();
        for m in [&one, &two] {
            lasts.push(get_json(&m.url("/stats")).await["last_request"].clone());
        }
        assert!(
            lasts.iter().any(
                |l| l["path"] == format!("/v1/responses/{id}/input_items").as_str()
                    && l["query"] == "order=asc"
            ),
            "the query string reached the backend: {lasts:?}"
        );
        // It is continued there too, without naming the model again.
        let (status, next) = call(
            &gw,
            Method::POST,
            "/v1/responses",
            KEY,
            Some(json!({"previous_response_id": id, "input": "And then?", "max_output_tokens": 4})),
        )
        .await;
        assert_eq!(status, 200, "{next}");
        assert_eq!(next["previous_response_id"], id.as_str());
        let after = received(&[&one, &two]).await;
        let moved: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
        assert!(
            moved.contains(&0) && moved.contains(&3),
            "calls spread over both backends: {moved:?}"
        );
        let (status, cancelled) = call(
            &gw,
            Method::POST,
            &format!("/v1/responses/{id}/cancel"),
            KEY,
            None,
        )
        .await;
        assert_eq!(
            (status, cancelled["status"].as_str()),
            (200, Some("cancelled")),
            "{cancelled}"
        );
        let (status, _) = call(
            &gw,
            Method::DELETE,
            &format!("/v1/responses/{id}"),
            KEY,
            None,
        )
        .await;
        assert_eq!(status, 200);
        // Deleted: the gateway forgets it and answers 404 itself.
        let before = received(&[&one, &two]).await;
        let (status, gone) =
            call(&gw, Method::GET, &format!("/v1/responses/{id}"), KEY, None).await;
        assert_eq!(status, 404);
        assert_eq!(gone["error"]["code"], "response_not_found");
        assert_eq!(received(&[&one, &two]).await, before);
    }
}

#[tokio::test]
async fn unknown_ids_and_other_tenants_ids_are_404_and_reach_no_backend() {
    let m = mock(&FAST);
    let gw = gateway(&format!(
        "{}\n[[tenants]]\nname = \"other\"\nkeys = [{{ sha256 = \"{}\" }}]\n",
        model("m", &[("one", "region-a", m.url("/v1"))]),
        sha256_hex("sk-other")
    ));
    use reqwest::Method;
    let (_, created) = call(
        &gw,
        Method::POST,
        "/v1/responses",
        KEY,
        Some(json!({"model": "m", "input": "Hi", "max_output_tokens": 2})),
    )
    .await;
    let id = created["id"].as_str().unwrap().to_owned();
    // A response created with `store: false` is kept nowhere, and not remembered either.
    let (_, unstored) = call(
        &gw,
        Method::POST,
        "/v1/responses",
        KEY,
        Some(json!({"model": "m", "input": "Hi", "max_output_tokens": 2, "store": false})),
    )
    .await;
    let unstored = format!("/v1/responses/{}", unstored["id"].as_str().unwrap());
    let before = received(&[&m]).await;
    for (path, key) in [
        (unstored, KEY),
        (format!("/v1/responses/{id}"), "sk-other"),
        ("/v1/responses/resp_neverseen".to_owned(), KEY),
        ("/v1/responses/..%2F..%2Fadmin".to_owned(), KEY),
    ] {
        let (status, v) = call(&gw, Method::GET, &path, key, None).await;
        assert_eq!(status, 404, "{path}: {v}");
        assert_eq!(v["error"]["code"], "response_not_found", "{path}: {v}");
    }
    let (status, v) = call(
        &gw,
        Method::POST,
        "/v1/responses",
        "sk-other",
        Some(json!({"previous_response_id": id, "input": "x"})),
    )
    .await;
    assert_eq!(status, 404, "{v}");
    assert_eq!(received(&[&m]).await, before);
}

#[tokio::test]
async fn the_query_the_anthropic_headers_and_the_backends_request_id_pass_through() {
    let m = mock(&FAST);
    let gw = gateway(&model("m", &[("one", "region-a", m.url("/v1"))]));
    let r = client()
        .post(gw.url("/v1/messages?beta=true"))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "prompt-caching-2024-07-31")
        .json(&json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let ours = r.headers()["x-request-id"].to_str().unwrap().to_owned();
    // The Messages API's `request-id` is spillway's; the backend's own is kept beside it.
    assert_eq!(r.headers()["request-id"].to_str().unwrap(), ours);
    let theirs = r.headers()["x-upstream-request-id"].to_str().unwrap();
    assert!(theirs.starts_with("req_"), "{theirs}");
    let last = &get_json(&m.url("/stats")).await["last_request"];
    assert_eq!(last["query"], "beta=true", "{last}");
    assert_eq!(last["anthropic_version"], "2023-06-01", "{last}");
    assert_eq!(
        last["anthropic_beta"], "prompt-caching-2024-07-31",
        "{last}"
    );
    assert_eq!(last["request_id"], ours.as_str(), "{last}");
}

#[tokio::test]
async fn stored_chat_completions_are_each_tenants_own() {
    let m = mock(&FAST);
    // A standalone server behind `kind = "openai"`: it keeps completions only if it says so.
    let gw = gateway(&format!(
        "{}surfaces = [\"chat\", \"stored_chat\"]\n\n[[tenants]]\nname = \"other\"\nkeys = [{{ sha256 = \"{}\" }}]\n",
        model("m", &[("one", "region-a", m.url("/v1"))]),
        sha256_hex("sk-other")
    ));
    use reqwest::Method;
    let stored = |text: &str| {
        json!({"model": "m", "store": true, "metadata": {"topic": "tour"}, "max_tokens": 3,
               "messages": [{"role": "user", "content": text}]})
    };
    let (status, mine) = call(
        &gw,
        Method::POST,
        "/v1/chat/completions",
        KEY,
        Some(stored("mine")),
    )
    .await;
    assert_eq!(status, 200, "{mine}");
    let mine = mine["id"].as_str().unwrap().to_owned();
    let (_, theirs) = call(
        &gw,
        Method::POST,
        "/v1/chat/completions",
        "sk-other",
        Some(stored("theirs")),
    )
    .await;
    let theirs = theirs["id"].as_str().unwrap().to_owned();
    // The backend keeps both under one key; each tenant lists and reaches only its own.
    let (status, list) = call(&gw, Method::GET, "/v1/chat/completions?limit=10", KEY, None).await;
    assert_eq!(status, 200, "{list}");
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["id"].as_str())
        .collect();
    assert_eq!(ids, [mine.as_str()], "{list}");
    // Even when it asks for the other tenant's tag.
    let (_, list) = call(
        &gw,
        Method::GET,
        "/v1/chat/completions?metadata%5Bspillway_tenant%5D=other",
        KEY,
        None,
    )
    .await;
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["id"].as_str())
        .collect();
    assert_eq!(ids, [mine.as_str()], "{list}");
    let (status, _) = call(
        &gw,
        Method::GET,
        &format!("/v1/chat/completions/{theirs}"),
        KEY,
        None,
    )
    .await;
    assert_eq!(status, 404);
    let (status, got) = call(
        &gw,
        Method::GET,
        &format!("/v1/chat/completions/{mine}"),
        KEY,
        None,
    )
    .await;
    assert_eq!(
        (status, got["id"].as_str()),
        (200, Some(mine.as_str())),
        "{got}"
    );
    let (status, msgs) = call(
        &gw,
        Method::GET,
        &format!("/v1/chat/completions/{mine}/messages"),
        KEY,
        None,
    )
    .await;
    assert_eq!(status, 200, "{msgs}");
    assert_eq!(msgs["data"][0]["content"], "mine", "{msgs}");
    // A metadata update cannot take the completion out of its tenant's list.
    let (status, updated) = call(
        &gw,
        Method::POST,
        &format!("/v1/chat/completions/{mine}"),
        KEY,
        Some(json!({"metadata": {"topic": "changed"}})),
    )
    .await;
    assert_eq!(status, 200, "{updated}");
    assert_eq!(
        updated["metadata"],
        json!({"topic": "changed", "spillway_tenant": "tenant-a"})
    );
    // An update larger than a metadata object can be is refused as a body, before any backend.
    let before = received(&[&m]).await;
    let (status, refused) = call(
        &gw,
        Method::POST,
        &format!("/v1/chat/completions/{mine}"),
        KEY,
        Some(json!({"metadata": {"topic": "x".repeat(70 * 1024)}})),
    )
    .await;
    assert_eq!(status, 413, "{refused}");
    assert_eq!(refused["error"]["code"], "body_too_large", "{refused}");
    assert_eq!(received(&[&m]).await, before);
    let (status, _) = call(
        &gw,
        Method::DELETE,
        &format!("/v1/chat/completions/{mine}"),
        KEY,
        None,
    )
    .await;
    assert_eq!(status, 200);
    let (status, gone) = call(
        &gw,
        Method::GET,
        &format!("/v1/chat/completions/{mine}"),
        KEY,
        None,
    )
    .await;
    assert_eq!(status, 404, "{gone}");
    // Without `store`, nothing is kept.
    let mut plain = stored("plain");
    plain["store"] = json!(false);
    let (_, plain) = call(&gw, Method::POST, "/v1/chat/completions", KEY, Some(plain)).await;
    let (status, _) = call(
        &gw,
        Method::GET,
        &format!("/v1/chat/completions/{}", plain["id"].as_str().unwrap()),
        KEY,
        None,
    )
    .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn stored_chat_completions_need_a_backend_that_declares_them() {
    let m = mock(&FAST);
    let gw = gateway(&format!(
        "{}surfaces = [\"chat\"]\n",
        model("m", &[("one", "region-a", m.url("/v1"))])
    ));
    let (status, v) = call(&gw, reqwest::Method::GET, "/v1/chat/completions", KEY, None).await;
    assert_eq!(status, 404, "{v}");
    assert_eq!(v["error"]["code"], "surface_not_served");
    assert_eq!(get_json(&m.url("/stats")).await["received"], 0);
}
