//! Token usage reported by backends, read from response bodies as they are relayed.
//!
//! Tokens-per-minute limits admit a request by reserving an estimate of its tokens; the estimate
//! is then reconciled with the `usage` object the backend reports, for plain JSON responses and
//! for SSE streams alike (a chat stream reports it once, in its last event, when the request asked
//! for `stream_options: {"include_usage": true}`; a Responses stream in `response.completed`; a
//! Messages stream in `message_start` and `message_delta`). The count has to come from the
//! backend: a client has every reason to under-report.
//!
//! The relay passes each frame on unchanged and shows it to a [`UsageScanner`] on the way. A
//! gateway's memory must not grow with the size of what it relays, so the scanner never holds the
//! body: it is a byte-at-a-time state machine whose only carry-over between chunks is its state
//! (how much of the key `"usage"` it has matched), plus the `usage` object itself while it is
//! being read, capped at [`MAX_USAGE_BYTES`]. Each byte costs constant work, and most cost less:
//! the text between keys is skipped with a vectorised search for the key, and a `usage` object
//! that lies whole in one chunk (the usual case) is parsed where it lies, the parse telling where
//! it ends (a plain one by `plain.rs` in one pass, any other by serde); only one split across
//! chunks is copied.
//!
//! What is matched, and the edge cases accepted:
//! - The key is the literal `"usage"` followed by optional whitespace, `:`, optional whitespace
//!   and `{`. In valid JSON that can only be an object key: inside a string value every quote is
//!   escaped (`\"usage\"`), so the text `"content":"the \"usage\": {...}"` never matches.
//! - A key named `usage` at any depth counts, not only the top-level one: a vendor extension
//!   nesting its own `"usage": {...}` deeper in a body is read as the report if it comes last.
//! - A key spelled with escapes (`"\u0075sage"`) is not recognised; no backend writes that.
//! - A body that is not JSON at all (an HTML error page) is scanned like any other: a
//!   `"usage": {` in it is captured, fails to parse and is ignored.
//! - In an SSE body only `data:` lines are read, and a blank line (the end of an event) drops any
//!   half-read object, so one truncated event cannot swallow the next. Comment, `event:` and `id:`
//!   lines are skipped; a JSON value spread over several `data:` lines is read as the SSE spec
//!   joins them (with a line feed, which JSON treats as whitespace).
//! - An object larger than [`MAX_USAGE_BYTES`] is given up on and scanning resumes at the next
//!   byte, so a body can never keep the scanner capturing for more than that many bytes.
//! - An object whose counts are not non-negative integers is ignored, as is `"usage": null`
//!   (sent in every stream chunk by some backends and settings). Each count is the last one
//!   read: a later object replaces the counts it gives and leaves the others (a Messages stream
//!   gives the prompt in `message_start` and only the output in `message_delta`).
//! - Chat completions, completions and embeddings say `prompt_tokens` and `completion_tokens`;
//!   the Responses and Messages APIs say `input_tokens` and `output_tokens` (the Messages API's
//!   prompt-cache reads and writes, `cache_read_input_tokens` and `cache_creation_input_tokens`,
//!   count as prompt tokens too).

use serde::Deserialize;

/// The most bytes a `usage` object may take. Real ones, details included, are a few hundred.
pub const MAX_USAGE_BYTES: usize = 4096;

/// What a `usage` object's buffer is made room for when the first one starts.
const USUAL_USAGE_BYTES: usize = 512;

/// Token usage as a backend reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
}

/// Finds the last `usage` object in a response body fed to it chunk by chunk.
#[derive(Debug)]
pub struct UsageScanner {
    sse: bool,
    /// Where the scanner is in the current line of an SSE body.
    line: Line,
    /// The previous byte was a CR ending an SSE line, so an LF right after it ends nothing.
    after_cr: bool,
    json: Json,
    /// The `usage` object being read, at most [`MAX_USAGE_BYTES`].
    object: Vec<u8>,
    last: Option<Usage>,
}

impl UsageScanner {
    /// `sse`: the body is a text/event-stream.
    pub fn new(sse: bool) -> Self {
        Self {
            sse,
            line: Line::Start(0),
            after_cr: false,
            json: Json::SEEKING,
            object: Vec::new(),
            last: None,
        }
    }

    /// Looks at the next chunk of the body (chunks split anywhere, even inside a key or a number).
    ///
    /// The result is that of feeding the chunk a byte at a time (the tests hold it to that), but
    /// the runs of bytes that cannot change the state are found with `memchr`: the JSON text
    /// before the next `"usage"` (and the key itself) and SSE lines that are not data are
    /// skipped. A `usage` object whole in the chunk is parsed in place; the bytes of one that is
    /// not are walked in one loop and copied whole.
    pub fn feed(&mut self, chunk: &[u8]) {
        if self.sse {
            self.feed_sse(chunk);
        } else {
            self.feed_json(chunk);
        }
    }

    /// [`feed`](Self::feed) without the skips: every byte through the state machine.
    #[cfg(test)]
    fn feed_bytewise(&mut self, chunk: &[u8]) {
        for &byte in chunk {
            if self.sse {
                self.sse_step(byte);
            } else {
                self.json_step(byte);
            }
        }
    }

    fn feed_json(&mut self, mut bytes: &[u8]) {
        while let Some(&byte) = bytes.first() {
            if let Json::Seeking {
                matched: 0,
                after_backslash,
            } = self.json
            {
                // Nothing of the key is matched: up to the next whole key every byte leaves the
                // state as it is, but for the backslash flag, which only the last skipped byte
                // decides; a key whose quote no backslash escapes is the whole key matched. With
                // no whole key, a match can begin only at a quote among the last bytes, and the
                // bytes up to it (all of them, without one) are skipped the same way.
                let (at, whole) = match key_finder().find(bytes) {
                    Some(at) => (at, true),
                    None => {
                        let tail = bytes.len().saturating_sub(KEY.len() - 1);
                        let quote = memchr::memchr(b'"', &bytes[tail..]);
                        (quote.map_or(bytes.len(), |q| tail + q), false)
                    }
                };
                // Whether the byte before `at` (the key's quote, or the first byte not skipped)
                // is a backslash.
                let backslash_before = match at {
                    0 => after_backslash,
                    _ => bytes[at - 1] == b'\\',
                };
                if whole && !backslash_before {
                    self.json = Json::BeforeColon;
                    bytes = &bytes[at + KEY.len()..];
                    continue;
                }
                if at > 0 {
                    self.json = Json::Seeking {
                        matched: 0,
                        after_backslash: backslash_before,
                    };
                    bytes = &bytes[at..];
                    continue;
                }
            }
            if let (Json::BeforeValue, b'{') = (self.json, byte) {
                // The usual case: the whole object is in this chunk, and the parse that reads
                // its counts also finds where it ends. An object split across chunks, or one
                // that does not parse, is walked a byte at a time below instead (the same
                // answer: a parse that succeeds ends where the walk would).
                let window = &bytes[..bytes.len().min(MAX_USAGE_BYTES)];
                if let Some((taken, reported)) = parse_prefix(window) {
                    self.report(reported);
                    self.json = Json::SEEKING;
                    bytes = &bytes[taken..];
                    continue;
                }
            }
            if let Json::Object {
                depth,
                in_string,
                escaped,
            } = self.json
            {
                // Inside the object, the bytes up to its closing brace (or up to the cap) are
                // walked in one tight loop and kept whole: stepping the state machine between
                // each quote cost more than the rest of the body's scan together.
                let room = MAX_USAGE_BYTES.saturating_sub(self.object.len());
                let window = &bytes[..bytes.len().min(room)];
                if !window.is_empty() {
                    let (taken, state) = walk_object(window, depth, in_string, escaped);
                    self.object.extend_from_slice(&window[..taken]);
                    bytes = &bytes[taken..];
                    match state {
                        Some(json) => self.json = json,
                        None => self.object_ended(),
                    }
                    continue;
                }
            }
            self.json_step(byte);
            bytes = &bytes[1..];
        }
    }

    fn feed_sse(&mut self, mut bytes: &[u8]) {
        while let Some(&byte) = bytes.first() {
            // Inside a line, only its end changes the line's state: a data line's value goes to
            // the JSON scanner whole, any other line is skipped.
            if matches!(self.line, Line::Data | Line::Other) {
                let end = memchr::memchr2(b'\n', b'\r', bytes).unwrap_or(bytes.len());
                if end > 0 {
                    if let Line::Data = self.line {
                        self.feed_json(&bytes[..end]);
                    }
                    self.after_cr = false;
                    bytes = &bytes[end..];
                    continue;
                }
            }
            self.sse_step(byte);
            bytes = &bytes[1..];
        }
    }

    /// The last complete non-null `usage` object seen, if any.
    pub fn usage(&self) -> Option<Usage> {
        self.last
    }

    /// The usage to reconcile with once the body has ended; an object still half read is dropped.
    pub fn finish(self) -> Option<Usage> {
        self.last
    }

    fn sse_step(&mut self, byte: u8) {
        let line = self.line;
        if byte == b'\n' && self.after_cr {
            // The second half of a CRLF.
            self.after_cr = false;
            return;
        }
        self.after_cr = byte == b'\r';
        if byte == b'\n' || byte == b'\r' {
            match line {
                Line::Start(0) => self.reset(),
                Line::AfterField | Line::Data => self.json_step(b'\n'),
                Line::Start(_) | Line::Other => {}
            }
            self.line = Line::Start(0);
            return;
        }
        self.line = match line {
            Line::Start(n) if DATA_FIELD.get(n) == Some(&byte) => {
                if n + 1 == DATA_FIELD.len() {
                    Line::AfterField
                } else {
                    Line::Start(n + 1)
                }
            }
            Line::Start(_) => Line::Other,
            Line::AfterField => {
                // One space after the colon belongs to the field syntax, not to the data.
                if byte != b' ' {
                    self.json_step(byte);
                }
                Line::Data
            }
            Line::Data => {
                self.json_step(byte);
                Line::Data
            }
            Line::Other => Line::Other,
        };
    }

    fn json_step(&mut self, byte: u8) {
        self.json = match self.json {
            Json::Seeking {
                matched,
                after_backslash,
            } => {
                let matched =
                    if KEY.get(matched) == Some(&byte) && (matched > 0 || !after_backslash) {
                        matched + 1
                    } else {
                        // No proper prefix of the key ends in a quote, so a mismatch can only restart
                        // the match at a new opening quote.
                        usize::from(byte == b'"' && !after_backslash)
                    };
                if matched == KEY.len() {
                    Json::BeforeColon
                } else {
                    Json::Seeking {
                        matched,
                        after_backslash: byte == b'\\',
                    }
                }
            }
            Json::BeforeColon if is_json_space(byte) => Json::BeforeColon,
            Json::BeforeColon if byte == b':' => Json::BeforeValue,
            Json::BeforeValue if is_json_space(byte) => Json::BeforeValue,
            Json::BeforeValue if byte == b'{' => {
                self.object.clear();
                // Room for a usual object at once (with OpenAI's details about 300 bytes),
                // rather than growing to it a few bytes at a time.
                self.object.reserve(USUAL_USAGE_BYTES);
                self.object.push(byte);
                Json::Object {
                    depth: 1,
                    in_string: false,
                    escaped: false,
                }
            }
            // Not an object after all (`null`, or not a key): look at this byte afresh.
            Json::BeforeColon | Json::BeforeValue => return self.rescan(byte),
            Json::Object {
                depth,
                in_string,
                escaped,
            } => {
                if self.object.len() >= MAX_USAGE_BYTES {
                    return self.rescan(byte);
                }
                self.object.push(byte);
                match walk_object(&[byte], depth, in_string, escaped) {
                    (_, Some(json)) => json,
                    (_, None) => return self.object_ended(),
                }
            }
        };
    }

    /// The `usage` object's closing brace was read: its counts, if it is one, are the latest.
    fn object_ended(&mut self) {
        if let Some(reported) = parse(&self.object) {
            self.report(reported);
        }
        self.object.clear();
        self.json = Json::SEEKING;
    }

    /// A whole `usage` object's counts: the latest.
    fn report(&mut self, reported: Reported) {
        self.last = Some(self.last.unwrap_or_default().updated(reported));
    }

    /// Drops any partial match or object and looks at `byte` as if scanning had just begun.
    fn rescan(&mut self, byte: u8) {
        self.reset();
        self.json_step(byte);
    }

    fn reset(&mut self) {
        self.json = Json::SEEKING;
        self.object.clear();
    }
}

const KEY: &[u8] = b"\"usage\"";
const DATA_FIELD: &[u8] = b"data:";

/// The search for [`KEY`], built once.
fn key_finder() -> &'static memchr::memmem::Finder<'static> {
    static FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(KEY));
    &FINDER
}

/// Where the scanner is in an SSE line.
#[derive(Debug, Clone, Copy)]
enum Line {
    /// At the start of a line, with this many bytes of `data:` matched.
    Start(usize),
    /// Just after `data:`, where one space may follow.
    AfterField,
    /// In a data field's value: JSON.
    Data,
    /// In a line that is not a data field (a comment, `event:`, `id:`, `retry:`): ignored.
    Other,
}

/// Where the scanner is in the JSON text.
#[derive(Debug, Clone, Copy)]
enum Json {
    /// Looking for the key, `matched` bytes of it seen so far.
    Seeking {
        matched: usize,
        after_backslash: bool,
    },
    /// After the key, before the colon.
    BeforeColon,
    /// After the colon, before the value.
    BeforeValue,
    /// Inside the `usage` object, `depth` braces deep.
    Object {
        depth: u32,
        in_string: bool,
        escaped: bool,
    },
}

impl Json {
    const SEEKING: Json = Json::Seeking {
        matched: 0,
        after_backslash: false,
    };
}

/// Walks `bytes`, the next of a `usage` object in the given state, up to and including its
/// closing brace: how many bytes belong to it, and the state after them (`None` when the brace
/// closed it).
fn walk_object(
    bytes: &[u8],
    mut depth: u32,
    mut in_string: bool,
    mut escaped: bool,
) -> (usize, Option<Json>) {
    for (at, &byte) in bytes.iter().enumerate() {
        if escaped {
            escaped = false;
        } else if in_string {
            match byte {
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
        } else {
            match byte {
                b'"' => in_string = true,
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        return (at + 1, None);
                    }
                }
                _ => {}
            }
        }
    }
    let state = Json::Object {
        depth,
        in_string,
        escaped,
    };
    (bytes.len(), Some(state))
}

fn is_json_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// The counts one `usage` object reports, each `None` where it says nothing; `None` altogether
/// if it is not JSON or a count is not a `u64`.
///
/// Chat, completions and embeddings report `prompt_tokens` and `completion_tokens`; the Responses
/// and Messages APIs report `input_tokens` and `output_tokens`. The Messages API counts the
/// prompt tokens read from or written to its prompt cache apart from `input_tokens`
/// (`cache_read_input_tokens`, `cache_creation_input_tokens`); they are prompt tokens the
/// engine took in all the same, so they count as prompt tokens here.
fn parse(object: &[u8]) -> Option<Reported> {
    // The buffer ends at the object's closing brace: the object is all of it or it is not one.
    parse_prefix(object)
        .filter(|&(taken, _)| taken == object.len())
        .map(|(_, reported)| reported)
}

/// [`parse`] of the object `bytes` begin with, and how many bytes it took; `None` if they end
/// before it does or it does not parse.
fn parse_prefix(bytes: &[u8]) -> Option<(usize, Reported)> {
    if let Some((taken, fields)) = plain::read_prefix(bytes) {
        return Some((taken, fields.into()));
    }
    let mut objects = serde_json::Deserializer::from_slice(bytes).into_iter::<Fields>();
    let fields = objects.next()?.ok()?;
    Some((objects.byte_offset(), fields.into()))
}

/// The counts of a `usage` object; other fields (`prompt_tokens_details`,
/// `output_tokens_details`, ...) are ignored. Plain objects are read by `plain.rs` instead,
/// with the same result.
#[derive(Deserialize, Default)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct Fields {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    total_tokens: Option<u64>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
}

impl From<Fields> for Reported {
    fn from(f: Fields) -> Reported {
        let input = [
            f.input_tokens,
            f.cache_read_input_tokens,
            f.cache_creation_input_tokens,
        ];
        let input = input.iter().any(Option::is_some).then(|| {
            input
                .iter()
                .flatten()
                .fold(0u64, |a, n| a.saturating_add(*n))
        });
        Reported {
            prompt: f.prompt_tokens.or(input),
            completion: f.completion_tokens.or(f.output_tokens),
            total: f.total_tokens,
        }
    }
}

/// What one `usage` object said.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Reported {
    prompt: Option<u64>,
    completion: Option<u64>,
    total: Option<u64>,
}

impl Usage {
    /// The usage after `reported`, a later object, on top of `self`: each count the later one
    /// gives replaces the earlier one, and the others stay. A Messages stream reports the prompt
    /// in `message_start` and the final output count alone in `message_delta`.
    fn updated(self, reported: Reported) -> Usage {
        let prompt_tokens = reported.prompt.unwrap_or(self.prompt_tokens);
        let completion_tokens = reported.completion.unwrap_or(self.completion_tokens);
        let sum = prompt_tokens.saturating_add(completion_tokens);
        Usage {
            prompt_tokens,
            completion_tokens,
            // A reported total stands only beside both of the counts it adds up.
            total_tokens: match reported {
                Reported {
                    prompt: Some(_),
                    completion: Some(_),
                    total: Some(total),
                } => total,
                _ => sum,
            },
        }
    }
}

mod plain;
#[cfg(test)]
mod tests;
