//! Stored chat completions over HTTP: a chat created with `store: true` (plain or streamed) is
//! listed, retrieved, its messages listed, its metadata updated and deleted; the list's filters
//! and paging; unknown ids; bad queries and bodies; and the checks every stored-state route
//! shares with inference (key, faults, counting, the query remembered).

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use serde_json::{json, Value};
use spillway_testkit::http::{client, expect_openai_error};
use support::*;

const CHATS: &str = "/v1/chat/completions";

/// A chat create with `extra` fields merged in, answered 200.
async fn create(mock: &Mock, extra: Value) -> Value {
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "Hello"}]});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let r = post(mock, CHATS, &body).await;
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

fn ids(list: &Value) -> Vec<String> {
    assert_eq!(list["object"], "list", "{list}");
    list["data"].as_array().unwrap().iter().map(id_of).collect()
}

/// A 404 `not_found` in OpenAI's shape naming `id`.
async fn not_found(r: reqwest::Response, id: &str) {
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v["error"],
        json!({"message": format!("No chat completion found with id '{id}'."),
               "type": "invalid_request_error", "param": null, "code": "not_found"})
    );
}

#[tokio::test]
async fn a_stored_chat_is_listed_retrieved_updated_and_deleted() {
    let mock = start(profile(|p| p.max_output_tokens = 3)).await;
    let messages = json!([
        {"role": "system", "content": "Be brief"},
        {"role": "user", "content": "Hello", "id": "mine"},
        {"role": "user", "content": [{"type": "text", "text": "again"}]},
    ]);
    let body = json!({"store": true, "messages": messages, "metadata": {"team": "a"}});
    let created = create(&mock, body).await;
    let id = id_of(&created);
    assert!(id.starts_with("chatcmpl-"), "{id}");
    let path = format!("{CHATS}/{id}");

    let stored = get_ok(&mock, &path).await;
    assert_eq!(stored["object"], "chat.completion");
    assert_eq!(stored["metadata"], json!({"team": "a"}));
    let mut without_metadata = stored.clone();
    without_metadata.as_object_mut().unwrap().remove("metadata");
    assert_eq!(without_metadata, created);

    let list = get_ok(&mock, CHATS).await;
    assert_eq!(list["data"], json!([stored.clone()]));
    assert_eq!(
        (&list["first_id"], &list["last_id"]),
        (&json!(id), &json!(id))
    );
    assert_eq!(list["has_more"], false);

    let listed = get_ok(&mock, &format!("{path}/messages")).await;
    let expected_ids = [format!("{id}-0"), "mine".to_owned(), format!("{id}-2")];
    assert_eq!(ids(&listed), expected_ids);
    assert_eq!(listed["data"][0]["content"], "Be brief");
    assert_eq!(listed["data"][2]["content"][0]["text"], "again");
    assert_eq!(listed["has_more"], false);
    let q = format!("{path}/messages?order=desc&limit=1&after={id}-2");
    let page = get_ok(&mock, &q).await;
    assert_eq!(ids(&page), ["mine"]);
    assert_eq!(page["has_more"], true);

    let update = json!({"metadata": {"team": "b", "run": "7"}});
    let r = post(&mock, &path, &update).await;
    assert_eq!(r.status(), 200);
    let updated: Value = r.json().await.unwrap();
    assert_eq!(updated["metadata"], update["metadata"]);
    assert_eq!(mock.stats().await["last_request"]["body"], update);
    assert_eq!(updated["choices"], created["choices"]);
    assert_eq!(get_ok(&mock, &path).await, updated);

    let r = client().delete(mock.url(&path)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let deleted: Value = r.json().await.unwrap();
    assert_eq!(
        deleted,
        json!({"object": "chat.completion.deleted", "id": id, "deleted": true})
    );
    not_found(get(&mock, &path).await, &id).await;
    assert!(ids(&get_ok(&mock, CHATS).await).is_empty());

    let s = mock.stats().await;
    // The create, 8 served reads and writes, and the 404.
    assert_eq!(
        (&s["received"], &s["served"], &s["rejected_invalid"]),
        (&json!(10), &json!(9), &json!(1)),
        "{s}"
    );
    assert_eq!(s["by_path"][CHATS], 3, "{s}");
    assert_eq!(s["by_path"]["/v1/chat/completions/{id}"], 5, "{s}");
    assert_eq!(s["by_path"]["/v1/chat/completions/{id}/messages"], 2, "{s}");
    assert_eq!(s["last_request"]["path"], CHATS);
}

#[tokio::test]
async fn a_chat_without_store_true_is_not_stored() {
    let mock = start(profile(|_| {})).await;
    for extra in [json!({}), json!({"store": false}), json!({"store": null})] {
        let created = create(&mock, extra.clone()).await;
        assert!(created.get("metadata").is_none(), "{created}");
        let id = id_of(&created);
        not_found(get(&mock, &format!("{CHATS}/{id}")).await, &id).await;
    }
    // Other surfaces store nothing here either.
    let r = post(
        &mock,
        "/v1/completions",
        &json!({"model": "m", "prompt": "x"}),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert!(ids(&get_ok(&mock, CHATS).await).is_empty());
}

#[tokio::test]
async fn a_streamed_chat_is_stored_once_it_completes() {
    let mock = start(profile(|p| p.max_output_tokens = 3)).await;
    let mut body = chat_body(true, 50);
    body["store"] = true.into();
    body["metadata"] = json!({"k": "v"});
    let (text, failed) = read_stream(chat(&mock, &body).await).await;
    assert!(!failed, "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let first = text.lines().next().unwrap().strip_prefix("data: ").unwrap();
    let chunk: Value = serde_json::from_str(first).unwrap();
    let id = id_of(&chunk);

    let stored = get_ok(&mock, &format!("{CHATS}/{id}")).await;
    assert_eq!(stored["object"], "chat.completion");
    assert_eq!(stored["created"], chunk["created"]);
    assert_eq!(stored["model"], "m");
    assert_eq!(
        stored["choices"][0]["message"],
        json!({"role": "assistant", "content": "the quick mock", "refusal": null})
    );
    assert_eq!(stored["choices"][0]["finish_reason"], "stop");
    assert_eq!(stored["usage"]["completion_tokens"], 3);
    assert_eq!(stored["metadata"], json!({"k": "v"}));
    let listed = get_ok(&mock, &format!("{CHATS}/{id}/messages")).await;
    assert_eq!(ids(&listed), [format!("{id}-0")]);

    // A stream the profile breaks off is never complete, so never stored.
    mock.server
        .set_profile(profile(|p| p.fault.break_stream_after = Some(1)));
    let (text, failed) = read_stream(chat(&mock, &body).await).await;
    assert!(failed, "{text}");
    assert_eq!(ids(&get_ok(&mock, CHATS).await), [id]);
}

#[tokio::test]
async fn the_list_filters_by_model_and_metadata_and_pages() {
    let mock = start(profile(|p| p.models = vec!["m".into(), "n".into()])).await;
    let mut made = Vec::new();
    for i in 0..5 {
        let model = if i == 1 { "n" } else { "m" };
        let team = if i % 2 == 0 { "even" } else { "odd" };
        let extra = json!({"store": true, "model": model,
                           "metadata": {"team": team, "i": i.to_string()}});
        made.push(id_of(&create(&mock, extra).await));
    }
    let list = |q: &str| {
        let path = format!("{CHATS}?{q}");
        let mock = &mock;
        async move { get_ok(mock, &path).await }
    };
    assert_eq!(ids(&list("").await), made);
    let desc = list("order=desc").await;
    let reversed: Vec<String> = made.iter().rev().cloned().collect();
    assert_eq!(ids(&desc), reversed);

    let only_n = list("model=n").await;
    assert_eq!(ids(&only_n), [made[1].clone()]);
    assert_eq!(only_n["data"][0]["model"], "n");
    assert!(ids(&list("model=other").await).is_empty());

    let even = [made[0].clone(), made[2].clone(), made[4].clone()];
    assert_eq!(ids(&list("metadata[team]=even").await), even);
    // Brackets percent-encoded, as a client may send them, and two pairs at once.
    let q = "metadata%5Bteam%5D=even&metadata%5Bi%5D=2";
    assert_eq!(ids(&list(q).await), [made[2].clone()]);
    let q = "metadata[team]=odd&model=m";
    assert_eq!(ids(&list(q).await), [made[3].clone()]);

    let first = list("limit=2").await;
    assert_eq!(ids(&first), made[..2]);
    assert_eq!(first["has_more"], true);
    assert_eq!(first["last_id"], made[1].as_str());
    let next = list(&format!("limit=2&after={}", made[1])).await;
    assert_eq!(ids(&next), made[2..4]);
    assert_eq!(next["has_more"], true);
    let last = list(&format!("limit=2&after={}", made[3])).await;
    assert_eq!(ids(&last), made[4..]);
    assert_eq!(last["has_more"], false);
    let back = list(&format!("order=desc&limit=2&after={}", made[2])).await;
    assert_eq!(ids(&back), [made[1].clone(), made[0].clone()]);
    // Paging a filtered list: the cursor need not be kept by the filter.
    let q = format!("metadata[team]=even&limit=1&after={}", made[1]);
    let page = list(&q).await;
    assert_eq!(ids(&page), [made[2].clone()]);
    assert_eq!(page["has_more"], true);
    assert_eq!(list("limit=100").await["data"].as_array().unwrap().len(), 5);
}

#[tokio::test]
async fn unknown_ids_are_404_on_every_chat_route() {
    let mock = start(profile(|_| {})).await;
    let c = client();
    let base = mock.url(&format!("{CHATS}/chatcmpl-nope"));
    let requests = [
        c.get(&base),
        c.post(&base).json(&json!({"metadata": {"a": "b"}})),
        c.delete(&base),
        c.get(format!("{base}/messages")),
    ];
    for request in requests {
        not_found(request.send().await.unwrap(), "chatcmpl-nope").await;
    }
    // An id that is not text names nothing, and is refused as unreadable.
    let r = get(&mock, &format!("{CHATS}/%FF%FE")).await;
    expect_openai_error(r, 400, "invalid_value").await;
    let s = mock.stats().await;
    assert_eq!(
        (&s["received"], &s["rejected_invalid"], &s["served"]),
        (&json!(5), &json!(5), &json!(0)),
        "{s}"
    );
    assert_eq!(s["by_path"]["/v1/chat/completions/{id}"], 4, "{s}");
}

#[tokio::test]
async fn bad_queries_and_bodies_are_400() {
    let mock = start(profile(|_| {})).await;
    let id = id_of(&create(&mock, json!({"store": true})).await);
    let path = format!("{CHATS}/{id}");
    for q in [
        "limit=0",
        "limit=101",
        "limit=x",
        "order=up",
        "after=chatcmpl-gone",
    ] {
        let r = get(&mock, &format!("{CHATS}?{q}")).await;
        expect_openai_error(r, 400, "invalid_value").await;
        let r = get(&mock, &format!("{path}/messages?{q}")).await;
        expect_openai_error(r, 400, "invalid_value").await;
    }

    for (body, code) in [
        (
            json!({"metadata": {"a": "b"}, "store": true}),
            "unknown_parameter",
        ),
        (json!({"store": true}), "unknown_parameter"),
        (json!({}), "invalid_value"),
        (json!({"metadata": "a=b"}), "invalid_value"),
        (json!({"metadata": {"a": 1}}), "invalid_value"),
        (json!({"metadata": {"k".repeat(65): "v"}}), "invalid_value"),
        (json!([{"metadata": {}}]), "invalid_json"),
    ] {
        let r = post(&mock, &path, &body).await;
        expect_openai_error(r, 400, code).await;
    }
    let r = client()
        .post(mock.url(&path))
        .body("{nope")
        .send()
        .await
        .unwrap();
    expect_openai_error(r, 400, "invalid_json").await;
    // None of these changed it.
    assert_eq!(get_ok(&mock, &path).await["metadata"], json!({}));

    for extra in [
        json!({"store": "yes"}),
        json!({"store": 1}),
        json!({"metadata": ["a"]}),
        json!({"store": false, "metadata": {"a": {"b": "c"}}}),
    ] {
        let mut body = chat_body(false, 1);
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        expect_openai_error(chat(&mock, &body).await, 400, "invalid_value").await;
    }
    assert_eq!(ids(&get_ok(&mock, CHATS).await), [id]);
}

#[tokio::test]
async fn chat_routes_check_the_key_meet_faults_and_remember_the_query() {
    let mock = start_with_key(profile(|_| {}), "k1").await;
    let c = client();
    let r = c
        .post(mock.url(CHATS))
        .bearer_auth("k1")
        .json(&json!({"model": "m", "store": true, "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .unwrap();
    let id = id_of(&r.json::<Value>().await.unwrap());
    let one = mock.url(&format!("{CHATS}/{id}"));
    let all = mock.url(CHATS);
    let messages = format!("{one}/messages");

    for url in [&all, &one, &messages] {
        let r = c.get(url).send().await.unwrap();
        expect_openai_error(r, 401, "missing_api_key").await;
    }
    let r = c
        .post(&one)
        .header("api-key", "k2")
        .json(&json!({"metadata": {}}))
        .send()
        .await
        .unwrap();
    expect_openai_error(r, 401, "invalid_api_key").await;
    let r = c.delete(&one).send().await.unwrap();
    expect_openai_error(r, 401, "missing_api_key").await;
    for (name, value) in [
        ("authorization", "Bearer k1"),
        ("api-key", "k1"),
        ("x-api-key", "k1"),
    ] {
        let r = c.get(&one).header(name, value).send().await.unwrap();
        assert_eq!(r.status(), 200, "{name}");
    }
    let query = "model=m&limit=5&include%5B%5D=x";
    let r = c
        .get(format!("{all}?{query}"))
        .bearer_auth("k1")
        .send()
        .await
        .unwrap();
    assert_eq!(ids(&r.json::<Value>().await.unwrap()), [id.as_str()]);
    let last = &mock.stats().await["last_request"];
    assert_eq!(last["path"], CHATS);
    assert_eq!(last["query"], query);
    assert_eq!(last["auth"], "bearer");

    let mut failing = mock.server.profile();
    failing.fault.error_rate = 1.0;
    failing.fault.error_status = 503;
    mock.server.set_profile(failing);
    let update = json!({"metadata": {"a": "b"}});
    let r = c
        .post(&one)
        .bearer_auth("k1")
        .json(&update)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    // The update's body is remembered, though the fault struck before it was looked at.
    assert_eq!(mock.stats().await["last_request"]["body"], update);
    for r in [
        c.get(&all).bearer_auth("k1").send().await.unwrap(),
        c.get(&one).bearer_auth("k1").send().await.unwrap(),
        c.delete(&one).bearer_auth("k1").send().await.unwrap(),
        c.get(&messages).bearer_auth("k1").send().await.unwrap(),
    ] {
        assert_eq!(r.status(), 503);
    }
    let s = mock.stats().await;
    assert_eq!(
        (&s["errors_injected"], &s["rejected_invalid"], &s["served"]),
        (&json!(5), &json!(5), &json!(5)),
        "{s}"
    );

    // The faults struck before the update and the delete: it is there, unchanged.
    let mut healthy = mock.server.profile();
    healthy.fault.error_rate = 0.0;
    mock.server.set_profile(healthy);
    let r = c.get(&one).bearer_auth("k1").send().await.unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["metadata"], json!({}));
}
