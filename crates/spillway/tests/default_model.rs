//! A tenant's default model: where a Responses API create that names no model goes, set in the
//! config file, the admin API and the CLI, against real mock-backend processes.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use reqwest::Method;
use serde_json::{json, Value};
use spillway_testkit::http::{client, get_json};
use support::*;

const ADMIN_TOKEN: &str = "test-admin-token-0123456789";
const DEFAULTED_KEY: &str = "sk-test-tenant-defaulted";

/// A mock that serves `name` as fast as it can.
fn fast(name: &str) -> Proc {
    mock(&["--model", name, "--ttft", "0ms", "--tokens-per-sec", "0"])
}

/// Models `m` and `n`, one backend each, and tenant `defaulted` whose default is `n`.
fn two_models(m: &Proc, n: &Proc) -> Proc {
    let config = format!(
        "{}{}\n[[tenants]]\nname = \"defaulted\"\nkeys = [{{ sha256 = \"{}\" }}]\n\
         models = [\"m\", \"n\"]\ndefault_model = \"n\"\n",
        model("m", &[("bm", "region-a", m.url("/v1"))]),
        model("n", &[("bn", "region-a", n.url("/v1"))]),
        sha256_hex(DEFAULTED_KEY),
    );
    gateway_with_env(&config, &[("SPILLWAY_ADMIN_TOKEN", ADMIN_TOKEN)])
}

async fn post(gw: &Proc, path: &str, key: &str, body: Value) -> (u16, Option<String>, Value) {
    let r = client()
        .post(gw.url(path))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let answered_by = r
        .headers()
        .get("x-spillway-model")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, answered_by, r.json().await.unwrap())
}

/// The model each mock was last asked for, and how many requests it received.
async fn seen(mocks: &[&Proc]) -> Vec<(Value, u64)> {
    let mut out = Vec::new();
    for m in mocks {
        let stats = get_json(&m.url("/stats")).await;
        out.push((
            stats["last_request"]["model"].clone(),
            stats["received"].as_u64().unwrap(),
        ));
    }
    out
}

/// How many requests each mock received.
async fn received(mocks: &[&Proc]) -> Vec<u64> {
    seen(mocks).await.into_iter().map(|(_, n)| n).collect()
}

fn unnamed() -> Value {
    json!({"input": "Say hello", "max_output_tokens": 4})
}

#[tokio::test]
async fn a_create_without_a_model_goes_to_the_tenants_default_and_the_backend_is_told_it() {
    let (m, n) = (fast("m"), fast("n"));
    let gw = two_models(&m, &n);
    let (status, answered_by, v) = post(&gw, "/v1/responses", DEFAULTED_KEY, unnamed()).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(answered_by.as_deref(), Some("n"));
    assert_eq!(
        v["model"], "n",
        "the body's model as the backend returned it"
    );
    assert_eq!(seen(&[&m, &n]).await, [(Value::Null, 0), (json!("n"), 1)]);

    // A model the caller names still wins.
    let named = json!({"model": "m", "input": "Hi", "max_output_tokens": 4});
    let (status, _, created) = post(&gw, "/v1/responses", DEFAULTED_KEY, named).await;
    assert_eq!(status, 200, "{created}");
    assert_eq!(seen(&[&m]).await, [(json!("m"), 1)]);

    // A continued response goes where it was created, not to the default.
    let next = json!({"previous_response_id": created["id"], "input": "And?"});
    let (status, _, v) = post(&gw, "/v1/responses", DEFAULTED_KEY, next).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(received(&[&m, &n]).await, [2, 1]);

    // Only the Responses API may leave the model out.
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}]});
    let (status, _, v) = post(&gw, "/v1/chat/completions", DEFAULTED_KEY, chat).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(received(&[&m, &n]).await, [2, 1]);
}

#[tokio::test]
async fn without_a_default_a_create_that_names_no_model_is_refused_before_any_backend() {
    let (m, n) = (fast("m"), fast("n"));
    let gw = two_models(&m, &n);
    let (status, _, v) = post(&gw, "/v1/responses", KEY, unnamed()).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("default_model"), "{message}");
    assert_eq!(seen(&[&m, &n]).await, [(Value::Null, 0), (Value::Null, 0)]);
}

#[tokio::test]
async fn the_admin_api_sets_changes_and_clears_a_default_and_it_holds_at_once() {
    let (m, n) = (fast("m"), fast("n"));
    let gw = two_models(&m, &n);
    let admin = |method: Method, path: &str, body: Option<Value>| {
        admin_call(gw.admin_url(path), ADMIN_TOKEN, method, body)
    };
    let r = admin(
        Method::POST,
        "/admin/tenants",
        Some(json!({"name": "made", "allowed_models": ["m"], "default_model": "n"})),
    )
    .await;
    assert_eq!(
        r.status(),
        400,
        "a default the tenant may not use is refused"
    );

    let patch = json!({"default_model": "m"});
    let r = admin(Method::PATCH, "/admin/tenants/defaulted", Some(patch)).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["default_model"], "m", "{v}");
    let (status, answered_by, _) = post(&gw, "/v1/responses", DEFAULTED_KEY, unnamed()).await;
    assert_eq!((status, answered_by.as_deref()), (200, Some("m")));

    let clear = json!({"default_model": null});
    let r = admin(Method::PATCH, "/admin/tenants/defaulted", Some(clear)).await;
    assert_eq!(r.status(), 200);
    let (status, _, v) = post(&gw, "/v1/responses", DEFAULTED_KEY, unnamed()).await;
    assert_eq!(status, 400, "{v}");

    // A default outside the models the tenant may use is refused as naming that model would be.
    let outside = json!({"allowed_models": ["m"]});
    admin(Method::PATCH, "/admin/tenants/defaulted", Some(outside)).await;
    let back = json!({"default_model": "n"});
    admin(Method::PATCH, "/admin/tenants/defaulted", Some(back)).await;
    let (status, _, v) = post(&gw, "/v1/responses", DEFAULTED_KEY, unnamed()).await;
    assert_eq!(status, 403, "{v}");
    assert_eq!(seen(&[&n]).await, [(Value::Null, 0)]);
}

#[tokio::test]
async fn the_cli_sets_a_default_and_a_gateway_then_routes_by_it() {
    let store = TempStore::new("cli-default");
    let url = store.url();
    let (ok, _, err) = cli_at(
        &url,
        &[
            "tenants",
            "add",
            "cli-team",
            "--models",
            "m",
            "--default-model",
            "n",
        ],
    );
    assert!(!ok.success(), "a default outside --models is refused");
    assert!(err.contains("default_model"), "{err}");
    let (ok, out, err) = cli_at(
        &url,
        &["tenants", "add", "cli-team", "--default-model", "n"],
    );
    assert!(ok.success(), "{err}");
    let row = out.lines().find(|l| l.starts_with("cli-team")).unwrap();
    assert!(row.split_whitespace().any(|w| w == "n"), "shown: {out}");
    let (ok, out, err) = cli_at(&url, &["tenants", "show", "cli-team", "--json"]);
    assert!(ok.success(), "{err}");
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["tenant"]["default_model"], "n");
    let (ok, out, err) = cli_at(&url, &["keys", "create", "cli-team", "--json"]);
    assert!(ok.success(), "{err}");
    let secret = serde_json::from_str::<Value>(&out).unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_owned();

    let (m, n) = (fast("m"), fast("n"));
    let gw = gateway(&format!(
        "[store]\nurl = \"{url}\"\n{}{}",
        model("m", &[("bm", "region-a", m.url("/v1"))]),
        model("n", &[("bn", "region-a", n.url("/v1"))]),
    ));
    let (status, answered_by, v) = post(&gw, "/v1/responses", &secret, unnamed()).await;
    assert_eq!((status, answered_by.as_deref()), (200, Some("n")), "{v}");

    // Cleared from the command line; setting and clearing it at once is refused.
    let both = [
        "tenants",
        "update",
        "cli-team",
        "--default-model",
        "m",
        "--clear",
        "default-model",
    ];
    let (ok, _, err) = cli_at(&url, &both);
    assert!(!ok.success());
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains("contradict"), "{err}");
    let clear = [
        "tenants",
        "update",
        "cli-team",
        "--clear",
        "default-model",
        "--clear",
        "rpm",
    ];
    let (ok, _, err) = cli_at(&url, &clear);
    assert!(ok.success(), "{err}");
    let (_, out, _) = cli_at(&url, &["tenants", "show", "cli-team", "--json"]);
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert!(shown["tenant"]["default_model"].is_null(), "{shown}");
}
