//! The response's model and finish reasons, read from its body as it is relayed, for the span's
//! `gen_ai.response.model` and `gen_ai.response.finish_reasons`.
//!
//! Like the usage scanner (`crate::usage`) it never holds the body: a byte-at-a-time match of
//! the keys `"model"`, `"finish_reason"` (OpenAI's APIs) and `"stop_reason"` (Anthropic's), each
//! followed by optional whitespace, `:`, optional whitespace and a string, whose value is kept
//! up to [`MAX_VALUE`] bytes. Inside a JSON string every quote is escaped, so the key's text in
//! a message's content never matches. Only the first model is kept, and at most
//! [`MAX_REASONS`] distinct reasons (one per choice). It runs only for a sampled span.

/// The longest value kept; a longer one is cut here.
const MAX_VALUE: usize = 128;
/// Distinct finish reasons kept at most.
const MAX_REASONS: usize = 8;

const KEYS: [&[u8]; 3] = [b"\"model\"", b"\"finish_reason\"", b"\"stop_reason\""];

/// What was read of a response body.
#[derive(Debug, Default)]
pub(crate) struct Fields {
    pub model: Option<String>,
    pub finish_reasons: Vec<String>,
    /// How much of each key the last bytes matched.
    matched: [usize; 3],
    state: State,
    value: Vec<u8>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum State {
    #[default]
    Seeking,
    /// Key `0` matched: waiting for the colon.
    Colon(usize),
    /// After the colon: waiting for the string's opening quote.
    Open(usize),
    /// Inside the string; `escaped` after a backslash.
    Value { key: usize, escaped: bool },
}

impl Fields {
    pub(crate) fn feed(&mut self, chunk: &[u8]) {
        for &byte in chunk {
            self.step(byte);
        }
    }

    fn step(&mut self, byte: u8) {
        match self.state {
            State::Seeking => {
                for (key, pattern) in KEYS.iter().enumerate() {
                    let m = &mut self.matched[key];
                    if pattern[*m] == byte {
                        *m += 1;
                        if *m == pattern.len() {
                            self.matched = [0; 3];
                            self.state = State::Colon(key);
                            return;
                        }
                    } else {
                        *m = usize::from(byte == b'"');
                    }
                }
            }
            State::Colon(key) => match byte {
                b':' => self.state = State::Open(key),
                b' ' | b'\t' | b'\r' | b'\n' => {}
                _ => self.reseek(byte),
            },
            State::Open(key) => match byte {
                b'"' => {
                    self.value.clear();
                    self.state = State::Value {
                        key,
                        escaped: false,
                    };
                }
                b' ' | b'\t' | b'\r' | b'\n' => {}
                _ => self.reseek(byte),
            },
            State::Value { key, escaped } => {
                if escaped || byte != b'"' {
                    let escaped = !escaped && byte == b'\\';
                    if !escaped && self.value.len() < MAX_VALUE {
                        self.value.push(byte);
                    }
                    self.state = State::Value { key, escaped };
                } else {
                    self.keep(key);
                    self.state = State::Seeking;
                }
            }
        }
    }

    /// Not a key after all: the byte may start one.
    fn reseek(&mut self, byte: u8) {
        self.state = State::Seeking;
        self.step(byte);
    }

    fn keep(&mut self, key: usize) {
        let value = String::from_utf8_lossy(&self.value).into_owned();
        if key == 0 {
            self.model.get_or_insert(value);
        } else if self.finish_reasons.len() < MAX_REASONS && !self.finish_reasons.contains(&value) {
            self.finish_reasons.push(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn read(chunks: &[&[u8]]) -> Fields {
        let mut f = Fields::default();
        for c in chunks {
            f.feed(c);
        }
        f
    }

    #[test]
    fn a_chat_completion_gives_its_model_and_reason() {
        let body = br#"{"id":"x","model":"llama-3","choices":[{"index":0,"message":{"role":"assistant","content":"the \"model\": \"fake\""},"finish_reason":"stop"}]}"#;
        let f = read(&[body]);
        assert_eq!(f.model.as_deref(), Some("llama-3"));
        assert_eq!(f.finish_reasons, ["stop"]);
    }

    #[test]
    fn a_stream_gives_the_first_model_and_each_reason_once() {
        let f = read(&[
            b"data: {\"model\" : \"m1\",\"choices\":[{\"finish_reason\":null}]}\n\n",
            b"data: {\"model\":\"m1\",\"choices\":[{\"index\":0,\"finish_reason\":\"length\"},{\"index\":1,\"finish_reason\":\"stop\"}]}\n\n",
            b"data: {\"model\":\"other\",\"choices\":[{\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
        ]);
        assert_eq!(f.model.as_deref(), Some("m1"));
        assert_eq!(f.finish_reasons, ["length", "stop"]);
    }

    #[test]
    fn anthropic_stop_reasons_count() {
        let f = read(&[br#"{"type":"message","model":"claude","stop_reason":"end_turn"}"#]);
        assert_eq!(f.model.as_deref(), Some("claude"));
        assert_eq!(f.finish_reasons, ["end_turn"]);
    }

    #[test]
    fn a_value_is_cut_at_its_cap() {
        let long = "m".repeat(1000);
        let f = read(&[format!("{{\"model\":\"{long}\"}}").as_bytes()]);
        assert_eq!(f.model.unwrap().len(), MAX_VALUE);
    }

    proptest! {
        /// However the body is split into chunks, the same fields are read.
        #[test]
        fn chunking_does_not_change_what_is_read(cuts in proptest::collection::vec(0usize..160, 0..6)) {
            let body: &[u8] = br#"data: {"model":"a-b","choices":[{"finish_reason":"tool_calls"}]}

data: {"model":"z","stop_reason":"max_tokens"}
"#;
            let whole = read(&[body]);
            let mut cuts = cuts.into_iter().map(|c| c.min(body.len())).collect::<Vec<_>>();
            cuts.sort_unstable();
            let mut chunks = Vec::new();
            let mut at = 0;
            for c in cuts {
                chunks.push(&body[at..c]);
                at = c;
            }
            chunks.push(&body[at..]);
            let split = read(&chunks);
            prop_assert_eq!(split.model, whole.model);
            prop_assert_eq!(split.finish_reasons, whole.finish_reasons);
        }
    }
}
