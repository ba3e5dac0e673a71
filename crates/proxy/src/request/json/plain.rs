//! A request body's top-level fields read without serde, when the body is plain JSON.
//!
//! serde's derive reads the body as a struct: each key decoded and matched, each value it does
//! not keep walked over and checked. On the benchmark's 366-byte chat request that took about
//! 5 k instructions, more than any other step of the gateway's own. This reads the same body
//! in one pass: strings are skipped eight bytes at a time, and only the few fields routing
//! reads are looked at.
//!
//! It reads only what it can read exactly as serde would: a top-level object whose keys have no
//! escapes, the fields it keeps in the shapes below, and anything else of valid JSON (escapes
//! included) at most [`MAX_DEPTH`] deep. On everything else (a key or a kept string that is not
//! UTF-8 or has an escape, a kept number that is negative, a fraction or too
//! long, a kept field given twice, an array at the top) it gives up with `None`, and the caller
//! asks serde, which then decides, with its error message. So wherever this gives an answer
//! it is serde's answer (a property test holds it to that), and it is never the only judge of
//! a body it refuses.

use std::borrow::Cow;

use super::Fields;
use crate::json_scan::{self, Cursor};

/// Nesting beyond this is left to serde (whose own limit is 128).
const MAX_DEPTH: u32 = 64;

/// The fields of `body`, if it is plain JSON as the module describes.
pub(super) fn read(body: &[u8]) -> Option<Fields<'_>> {
    let mut reader = Reader(Cursor::new(body));
    let fields = reader.top()?;
    reader.space();
    (reader.at == body.len()).then_some(fields)
}

/// The bytes of `word` (little-endian) that end a run of a string's plain content (a quote, a
/// backslash or a control character), marked as [`json_scan::marks`] marks them.
fn string_stop(word: u64) -> u64 {
    json_scan::marks(word, b'"') | json_scan::marks(word, b'\\') | json_scan::controls(word)
}

/// The fields kept, each with the shapes read here.
#[derive(Clone, Copy)]
enum Kept {
    Model,
    Stream,
    MaxTokens,
    MaxCompletionTokens,
    MaxOutputTokens,
    N,
    PreviousResponseId,
    Store,
}

impl Kept {
    fn of(key: &[u8]) -> Option<Kept> {
        Some(match key {
            b"model" => Kept::Model,
            b"stream" => Kept::Stream,
            b"max_tokens" => Kept::MaxTokens,
            b"max_completion_tokens" => Kept::MaxCompletionTokens,
            b"max_output_tokens" => Kept::MaxOutputTokens,
            b"n" => Kept::N,
            b"previous_response_id" => Kept::PreviousResponseId,
            b"store" => Kept::Store,
            _ => return None,
        })
    }
}

/// A kept value as serde's `serde_json::Value` would hold it, in the shapes read here.
enum Plain<'a> {
    Null,
    Bool(bool),
    Count(u64),
    Text(&'a str),
}

json_scan::on_a_cursor!(Reader);

impl<'a> Reader<'a> {
    /// The top-level object: the kept fields read, everything else walked over.
    fn top(&mut self) -> Option<Fields<'a>> {
        let mut fields = Fields::default();
        // serde refuses a kept field given twice; so does this, by leaving it to serde.
        let mut seen = [false; 8];
        if self.open(b'{', b'}')? {
            return Some(fields);
        }
        loop {
            self.space();
            // serde checks that a key is UTF-8 even where it matches no field (the usual
            // ASCII key needs no more than a look).
            let key = self.string(false)?;
            if !key.is_ascii() {
                std::str::from_utf8(key).ok()?;
            }
            self.eat(b':')?;
            self.space();
            match Kept::of(key) {
                Some(kept) => {
                    if std::mem::replace(&mut seen[kept as usize], true) {
                        return None;
                    }
                    let value = self.plain()?;
                    keep(&mut fields, kept, value)?;
                }
                None => self.value(1)?,
            }
            if self.ended(b'}')? {
                return Some(fields);
            }
        }
    }

    /// A kept field's value: `null`, `true`, `false`, an unsigned integer or a string without
    /// escapes.
    fn plain(&mut self) -> Option<Plain<'a>> {
        Some(match self.peek()? {
            b'n' => self.literal(b"null").map(|()| Plain::Null)?,
            b't' => self.literal(b"true").map(|()| Plain::Bool(true))?,
            b'f' => self.literal(b"false").map(|()| Plain::Bool(false))?,
            b'"' => Plain::Text(std::str::from_utf8(self.string(false)?).ok()?),
            _ => Plain::Count(self.integer()?),
        })
    }

    /// Any JSON value, walked over and checked as serde checks what it ignores; `depth` is that
    /// of the object or array it is in.
    fn value(&mut self, depth: u32) -> Option<()> {
        match self.peek()? {
            b'"' => self.string(true).map(drop),
            b'{' if depth < MAX_DEPTH => {
                if self.open(b'{', b'}')? {
                    return Some(());
                }
                loop {
                    self.space();
                    self.string(true)?;
                    self.eat(b':')?;
                    self.space();
                    self.value(depth + 1)?;
                    if self.ended(b'}')? {
                        return Some(());
                    }
                }
            }
            b'[' if depth < MAX_DEPTH => {
                if self.open(b'[', b']')? {
                    return Some(());
                }
                loop {
                    self.space();
                    self.value(depth + 1)?;
                    if self.ended(b']')? {
                        return Some(());
                    }
                }
            }
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    /// A string at the reader, its bytes between the quotes. With `escapes`, the escapes JSON
    /// has are walked over (the bytes are then not decoded, only good to drop); without, an
    /// escape gives up. The bytes are not checked as UTF-8: serde checks only those of the
    /// strings it keeps, and so does this.
    fn string(&mut self, escapes: bool) -> Option<&'a [u8]> {
        if self.peek()? != b'"' {
            return None;
        }
        let start = self.at + 1;
        let mut at = start;
        loop {
            let stop = self.first_marked(at, string_stop)?;
            match self.bytes[stop] {
                b'"' => {
                    self.at = stop + 1;
                    return Some(&self.bytes[start..stop]);
                }
                b'\\' if escapes => at = stop + escape_len(&self.bytes[stop + 1..])? + 1,
                // A control character, or an escape where none is read.
                _ => return None,
            }
        }
    }

    /// An unsigned integer that is not the start of a fraction or an exponent.
    fn integer(&mut self) -> Option<u64> {
        self.0
            .integer(|next| !matches!(next, Some(b'.' | b'e' | b'E')))
    }

    /// Any number as JSON writes it, walked over: `-`, no leading zero, a fraction and an
    /// exponent each with at least one digit.
    fn number(&mut self) -> Option<()> {
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek()? {
            b'0' => self.at += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            self.some_digits()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            self.some_digits()?;
        }
        Some(())
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.at += 1;
        }
    }

    fn some_digits(&mut self) -> Option<()> {
        let start = self.at;
        self.digits();
        (self.at > start).then_some(())
    }
}

/// The length of the escape after a backslash (`rest` begins after it), as serde walks over
/// one it ignores: one of `"\/bfnrt`, or `u` and four hex digits (any, a lone surrogate too).
fn escape_len(rest: &[u8]) -> Option<usize> {
    match rest.first()? {
        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(1),
        b'u' => rest
            .get(1..5)?
            .iter()
            .all(u8::is_ascii_hexdigit)
            .then_some(5),
        _ => None,
    }
}

/// Puts a kept field's value where serde's reading of it would put it; `None` for a shape
/// serde would refuse.
fn keep<'a>(fields: &mut Fields<'a>, kept: Kept, value: Plain<'a>) -> Option<()> {
    // What `serde_json::Value::as_u64` and `as_bool` give for the value.
    let count = match value {
        Plain::Count(n) => Some(n),
        _ => None,
    };
    let flag = match value {
        Plain::Bool(b) => Some(b),
        _ => None,
    };
    match kept {
        Kept::Model | Kept::PreviousResponseId => {
            let text = match value {
                Plain::Null => None,
                Plain::Text(text) => Some(Cow::Borrowed(text)),
                Plain::Bool(_) | Plain::Count(_) => return None,
            };
            match kept {
                Kept::Model => fields.model = text,
                _ => fields.previous_response_id = text,
            }
        }
        // `Option<bool>`: `null` or a boolean.
        Kept::Stream => match value {
            Plain::Null | Plain::Bool(_) => fields.stream = flag,
            Plain::Count(_) | Plain::Text(_) => return None,
        },
        Kept::MaxTokens => fields.max_tokens = count,
        Kept::MaxCompletionTokens => fields.max_completion_tokens = count,
        Kept::MaxOutputTokens => fields.max_output_tokens = count,
        Kept::N => fields.n = count,
        Kept::Store => fields.store = flag,
    }
    Some(())
}

#[cfg(test)]
#[path = "plain_tests.rs"]
mod tests;
