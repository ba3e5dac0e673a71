//! The plain reading of a request body held to serde's: hand-picked bodies at each edge of the
//! JSON grammar, and property tests on generated and damaged bodies.

use proptest::prelude::*;

use super::super::by_serde;
use super::*;

fn fields(text: &str) -> Option<Fields<'_>> {
    read(text.as_bytes())
}

#[test]
fn reads_a_chat_request_as_serde_does() {
    let text = r#"{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Quelle est la capitale de la France ? \u00e9 \ud83d\ude00 \"quoted\"\n\t日本語"}],"temperature":0.2,"max_tokens":128,"top_p":1,"user":"u-1","stream":true,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"number","minimum":-1.5e-3}}}}}],"logit_bias":{"50256":-100},"stop":null,"seed":-7}"#;
    let read = fields(text).expect("a plain body is read");
    assert_eq!(read, by_serde(text.as_bytes()).unwrap());
    assert_eq!(read.model.as_deref(), Some("gpt-4o-mini"));
    assert_eq!((read.stream, read.max_tokens), (Some(true), Some(128)));
    let read = fields(
        " \n{ \"model\" : \"m\" , \"n\" : 3 , \"store\" : true , \"max_output_tokens\" : 0 ,\
         \"previous_response_id\" : \"resp_1\" , \"max_completion_tokens\" : null } \r\n",
    )
    .unwrap();
    assert_eq!(
        (
            read.n,
            read.store,
            read.max_output_tokens,
            read.max_completion_tokens
        ),
        (Some(3), Some(true), Some(0), None)
    );
    assert_eq!(read.previous_response_id.as_deref(), Some("resp_1"));
    assert_eq!(fields("{}"), Some(Fields::default()));
    // Kept fields of another type are read as serde's `Value` reads them.
    let read = fields(r#"{"model":null,"max_tokens":"lots","n":true,"store":1}"#).unwrap();
    assert_eq!(
        read,
        by_serde(br#"{"model":null,"max_tokens":"lots","n":true,"store":1}"#).unwrap()
    );
    assert_eq!((read.max_tokens, read.n, read.store), (None, None, None));
}

#[test]
fn walks_over_strings_as_serde_does_without_decoding_them() {
    // Not UTF-8 in a string serde walks over: serde checks it no more than this does.
    let body = b"{\"model\":\"m\",\"a\":\"\xff\xfe\",\"b\":[\"\xc3\"]}";
    assert_eq!(read(body), Some(by_serde(body).unwrap()));
}

#[test]
fn leaves_to_serde_what_it_does_not_read_exactly() {
    for text in [
        // Not an object, not ended, more after it.
        "[]",
        r#"["m"]"#,
        "",
        "   ",
        r#"{"model":"m""#,
        r#"{"model":"m"} x"#,
        r#"{"model":"m"}{}"#,
        "\u{feff}{}",
        // Kept fields in shapes not read here.
        r#"{"model":"m\u0065"}"#,
        r#"{"model":3}"#,
        r#"{"model":["m"]}"#,
        r#"{"stream":"yes"}"#,
        r#"{"stream":1}"#,
        r#"{"max_tokens":-1}"#,
        r#"{"max_tokens":1.5}"#,
        r#"{"max_tokens":1e3}"#,
        r#"{"max_tokens":01}"#,
        r#"{"max_tokens":18446744073709551615}"#,
        r#"{"n":{"a":1}}"#,
        r#"{"store":"y\n"}"#,
        r#"{"model":"m","model":"m"}"#,
        r#"{"stream":null,"stream":true}"#,
        // An escaped key, which serde decodes.
        r#"{"mod\u0065l":"m"}"#,
        // Not JSON.
        r#"{"model":"m",}"#,
        r#"{"a":[1,]}"#,
        r#"{"a":01}"#,
        r#"{"a":1.}"#,
        r#"{"a":1e}"#,
        r#"{"a":-}"#,
        r#"{"a":.5}"#,
        r#"{"a":"\x"}"#,
        r#"{"a":"\u12"}"#,
        "{\"a\":\"\u{1}\"}",
        r#"{"a" 1}"#,
        r#"{"a":tru}"#,
        r#"{"a":nul}"#,
        r#"{"a":{"b"}}"#,
        r#"{"a":[}"#,
        r#"{a:1}"#,
    ] {
        assert!(fields(text).is_none(), "{text}");
    }
    // Not UTF-8 in a key or a kept string, which serde decodes and refuses.
    for body in [&b"{\"model\":\"m\xff\"}"[..], b"{\"\xff\":1}"] {
        assert!(read(body).is_none());
        assert!(by_serde(body).is_err());
    }
    // Nested past the limit here, within serde's.
    let deep = format!(
        r#"{{"model":"m","a":{}1{}}}"#,
        "[".repeat(70),
        "]".repeat(70)
    );
    assert!(fields(&deep).is_none());
    assert!(by_serde(deep.as_bytes()).is_ok());
    let shallow = format!(
        r#"{{"model":"m","a":{}1{}}}"#,
        "[".repeat(60),
        "]".repeat(60)
    );
    assert!(fields(&shallow).is_some());
}

/// Any JSON value as text, of every shape serde walks over: strings with escapes and
/// characters beyond ASCII, numbers of every form, nested a few deep.
fn value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("null".to_owned()),
        Just("true".to_owned()),
        Just("false".to_owned()),
        (0u64..100_000).prop_map(|n| n.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| serde_json::to_string(&f).unwrap()),
        Just("-0".to_owned()),
        Just("1E+2".to_owned()),
        Just("2.5e-3".to_owned()),
        "[ -~é日\\\\\"\n\t\u{1}]{0,12}".prop_map(|s| serde_json::to_string(&s).unwrap()),
        Just(r#""\ud83d\ude00 \u00E9 \/""#.to_owned()),
        Just(r#""\udc00""#.to_owned()),
    ];
    leaf.prop_recursive(6, 48, 5, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5)
                .prop_map(|items| format!("[{}]", items.join(","))),
            proptest::collection::vec(("[a-z_é]{1,8}", inner), 0..5).prop_map(|members| {
                let members: Vec<String> = members
                    .into_iter()
                    .map(|(k, v)| format!("\"{k}\" : {v}"))
                    .collect();
                format!("{{{}}}", members.join(","))
            }),
        ]
    })
}

/// A kept field's name, often, else any name.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => proptest::sample::select(vec!["model", "stream", "max_tokens",
            "max_completion_tokens", "max_output_tokens", "n", "previous_response_id", "store"])
            .prop_map(str::to_owned),
        1 => "[a-z_]{1,10}",
        1 => Just(r"mod\u0065l".to_owned()),
    ]
}

/// Up to eight of JSON's tokens and pieces of them, run together.
fn tokens() -> impl Strategy<Value = String> {
    let token = prop::sample::select(vec![
        "0", "1", "12", "-", ".", "e", "E", "+", "\"a\"", "\"", "\\", "\\u00e9", "\\n", "\\x", "é",
        "\u{1}", "[", "]", "{", "}", ",", ":", " ", "true", "tru", "false", "null", "n",
    ]);
    proptest::collection::vec(token, 1..8).prop_map(|tokens| tokens.concat())
}

/// A kept field's value: mostly the shapes read here, else anything.
fn kept_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("null".to_owned()),
        Just("true".to_owned()),
        Just("false".to_owned()),
        "-?0?[0-9]{1,21}(\\.[0-9]?)?",
        "\"[a-z./ -]{0,6}\"",
        tokens(),
        value(),
    ]
}

/// A top-level object of kept fields and others.
fn body() -> impl Strategy<Value = String> {
    let member = prop_oneof![(key(), kept_value()), ("[a-z_]{1,10}", value())];
    proptest::collection::vec(member, 0..6).prop_map(|members| {
        let members: Vec<String> = members
            .into_iter()
            .map(|(k, v)| format!("\"{k}\":{v}"))
            .collect();
        format!("{{{}}}", members.join(","))
    })
}

/// Edits that make most bodies something serde refuses, and some it takes another way.
#[derive(Debug, Clone)]
enum Edit {
    Cut(prop::sample::Index),
    Drop(prop::sample::Index),
    Put(prop::sample::Index, char),
}

fn edit(mut bytes: Vec<u8>, edit: &Edit) -> Vec<u8> {
    let at = |i: &prop::sample::Index| i.index(bytes.len() + 1);
    match edit {
        Edit::Cut(i) => bytes.truncate(at(i)),
        Edit::Drop(i) => {
            let i = at(i);
            if i < bytes.len() {
                bytes.remove(i);
            }
        }
        Edit::Put(i, c) => {
            let i = at(i);
            let mut buf = [0; 4];
            bytes.splice(i..i, c.encode_utf8(&mut buf).bytes());
        }
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Whatever this reads, serde reads the same way, and wherever serde refuses a body this
    /// does not read it.
    #[test]
    fn gives_serdes_answer_or_none(
        text in body(),
        edits in proptest::collection::vec(prop_oneof![
            any::<prop::sample::Index>().prop_map(Edit::Cut),
            any::<prop::sample::Index>().prop_map(Edit::Drop),
            (any::<prop::sample::Index>(), prop::sample::select(
                vec!['{', '}', '[', ']', ',', ':', '"', '\\', ' ', '0', '-', '.', 'e', 'n', '\u{1}']
            )).prop_map(|(i, c)| Edit::Put(i, c)),
        ], 0..3),
    ) {
        let mut bytes = text.into_bytes();
        for e in &edits {
            bytes = edit(bytes, e);
        }
        if let Some(fields) = read(&bytes) {
            prop_assert_eq!(Ok(fields), by_serde(&bytes).map_err(|e| e.to_string()));
        }
    }

    /// Values made of JSON's tokens, often valid and dense in the edges of its grammar
    /// (numbers cut short, escapes, literals, brackets), as a kept field's value and as an
    /// ignored one's.
    #[test]
    fn values_of_json_tokens_are_read_as_serde_reads_them(
        kept in key(),
        kept_value in kept_value(),
        other in tokens(),
    ) {
        for text in [
            format!(r#"{{"{kept}":{kept_value}}}"#),
            format!(r#"{{"model":"m","x":{other}}}"#),
            format!(r#"{{"model":"m","x":"{other}"}}"#),
        ] {
            if let Some(fields) = fields(&text) {
                prop_assert_eq!(Ok(fields), by_serde(text.as_bytes()).map_err(|e| e.to_string()));
            }
        }
    }

    #[test]
    fn random_bytes_are_never_read_where_serde_refuses_them(
        bytes in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        if let Some(fields) = read(&bytes) {
            prop_assert_eq!(Ok(fields), by_serde(&bytes).map_err(|e| e.to_string()));
        }
    }

    /// Bodies whose kept fields are in the shapes read here are all read, whatever else they
    /// hold: the fast path is the usual one, not a test that passes by giving up.
    #[test]
    fn plain_bodies_are_read(
        model in "[a-zA-Z0-9._/:-]{1,30}",
        max_tokens in proptest::option::of(0u64..1_000_000),
        stream in proptest::option::of(any::<bool>()),
        others in proptest::collection::vec(("[a-z_]{1,10}", value()), 0..6),
    ) {
        let mut members = vec![format!("\"model\":\"{model}\"")];
        if let Some(m) = max_tokens {
            members.push(format!("\"max_tokens\":{m}"));
        }
        if let Some(s) = stream {
            members.push(format!("\"stream\":{s}"));
        }
        for (k, v) in others {
            if Kept::of(k.as_bytes()).is_none() {
                members.push(format!("\"{k}\":{v}"));
            }
        }
        let text = format!("{{{}}}", members.join(","));
        let read = fields(&text);
        prop_assert!(read.is_some(), "{}", text);
        prop_assert_eq!(read, by_serde(text.as_bytes()).ok());
    }
}
