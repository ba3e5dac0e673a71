use proptest::prelude::*;

use super::*;

/// llama.cpp's own HTTP server (the `xllamacpp` wheel's build, `build_info` "b0-unknown", two
/// slots) serving gemma, captured from its `/metrics` while three completions were sent: two
/// processing, one deferred. This build exports no `llamacpp:kv_cache_usage_ratio`.
const LLAMACPP: &str = include_str!("../fixtures/llamacpp.txt");

/// vLLM: the example output in vllm-project/vllm `docs/design/metrics.md` (commit 0328b592),
/// the lines elided there left out; the `num_requests_waiting`, `kv_cache_usage_perc` and
/// deprecated `gpu_cache_usage_perc` series added in the same format, with the HELP texts
/// vLLM registers for them (`vllm/v1/metrics/loggers.py`).
const VLLM: &str = include_str!("../fixtures/vllm.txt");

/// SGLang: the example output in sgl-project/sglang `docs/references/production_metrics.md`
/// (commit 00b08c49), with the middle buckets of `func_latency_seconds` left out.
const SGLANG: &str = include_str!("../fixtures/sglang.txt");

/// TGI's router exports through the `metrics` crate and `metrics-exporter-prometheus`, the
/// exporter spillway itself uses: this renders TGI's gauge and histogram names (from
/// huggingface/text-generation-inference `docs/source/reference/metrics.md`, commit 53fdbe61)
/// with that exporter, so the page has the real format.
fn tgi_page(queue: f64, batch: f64) -> String {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        metrics::gauge!("tgi_queue_size").set(queue);
        metrics::gauge!("tgi_batch_current_size").set(batch);
        metrics::gauge!("tgi_batch_current_max_tokens").set(4096.0);
        metrics::counter!("tgi_request_count").increment(42);
        metrics::histogram!("tgi_request_duration").record(0.8);
        metrics::histogram!("tgi_batch_forward_duration", "method" => "decode").record(0.02);
    });
    handle.render()
}

fn sample(running: f64, waiting: f64, kv_usage: Option<f64>) -> Sample {
    Sample {
        running,
        waiting,
        kv_usage,
    }
}

#[test]
fn llamacpp_page_reads_processing_and_deferred_without_kv() {
    assert_eq!(
        parse(Engine::Llamacpp, LLAMACPP),
        Ok((Engine::Llamacpp, sample(2.0, 1.0, None)))
    );
}

#[test]
fn vllm_page_reads_running_waiting_and_the_current_kv_name() {
    assert_eq!(
        parse(Engine::Vllm, VLLM),
        Ok((Engine::Vllm, sample(8.0, 3.0, Some(0.6125))))
    );
}

#[test]
fn older_vllm_with_only_gpu_cache_usage_still_reads_kv() {
    let old = VLLM.replace("vllm:kv_cache_usage_perc", "vllm:other_gauge");
    let old = old.replace(
        "0.6125\n# HELP vllm:generation",
        "0.5\n# HELP vllm:generation",
    );
    assert_eq!(
        parse(Engine::Vllm, &old).map(|(_, s)| s.kv_usage),
        Ok(Some(0.5))
    );
}

#[test]
fn sglang_page_reads_running_queue_and_token_usage() {
    assert_eq!(
        parse(Engine::Sglang, SGLANG),
        Ok((Engine::Sglang, sample(162.0, 2826.0, Some(0.28))))
    );
}

#[test]
fn tgi_page_reads_batch_and_queue() {
    let page = tgi_page(6.0, 4.0);
    assert_eq!(
        parse(Engine::Tgi, &page),
        Ok((Engine::Tgi, sample(4.0, 6.0, None))),
        "{page}"
    );
}

#[test]
fn auto_detects_each_engine_by_its_names() {
    let tgi = tgi_page(0.0, 1.0);
    for (page, engine) in [
        (VLLM, Engine::Vllm),
        (SGLANG, Engine::Sglang),
        (LLAMACPP, Engine::Llamacpp),
        (tgi.as_str(), Engine::Tgi),
    ] {
        assert_eq!(
            parse(Engine::Auto, page).map(|(e, _)| e),
            Ok(engine),
            "{page}"
        );
    }
}

#[test]
fn data_parallel_vllm_sums_counts_and_keeps_the_fullest_kv_cache() {
    let page = "\
vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0
vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 2.0
vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 4.0
vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 0.0
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25
vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.75
";
    assert_eq!(
        parse(Engine::Vllm, page),
        Ok((Engine::Vllm, sample(5.0, 4.0, Some(0.75))))
    );
}

#[test]
fn longer_names_and_other_families_are_not_counted() {
    let page = "\
vllm:num_requests_running 1
vllm:num_requests_waiting 2
vllm:num_requests_waiting_by_reason{reason=\"capacity, deferred\"} 9
vllm:num_requests_running_total 50
python_gc_objects_collected_total{generation=\"0\"} 455678.0
";
    assert_eq!(
        parse(Engine::Auto, page),
        Ok((Engine::Vllm, sample(1.0, 2.0, None)))
    );
}

#[test]
fn labels_timestamps_escapes_and_spacing_are_read() {
    let page = "\
  sglang:num_running_reqs{model_name=\"a \\\"quoted\\\" \\\\ name\\n\", tp_rank=\"0\",} 3 1395066363000\r
sglang:num_queue_reqs\t7
sglang:num_queue_reqs{} 1e1
";
    assert_eq!(
        parse(Engine::Sglang, page),
        Ok((Engine::Sglang, sample(3.0, 17.0, None)))
    );
}

#[test]
fn an_empty_page_is_refused() {
    for page in ["", "\n\n", "# HELP x y\n# TYPE x gauge\n"] {
        assert_eq!(
            parse(Engine::Auto, page),
            Err(ParseError::NoEngineMetrics {
                engine: "any known engine"
            })
        );
    }
}

#[test]
fn another_engines_page_is_refused() {
    assert_eq!(
        parse(Engine::Vllm, LLAMACPP),
        Err(ParseError::NoEngineMetrics { engine: "vllm" })
    );
    assert_eq!(
        parse(Engine::Tgi, SGLANG),
        Err(ParseError::NoEngineMetrics { engine: "tgi" })
    );
}

#[test]
fn an_html_page_is_refused() {
    let page = "<!doctype html>\n<html><body>Not Found</body></html>\n";
    assert!(matches!(
        parse(Engine::Auto, page),
        Err(ParseError::NoEngineMetrics { .. })
    ));
}

#[test]
fn a_page_without_the_queue_is_refused() {
    // What the vLLM docs show with the elided lines left out: running, but no queue.
    let page = VLLM
        .lines()
        .filter(|l| !l.contains("num_requests_waiting"))
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(
        parse(Engine::Auto, &page),
        Err(ParseError::Missing {
            metric: "vllm:num_requests_waiting"
        })
    );
}

#[test]
fn nan_infinite_and_negative_values_are_refused() {
    for value in ["NaN", "+Inf", "-Inf", "-1", "1e400", "0x10", "one", "1e"] {
        let page = format!("tgi_queue_size {value}\ntgi_batch_current_size 1\n");
        assert!(
            matches!(
                parse(Engine::Tgi, &page),
                Err(ParseError::BadValue {
                    line: 1,
                    metric: "tgi_queue_size",
                    ..
                })
            ),
            "{value}: {:?}",
            parse(Engine::Tgi, &page)
        );
    }
}

#[test]
fn a_kv_share_above_one_is_refused() {
    let page = VLLM.replace(
        "vllm:kv_cache_usage_perc{model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 0.6125",
        "vllm:kv_cache_usage_perc{model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 61.25",
    );
    assert!(matches!(
        parse(Engine::Vllm, &page),
        Err(ParseError::NotAShare {
            metric: "vllm:kv_cache_usage_perc",
            ..
        })
    ));
}

#[test]
fn malformed_sample_lines_of_read_names_are_refused() {
    for line in [
        "tgi_queue_size",
        "tgi_queue_size{",
        "tgi_queue_size{a=\"b\" 1",
        "tgi_queue_size{a=b} 1",
        "tgi_queue_size{a=\"b\\x\"} 1",
        "tgi_queue_size{1a=\"b\"} 1",
        "tgi_queue_size{a=\"b\"}1",
        "tgi_queue_size 1 2.5",
        "tgi_queue_size 1 2 3",
    ] {
        let page = format!("tgi_batch_current_size 1\n{line}\n");
        assert_eq!(
            parse(Engine::Tgi, &page),
            Err(ParseError::Malformed {
                line: 2,
                metric: "tgi_queue_size"
            }),
            "{line}"
        );
    }
}

#[test]
fn malformed_lines_of_other_names_do_not_spoil_the_reading() {
    let page = "tgi_request_duration{le=} what\ntgi_queue_size 2\ntgi_batch_current_size 1\n";
    assert_eq!(
        parse(Engine::Tgi, page),
        Ok((Engine::Tgi, sample(1.0, 2.0, None)))
    );
}

fn label_value() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            Just("\\\\".to_owned()),
            Just("\\\"".to_owned()),
            Just("\\n".to_owned()),
            "[a-zA-Z0-9 ,={}/:._-]{0,8}",
        ],
        0..4,
    )
    .prop_map(|parts| parts.concat())
}

proptest! {
    /// No page, however broken, makes the parser panic.
    #[test]
    fn arbitrary_input_never_panics(text in any::<String>()) {
        for engine in Engine::CHOICES {
            let _ = parse(engine, &text);
        }
    }

    /// Pages made of fragments of real lines (the inputs that reach the deeper branches)
    /// never make the parser panic either.
    #[test]
    fn near_miss_pages_never_panic(parts in proptest::collection::vec(prop_oneof![
        Just("vllm:num_requests_running".to_owned()),
        Just("sglang:token_usage".to_owned()),
        Just("{".to_owned()), Just("}".to_owned()), Just("=".to_owned()),
        Just("\"".to_owned()), Just("\\".to_owned()), Just(",".to_owned()),
        Just(" ".to_owned()), Just("\n".to_owned()), Just("#".to_owned()),
        Just("NaN".to_owned()), Just("+Inf".to_owned()), Just("1e5".to_owned()),
        "[a-z_:]{1,6}", "[0-9.eE+-]{1,6}", any::<char>().prop_map(String::from),
    ], 0..40)) {
        let page = parts.concat();
        for engine in Engine::CHOICES {
            let _ = parse(engine, &page);
        }
    }

    /// A page of one engine's series over random label sets reads back as their sums (and the
    /// fullest KV share).
    #[test]
    fn random_label_sets_read_back_as_their_sums(
        series in proptest::collection::vec(
            (label_value(), 0u32..10_000, 0u32..10_000, 0.0f64..=1.0),
            1..6,
        )
    ) {
        let mut page = String::from("# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n");
        for (i, (model, running, waiting, kv)) in series.iter().enumerate() {
            let labels = format!("{{engine=\"{i}\",model_name=\"{model}\"}}");
            page += &format!("vllm:num_requests_running{labels} {running}.0\n");
            page += &format!("vllm:num_requests_waiting{labels} {waiting}\n");
            page += &format!("vllm:kv_cache_usage_perc{labels} {kv:e}\n");
        }
        let want = sample(
            series.iter().map(|s| f64::from(s.1)).sum(),
            series.iter().map(|s| f64::from(s.2)).sum(),
            series.iter().map(|s| s.3).reduce(f64::max),
        );
        prop_assert_eq!(parse(Engine::Auto, &page), Ok((Engine::Vllm, want)));
    }
}
