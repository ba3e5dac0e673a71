//! Tenants and keys in the store: the admin API and CLI, revocation, disabled tenants, probes
//! that do not depend on the store, and lookups that survive a store outage.

// Tests time real processes and sockets on the system clock (see clippy.toml).
#![allow(clippy::disallowed_methods)]

mod support;

use std::process::Command;
use std::time::Duration;

use spillway_testkit::eventually;
use spillway_testkit::http::{client, get_json};
use support::*;

const ADMIN_TOKEN: &str = "test-admin-token-0123456789";
const FAST: [&str; 6] = ["--model", "m", "--ttft", "0ms", "--tokens-per-sec", "0"];

fn admin_gateway(mock: &Proc, extra: &str) -> Proc {
    gateway_with_env(
        &format!("{extra}\n{}", model("m", &[("b", "r", mock.url("/v1"))])),
        &[("SPILLWAY_ADMIN_TOKEN", ADMIN_TOKEN)],
    )
}

async fn admin(
    gw: &Proc,
    method: reqwest::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> reqwest::Response {
    admin_call(gw.admin_url(path), ADMIN_TOKEN, method, body).await
}

async fn chat_as(gw: &Proc, key: &str) -> reqwest::Response {
    client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(&chat_body("m", false))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn admin_api_creates_tenants_and_keys_and_revocation_is_immediate_here() {
    let mock = mock(&FAST);
    let gw = admin_gateway(&mock, "");
    let post = reqwest::Method::POST;
    let r = admin(
        &gw,
        post.clone(),
        "/admin/tenants",
        Some(serde_json::json!({"name": "team-x", "requests_per_min": 600, "priority": "batch"})),
    )
    .await;
    assert_eq!(r.status(), 201);
    let again = admin(
        &gw,
        post.clone(),
        "/admin/tenants",
        Some(serde_json::json!({"name": "team-x"})),
    )
    .await;
    assert_eq!(again.status(), 409);
    let r = admin(
        &gw,
        post.clone(),
        "/admin/tenants/team-x/keys",
        Some(serde_json::json!({"description": "ci"})),
    )
    .await;
    assert_eq!(r.status(), 201);
    let v: serde_json::Value = r.json().await.unwrap();
    let secret = v["secret"].as_str().unwrap().to_owned();
    let id = v["key"]["id"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("sk-spw-"), "{v}");
    assert!(secret.len() >= 40, "{v}");
    assert_eq!(chat_as(&gw, &secret).await.status(), 200);
    // Listing never shows the secret.
    let list = admin(
        &gw,
        reqwest::Method::GET,
        "/admin/tenants/team-x/keys",
        None,
    )
    .await
    .text()
    .await
    .unwrap();
    assert!(list.contains(&id) && !list.contains(&secret), "{list}");
    // Revoked through this gateway's admin API: refused at once, though the key was cached.
    let r = admin(&gw, post.clone(), &format!("/admin/keys/{id}/revoke"), None).await;
    assert_eq!(r.status(), 200);
    assert_eq!(chat_as(&gw, &secret).await.status(), 401);
    // A disabled tenant's other keys are refused with 403.
    let v: serde_json::Value = admin(&gw, post.clone(), "/admin/tenants/team-x/keys", None)
        .await
        .json()
        .await
        .unwrap();
    let second = v["secret"].as_str().unwrap().to_owned();
    assert_eq!(chat_as(&gw, &second).await.status(), 200);
    assert_eq!(
        admin(&gw, post.clone(), "/admin/tenants/team-x/disable", None)
            .await
            .status(),
        200
    );
    let r = chat_as(&gw, &second).await;
    assert_eq!(r.status(), 403);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "tenant_disabled");
    // Unknown ids and tenants are 404s, bad bodies 400s.
    assert_eq!(
        admin(&gw, post.clone(), "/admin/keys/key_nope/revoke", None)
            .await
            .status(),
        404
    );
    assert_eq!(
        admin(&gw, reqwest::Method::GET, "/admin/tenants/nobody", None)
            .await
            .status(),
        404
    );
    let bad = client()
        .post(gw.admin_url("/admin/tenants"))
        .bearer_auth(ADMIN_TOKEN)
        .body("{nope")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
}

#[tokio::test]
async fn admin_api_needs_its_token_and_is_off_without_one() {
    let mock = mock(&FAST);
    let gw = admin_gateway(&mock, "");
    let c = client();
    let r = c.get(gw.admin_url("/admin/tenants")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let r = c
        .get(gw.admin_url("/admin/tenants"))
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // The admin API is not on the main listener.
    let r = c
        .get(gw.url("/admin/tenants"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let off = gateway(&model("m", &[("b", "r", mock.url("/v1"))]));
    let r = c
        .get(off.admin_url("/admin/tenants"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "admin_api_disabled");
}

#[tokio::test]
async fn cli_manages_the_store_a_gateway_then_serves_from() {
    let mock = mock(&FAST);
    let db = std::env::temp_dir().join(format!("spillway-cli-{}.db", std::process::id()));
    let url = format!("sqlite://{}", db.display());
    let cli = |args: &[&str]| {
        let out = Command::new(bin())
            .args(args)
            .args(["--store", &url])
            .output()
            .unwrap();
        (
            out.status,
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, _, err) = cli(&[
        "tenants", "add", "cli-team", "--rpm", "100", "--models", "m",
    ]);
    assert!(ok.success(), "{err}");
    let (ok, out, err) = cli(&[
        "keys",
        "create",
        "cli-team",
        "--description",
        "from the CLI",
    ]);
    assert!(ok.success(), "{err}");
    let secret = out.trim().to_owned();
    assert!(secret.starts_with("sk-spw-"), "{out}");
    let (_, listed, _) = cli(&["keys", "list", "cli-team"]);
    assert!(
        !listed.contains(&secret) && listed.contains("sk-spw-"),
        "{listed}"
    );
    let (ok, _, err) = cli(&["tenants", "add", "bad name!"]);
    assert!(!ok.success());
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    let gw = gateway(&format!(
        "{}\n[store]\nurl = \"{url}\"\n",
        model("m", &[("b", "r", mock.url("/v1"))])
    ));
    assert_eq!(chat_as(&gw, &secret).await.status(), 200);
    // Config tenants were bootstrapped into the same store.
    let (_, tenants, _) = cli(&["tenants", "list"]);
    assert!(
        tenants.contains("tenant-a") && tenants.contains("cli-team"),
        "{tenants}"
    );
    drop(gw);
    for ext in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{ext}", db.display()));
    }
}

#[tokio::test]
async fn probes_never_depend_on_the_store_and_deps_are_reported_apart() {
    let mock = mock(&FAST);
    let gw = admin_gateway(&mock, "");
    let c = client();
    eventually(Duration::from_secs(5), "ready", || async {
        matches!(c.get(gw.url("/readyz")).send().await, Ok(r) if r.status() == 200)
    })
    .await;
    let deps = get_json(&gw.admin_url("/healthz/deps")).await;
    assert_eq!(deps["store"]["status"], "ok", "{deps}");
    assert!(
        deps["store_pool"]["max_size"].as_u64().unwrap() > 0,
        "{deps}"
    );
    // One lookup, of a key nobody has, so the lookup histogram has a sample.
    assert_eq!(chat_as(&gw, "sk-spw-unknown").await.status(), 401);
    let m = metrics(&gw).await;
    assert!(m.contains("spillway_store_pool_max_connections"), "{m}");
    assert!(
        m.contains("spillway_store_pool_acquire_seconds_count"),
        "{m}"
    );
    assert!(m.contains("spillway_store_queries_total"), "{m}");
    // Lookups have their own, finer buckets (a cache hit takes microseconds).
    assert!(
        m.contains("spillway_key_lookup_seconds_bucket{le=\"0.00005\"}"),
        "{m}"
    );
    // The key cache's size is on the page, set when it is rendered.
    assert!(m.contains("spillway_key_cache_entries{"), "{m}");
}

/// Creates `tenant` through the admin API with `fields` and one key, and returns the key.
async fn tenant_with_key(gw: &Proc, tenant: serde_json::Value) -> String {
    let name = tenant["name"].as_str().unwrap().to_owned();
    let r = admin(gw, reqwest::Method::POST, "/admin/tenants", Some(tenant)).await;
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let path = format!("/admin/tenants/{name}/keys");
    let v: serde_json::Value = admin(gw, reqwest::Method::POST, &path, None)
        .await
        .json()
        .await
        .unwrap();
    v["secret"].as_str().unwrap().to_owned()
}

/// The status and the error body of an admin call that should fail.
async fn admin_error(
    gw: &Proc,
    method: reqwest::Method,
    path: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let r = admin(gw, method, path, Some(body)).await;
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

#[tokio::test]
async fn a_star_in_allowed_models_means_every_model_through_the_admin_api() {
    let mock = mock(&FAST);
    let gw = admin_gateway(&mock, "");
    let created = tenant_with_key(
        &gw,
        serde_json::json!({"name": "star", "allowed_models": ["*"]}),
    )
    .await;
    assert_eq!(chat_as(&gw, &created).await.status(), 200);
    // Changed to "*" from a list that allowed nothing.
    let patched = tenant_with_key(
        &gw,
        serde_json::json!({"name": "star-later", "allowed_models": []}),
    )
    .await;
    assert_eq!(chat_as(&gw, &patched).await.status(), 403);
    let r = admin(
        &gw,
        reqwest::Method::PATCH,
        "/admin/tenants/star-later",
        Some(serde_json::json!({"allowed_models": ["*"]})),
    )
    .await;
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert!(v["allowed_models"].is_null(), "stored as every model: {v}");
    assert_eq!(chat_as(&gw, &patched).await.status(), 200);
}

#[tokio::test]
async fn a_star_in_allowed_models_means_every_model_through_the_cli() {
    let mock = mock(&FAST);
    let store = TempStore::new("cli-star");
    let url = store.url();
    let (ok, out, err) = cli_at(&url, &["tenants", "add", "star", "--models", "*"]);
    assert!(ok.success(), "{err}");
    assert!(out.contains(" all"), "listed as every model: {out}");
    let (ok, out, err) = cli_at(&url, &["keys", "create", "star"]);
    assert!(ok.success(), "{err}");
    let secret = out.trim().to_owned();
    let (ok, _, err) = cli_at(&url, &["tenants", "add", "star-later", "--models", "m2"]);
    assert!(ok.success(), "{err}");
    let (ok, _, err) = cli_at(&url, &["tenants", "update", "star-later", "--models", "*"]);
    assert!(ok.success(), "{err}");
    let (ok, out, err) = cli_at(&url, &["keys", "create", "star-later"]);
    assert!(ok.success(), "{err}");
    let later = out.trim().to_owned();

    let gw = gateway(&format!(
        "{}\n[store]\nurl = \"{url}\"\n",
        model("m", &[("b", "r", mock.url("/v1"))])
    ));
    assert_eq!(chat_as(&gw, &secret).await.status(), 200);
    assert_eq!(chat_as(&gw, &later).await.status(), 200);
}

#[tokio::test]
async fn admin_patch_with_null_clears_a_limit_and_refuses_unknown_fields() {
    let mock = mock(&FAST);
    let gw = admin_gateway(&mock, "");
    let key = tenant_with_key(
        &gw,
        serde_json::json!({"name": "limited", "requests_per_min": 1}),
    )
    .await;
    assert_eq!(chat_as(&gw, &key).await.status(), 200);
    assert_eq!(chat_as(&gw, &key).await.status(), 429);
    let r = admin(
        &gw,
        reqwest::Method::PATCH,
        "/admin/tenants/limited",
        Some(serde_json::json!({"requests_per_min": null})),
    )
    .await;
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert!(v["requests_per_min"].is_null(), "{v}");
    // No limit any more: the minute's one request is long spent, and more pass.
    for _ in 0..3 {
        assert_eq!(chat_as(&gw, &key).await.status(), 200);
    }
    // A misspelt field is refused, naming it, instead of being ignored.
    let (status, v) = admin_error(
        &gw,
        reqwest::Method::PATCH,
        "/admin/tenants/limited",
        serde_json::json!({"requests_per_minute": 5}),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "invalid_request", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("requests_per_minute"), "{message}");
    // A field that has no "none" cannot be cleared.
    let (status, v) = admin_error(
        &gw,
        reqwest::Method::PATCH,
        "/admin/tenants/limited",
        serde_json::json!({"priority": null}),
    )
    .await;
    assert_eq!(status, 400, "{v}");
}

#[tokio::test]
async fn a_limit_of_zero_is_refused_by_the_admin_api_and_the_cli() {
    let mock = mock(&FAST);
    let gw = admin_gateway(&mock, "");
    for field in ["requests_per_min", "tokens_per_min", "max_concurrency"] {
        let (status, v) = admin_error(
            &gw,
            reqwest::Method::POST,
            "/admin/tenants",
            serde_json::json!({"name": "zero", field: 0}),
        )
        .await;
        assert_eq!(status, 400, "{field}: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{message}");
    }
    let r = admin(
        &gw,
        reqwest::Method::POST,
        "/admin/tenants",
        Some(serde_json::json!({"name": "zero"})),
    )
    .await;
    assert_eq!(r.status(), 201);
    let (status, v) = admin_error(
        &gw,
        reqwest::Method::PATCH,
        "/admin/tenants/zero",
        serde_json::json!({"max_concurrency": 0}),
    )
    .await;
    assert_eq!(status, 400, "{v}");

    let store = TempStore::new("cli-zero");
    let url = store.url();
    for flag in ["--rpm", "--tpm", "--max-concurrency"] {
        let (ok, _, err) = cli_at(&url, &["tenants", "add", "zero", flag, "0"]);
        assert!(!ok.success(), "{flag}");
        assert_eq!(err.trim().lines().count(), 1, "{flag}: {err}");
        assert!(err.contains("at least 1"), "{flag}: {err}");
    }
    let (ok, _, err) = cli_at(&url, &["tenants", "add", "zero"]);
    assert!(ok.success(), "{err}");
    let (ok, _, err) = cli_at(&url, &["tenants", "update", "zero", "--rpm", "0"]);
    assert!(!ok.success());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("requests_per_min"), "{err}");
}

#[tokio::test]
async fn a_zero_rate_limit_left_in_the_store_refuses_requests_instead_of_lifting_the_limit() {
    let mock = mock(&FAST);
    let store = TempStore::new("zero-rate");
    let gw = admin_gateway(&mock, &format!("[store]\nurl = \"{}\"\n", store.url()));
    for (field, tenant) in [
        ("requests_per_min", "old-rpm"),
        ("tokens_per_min", "old-tpm"),
    ] {
        let key = tenant_with_key(&gw, serde_json::json!({"name": tenant, field: 1000})).await;
        assert_eq!(chat_as(&gw, &key).await.status(), 200);
        // A record written before the store refused 0, made here behind the store's back.
        let sql = format!("UPDATE tenants SET {field} = 0 WHERE name = '{tenant}'");
        let out = Command::new("sqlite3")
            .arg(&store.0)
            .arg(&sql)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Any change through the admin API drops the tenant's cached answers, so the record
        // is read again.
        let path = format!("/admin/tenants/{tenant}");
        let body = serde_json::json!({"enabled": true});
        let r = admin(&gw, reqwest::Method::PATCH, &path, Some(body)).await;
        assert_eq!(r.status(), 200);
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v[field], 0, "{v}");
        for _ in 0..3 {
            let r = chat_as(&gw, &key).await;
            assert_eq!(r.status(), 429, "{field} = 0 let a request through");
        }
    }
}

#[tokio::test]
async fn expired_keys_and_the_tenant_names_dot_and_dot_dot_are_refused() {
    let mock = mock(&FAST);
    let gw = admin_gateway(&mock, "");
    for name in [".", ".."] {
        let (status, v) = admin_error(
            &gw,
            reqwest::Method::POST,
            "/admin/tenants",
            serde_json::json!({"name": name}),
        )
        .await;
        assert_eq!(status, 400, "{name:?}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("'..'"),
            "{v}"
        );
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    for past in [1, now - 60] {
        let (status, v) = admin_error(
            &gw,
            reqwest::Method::POST,
            "/admin/tenants/tenant-a/keys",
            serde_json::json!({"expires_at": past}),
        )
        .await;
        assert_eq!(status, 400, "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("expires_at"),
            "{v}"
        );
    }
    let r = admin(
        &gw,
        reqwest::Method::POST,
        "/admin/tenants/tenant-a/keys",
        Some(serde_json::json!({"expires_at": now + 3600})),
    )
    .await;
    assert_eq!(r.status(), 201);

    let store = TempStore::new("cli-dots");
    let url = store.url();
    for name in [".", ".."] {
        let (ok, _, err) = cli_at(&url, &["tenants", "add", name]);
        assert!(!ok.success(), "{name:?}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    let (ok, _, err) = cli_at(&url, &["tenants", "add", "dots.ok"]);
    assert!(ok.success(), "{err}");
    let (ok, _, err) = cli_at(&url, &["keys", "create", "dots.ok", "--expires-in", "0s"]);
    assert!(!ok.success());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("expires_at"), "{err}");
}
