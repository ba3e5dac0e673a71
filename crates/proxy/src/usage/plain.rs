//! A `usage` object read without serde, when it is plain JSON.
//!
//! Nearly every answer's `usage` object is a few counts and, beside them, a few objects of counts
//! (`prompt_tokens_details`, ...). On the benchmark's 270-byte object serde took about 14
//! instructions a byte, much of it validating the objects it then ignores, and this about 9
//! (`bench/instructions.sh`: 1.5 k fewer per request).
//!
//! It reads only what it can read exactly as serde's `Fields` would: keys and strings of
//! printable ASCII without escapes, unsigned integers of at most 19 digits, `true`, `false`,
//! `null`, and objects of these, at most [`MAX_DEPTH`] deep. On anything else (an escape, a
//! float, a negative number, an array, a byte that is not ASCII, a count given twice, an end
//! before the object's) it gives up with `None`, and the caller asks serde, which then decides.
//! So wherever this gives an answer it is serde's answer (a property test holds it to that), and
//! it is never the only judge of a body it cannot read.

use super::Fields;
use crate::json_scan::{self, Cursor};

/// Nesting beyond this is left to serde.
const MAX_DEPTH: u32 = 8;

/// The object `bytes` begin with (at its `{`) and how many bytes it took, if it is plain.
pub(super) fn read_prefix(bytes: &[u8]) -> Option<(usize, Fields)> {
    let mut reader = Reader(Cursor::new(bytes));
    let fields = reader.counts()?;
    Some((reader.at, fields))
}

/// The bytes of `word` (little-endian) that are a quote, a backslash or not printable ASCII,
/// each marked by its high bit. Past the first one marked, others may be marked wrongly; the
/// first is always right, and none is marked when there is none.
fn unusual(word: u64) -> u64 {
    json_scan::marks(word, b'"')
        | json_scan::marks(word, b'\\')
        | json_scan::marks(word, 0x7f)
        | json_scan::controls(word)
        | (word & json_scan::HIGHS)
}

json_scan::on_a_cursor!(Reader);

/// Which of the counts a key names.
#[derive(Clone, Copy)]
enum Count {
    Prompt,
    Completion,
    Total,
    Input,
    Output,
    CacheRead,
    CacheCreation,
}

impl Count {
    fn of(key: &[u8]) -> Option<Count> {
        Some(match key {
            b"prompt_tokens" => Count::Prompt,
            b"completion_tokens" => Count::Completion,
            b"total_tokens" => Count::Total,
            b"input_tokens" => Count::Input,
            b"output_tokens" => Count::Output,
            b"cache_read_input_tokens" => Count::CacheRead,
            b"cache_creation_input_tokens" => Count::CacheCreation,
            _ => return None,
        })
    }

    fn slot(self, fields: &mut Fields) -> &mut Option<u64> {
        match self {
            Count::Prompt => &mut fields.prompt_tokens,
            Count::Completion => &mut fields.completion_tokens,
            Count::Total => &mut fields.total_tokens,
            Count::Input => &mut fields.input_tokens,
            Count::Output => &mut fields.output_tokens,
            Count::CacheRead => &mut fields.cache_read_input_tokens,
            Count::CacheCreation => &mut fields.cache_creation_input_tokens,
        }
    }
}

impl<'a> Reader<'a> {
    /// The top-level object: its counts read, everything else walked over.
    fn counts(&mut self) -> Option<Fields> {
        let mut fields = Fields::default();
        // serde refuses a count given twice; so does this, by leaving it to serde.
        let mut seen = [false; 7];
        self.members(|reader, key| match Count::of(key) {
            Some(count) => {
                let seen = &mut seen[count as usize];
                if std::mem::replace(seen, true) {
                    return None;
                }
                *count.slot(&mut fields) = match reader.peek()? {
                    b'n' => reader.literal(b"null").map(|()| None)?,
                    _ => Some(reader.integer()?),
                };
                Some(())
            }
            None => reader.value(1),
        })?;
        Some(fields)
    }

    /// An object's members, each value read by `value` once its key and colon are read.
    fn members(&mut self, mut value: impl FnMut(&mut Self, &[u8]) -> Option<()>) -> Option<()> {
        if self.open(b'{', b'}')? {
            return Some(());
        }
        loop {
            self.space();
            let key = self.string()?;
            self.eat(b':')?;
            self.space();
            value(self, key)?;
            if self.ended(b'}')? {
                return Some(());
            }
        }
    }

    /// Any plain value, walked over; `depth` is that of the object it is in.
    fn value(&mut self, depth: u32) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(drop),
            b'0'..=b'9' => self.integer().map(drop),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'{' if depth < MAX_DEPTH => self.members(|reader, _| reader.value(depth + 1)),
            _ => None,
        }
    }

    /// A string of printable ASCII without escapes; its bytes between the quotes.
    fn string(&mut self) -> Option<&'a [u8]> {
        if self.peek()? != b'"' {
            return None;
        }
        let start = self.at + 1;
        let end = self.first_marked(start, unusual)?;
        let bytes: &'a [u8] = self.bytes;
        (bytes[end] == b'"').then(|| {
            self.at = end + 1;
            &bytes[start..end]
        })
    }

    /// An unsigned integer as JSON writes it: no leading zero, no fraction, no exponent.
    fn integer(&mut self) -> Option<u64> {
        self.0
            .integer(|next| matches!(next, Some(b' ' | b'\t' | b'\n' | b'\r' | b',' | b'}')))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// serde's reading of the object `bytes` begin with, as the scanner asks for it.
    fn by_serde(bytes: &[u8]) -> Option<(usize, Fields)> {
        let mut objects = serde_json::Deserializer::from_slice(bytes).into_iter::<Fields>();
        let fields = objects.next()?.ok()?;
        Some((objects.byte_offset(), fields))
    }

    fn read(text: &str) -> Option<(usize, Fields)> {
        read_prefix(text.as_bytes())
    }

    #[test]
    fn reads_a_chat_usage_with_its_details() {
        let text = r#"{"prompt_tokens":42,"completion_tokens":36,"total_tokens":78,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}},"x":1"#;
        let (taken, fields) = read(text).unwrap();
        assert_eq!(&text[taken..], r#","x":1"#);
        assert_eq!(
            (
                fields.prompt_tokens,
                fields.completion_tokens,
                fields.total_tokens
            ),
            (Some(42), Some(36), Some(78))
        );
        let (_, fields) =
            read(r#"{ "input_tokens" : 7 , "cache_read_input_tokens": null }"#).unwrap();
        assert_eq!(
            (fields.input_tokens, fields.cache_read_input_tokens),
            (Some(7), None)
        );
        assert_eq!(read("{}").unwrap().0, 2);
    }

    #[test]
    fn leaves_to_serde_what_it_does_not_read_exactly() {
        for text in [
            r#"{"prompt_tokens":1.5}"#,
            r#"{"prompt_tokens":-1}"#,
            r#"{"prompt_tokens":1e3}"#,
            r#"{"prompt_tokens":01}"#,
            r#"{"prompt_tokens":"1"}"#,
            r#"{"prompt_tokens":18446744073709551615}"#,
            r#"{"prompt_tokens":1,"prompt_tokens":2}"#,
            r#"{"pr\u006fmpt_tokens":1}"#,
            r#"{"a":[1]}"#,
            r#"{"a":"é"}"#,
            r#"{"a":1,}"#,
            r#"{"a":1"#,
            r#"{"a":{"b":{"c":{"d":{"e":{"f":{"g":{"h":{"i":1}}}}}}}}}"#,
            r#"{"a" 1}"#,
            "{\"a\":\"\t\"}",
        ] {
            assert!(read(text).is_none(), "{text}");
        }
    }

    /// Values of the shapes read here, and of others, in objects nested a few deep.
    fn value() -> impl Strategy<Value = String> {
        let plain = prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("false".to_owned()),
            (0u64..1000).prop_map(|n| n.to_string()),
            "[a-z ]{0,10}".prop_map(|s| format!("\"{s}\"")),
        ];
        let odd = prop_oneof![
            any::<u64>().prop_map(|n| n.to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            Just("1.5".to_owned()),
            Just("01".to_owned()),
            Just("[1,2]".to_owned()),
            "[ -~é\\\\\"]{0,10}".prop_map(|s| serde_json::to_string(&s).unwrap()),
        ];
        let leaf = prop_oneof![12 => plain, 1 => odd];
        leaf.prop_recursive(10, 64, 5, |inner| {
            proptest::collection::vec(("[a-z_]{1,8}", inner), 0..5).prop_map(|members| {
                let members: Vec<String> = members
                    .into_iter()
                    .map(|(k, v)| format!("\"{k}\":{v}"))
                    .collect();
                format!("{{{}}}", members.join(","))
            })
        })
    }

    proptest! {
        /// Whatever this reads, serde reads the same way: the same counts, ending at the same
        /// byte. Objects built only of the plain shapes are all read.
        #[test]
        fn gives_serdes_answer_or_none(
            members in proptest::collection::vec(prop_oneof![
                ("[a-z_]{1,12}", value()),
                (
                    proptest::sample::select(vec!["prompt_tokens", "completion_tokens",
                        "total_tokens", "input_tokens", "output_tokens",
                        "cache_read_input_tokens", "cache_creation_input_tokens"])
                        .prop_map(str::to_owned),
                    prop_oneof![
                        6 => (0u64..1_000_000).prop_map(|n| n.to_string()),
                        1 => Just("null".to_owned()),
                        1 => value(),
                    ],
                ),
            ], 0..8),
            spaces in proptest::collection::vec(
                proptest::sample::select(vec!["", " ", "\n", "\t", "\r\n  "]), 5),
            tail in "[ -~]{0,8}",
        ) {
            let members: Vec<String> = members
                .iter()
                .map(|(k, v)| format!("{s}\"{k}\"{s}:{t}{v}{t}", s = spaces[0], t = spaces[1]))
                .collect();
            let comma = format!("{},{}", spaces[3], spaces[3]);
            let text = format!("{{{}{}{}}}{}", spaces[2], members.join(&comma), spaces[4], tail);
            let fast = read_prefix(text.as_bytes());
            if let Some(fast) = fast {
                prop_assert_eq!(Some(fast), by_serde(text.as_bytes()), "{}", text);
            }
        }

        /// Bytes of any kind after the brace, most of them those JSON is made of: never a
        /// panic, and never an answer serde would not give.
        #[test]
        fn any_bytes_give_serdes_answer_or_none(
            pieces in proptest::collection::vec(prop_oneof![
                4 => proptest::sample::select(
                    b"{}[]\":,0123456789 \n\\-.etrufalsn_abc".to_vec()).prop_map(|b| vec![b]),
                1 => any::<u8>().prop_map(|b| vec![b]),
                1 => Just(b"\"prompt_tokens\":".to_vec()),
                1 => Just(b"\"total_tokens\":12".to_vec()),
            ], 0..64),
        ) {
            let text = [&b"{"[..], &pieces.concat()].concat();
            if let Some(fast) = read_prefix(&text) {
                prop_assert_eq!(Some(fast), by_serde(&text), "{:?}", String::from_utf8_lossy(&text));
            }
        }

        #[test]
        fn plain_objects_are_all_read(
            counts in proptest::collection::vec(0u64..10_000_000_000_000_000_000, 3),
            details in proptest::collection::vec(("[a-z_]{1,12}", 0u64..1_000_000), 0..5),
        ) {
            let details: Vec<String> =
                details.iter().map(|(k, n)| format!("\"{k}\":{n}")).collect();
            let text = format!(
                r#"{{"prompt_tokens":{},"completion_tokens":{},"total_tokens":{},"prompt_tokens_details":{{{}}}}}"#,
                counts[0], counts[1], counts[2], details.join(",")
            );
            let fast = read_prefix(text.as_bytes());
            prop_assert!(fast.is_some(), "{}", text);
            prop_assert_eq!(fast, by_serde(text.as_bytes()));
        }
    }
}
