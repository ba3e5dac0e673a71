//! What the two JSON readers that skip serde share (`request/json/plain.rs` for a request's
//! fields, `usage/plain.rs` for an answer's `usage`): a cursor over the text with JSON's white
//! space, literals and unsigned integers, and the word-at-a-time marking of the bytes a string
//! scan stops at.

/// Digits of the largest integer read: every 19-digit number fits a `u64`.
const MAX_DIGITS: usize = 19;

const ONES: u64 = 0x0101_0101_0101_0101;
/// The high bit of each byte of a word.
pub(crate) const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The bytes of `word` (little-endian) equal to `byte`, each marked by its high bit. Past the
/// first one marked, others may be marked wrongly; the first is always right, and none is marked
/// when there is none. The same holds for [`controls`] and for any `|` of these.
pub(crate) fn marks(word: u64, byte: u8) -> u64 {
    let w = word ^ (ONES * u64::from(byte));
    w.wrapping_sub(ONES) & !w & HIGHS
}

/// The bytes of `word` below a space (control characters), marked as [`marks`] marks.
pub(crate) fn controls(word: u64) -> u64 {
    word.wrapping_sub(ONES * 0x20) & !word & HIGHS
}

/// A place in JSON text.
pub(crate) struct Cursor<'a> {
    pub bytes: &'a [u8],
    pub at: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes, at: 0 }
    }

    pub(crate) fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    /// Past JSON's white space.
    pub(crate) fn space(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    /// `byte` next, after any white space.
    pub(crate) fn eat(&mut self, byte: u8) -> Option<()> {
        self.space();
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// `open` next (`{` or `[`), after any white space: `true` when `close` follows at once (an
    /// empty object or array), which is then taken too.
    pub(crate) fn open(&mut self, open: u8, close: u8) -> Option<bool> {
        self.eat(open)?;
        self.space();
        let empty = self.peek()? == close;
        if empty {
            self.at += 1;
        }
        Some(empty)
    }

    /// After a member or an element: `,` for another (`false`), `close` for the end (`true`).
    pub(crate) fn ended(&mut self, close: u8) -> Option<bool> {
        self.space();
        let byte = self.peek()?;
        self.at += 1;
        match byte {
            b',' => Some(false),
            _ if byte == close => Some(true),
            _ => None,
        }
    }

    /// Where the first byte from `from` on lies that `marked` marks (a function of a
    /// little-endian word built of [`marks`] and [`controls`]): eight bytes at a time, a byte at
    /// a time only in the last few. `None` when no byte is marked.
    pub(crate) fn first_marked(&self, from: usize, marked: impl Fn(u64) -> u64) -> Option<usize> {
        let mut at = from;
        while let Some(word) = self.bytes.get(at..at + 8) {
            match marked(u64::from_le_bytes(word.try_into().ok()?)) {
                0 => at += 8,
                found => return Some(at + found.trailing_zeros() as usize / 8),
            }
        }
        let tail = self.bytes.get(at..)?;
        let within = tail
            .iter()
            .position(|&b| marked(u64::from(b)) & 0x80 != 0)?;
        Some(at + within)
    }

    /// `word` next (`true`, `false`, `null`).
    pub(crate) fn literal(&mut self, word: &[u8]) -> Option<()> {
        let found = self.bytes.get(self.at..self.at + word.len())? == word;
        found.then(|| self.at += word.len())
    }

    /// An unsigned integer as JSON writes it (no leading zero), of at most 19 digits, whose next
    /// byte `ends` accepts.
    pub(crate) fn integer(&mut self, ends: impl Fn(Option<&u8>) -> bool) -> Option<u64> {
        let rest = &self.bytes[self.at..];
        let mut n: u64 = 0;
        let mut digits = 0;
        while let Some(&d @ b'0'..=b'9') = rest.get(digits) {
            if digits == MAX_DIGITS || (digits == 1 && n == 0) {
                return None;
            }
            n = n * 10 + u64::from(d - b'0');
            digits += 1;
        }
        (digits > 0 && ends(rest.get(digits))).then(|| {
            self.at += digits;
            n
        })
    }
}

/// A reader built on a [`Cursor`] (each reader adds what it reads to one), used as the cursor.
macro_rules! on_a_cursor {
    ($reader:ident) => {
        struct $reader<'a>(crate::json_scan::Cursor<'a>);

        impl<'a> std::ops::Deref for $reader<'a> {
            type Target = crate::json_scan::Cursor<'a>;
            fn deref(&self) -> &Self::Target {
                &self.0
            }
        }

        impl std::ops::DerefMut for $reader<'_> {
            fn deref_mut(&mut self) -> &mut Self::Target {
                &mut self.0
            }
        }
    };
}
pub(crate) use on_a_cursor;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_byte_marked_is_the_first_one_asked_for() {
        let word = u64::from_le_bytes(*b"ab\"c\\\x01\x7f\xff");
        assert_eq!(marks(word, b'"').trailing_zeros() / 8, 2);
        assert_eq!(marks(word, b'\\').trailing_zeros() / 8, 4);
        assert_eq!(controls(word).trailing_zeros() / 8, 5);
        assert_eq!(marks(word, b'z'), 0);
        assert_eq!(controls(u64::from_le_bytes(*b"plain ok")), 0);
    }

    #[test]
    fn the_first_marked_byte_is_found_in_whole_words_and_in_the_tail() {
        let quote = |w| marks(w, b'"');
        for (text, from, found) in [
            (&b"abcdefgh\"ij"[..], 0, Some(8)),
            (b"ab\"defghijk\"", 0, Some(2)),
            (b"ab\"defghijk\"", 3, Some(11)),
            (b"abc\"", 0, Some(3)),
            (b"abcdefghijkl", 0, None),
            (b"", 0, None),
        ] {
            assert_eq!(
                Cursor::new(text).first_marked(from, quote),
                found,
                "{text:?}"
            );
        }
    }

    #[test]
    fn integers_take_no_leading_zero_and_at_most_nineteen_digits() {
        let any = |_: Option<&u8>| true;
        assert_eq!(Cursor::new(b"0").integer(any), Some(0));
        assert_eq!(Cursor::new(b"01").integer(any), None);
        assert_eq!(
            Cursor::new(b"9999999999999999999").integer(any),
            Some(9_999_999_999_999_999_999)
        );
        assert_eq!(Cursor::new(b"10000000000000000000").integer(any), None);
        assert_eq!(Cursor::new(b"12.5").integer(|b| b != Some(&b'.')), None);
        let mut c = Cursor::new(b"12,");
        assert_eq!(c.integer(|b| b == Some(&b',')), Some(12));
        assert_eq!(c.at, 2);
    }
}
