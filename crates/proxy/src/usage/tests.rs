use proptest::prelude::*;

use super::*;

fn usage(prompt_tokens: u64, completion_tokens: u64, total_tokens: u64) -> Option<Usage> {
    Some(Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens,
    })
}

fn scan(sse: bool, chunks: &[&[u8]]) -> Option<Usage> {
    let mut scanner = UsageScanner::new(sse);
    for chunk in chunks {
        scanner.feed(chunk);
    }
    scanner.finish()
}

fn scan_whole(sse: bool, body: &[u8]) -> Option<Usage> {
    scan(sse, &[body])
}

const CHAT: &[u8] = br#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m",
"choices":[{"index":0,"message":{"role":"assistant","content":"Hello!"},"finish_reason":"stop"}],
"usage": {"prompt_tokens": 9, "completion_tokens": 12, "total_tokens": 21}}"#;

/// An SSE stream as vLLM sends it with `include_usage`: `"usage":null` in every content chunk.
fn stream(chunks: usize) -> Vec<u8> {
    let mut body = Vec::new();
    for i in 0..chunks {
        let event = format!(
            "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\
             \"delta\":{{\"content\":\"tok{i} {{\\\"usage\\\": {{}}}}\"}}}}],\"usage\":null}}\n\n"
        );
        body.extend_from_slice(event.as_bytes());
    }
    body.extend_from_slice(
        b"data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\
          \"completion_tokens\":50,\"total_tokens\":55}}\n\ndata: [DONE]\n\n",
    );
    body
}

#[test]
fn reads_usage_at_the_end_of_a_chat_completion() {
    assert_eq!(scan_whole(false, CHAT), usage(9, 12, 21));
}

#[test]
fn reads_usage_that_comes_first() {
    let body = br#"{"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3},
        "choices":[{"message":{"content":"hi"}}]}"#;
    assert_eq!(scan_whole(false, body), usage(1, 2, 3));
}

#[test]
fn every_split_point_gives_the_same_usage() {
    let sse = stream(3);
    for (is_sse, body) in [(false, CHAT), (true, &sse[..])] {
        let whole = scan_whole(is_sse, body);
        assert!(whole.is_some());
        for at in 0..=body.len() {
            let (a, b) = body.split_at(at);
            assert_eq!(scan(is_sse, &[a, b]), whole, "split at {at}");
        }
        let bytes: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(scan(is_sse, &bytes), whole, "byte by byte");
    }
}

#[test]
fn a_stream_of_null_usages_ends_with_the_real_one() {
    let body = stream(50);
    assert_eq!(scan_whole(true, &body), usage(5, 50, 55));
    // A scanner told the wrong content type still finds it: the JSON is the same.
    assert_eq!(scan_whole(false, &body), usage(5, 50, 55));
    let events: Vec<&[u8]> = body.split_inclusive(|&b| b == b'\n').collect();
    assert_eq!(scan(true, &events), usage(5, 50, 55));
}

#[test]
fn null_usage_alone_is_no_usage() {
    assert_eq!(scan_whole(true, b"data: {\"usage\": null}\n\n"), None);
    assert_eq!(scan_whole(false, br#"{"usage" : null}"#), None);
}

#[test]
fn details_nested_in_usage_are_ignored() {
    let body = br#"{"usage":{"prompt_tokens":10,"completion_tokens":4,"total_tokens":14,
        "prompt_tokens_details":{"cached_tokens":3},
        "completion_tokens_details":{"reasoning_tokens":0}}}"#;
    assert_eq!(scan_whole(false, body), usage(10, 4, 14));
}

#[test]
fn braces_and_quotes_inside_strings_do_not_count() {
    let body =
        br#"{"choices":[{"message":{"content":"}{ \"usage\": {\"prompt_tokens\": 999} \\"}}],
        "usage":{"note":"} \"}\" {","prompt_tokens":2,"completion_tokens":3,"total_tokens":5}}"#;
    assert_eq!(scan_whole(false, body), usage(2, 3, 5));
    let body = br#"{"usage":{"note":"a\nb \\","prompt_tokens":2,"completion_tokens":3}}"#;
    assert_eq!(scan_whole(false, body), usage(2, 3, 5));
    // Only the escaped text mentions usage: nothing to report.
    let body = br#"{"content":"the \"usage\": {\"prompt_tokens\": 7}"}"#;
    assert_eq!(scan_whole(false, body), None);
}

#[test]
fn an_oversize_usage_object_is_ignored_and_scanning_goes_on() {
    let padding = "x".repeat(MAX_USAGE_BYTES);
    let big = format!(r#"{{"usage":{{"prompt_tokens":1,"pad":"{padding}"}}}}"#);
    assert_eq!(scan_whole(false, big.as_bytes()), None);
    let then = format!(r#"{big}{{"usage":{{"prompt_tokens":4,"completion_tokens":1}}}}"#);
    assert_eq!(scan_whole(false, then.as_bytes()), usage(4, 1, 5));
}

#[test]
fn a_body_without_usage_has_none() {
    assert_eq!(scan_whole(false, b""), None);
    assert_eq!(
        scan_whole(false, br#"{"choices":[],"usage_note":{"a":1}}"#),
        None
    );
    assert_eq!(
        scan_whole(true, b"data: {\"choices\":[]}\n\ndata: [DONE]\n\n"),
        None
    );
}

#[test]
fn reads_an_embeddings_response() {
    let body =
        br#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,-0.2]}],
        "model":"e","usage":{"prompt_tokens":8,"total_tokens":8}}"#;
    assert_eq!(scan_whole(false, body), usage(8, 0, 8));
}

#[test]
fn a_missing_total_is_the_sum_of_the_parts() {
    assert_eq!(
        scan_whole(
            false,
            br#"{"usage":{"completion_tokens":6,"prompt_tokens":2}}"#
        ),
        usage(2, 6, 8)
    );
}

#[test]
fn counts_that_are_not_integers_void_that_object_only() {
    let good = br#"{"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;
    for bad in [
        &br#"{"usage":{"prompt_tokens":1.5}}"#[..],
        br#"{"usage":{"prompt_tokens":-1}}"#,
        br#"{"usage":{"prompt_tokens":"3"}}"#,
        br#"{"usage":{"prompt_tokens":1,}}"#,
    ] {
        assert_eq!(scan_whole(false, bad), None);
        assert_eq!(scan(false, &[good, bad]), usage(1, 1, 2));
    }
}

#[test]
fn a_key_after_a_backslash_is_not_a_key() {
    let body = br#"{"a":"x\"usage":{"prompt_tokens":1}}"#;
    assert_eq!(scan_whole(false, body), None);
    // Cut just after the backslash: the flag crosses the chunks.
    let (a, b) = body.split_at(8);
    assert_eq!(a.last(), Some(&b'\\'));
    assert_eq!(scan(false, &[a, b]), None);
    let sse = b"data: {\"a\":\"x\\\"usage\":{\"prompt_tokens\":1}}\n\n";
    assert_eq!(scan_whole(true, sse), None);
}

#[test]
fn the_last_usage_wins() {
    let body = br#"{"usage":{"prompt_tokens":1}} {"usage":{"prompt_tokens":2}}"#;
    assert_eq!(scan_whole(false, body), usage(2, 0, 2));
}

#[test]
fn sse_reads_only_data_lines() {
    let body = b": \"usage\":{\"prompt_tokens\":99}\nevent: x \"usage\":{\"prompt_tokens\":98}\n\n\
                 data:{\"usage\":{\"prompt_tokens\":1}}\r\n\r\n";
    assert_eq!(scan_whole(true, body), usage(1, 0, 1));
    let after = b"data: {\"usage\":{\"prompt_tokens\":1}}\n: {\"usage\":{\"prompt_tokens\":2}}\n\n";
    assert_eq!(scan_whole(true, after), usage(1, 0, 1));
}

#[test]
fn sse_joins_data_lines_and_handles_every_line_ending() {
    let body = b"data: {\"usage\":\r\ndata: {\"prompt_tokens\":3,\rdata: \"total_tokens\":3}}\n\n";
    assert_eq!(scan_whole(true, body), usage(3, 0, 3));
}

#[test]
fn a_truncated_sse_event_does_not_swallow_the_next() {
    let body = b"data: {\"usage\":{\"prompt_tokens\":1,\"x\":\"}\n\n\
                 data: {\"usage\":{\"prompt_tokens\":2}}\n\n";
    assert_eq!(scan_whole(true, body), usage(2, 0, 2));
}

#[test]
fn the_object_buffer_stays_within_the_cap() {
    let mut scanner = UsageScanner::new(false);
    scanner.feed(b"\"usage\":{");
    for _ in 0..100 {
        scanner.feed(&[b'{'; 1000]);
        assert!(scanner.object.capacity() <= MAX_USAGE_BYTES);
    }
    // Plain bytes, in a string and outside one, are copied in runs: the cap holds for them too.
    for run in [
        &b"\"usage\":{\"a\":\""[..],
        &[b'x'; 3000],
        b"\",",
        &[b'1'; 3000],
    ] {
        scanner.feed(run);
        assert!(scanner.object.len() <= MAX_USAGE_BYTES);
    }
}

#[test]
fn a_hostile_body_of_near_keys_and_oversize_objects_is_read_as_the_machine_reads_it() {
    // Keys without objects, keys split by escapes, objects past the cap, then one real report.
    let mut body = Vec::new();
    for i in 0..2000 {
        body.extend_from_slice(match i % 4 {
            0 => br#""usage": null, "#.as_slice(),
            1 => br#"\"usage\":{ "#,
            2 => br#""usag"usage" "#,
            _ => br#""usage":{"pad":"#,
        });
    }
    body.extend_from_slice(&[b'x'; 3 * MAX_USAGE_BYTES]);
    body.extend_from_slice(br#""}} "usage":{"prompt_tokens":6,"completion_tokens":1}"#);
    let mut machine = UsageScanner::new(false);
    machine.feed_bytewise(&body);
    let expected = machine.finish();
    assert_eq!(expected, usage(6, 1, 7));
    assert_eq!(scan_whole(false, &body), expected);
    for size in [1, 7, 100, 4096] {
        let mut scanner = UsageScanner::new(false);
        for chunk in body.chunks(size) {
            scanner.feed(chunk);
            assert!(scanner.object.len() <= MAX_USAGE_BYTES);
        }
        assert_eq!(scanner.finish(), expected, "chunks of {size}");
    }
}

/// Cuts `body` at the given points (taken modulo its length).
fn chunked(body: &[u8], mut cuts: Vec<usize>) -> Vec<&[u8]> {
    cuts.iter_mut().for_each(|c| *c %= body.len() + 1);
    cuts.sort_unstable();
    let mut chunks = Vec::new();
    let mut from = 0;
    for cut in cuts {
        chunks.push(&body[from..cut]);
        from = cut;
    }
    chunks.push(&body[from..]);
    chunks
}

/// Bytes that the scanner's states turn on, so random bodies reach all of them.
fn jsonish() -> impl Strategy<Value = Vec<u8>> {
    let byte = prop_oneof![
        any::<u8>(),
        proptest::sample::select(b"\"usage:{}\\ \n\r0123456789,data".to_vec()),
    ];
    let piece = prop_oneof![
        3 => proptest::collection::vec(byte, 1..8),
        1 => Just(br#""usage":{"#.to_vec()),
        1 => Just(br#"\"usage":{"prompt_tokens":3}"#.to_vec()),
        1 => Just(br#""prompt_tokens":7}"#.to_vec()),
        1 => Just(b"\n\ndata: ".to_vec()),
    ];
    proptest::collection::vec(piece, 0..64).prop_map(|pieces| pieces.concat())
}

/// JSON values of every kind, with strings that hold quotes, backslashes and braces.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        "[{}\"\\\\a-z ]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            proptest::collection::btree_map("[a-z_{}\"]{1,20}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    /// Whole objects are parsed where they stand and split ones are walked: both end where the
    /// state machine ends them, with the same counts, for objects of every shape and size
    /// (past the cap too).
    #[test]
    fn usage_objects_of_any_shape_read_as_the_machine_reads_them(
        fields in proptest::collection::vec(("[a-z_]{1,30}", json_value()), 0..12),
        counts in proptest::collection::vec(
            (proptest::sample::select(vec!["prompt_tokens", "completion_tokens",
                "total_tokens", "input_tokens", "output_tokens"]), any::<u64>()), 0..4),
        pad in 0usize..(2 * MAX_USAGE_BYTES),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        let mut object = serde_json::Map::new();
        for (key, value) in fields {
            object.insert(key, value);
        }
        for (key, n) in counts {
            object.insert(key.to_owned(), n.into());
        }
        if pad > 0 {
            object.insert("pad".to_owned(), "x".repeat(pad).into());
        }
        let body = format!(
            r#"{{"id":"a \"usage\": {{","usage":{},"more":{{"usage":null}}}}"#,
            serde_json::Value::Object(object)
        );
        let mut machine = UsageScanner::new(false);
        machine.feed_bytewise(body.as_bytes());
        let expected = machine.finish();
        prop_assert_eq!(scan_whole(false, body.as_bytes()), expected);
        prop_assert_eq!(scan(false, &chunked(body.as_bytes(), cuts)), expected);
    }

    #[test]
    fn any_bytes_any_chunking_same_answer_no_panic(
        body in prop_oneof![proptest::collection::vec(any::<u8>(), 0..2048), jsonish()],
        cuts in proptest::collection::vec(any::<usize>(), 0..16),
        sse in any::<bool>(),
    ) {
        let whole = scan_whole(sse, &body);
        prop_assert_eq!(scan(sse, &chunked(&body, cuts)), whole);
        // The skips change nothing: the state machine alone gives the same answer.
        let mut machine = UsageScanner::new(sse);
        machine.feed_bytewise(&body);
        prop_assert_eq!(machine.finish(), whole);
    }

    #[test]
    fn reported_counts_survive_any_chunking(
        prompt in any::<u64>(),
        completion in any::<u64>(),
        total in any::<u64>(),
        content in "[ -~]{0,40}",
        cuts in proptest::collection::vec(any::<usize>(), 0..16),
    ) {
        let content = serde_json::to_string(&content).unwrap();
        let body = format!(
            "data: {{\"choices\":[{{\"delta\":{{\"content\":{content}}}}}],\"usage\":null}}\n\n\
             data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":{prompt},\
             \"completion_tokens\":{completion},\"total_tokens\":{total}}}}}\n\ndata: [DONE]\n\n"
        );
        let expected = usage(prompt, completion, total);
        prop_assert_eq!(scan(true, &chunked(body.as_bytes(), cuts.clone())), expected);
        prop_assert_eq!(scan(false, &chunked(body.as_bytes(), cuts)), expected);
    }
}

#[test]
fn reads_a_responses_api_answer_and_its_stream() {
    let plain = br#"{"id":"resp_1","object":"response","status":"completed","output":[],
"usage":{"input_tokens":11,"input_tokens_details":{"cached_tokens":4},"output_tokens":7,
"output_tokens_details":{"reasoning_tokens":0},"total_tokens":18}}"#;
    assert_eq!(scan_whole(false, plain), usage(11, 7, 18));
    let stream = b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\n\
event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n\
event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":11,\"output_tokens\":7,\"total_tokens\":18}}}\n\n";
    assert_eq!(scan_whole(true, stream), usage(11, 7, 18));
}

#[test]
fn a_messages_stream_takes_its_prompt_from_message_start_and_its_output_from_message_delta() {
    let stream = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":20,\"output_tokens\":1,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":30}}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":15}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    // Prompt-cache reads are prompt tokens the engine took in.
    assert_eq!(scan_whole(true, stream), usage(50, 15, 65));
    for cut in 1..stream.len() {
        assert_eq!(
            scan(true, &[&stream[..cut], &stream[cut..]]),
            usage(50, 15, 65)
        );
    }
}

#[test]
fn a_plain_messages_answer_counts_cache_writes_as_prompt() {
    let plain = br#"{"id":"msg_1","type":"message","content":[{"type":"text","text":"hi"}],
"usage":{"input_tokens":5,"output_tokens":3,"cache_creation_input_tokens":7,"cache_read_input_tokens":0}}"#;
    assert_eq!(scan_whole(false, plain), usage(12, 3, 15));
}
