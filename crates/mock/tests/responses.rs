//! The OpenAI Responses API (`POST /v1/responses`): the response object, its usage and limit,
//! the stream of semantic events, and a stream broken off by the profile.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use serde_json::{json, Value};
use spillway_testkit::http::{client, expect_openai_error};
use support::*;

const PATH: &str = "/v1/responses";

fn is_hex(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[tokio::test]
async fn plain_response_has_the_response_shape_and_usage() {
    let mock = start(profile(|_| {})).await;
    // "Be brief" and "Hello there, mock" are 8 + 17 characters: 6 prompt tokens.
    let body = json!({"model": "m", "instructions": "Be brief", "input": "Hello there, mock",
                      "temperature": 0.2, "x_vendor": {"ignored": true}});
    let r = post(&mock, PATH, &body).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    assert!(!r.headers().contains_key("request-id"));
    let v: Value = r.json().await.unwrap();
    let id = v["id"].as_str().unwrap();
    assert!(
        id.strip_prefix("resp_")
            .is_some_and(|h| h.len() == 32 && is_hex(h)),
        "{id}"
    );
    assert_eq!(v["object"], "response");
    assert!(v["created_at"].as_u64().unwrap() > 1_600_000_000);
    assert_eq!(v["status"], "completed");
    assert_eq!(v["model"], "m");
    assert_eq!(v["incomplete_details"], Value::Null);
    assert_eq!(v["error"], Value::Null);
    let output = v["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{v}");
    let item = &output[0];
    assert_eq!(item["type"], "message");
    assert!(item["id"]
        .as_str()
        .unwrap()
        .strip_prefix("msg_")
        .is_some_and(is_hex));
    assert_eq!(
        (&item["status"], &item["role"]),
        (&json!("completed"), &json!("assistant"))
    );
    let part = &item["content"][0];
    assert_eq!(part["type"], "output_text");
    assert_eq!(part["annotations"], json!([]));
    // Without a limit the profile's 16 tokens are generated, one word each.
    assert_eq!(part["text"].as_str().unwrap().split(' ').count(), 16);
    assert_eq!(
        v["usage"],
        json!({"input_tokens": 6, "input_tokens_details": {"cached_tokens": 0},
               "output_tokens": 16, "output_tokens_details": {"reasoning_tokens": 0},
               "total_tokens": 22})
    );

    // Input items count as chat messages do, in either content form.
    let items = json!({"model": "m", "input": [
        {"role": "user", "content": "x".repeat(40)},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "y".repeat(20)}]},
    ]});
    let v: Value = post(&mock, PATH, &items).await.json().await.unwrap();
    assert_eq!(v["usage"]["input_tokens"], 15, "{v}");
    let s = mock.stats().await;
    assert_eq!(
        (&s["served"], &s["by_path"][PATH]),
        (&json!(2), &json!(2)),
        "{s}"
    );
}

#[tokio::test]
async fn max_output_tokens_stops_the_response_incomplete() {
    let mock = start(profile(|_| {})).await;
    let body = json!({"model": "m", "input": "Hello there, mock", "max_output_tokens": 3});
    let v: Value = post(&mock, PATH, &body).await.json().await.unwrap();
    assert_eq!(v["status"], "incomplete", "{v}");
    assert_eq!(
        v["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(v["output"][0]["content"][0]["text"], "the quick mock");
    assert_eq!(v["usage"]["input_tokens"], 4);
    assert_eq!(v["usage"]["output_tokens"], 3);
    assert_eq!(v["usage"]["total_tokens"], 7);
}

#[tokio::test]
async fn stream_is_the_semantic_events_in_order_ending_with_completed() {
    let mock = start(profile(|p| p.max_output_tokens = 5)).await;
    let body = json!({"model": "m", "input": "Hello there, mock", "stream": true});
    let r = post(&mock, PATH, &body).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let (text, failed) = read_stream(r).await;
    assert!(!failed, "{text}");
    assert!(!text.contains("[DONE]"), "{text}");
    let events = named_events(&text);
    let mut expected = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    expected.extend(["response.output_text.delta"; 5]);
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(names(&events), expected, "{text}");
    for (n, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["type"], name.as_str(), "{data}");
        assert_eq!(data["sequence_number"], n, "{data}");
    }

    let created = &events[0].1["response"];
    assert_eq!(created["status"], "in_progress");
    assert_eq!(created["output"], json!([]));
    assert_eq!(created["usage"], Value::Null);
    let item_id = events[2].1["item"]["id"].as_str().unwrap().to_owned();
    let deltas: String = events[4..9]
        .iter()
        .map(|(_, d)| {
            assert_eq!(d["item_id"], item_id.as_str(), "{d}");
            assert_eq!(
                (&d["output_index"], &d["content_index"]),
                (&json!(0), &json!(0))
            );
            d["delta"].as_str().unwrap()
        })
        .collect();
    assert_eq!(deltas, "the quick mock model writes");
    assert_eq!(events[9].1["text"], deltas.as_str());
    assert_eq!(events[10].1["part"]["text"], deltas.as_str());
    assert_eq!(events[11].1["item"]["status"], "completed");

    let done = &events[12].1["response"];
    assert_eq!(done["id"], created["id"]);
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"][0]["id"], item_id.as_str());
    assert_eq!(done["output"][0]["content"][0]["text"], deltas.as_str());
    assert_eq!(done["usage"]["input_tokens"], 4);
    assert_eq!(done["usage"]["output_tokens"], 5);
    assert_eq!(done["usage"]["total_tokens"], 9);
    let s = mock.stats().await;
    assert_eq!(
        (&s["served"], &s["in_flight"]),
        (&json!(1), &json!(0)),
        "{s}"
    );
}

#[tokio::test]
async fn stream_cut_at_max_output_tokens_completes_with_status_incomplete() {
    let mock = start(profile(|_| {})).await;
    let body = json!({"model": "m", "input": "hi", "stream": true, "max_output_tokens": 2});
    let (text, failed) = read_stream(post(&mock, PATH, &body).await).await;
    assert!(!failed, "{text}");
    let events = named_events(&text);
    assert_eq!(events.len(), 4 + 2 + 4, "{text}");
    let (name, last) = events.last().unwrap();
    assert_eq!(name, "response.completed");
    assert_eq!(last["response"]["status"], "incomplete");
    assert_eq!(
        last["response"]["incomplete_details"]["reason"],
        "max_output_tokens"
    );
    assert_eq!(last["response"]["usage"]["output_tokens"], 2);
    assert_eq!(mock.stats().await["served"], 1);
}

#[tokio::test]
async fn broken_stream_ends_in_a_body_error_without_completed() {
    let mock = start(profile(|p| p.fault.break_stream_after = Some(2))).await;
    let body = json!({"model": "m", "input": "hi", "stream": true, "max_output_tokens": 10});
    let r = post(&mock, PATH, &body).await;
    assert_eq!(r.status(), 200);
    let (text, failed) = read_stream(r).await;
    assert!(failed, "the body must end in an error: {text}");
    let events = named_events(&text);
    // The four opening events and two tokens; break_stream_after counts tokens here.
    assert_eq!(events.len(), 4 + 2, "{text}");
    assert_eq!(events[5].0, "response.output_text.delta");
    assert!(!text.contains("response.completed"), "{text}");
    let s = mock.stats().await;
    assert_eq!(
        (
            &s["streams_broken"],
            &s["served"],
            &s["cancelled"],
            &s["in_flight"]
        ),
        (&json!(1), &json!(0), &json!(0), &json!(0)),
        "{s}"
    );
}

#[tokio::test]
async fn refusals_keep_the_openai_error_shape() {
    let mock = start(profile(|_| {})).await;
    let c = client();
    let url = mock.url(PATH);
    let r = c
        .post(&url)
        .json(&json!({"model": "nope", "input": "x"}))
        .send()
        .await
        .unwrap();
    let headers = expect_openai_error(r, 404, "model_not_found").await;
    assert!(!headers.contains_key("request-id"));
    for bad in [
        json!({"model": "m"}),
        json!({"model": "m", "input": 3}),
        json!({"model": "m", "input": "x", "max_output_tokens": -1}),
        json!({"model": "m", "input": "x", "instructions": {"a": 1}}),
    ] {
        let r = c.post(&url).json(&bad).send().await.unwrap();
        expect_openai_error(r, 400, "invalid_value").await;
    }
    let r = c.post(&url).body("{").send().await.unwrap();
    expect_openai_error(r, 400, "invalid_json").await;
    let s = mock.stats().await;
    assert_eq!(
        (&s["received"], &s["rejected_invalid"]),
        (&json!(6), &json!(6)),
        "{s}"
    );
}
