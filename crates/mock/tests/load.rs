//! Pace, capacity and cancellation: the behaviour a gateway's timeouts, limits and retries
//! are tested against.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::Value;
use spillway_mock::MockProfile;
use spillway_testkit::eventually;
use spillway_testkit::http::{client, sse_data};
use support::*;

const DEADLINE: Duration = Duration::from_secs(10);

#[tokio::test]
async fn stream_arrives_in_pieces_over_time_and_ends_with_done() {
    // 20 tokens at 20 tokens/s: the last token is due about a second after the first.
    let mock = start(profile(|p| {
        p.tokens_per_sec = 20.0;
        p.max_output_tokens = 20;
    }))
    .await;
    let r = chat(&mock, &chat_body(true, 20)).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let mut stream = r.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    let first_at = Instant::now();
    let first_text = String::from_utf8(first.to_vec()).unwrap();
    let role: Value = serde_json::from_str(sse_data(&first_text)[0]).unwrap();
    assert_eq!(role["object"], "chat.completion.chunk");
    assert_eq!(role["choices"][0]["delta"]["role"], "assistant");
    // The first event is here while the server is still generating this very request.
    let s = mock.stats().await;
    assert_eq!(
        (s["in_flight"].as_u64(), s["served"].as_u64()),
        (Some(1), Some(0)),
        "{s}"
    );

    let mut pieces = 1;
    let mut text = first_text;
    while let Some(chunk) = stream.next().await {
        text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        pieces += 1;
    }
    assert!(
        first_at.elapsed() >= Duration::from_millis(800),
        "{:?}",
        first_at.elapsed()
    );
    assert!(pieces >= 10, "events were buffered into {pieces} reads");
    let events = sse_data(&text);
    assert_eq!(events.len(), 1 + 20 + 1 + 1, "{text}");
    assert_eq!(events.last(), Some(&"[DONE]"));
    let finish: Value = serde_json::from_str(events[21]).unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    eventually(DEADLINE, "the stream counts as served", || async {
        let s = mock.stats().await;
        s["served"] == 1 && s["in_flight"] == 0
    })
    .await;
}

#[tokio::test]
async fn full_queue_answers_429_and_queued_requests_wait_their_turn() {
    // One slot, no queue; a slow stream holds the slot.
    let mock = start(profile(|p| {
        p.capacity = 1;
        p.queue = 0;
        p.tokens_per_sec = 2.0;
    }))
    .await;
    let chat = mock.url("/v1/chat/completions");
    let held = client()
        .post(&chat)
        .json(&chat_body(true, 100))
        .send()
        .await
        .unwrap();
    assert_eq!(held.status(), 200);
    let r = client()
        .post(&chat)
        .json(&chat_body(false, 1))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "queue_full");
    assert_eq!(mock.stats().await["rejected_queue_full"], 1);

    // A queue of one: the next request waits, the one after is refused.
    mock.server.set_profile(MockProfile {
        queue: 1,
        ..mock.server.profile()
    });
    let waiting = tokio::spawn({
        let chat = chat.clone();
        async move {
            client()
                .post(&chat)
                .json(&chat_body(false, 1))
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    eventually(DEADLINE, "one request queued", || async {
        mock.stats().await["queued"] == 1
    })
    .await;
    assert_eq!(
        client()
            .post(&chat)
            .json(&chat_body(false, 1))
            .send()
            .await
            .unwrap()
            .status(),
        429
    );
    // Dropping the held stream frees the slot for the waiting request.
    drop(held);
    assert_eq!(waiting.await.unwrap(), 200);
    let s = mock.stats().await;
    assert_eq!(s["rejected_queue_full"], 2, "{s}");
    assert_eq!(s["queued"], 0, "{s}");
}

#[tokio::test]
async fn raising_capacity_at_run_time_admits_the_queue() {
    let mock = start(profile(|p| {
        p.capacity = 1;
        p.queue = 4;
        p.tokens_per_sec = 2.0;
    }))
    .await;
    let chat = mock.url("/v1/chat/completions");
    let _held = client()
        .post(&chat)
        .json(&chat_body(true, 100))
        .send()
        .await
        .unwrap();
    let waiting = tokio::spawn({
        let chat = chat.clone();
        async move {
            client()
                .post(&chat)
                .json(&chat_body(false, 1))
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    eventually(DEADLINE, "one request queued", || async {
        mock.stats().await["queued"] == 1
    })
    .await;
    let r = client()
        .patch(mock.url("/control"))
        .json(&serde_json::json!({"capacity": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(waiting.await.unwrap(), 200);
}

#[tokio::test]
async fn client_going_away_counts_as_cancelled_and_frees_the_slot() {
    // 100 tokens at 5 tokens/s: twenty seconds, far longer than the test waits.
    let mock = start(profile(|p| {
        p.tokens_per_sec = 5.0;
        p.max_output_tokens = 100;
    }))
    .await;
    let chat = mock.url("/v1/chat/completions");
    let r = client()
        .post(&chat)
        .json(&chat_body(true, 100))
        .send()
        .await
        .unwrap();
    let mut stream = r.bytes_stream();
    stream.next().await.unwrap().unwrap();
    assert_eq!(mock.stats().await["in_flight"], 1);
    drop(stream);
    eventually(
        DEADLINE,
        "the dropped stream counts as cancelled",
        || async {
            let s = mock.stats().await;
            s["cancelled"] == 1 && s["in_flight"] == 0
        },
    )
    .await;

    // Non-streaming too: the client gives up while the server is still generating.
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    assert!(impatient
        .post(&chat)
        .json(&chat_body(false, 100))
        .send()
        .await
        .is_err());
    eventually(
        DEADLINE,
        "the abandoned request counts as cancelled",
        || async {
            let s = mock.stats().await;
            s["cancelled"] == 2 && s["in_flight"] == 0
        },
    )
    .await;
    assert_eq!(mock.stats().await["served"], 0);
}

#[tokio::test]
async fn ttft_delays_the_first_token() {
    let mock = start(profile(|p| p.ttft = Duration::from_millis(200))).await;
    let started = Instant::now();
    let r = chat(&mock, &chat_body(true, 2)).await;
    // Headers come at once; the first event waits for the first token.
    let mut stream = r.bytes_stream();
    stream.next().await.unwrap().unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "{:?}",
        started.elapsed()
    );
}
