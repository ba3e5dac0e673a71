use super::*;

fn problems(toml: &str) -> Vec<Problem> {
    match Config::from_toml(toml) {
        Err(ConfigError::Invalid(p)) => p,
        other => panic!("expected validation problems, got {other:?}"),
    }
}

const MINIMAL: &str = r#"
[[tenants]]
name = "t"
keys = [{ env = "T_KEY" }]
[[models]]
name = "m"
[[models.backends]]
name = "b"
url = "http://127.0.0.1:8000/v1"
"#;

#[test]
fn quickstart_is_valid_and_has_two_regions() {
    let c = Config::quickstart();
    let m = c.model("mock-small").unwrap();
    let regions: Vec<_> = m.backends.iter().map(|b| b.region.as_str()).collect();
    assert_eq!(regions, ["region-a", "region-b"]);
    assert!(matches!(&m.backends[0].kind, BackendKind::Mock(p) if p.models == ["mock-small"]));
    assert_eq!(
        c.tenants[0].keys,
        [KeySource::Sha256(key_digest(QUICKSTART_KEY))]
    );
}

#[test]
fn minimal_config_takes_documented_defaults() {
    let c = Config::from_toml(MINIMAL).unwrap();
    assert_eq!(c.server.listen, "127.0.0.1:8080".parse().unwrap());
    assert_eq!(c.server.admin_listen, "127.0.0.1:9090".parse().unwrap());
    assert_eq!(c.server.max_body_bytes, 8 * 1024 * 1024);
    assert_eq!(c.upstream.connect_timeout, Duration::from_secs(2));
    let b = &c.models[0].backends[0];
    assert_eq!(
        (b.weight, b.max_concurrency, b.region.as_str()),
        (1, 256, "default")
    );
    assert_eq!(b.upstream_model, "m");
    assert_eq!(b.kind.as_str(), "openai");
    assert!(c.tenants[0].allowed_models.is_none());
}

#[test]
fn unknown_key_is_a_parse_error_with_its_line() {
    let err =
        Config::from_toml("[server]\nlisten = \"127.0.0.1:1\"\nlisten_typo = 1\n").unwrap_err();
    let ConfigError::Parse(errors) = err else {
        panic!("{err:?}")
    };
    let msg = errors.join("\n");
    assert!(
        msg.contains("listen_typo") && msg.contains("line 3"),
        "{msg}"
    );
}

#[test]
fn every_problem_is_reported_with_its_location() {
    let p = problems(
        r#"
[server]
listen = "nope"
max_body_bytes = 0
worker_threads = 0
home_region = "mars"
[[tenants]]
name = "t"
keys = [{ sha256 = "abc" }, { sha256 = "00", env = "X" }]
models = ["m", "ghost"]
[[models]]
name = "m"
[[models.backends]]
name = "b"
kind = "azure"
url = "ftp://x"
weight = 0
[[models.backends]]
name = "b"
kind = "mock"
url = "http://127.0.0.1:1"
mock = { fault = { error_rate = 2.0 } }
"#,
    );
    let text: Vec<String> = p.iter().map(|p| p.to_string()).collect();
    let expect = [
        "server.listen: \"nope\" is not an IP:port address",
        "server.max_body_bytes: must be between 1",
        "server.worker_threads: must be between 1 and 1024, got 0",
        "server.home_region: no backend is in region \"mars\"",
        "models[\"m\"].backends[0] (\"b\").url: \"ftp://x\" is not an http(s) URL",
        "models[\"m\"].backends[0] (\"b\").api_version: is required",
        "models[\"m\"].backends[0] (\"b\").weight: must be between 1 and 1000",
        "models[\"m\"].backends[1].name: backend \"b\" is declared twice",
        "models[\"m\"].backends[1] (\"b\").url: a mock backend runs in-process",
        "models[\"m\"].backends[1] (\"b\").mock.fault.error_rate: must be between 0 and 1",
        "tenants[0] (\"t\").keys[0].sha256: must be 64 hex digits",
        "tenants[0] (\"t\").keys[1]: give exactly one of sha256 or env",
        "tenants[0] (\"t\").models[1]: unknown model \"ghost\"",
    ];
    for e in expect {
        assert!(
            text.iter().any(|t| t.starts_with(e)),
            "missing {e:?} in {text:#?}"
        );
    }
}

#[test]
fn empty_config_names_what_is_missing() {
    let text: Vec<String> = problems("").iter().map(|p| p.to_string()).collect();
    assert!(
        text.iter().any(|t| t.starts_with("models: no models")),
        "{text:?}"
    );
    // Tenants may live in the store alone: none in the file is fine.
    assert!(!text.iter().any(|t| t.starts_with("tenants")), "{text:?}");
}

#[test]
fn azure_deployment_defaults_to_upstream_model() {
    let c = Config::from_toml(&MINIMAL.replace(
        "url = \"http://127.0.0.1:8000/v1\"",
        "kind = \"azure\"\nurl = \"https://r.openai.azure.com\"\napi_version = \"2024-10-21\"\nupstream_model = \"gpt-4o\"\napi_key_env = \"AZ_KEY\"",
    ))
    .unwrap();
    match &c.models[0].backends[0].kind {
        BackendKind::Azure {
            deployment,
            api_version,
            ..
        } => {
            assert_eq!(
                (deployment.as_str(), api_version.as_str()),
                ("gpt-4o", "2024-10-21")
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn same_address_for_both_listeners_is_refused() {
    let p = problems(&format!(
        "[server]\nlisten = \"127.0.0.1:7000\"\nadmin_listen = \"127.0.0.1:7000\"\n{MINIMAL}"
    ));
    assert!(
        p.iter().any(|p| p.location == "server.admin_listen"),
        "{p:?}"
    );
}

#[test]
fn wildcard_model_list_allows_everything() {
    let c = Config::from_toml(&MINIMAL.replace("keys = [", "models = [\"*\"]\nkeys = [")).unwrap();
    assert!(c.tenants[0].allowed_models.is_none());
}

#[test]
fn resilience_sections_take_documented_defaults() {
    let c = Config::from_toml(MINIMAL).unwrap();
    assert_eq!(c.retry.policy, RetryPolicy::default());
    assert_eq!(c.retry.policy.max_attempts, 3);
    assert_eq!(c.retry.budget, BudgetConfig::default());
    assert_eq!(c.retry.deadline, Duration::from_secs(300));
    assert_eq!(c.retry.client_retry_headers, ["x-stainless-retry-count"]);
    assert!(c.retry.shed_client_retries && c.retry.discourage_caller_retries);
    assert!(c.outlier.enabled && c.health_check.enabled && c.adaptive_concurrency.enabled);
    assert_eq!(c.outlier.detector, OutlierConfig::default());
    assert_eq!(c.health_check.interval, Duration::from_secs(2));
    assert_eq!(c.health_check.timeout, Duration::from_secs(1));
    assert_eq!(c.adaptive_concurrency.recovery, Duration::from_secs(1));
    let b = &c.models[0].backends[0];
    assert_eq!(b.rules, Rules::default());
    assert_eq!(b.health_path.as_deref(), Some("/models"));
}

#[test]
fn naive_retries_are_settings_of_a_gateway_without_protections() {
    let c = Config::from_toml(&format!(
        "{MINIMAL}
[retry]
naive = true
max_attempts = 5
"
    ))
    .unwrap();
    assert_eq!(c.retry.policy, RetryPolicy::naive(5));
    assert!(!c.retry.policy.honour_pushback);
    assert_eq!(c.retry.budget, BudgetConfig::unlimited());
    assert!(!c.retry.shed_client_retries && !c.retry.discourage_caller_retries);
    assert!(c.retry.throttle.is_none());
    assert!(!c.outlier.enabled && !c.health_check.enabled && !c.adaptive_concurrency.enabled);
    assert!(c
        .models
        .iter()
        .flat_map(|m| &m.backends)
        .all(|b| b.rules == Rules::naive()));
}

#[test]
fn resilience_problems_are_reported_with_their_location() {
    let toml = format!(
        "[retry]\nmax_attempts = 9\nbudget_ratio = 2.0\ntransient_backoff_base = \"1s\"\ntransient_backoff_cap = \"10ms\"\nclient_retry_headers = [\"bad header\"{}]\n\
         [outlier]\nmax_ejection = \"1s\"\nbase_ejection = \"2s\"\npanic_threshold = -1.0\n\
         [health_check]\ninterval = \"1s\"\ntimeout = \"2s\"\n\
         [adaptive_concurrency]\nbackoff_ratio = 1.5\n{}",
        (1..17).map(|i| format!(", \"x-retry-{i}\"")).collect::<String>(),
        MINIMAL.replace(
            "url = \"http://127.0.0.1:8000/v1\"",
            "url = \"http://127.0.0.1:8000/v1\"\ncapacity_statuses = [200]\nhealth_path = \"models\"",
        )
    );
    let text: Vec<String> = problems(&toml).iter().map(|p| p.to_string()).collect();
    for e in [
        "retry.max_attempts: must be between 1 and 5, got 9",
        "retry.budget_ratio: must be between 0 and 1",
        "retry.transient_backoff_cap: must not be less than retry.transient_backoff_base",
        "retry.client_retry_headers[0]: \"bad header\" is not a header name",
        "retry.client_retry_headers: at most 16 names, got 17",
        "outlier.max_ejection: must not be less than outlier.base_ejection",
        "outlier.panic_threshold: must be between 0 and 1",
        "health_check.timeout: must not be longer than health_check.interval",
        "adaptive_concurrency.backoff_ratio: must be at least 0.1 and less than 1",
        "models[\"m\"].backends[0] (\"b\").capacity_statuses: 200 is not an error status",
        "models[\"m\"].backends[0] (\"b\").health_path: must start with /",
    ] {
        assert!(
            text.iter().any(|t| t.starts_with(e)),
            "missing {e:?} in {text:#?}"
        );
    }
}

#[test]
fn balance_takes_documented_defaults() {
    let c = Config::from_toml(MINIMAL).unwrap();
    let b = &c.models[0].balance;
    assert_eq!(b.strategy, Balance::LeastLoad);
    assert_eq!(b.prefix_chars, 1024);
    assert_eq!(b.load_factor, 1.25);
    assert_eq!(b.session_header.as_str(), "x-session-id");
    assert!(!b.session_from_user);
    assert_eq!(c.server.priority_header.as_str(), "x-spillway-priority");
    assert!(!c.models[0].backends[0].forward_priority);
    let toml = MINIMAL.replace(
        "name = \"m\"\n",
        "name = \"m\"\nbalance = \"prefix_affinity\"\naffinity_prefix_chars = 64\naffinity_load_factor = 2.0\nsession_header = \"x-conversation\"\nsession_from_user = true\n",
    );
    let b = Config::from_toml(&toml).unwrap().models[0].balance.clone();
    assert_eq!(
        (
            b.strategy,
            b.prefix_chars,
            b.load_factor,
            b.session_from_user
        ),
        (Balance::PrefixAffinity, 64, 2.0, true)
    );
    assert_eq!(b.session_header.as_str(), "x-conversation");
}

#[test]
fn balance_problems_are_reported_with_their_location() {
    let toml = MINIMAL.replace(
        "name = \"m\"\n",
        "name = \"m\"\nbalance = \"random\"\naffinity_prefix_chars = 0\naffinity_load_factor = 0.5\nsession_header = \"bad header\"\n",
    );
    let found: Vec<String> = problems(&toml).iter().map(|p| p.location.clone()).collect();
    for at in [
        "models[\"m\"].balance",
        "models[\"m\"].affinity_prefix_chars",
        "models[\"m\"].affinity_load_factor",
        "models[\"m\"].session_header",
    ] {
        assert!(found.iter().any(|f| f == at), "{at} not in {found:?}");
    }
}

#[test]
fn engine_settings_take_documented_defaults() {
    let c = Config::from_toml(MINIMAL).unwrap();
    let e = &c.engine_metrics;
    assert_eq!(e.interval, Duration::from_millis(250));
    assert_eq!(e.jitter, 0.2);
    assert_eq!(e.timeout, Duration::from_secs(1));
    assert_eq!(e.stale_after, Duration::from_secs(2));
    assert_eq!(e.max_body_bytes, 4 * 1024 * 1024);
    assert_eq!((e.max_queue, e.max_kv_usage), (2, 0.95));
    let b = &c.models[0].backends[0];
    assert_eq!(b.engine, Engine::Auto);
    assert_eq!(
        b.metrics_url.as_ref().map(|u| u.to_string()).as_deref(),
        Some("http://127.0.0.1:8000/metrics")
    );
}

#[test]
fn engine_defaults_by_kind_and_explicit_choices() {
    let c = Config::from_toml(
        r#"
[[models]]
name = "m"
[[models.backends]]
name = "az"
kind = "azure"
url = "https://r.openai.azure.com"
api_version = "2024-10-21"
[[models.backends]]
name = "mock"
kind = "mock"
[[models.backends]]
name = "llama"
url = "https://llama.internal:8443/v1"
engine = "llamacpp"
[[models.backends]]
name = "vllm"
url = "http://vllm:8000/v1"
engine = "vllm"
metrics_url = "http://vllm-sidecar:9400/metrics"
[[models.backends]]
name = "off"
url = "http://off:8000/v1"
engine = "none"
"#,
    )
    .unwrap();
    let got: Vec<(&str, Option<String>)> = c.models[0]
        .backends
        .iter()
        .map(|b| {
            (
                b.engine.as_str(),
                b.metrics_url.as_ref().map(|u| u.to_string()),
            )
        })
        .collect();
    let url = |s: &str| Some(s.to_owned());
    assert_eq!(
        got,
        [
            ("none", None),
            // Resolved from the in-process mock's address once it listens.
            ("auto", None),
            ("llamacpp", url("https://llama.internal:8443/metrics")),
            ("vllm", url("http://vllm-sidecar:9400/metrics")),
            ("none", None),
        ]
    );
}

#[test]
fn default_metrics_url_keeps_scheme_and_authority_only() {
    let base: http::Uri = "http://h:8000/v1".parse().unwrap();
    assert_eq!(
        default_metrics_url(&base).unwrap().to_string(),
        "http://h:8000/metrics"
    );
    let base: http::Uri = "https://user@h/openai/v1?x=1".parse().unwrap();
    assert_eq!(
        default_metrics_url(&base).unwrap().to_string(),
        "https://user@h/metrics"
    );
}

#[test]
fn engine_problems_are_reported_with_their_location() {
    let toml = format!(
        "[engine_metrics]\ninterval = \"0s\"\njitter = 1.5\ntimeout = \"3s\"\nstale_after = \"2s\"\n\
         max_body_bytes = 0\nmax_kv_usage = 2.0\n{}\n{}",
        MINIMAL.replace(
            "url = \"http://127.0.0.1:8000/v1\"",
            "url = \"http://127.0.0.1:8000/v1\"\nengine = \"ollama\"\nmetrics_url = \"ftp://x/metrics\"",
        ),
        r#"[[models.backends]]
name = "az"
kind = "azure"
url = "https://r.openai.azure.com"
api_version = "2024-10-21"
metrics_url = "https://r.openai.azure.com/metrics"
"#
    );
    let text: Vec<String> = problems(&toml).iter().map(|p| p.to_string()).collect();
    for e in [
        "engine_metrics.interval: must be greater than zero",
        "engine_metrics.jitter: must be between 0 and 1, got 1.5",
        "engine_metrics.stale_after: must be longer than engine_metrics.timeout (3s)",
        "engine_metrics.max_body_bytes: must be between 1 and 67108864, got 0",
        "engine_metrics.max_kv_usage: must be between 0 and 1, got 2",
        "models[\"m\"].backends[0] (\"b\").engine: unknown engine \"ollama\": expected \"vllm\", \"sglang\", \"llamacpp\", \"tgi\", \"auto\" or \"none\"",
        "models[\"m\"].backends[0] (\"b\").metrics_url: \"ftp://x/metrics\" is not an http(s) URL",
        "models[\"m\"].backends[1] (\"az\").metrics_url: is not scraped when engine is \"none\"",
    ] {
        assert!(
            text.iter().any(|t| t.starts_with(e)),
            "missing {e:?} in {text:#?}"
        );
    }
}

#[test]
fn stale_after_must_exceed_the_interval() {
    let p = problems(&format!(
        "[engine_metrics]\ninterval = \"2s\"\ntimeout = \"500ms\"\n{MINIMAL}"
    ));
    let text: Vec<String> = p.iter().map(|p| p.to_string()).collect();
    assert_eq!(
        text,
        ["engine_metrics.stale_after: must be longer than engine_metrics.interval (2s)"]
    );
}

#[test]
fn engine_metrics_section_rejects_unknown_keys() {
    let err =
        Config::from_toml(&format!("[engine_metrics]\nintervall = \"1s\"\n{MINIMAL}")).unwrap_err();
    assert!(
        matches!(&err, ConfigError::Parse(m) if m.iter().any(|m| m.contains("intervall"))),
        "{err:?}"
    );
}

#[test]
fn throttling_takes_documented_defaults_and_can_be_turned_off() {
    let c = Config::from_toml(MINIMAL).unwrap();
    assert_eq!(c.retry.throttle, Some(ThrottleConfig::default()));
    let t = ThrottleConfig::default();
    assert_eq!((t.k, t.window, t.probes), (2.0, Duration::from_secs(1), 5));
    let off = Config::from_toml(&format!("[retry]\nthrottle_k = 0\n{MINIMAL}")).unwrap();
    assert_eq!(off.retry.throttle, None);
    let text: Vec<String> = problems(&format!("[retry]\nthrottle_k = 0.5\n{MINIMAL}"))
        .iter()
        .map(|p| p.to_string())
        .collect();
    assert!(
        text.iter()
            .any(|t| t.starts_with("retry.throttle_k: must be 0 (off) or between 1 and 100")),
        "{text:?}"
    );
}

#[test]
fn tenant_names_and_zero_limits_are_refused_as_the_store_would() {
    let p = problems(
        r#"
[[tenants]]
name = "."
[[tenants]]
name = ".."
[[tenants]]
name = "a b"
[[tenants]]
name = "zero"
requests_per_min = 0
tokens_per_min = 0
max_concurrency = 0
[[models]]
name = "m"
[[models.backends]]
name = "b"
url = "http://127.0.0.1:1/v1"
"#,
    );
    let text: Vec<String> = p.iter().map(|p| p.to_string()).collect();
    let expect = [
        "tenants[0] (\".\").name: '.' and '..' are not names",
        "tenants[1] (\"..\").name: '.' and '..' are not names",
        "tenants[2] (\"a b\").name: use 1 to 64 characters",
        "tenants[3] (\"zero\").requests_per_min: must be at least 1",
        "tenants[3] (\"zero\").tokens_per_min: must be at least 1",
        "tenants[3] (\"zero\").max_concurrency: must be at least 1",
    ];
    for e in expect {
        assert!(
            text.iter().any(|t| t.starts_with(e)),
            "missing {e:?} in {text:#?}"
        );
    }
}

#[test]
fn an_absent_cache_table_is_the_one_default_and_the_spread_follows_the_ttl() {
    let c = Config::from_toml(MINIMAL).unwrap();
    assert_eq!(c.cache, CacheConfig::default());
    let c = Config::from_toml(&format!("{MINIMAL}\n[cache]\nttl = \"2m\"\n")).unwrap();
    assert_eq!(c.cache.ttl, Duration::from_secs(120));
    assert_eq!(c.cache.flush_spread, Duration::from_secs(120));
}

#[test]
fn a_tenants_priority_is_read_in_its_lowercase_spelling_or_refused_with_its_location() {
    let c = Config::from_toml(MINIMAL).unwrap();
    assert_eq!(c.tenants[0].priority, spillway_policy::Priority::Standard);
    let batch = MINIMAL.replace("keys = [", "priority = \"batch\"\nkeys = [");
    let c = Config::from_toml(&batch).unwrap();
    assert_eq!(c.tenants[0].priority, spillway_policy::Priority::Batch);
    let p = problems(&MINIMAL.replace("keys = [", "priority = \"Critical\"\nkeys = ["));
    let text: Vec<String> = p.iter().map(|p| p.to_string()).collect();
    assert_eq!(
        text,
        ["tenants[0] (\"t\").priority: \"Critical\": expected critical, standard or batch"]
    );
}

#[test]
fn a_tenants_default_model_is_one_it_may_use() {
    let c = Config::from_toml(MINIMAL).unwrap();
    assert_eq!(c.tenants[0].default_model, None);
    let with = MINIMAL.replace("keys = [", "default_model = \"m\"\nkeys = [");
    let c = Config::from_toml(&with).unwrap();
    assert_eq!(c.tenants[0].default_model.as_deref(), Some("m"));
    let unknown = MINIMAL.replace("keys = [", "default_model = \"ghost\"\nkeys = [");
    let text: Vec<String> = problems(&unknown).iter().map(|p| p.to_string()).collect();
    assert_eq!(
        text,
        ["tenants[0] (\"t\").default_model: unknown model \"ghost\""]
    );
    let two = format!(
        "{}[[models]]\nname = \"n\"\n[[models.backends]]\nname = \"c\"\nurl = \"http://127.0.0.1:8001/v1\"\n",
        MINIMAL.replace("keys = [", "models = [\"n\"]\ndefault_model = \"m\"\nkeys = [")
    );
    let text: Vec<String> = problems(&two).iter().map(|p| p.to_string()).collect();
    assert_eq!(
        text,
        ["tenants[0] (\"t\").default_model: \"m\" is not among the tenant's models"]
    );
}

#[test]
fn type_errors_in_several_sections_are_reported_together_with_their_lines() {
    let text = format!(
        "[server]\nlisten = 1\n[upstream]\nconnect_timeout = 5\n[retry]\nmax_attempts = \"x\"\n\
         [admission]\nmax_in_flight = -1\n{MINIMAL}\n[[tenants]]\nname = 7\n"
    );
    let Err(ConfigError::Parse(errors)) = Config::from_toml(&text) else {
        panic!("expected parse errors")
    };
    let lines: Vec<&str> = ["line 2", "line 4", "line 6", "line 8"].to_vec();
    for line in lines {
        assert!(
            errors.iter().any(|e| e.contains(line)),
            "no error at {line}: {errors:#?}"
        );
    }
    assert!(
        errors.iter().any(|e| e.contains("name = 7")),
        "the tenants list: {errors:#?}"
    );
    // A syntax error stops the parser: one error.
    let Err(ConfigError::Parse(errors)) = Config::from_toml("[server\nlisten = 1\n") else {
        panic!("expected a parse error")
    };
    assert_eq!(errors.len(), 1, "{errors:#?}");
}

#[test]
fn a_naive_cache_is_settings_and_a_lookup() {
    let c = Config::from_toml(&format!(
        "{MINIMAL}\n[cache]\nnaive = true\nredis = \"redis://127.0.0.1:6379\"\nflush_spread = \"30s\"\n"
    ))
    .unwrap();
    assert!(c.cache.naive);
    assert_eq!(c.cache.flush_spread, Duration::ZERO);
    assert!(c.cache.redis.is_none());
}

#[test]
fn surfaces_default_per_kind_and_a_declared_list_is_checked() {
    let c = Config::from_toml(MINIMAL).unwrap();
    assert_eq!(
        c.models[0].backends[0].surfaces,
        Surfaces::default_for("openai")
    );
    let with = |line: &str| {
        MINIMAL.replace(
            "url = \"http://127.0.0.1:8000/v1\"",
            &format!("url = \"http://127.0.0.1:8000/v1\"\n{line}"),
        )
    };
    let c = Config::from_toml(&with("surfaces = [\"chat\", \"messages\"]")).unwrap();
    let s = c.models[0].backends[0].surfaces;
    assert!(s.contains(Surface::Chat) && s.contains(Surface::Messages));
    assert!(!s.contains(Surface::Responses));
    for (line, says) in [
        ("surfaces = [\"chat\", \"chat\"]", "listed twice"),
        (
            "surfaces = [\"anthropic\"]",
            "unknown surface \"anthropic\"",
        ),
        ("surfaces = []", "at least one"),
    ] {
        let p = problems(&with(line));
        assert!(
            p.iter()
                .any(|p| p.location.ends_with(".surfaces") && p.message.contains(says)),
            "{line}: {p:?}"
        );
    }
    let azure = MINIMAL.replace(
        "url = \"http://127.0.0.1:8000/v1\"",
        "kind = \"azure\"\nurl = \"https://r.openai.azure.com\"\napi_version = \"2024-10-21\"",
    );
    let c = Config::from_toml(&azure).unwrap();
    assert!(!c.models[0].backends[0].surfaces.contains(Surface::Messages));
    let p = problems(&format!("{azure}\nsurfaces = [\"chat\", \"messages\"]"));
    assert!(p.iter().any(|p| p.message.contains("deployment")), "{p:?}");
}

#[test]
fn fallbacks_name_other_configured_models_and_known_triggers() {
    let two = format!(
        "{MINIMAL}\n[[models]]\nname = \"small\"\n[[models.backends]]\nname = \"s\"\nurl = \"http://127.0.0.1:8001/v1\"\n"
    );
    let with = |line: &str| two.replacen("name = \"m\"\n", &format!("name = \"m\"\n{line}\n"), 1);
    let c = Config::from_toml(&with(r#"fallbacks = [{ model = "small" }]"#)).unwrap();
    let f = &c.models[0].fallbacks;
    assert_eq!(f.len(), 1);
    assert_eq!(
        (f[0].model.as_str(), f[0].on.as_slice()),
        ("small", &Trigger::ALL[..])
    );
    let c = Config::from_toml(&with(
        r#"fallbacks = [{ model = "small", on = ["context_window"] }]"#,
    ))
    .unwrap();
    assert_eq!(c.models[0].fallbacks[0].on, [Trigger::ContextWindow]);
    for (line, says) in [
        (r#"fallbacks = [{ model = "nope" }]"#, "no model \"nope\""),
        (r#"fallbacks = [{ model = "m" }]"#, "itself"),
        (
            r#"fallbacks = [{ model = "small" }, { model = "small" }]"#,
            "listed twice",
        ),
        (
            r#"fallbacks = [{ model = "small", on = ["slow"] }]"#,
            "unknown trigger \"slow\"",
        ),
        (
            r#"fallbacks = [{ model = "small", on = [] }]"#,
            "at least one",
        ),
    ] {
        let p = problems(&with(line));
        assert!(
            p.iter()
                .any(|p| p.location.contains("fallbacks") && p.message.contains(says)),
            "{line}: {p:?}"
        );
    }
}

#[test]
fn a_rollout_brings_its_backends_as_the_new_side_with_the_policy_defaults() {
    let c = Config::from_toml(&format!(
        "{MINIMAL}[models.rollout]\nsteps = [10, 100]\n[[models.rollout.backends]]\nname = \"v2\"\nurl = \"http://127.0.0.1:8001/v1\"\n"
    ))
    .unwrap();
    let m = c.model("m").unwrap();
    let sides: Vec<_> = m
        .backends
        .iter()
        .map(|b| (b.name.as_str(), b.side))
        .collect();
    assert_eq!(sides, [("b", Side::Old), ("v2", Side::New)]);
    let plan = m.rollout.as_ref().unwrap();
    assert_eq!(plan.mode, RolloutMode::Staged);
    assert_eq!(plan.policy.steps, [10.0, 100.0]);
    assert_eq!(
        plan.policy.min_step_requests,
        spillway_policy::RolloutConfig::default().min_step_requests
    );
}

#[test]
fn a_rollout_s_problems_name_their_keys() {
    let p = problems(&format!(
        "{MINIMAL}[models.rollout]\nmode = \"yolo\"\nsteps = [50, 20]\n[[models.rollout.backends]]\nname = \"b\"\nurl = \"http://127.0.0.1:8001/v1\"\n"
    ));
    let at: Vec<_> = p.iter().map(|p| p.location.as_str()).collect();
    assert_eq!(
        at,
        [
            r#"models["m"].rollout.mode"#,
            r#"models["m"].rollout.steps"#,
            r#"models["m"].rollout.backends[0].name"#,
        ],
        "{p:?}"
    );
    let p = problems(&format!("{MINIMAL}[models.rollout]\n"));
    assert_eq!(p[0].location, r#"models["m"].rollout.backends"#, "{p:?}");
}

#[test]
fn a_url_with_a_password_comes_from_the_file_or_the_environment_never_both() {
    let p = problems(
        r#"
[store]
url = "postgres://db/spillway"
url_env = "STORE_URL"
[cache]
redis_env = "not a name"
[admission]
redis = "redis://r:6379"
redis_env = "LIMITS_REDIS"
[[models]]
name = "m"
[[models.backends]]
name = "b"
kind = "mock"
"#,
    );
    let text: Vec<String> = p.iter().map(|p| p.to_string()).collect();
    let expect = [
        "store.url: give store.url or store.url_env, not both",
        "cache.redis_env: \"not a name\" is not an environment variable name",
        "admission.redis: give admission.redis or admission.redis_env, not both",
    ];
    for e in expect {
        assert!(
            text.iter().any(|t| t.starts_with(e)),
            "missing {e:?} in {text:#?}"
        );
    }
    assert_eq!(text.len(), expect.len(), "{text:#?}");
    let c = Config::from_toml(
        "[store]\nurl_env = \"STORE_URL\"\n[[models]]\nname = \"m\"\n[[models.backends]]\nname = \"b\"\nkind = \"mock\"\n",
    )
    .unwrap();
    assert_eq!(c.store.url_env.as_deref(), Some("STORE_URL"));
    assert_eq!(c.store.url, "", "filled in from the environment at start");
}
