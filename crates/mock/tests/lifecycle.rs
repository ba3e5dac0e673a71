//! The Responses API's stored state over HTTP: responses stored by their create, retrieved,
//! cancelled and deleted; their input items; `previous_response_id`; compaction; and the
//! checks every stored-response route shares with inference (key, faults, counting).

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use serde_json::{json, Value};
use spillway_testkit::http::{client, expect_openai_error};
use support::*;

const CREATE: &str = "/v1/responses";

async fn create(mock: &Mock, body: &Value) -> Value {
    let r = post(mock, CREATE, body).await;
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

async fn get(mock: &Mock, path: &str) -> reqwest::Response {
    client().get(mock.url(path)).send().await.unwrap()
}

async fn get_ok(mock: &Mock, path: &str) -> Value {
    let r = get(mock, path).await;
    assert_eq!(r.status(), 200, "GET {path}");
    r.json().await.unwrap()
}

fn id_of(v: &Value) -> String {
    v["id"].as_str().unwrap().to_owned()
}

/// The error body of `r`, checked to be OpenAI's shape with `status` and `code`.
async fn openai_error(r: reqwest::Response, status: u16, code: &str) -> Value {
    assert_eq!(r.status().as_u16(), status);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], code, "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert!(v["error"]["message"].is_string(), "{v}");
    v
}

#[tokio::test]
async fn a_stored_response_is_retrieved_as_created_cancelled_and_deleted() {
    let mock = start(profile(|_| {})).await;
    let created = create(&mock, &json!({"model": "m", "input": "Hello there, mock"})).await;
    let id = id_of(&created);
    assert_eq!(created["store"], true);
    assert_eq!(created["previous_response_id"], Value::Null);
    let path = format!("{CREATE}/{id}");

    assert_eq!(get_ok(&mock, &path).await, created);

    let r = client()
        .post(mock.url(&format!("{path}/cancel")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let cancelled: Value = r.json().await.unwrap();
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(cancelled["output"], created["output"]);
    assert_eq!(get_ok(&mock, &path).await["status"], "cancelled");

    let r = client().delete(mock.url(&path)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let deleted: Value = r.json().await.unwrap();
    assert_eq!(
        deleted,
        json!({"id": id, "object": "response", "deleted": true})
    );
    openai_error(get(&mock, &path).await, 404, "response_not_found").await;
    let again = client().delete(mock.url(&path)).send().await.unwrap();
    openai_error(again, 404, "response_not_found").await;

    let s = mock.stats().await;
    assert_eq!(
        (&s["received"], &s["served"], &s["rejected_invalid"]),
        (&json!(7), &json!(5), &json!(2)),
        "{s}"
    );
    assert_eq!(s["by_path"]["/v1/responses/{id}"], 5, "{s}");
    assert_eq!(s["by_path"]["/v1/responses/{id}/cancel"], 1, "{s}");
    assert_eq!(s["last_request"]["path"], path.as_str());
    assert_eq!(s["last_request"]["body"], Value::Null);
}

#[tokio::test]
async fn input_items_list_the_creates_input_newest_first_by_default() {
    let mock = start(profile(|_| {})).await;
    let input = json!([
        {"role": "user", "content": "first"},
        {"type": "message", "role": "assistant", "id": "msg_given",
         "content": [{"type": "output_text", "text": "second"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "third"}]},
    ]);
    let created = create(&mock, &json!({"model": "m", "input": input})).await;
    let path = format!("{CREATE}/{}/input_items", id_of(&created));

    let asc = get_ok(&mock, &format!("{path}?order=asc")).await;
    assert_eq!(asc["object"], "list");
    assert_eq!(asc["has_more"], false);
    let data = asc["data"].as_array().unwrap();
    let texts: Vec<&str> = data
        .iter()
        .map(|i| i["content"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["first", "second", "third"]);
    for item in data {
        assert_eq!(item["type"], "message", "{item}");
        assert!(item["id"].as_str().unwrap().starts_with("msg_"), "{item}");
    }
    assert_eq!(data[1]["id"], "msg_given");
    assert_eq!(data[0]["content"][0]["type"], "input_text");
    assert_eq!(asc["first_id"], data[0]["id"]);
    assert_eq!(asc["last_id"], data[2]["id"]);

    let desc = get_ok(&mock, &path).await;
    let reversed: Vec<Value> = data.iter().rev().cloned().collect();
    assert_eq!(desc["data"], json!(reversed));
    let page = get_ok(&mock, &format!("{path}?order=asc&limit=1&after=msg_given")).await;
    assert_eq!(page["data"], json!([data[2].clone()]));
    let r = get(&mock, &format!("{path}?limit=0")).await;
    expect_openai_error(r, 400, "invalid_value").await;

    // A string input is one user message.
    let created = create(&mock, &json!({"model": "m", "input": "just this"})).await;
    let items = get_ok(&mock, &format!("{CREATE}/{}/input_items", id_of(&created))).await;
    let data = items["data"].as_array().unwrap();
    assert_eq!(data.len(), 1, "{items}");
    assert_eq!(data[0]["role"], "user");
    assert_eq!(
        data[0]["content"],
        json!([{"type": "input_text", "text": "just this"}])
    );
}

#[tokio::test]
async fn previous_response_id_continues_the_stored_conversation() {
    let mock = start(profile(|_| {})).await;
    // 16 characters: 4 prompt tokens, and the profile's 16 output tokens.
    let first = create(&mock, &json!({"model": "m", "input": "Hello there mock"})).await;
    assert_eq!(first["usage"]["total_tokens"], 20);
    let alone = create(&mock, &json!({"model": "m", "input": "And then?"})).await;
    let alone_tokens = alone["usage"]["input_tokens"].as_u64().unwrap();

    let body = json!({"model": "m", "input": "And then?", "previous_response_id": id_of(&first)});
    let second = create(&mock, &body).await;
    assert_eq!(second["previous_response_id"], id_of(&first).as_str());
    let tokens = second["usage"]["input_tokens"].as_u64().unwrap();
    assert_eq!(tokens, alone_tokens + 20, "{second}");

    // The model may be left out; the earlier response's serves.
    let body = json!({"input": "More", "previous_response_id": id_of(&second)});
    let third = create(&mock, &body).await;
    assert_eq!(third["model"], "m");
    assert_eq!(third["previous_response_id"], id_of(&second).as_str());
    let second_total = second["usage"]["total_tokens"].as_u64().unwrap();
    assert_eq!(third["usage"]["input_tokens"], second_total + 1, "{third}");
    assert_eq!(
        get_ok(&mock, &format!("{CREATE}/{}", id_of(&third))).await,
        third
    );

    for body in [
        json!({"model": "m", "input": "x", "previous_response_id": "resp_unknown"}),
        json!({"input": "x", "previous_response_id": "resp_unknown"}),
    ] {
        let v = openai_error(
            post(&mock, CREATE, &body).await,
            400,
            "previous_response_not_found",
        )
        .await;
        assert_eq!(v["error"]["param"], "previous_response_id");
        assert_eq!(
            v["error"]["message"],
            "Previous response with id 'resp_unknown' not found."
        );
    }
    // Neither a model nor a stored response: `model` is still required.
    let v = openai_error(
        post(&mock, CREATE, &json!({"input": "x"})).await,
        400,
        "invalid_value",
    )
    .await;
    assert_eq!(v["error"]["param"], "model");
    let s = mock.stats().await;
    assert_eq!(
        (&s["served"], &s["rejected_invalid"]),
        (&json!(5), &json!(3))
    );
}

#[tokio::test]
async fn a_stream_is_stored_once_it_completes_and_store_false_is_not() {
    let mock = start(profile(|p| p.max_output_tokens = 3)).await;
    let body = json!({"model": "m", "input": "Hello", "stream": true});
    let (text, failed) = read_stream(post(&mock, CREATE, &body).await).await;
    assert!(!failed, "{text}");
    let events = named_events(&text);
    let (name, last) = events.last().unwrap();
    assert_eq!(name, "response.completed");
    let completed = &last["response"];
    let stored = get_ok(&mock, &format!("{CREATE}/{}", id_of(completed))).await;
    assert_eq!(&stored, completed);
    assert_eq!(stored["status"], "completed");
    assert_eq!(stored["output"][0]["content"][0]["text"], "the quick mock");

    for stream in [false, true] {
        let body = json!({"model": "m", "input": "Hello", "stream": stream, "store": false});
        let r = post(&mock, CREATE, &body).await;
        assert_eq!(r.status(), 200);
        let id = if stream {
            let (text, _) = read_stream(r).await;
            let events = named_events(&text);
            assert_eq!(events[0].1["response"]["store"], false);
            id_of(&events[0].1["response"])
        } else {
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["store"], false);
            id_of(&v)
        };
        let r = get(&mock, &format!("{CREATE}/{id}")).await;
        openai_error(r, 404, "response_not_found").await;
    }
}

#[tokio::test]
async fn a_broken_stream_is_not_stored() {
    let mock = start(profile(|p| p.fault.break_stream_after = Some(1))).await;
    let body = json!({"model": "m", "input": "Hello", "stream": true});
    let (text, failed) = read_stream(post(&mock, CREATE, &body).await).await;
    assert!(failed, "{text}");
    let events = named_events(&text);
    let id = id_of(&events[0].1["response"]);
    let r = get(&mock, &format!("{CREATE}/{id}")).await;
    openai_error(r, 404, "response_not_found").await;
}

#[tokio::test]
async fn compact_answers_one_compaction_item_with_usage() {
    let mock = start(profile(|_| {})).await;
    let path = "/v1/responses/compact";
    // 40 characters: 10 prompt tokens, compacted to a quarter of them.
    let r = post(&mock, path, &json!({"model": "m", "input": "x".repeat(40)})).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let id = id_of(&v);
    assert!(
        id.strip_prefix("cmp_").is_some_and(|h| h.len() == 32),
        "{id}"
    );
    assert_eq!(v["object"], "response.compaction");
    assert!(v["created_at"].as_u64().unwrap() > 1_600_000_000);
    let output = v["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{v}");
    assert_eq!(output[0]["type"], "compaction");
    assert!(output[0]["id"].as_str().unwrap().starts_with("cmp_item_"));
    let opaque = output[0]["encrypted_content"].as_str().unwrap();
    assert!(
        !opaque.is_empty()
            && opaque
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b)),
        "{opaque}"
    );
    assert_eq!(v["usage"]["input_tokens"], 10);
    assert_eq!(v["usage"]["output_tokens"], 2);
    assert_eq!(v["usage"]["total_tokens"], 12);

    // A stored conversation alone, with the model taken from it.
    let first = create(&mock, &json!({"model": "m", "input": "Hello there mock"})).await;
    let body = json!({"previous_response_id": id_of(&first)});
    let v: Value = post(&mock, path, &body).await.json().await.unwrap();
    assert_eq!(v["usage"]["input_tokens"], 20, "{v}");

    let unknown = json!({"model": "m", "input": "x", "previous_response_id": "resp_gone"});
    let r = post(&mock, path, &unknown).await;
    openai_error(r, 400, "previous_response_not_found").await;
    let r = post(&mock, path, &json!({"model": "m"})).await;
    expect_openai_error(r, 400, "invalid_value").await;
    let r = post(&mock, path, &json!({"model": "nope", "input": "x"})).await;
    expect_openai_error(r, 404, "model_not_found").await;
    let r = post(&mock, path, &json!({"input": "x"})).await;
    expect_openai_error(r, 400, "invalid_value").await;
    let s = mock.stats().await;
    assert_eq!(s["by_path"][path], 6, "{s}");
    assert_eq!(
        (&s["served"], &s["rejected_invalid"]),
        (&json!(3), &json!(4))
    );
    assert_eq!(s["in_flight"], 0);
}

#[tokio::test]
async fn unknown_ids_are_404_on_every_stored_response_route() {
    let mock = start(profile(|_| {})).await;
    let c = client();
    let base = mock.url("/v1/responses/resp_nope");
    let requests = [
        c.get(&base),
        c.delete(&base),
        c.post(format!("{base}/cancel")),
        c.get(format!("{base}/input_items")),
        c.get(mock.url("/v1/responses/%FF%FE")),
    ];
    for (i, request) in requests.into_iter().enumerate() {
        let r = request.send().await.unwrap();
        if i == 4 {
            // An id that is not text names nothing, and is refused as unreadable.
            expect_openai_error(r, 400, "invalid_value").await;
        } else {
            let v = openai_error(r, 404, "response_not_found").await;
            assert_eq!(
                v["error"]["message"],
                "Response with id 'resp_nope' not found."
            );
        }
    }
    let s = mock.stats().await;
    assert_eq!(
        (&s["received"], &s["rejected_invalid"], &s["served"]),
        (&json!(5), &json!(5), &json!(0)),
        "{s}"
    );
    assert_eq!(s["by_path"]["/v1/responses/{id}/input_items"], 1, "{s}");
}

#[tokio::test]
async fn stored_response_routes_check_the_key_and_meet_the_profiles_faults() {
    let mock = start_with_key(profile(|_| {}), "k1").await;
    let c = client();
    let r = c
        .post(mock.url(CREATE))
        .bearer_auth("k1")
        .json(&json!({"model": "m", "input": "hi"}))
        .send()
        .await
        .unwrap();
    let id = id_of(&r.json::<Value>().await.unwrap());
    let url = mock.url(&format!("{CREATE}/{id}"));

    let r = c.get(&url).send().await.unwrap();
    expect_openai_error(r, 401, "missing_api_key").await;
    let r = c.get(&url).header("x-api-key", "k2").send().await.unwrap();
    expect_openai_error(r, 401, "invalid_api_key").await;
    for (name, value) in [
        ("authorization", "Bearer k1"),
        ("api-key", "k1"),
        ("x-api-key", "k1"),
    ] {
        let r = c.get(&url).header(name, value).send().await.unwrap();
        assert_eq!(r.status(), 200, "{name}");
    }

    let mut failing = mock.server.profile();
    failing.fault.error_rate = 1.0;
    failing.fault.error_status = 503;
    mock.server.set_profile(failing);
    for r in [
        c.get(&url).bearer_auth("k1").send().await.unwrap(),
        c.delete(&url).bearer_auth("k1").send().await.unwrap(),
        c.post(format!("{url}/cancel"))
            .bearer_auth("k1")
            .send()
            .await
            .unwrap(),
    ] {
        assert_eq!(r.status(), 503);
    }
    let s = mock.stats().await;
    assert_eq!(
        (&s["errors_injected"], &s["rejected_invalid"], &s["served"]),
        (&json!(3), &json!(2), &json!(4)),
        "{s}"
    );
    // The faults struck before the delete: the response is still there.
    let mut healthy = mock.server.profile();
    healthy.fault.error_rate = 0.0;
    mock.server.set_profile(healthy);
    let r = c.get(&url).bearer_auth("k1").send().await.unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["status"], "completed");
}

#[tokio::test]
async fn the_query_is_accepted_and_remembered() {
    let mock = start(profile(|_| {})).await;
    let created = create(&mock, &json!({"model": "m", "input": "hi"})).await;
    let path = format!("{CREATE}/{}", id_of(&created));
    let query = "include%5B%5D=message.output_text.logprobs&include[]=reasoning.encrypted_content";
    let v = get_ok(&mock, &format!("{path}?{query}")).await;
    assert_eq!(v, created);
    let last = &mock.stats().await["last_request"];
    assert_eq!(last["path"], path.as_str());
    assert_eq!(last["query"], query);
    assert_eq!(last["model"], Value::Null);
}
