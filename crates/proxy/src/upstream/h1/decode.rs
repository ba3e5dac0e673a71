//! How an upstream response body is delimited (RFC 9112 §6.3), and its decoding from what a
//! connection has read: a pure state machine over a buffer, so every way the bytes can arrive
//! split is testable without a socket.
//!
//! A connection may carry another request only when its body ended exactly where its framing
//! said: a body that runs to the connection's close, a head with both `Transfer-Encoding` and
//! `Content-Length`, or bytes after the end are never followed by another request on that
//! connection (the next response would be read from the wrong place: one caller's answer
//! handed to another).

use bytes::{Buf, Bytes, BytesMut};

/// The longest chunk-size line (with its extensions) read before it is an error.
const MAX_CHUNK_LINE: usize = 4096;
/// The most trailer bytes skipped after a chunked body before it is an error.
const MAX_TRAILERS: usize = 16 * 1024;
/// The most chunk-extension bytes a body's size lines may carry in all (each line is also held
/// to [`MAX_CHUNK_LINE`]): a backend sending a byte of data per 4 KiB of extensions is cut off.
const MAX_EXTENSIONS: usize = 16 * 1024;

/// How a body's end is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// `Content-Length`, or none at all (a `204`, a `304`).
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Neither: the body ends when the backend closes the connection.
    UntilClose,
}

/// A body's bytes were not framed as its head said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DecodeError {
    ChunkSize,
    ChunkLineTooLong,
    ExtensionsTooLong,
    ChunkDataEnd,
    TrailersTooLong,
    /// The connection closed before the framing's end.
    Truncated,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DecodeError::ChunkSize => "invalid chunk size line",
            DecodeError::ChunkLineTooLong => "chunk size line too long",
            DecodeError::ExtensionsTooLong => "chunk extensions too long",
            DecodeError::ChunkDataEnd => "chunk data not followed by CRLF",
            DecodeError::TrailersTooLong => "trailers too long",
            DecodeError::Truncated => "connection closed before the body's end",
        })
    }
}

/// What one step of decoding gave.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The next piece of the body.
    Data(Bytes),
    /// The buffer holds nothing more to decode: read more.
    NeedMore,
    /// The body ended.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Length(u64),
    ChunkSize,
    ChunkData(u64),
    ChunkDataEnd,
    Trailers(usize),
    UntilClose,
    Done,
}

/// Decodes one body from the bytes its connection reads.
#[derive(Debug)]
pub(crate) struct Decoder {
    state: State,
    /// Chunk-extension bytes read so far.
    extensions: usize,
}

impl Decoder {
    pub(crate) fn new(framing: Framing) -> Decoder {
        let state = match framing {
            Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::ChunkSize,
            Framing::UntilClose => State::UntilClose,
        };
        Decoder {
            state,
            extensions: 0,
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Bytes of body left, when the framing says.
    pub(crate) fn remaining(&self) -> Option<u64> {
        match self.state {
            State::Length(n) => Some(n),
            State::Done => Some(0),
            _ => None,
        }
    }

    /// The next piece of the body from `buf`, taking from it what it used.
    pub(crate) fn step(&mut self, buf: &mut BytesMut) -> Result<Step, DecodeError> {
        loop {
            match self.state {
                State::Done => return Ok(Step::Done),
                State::Length(left) | State::ChunkData(left) => {
                    if buf.is_empty() {
                        return Ok(Step::NeedMore);
                    }
                    let n = (buf.len() as u64).min(left);
                    let data = buf.split_to(n as usize).freeze();
                    let left = left - n;
                    self.state = match self.state {
                        State::Length(_) if left == 0 => State::Done,
                        State::Length(_) => State::Length(left),
                        _ if left == 0 => State::ChunkDataEnd,
                        _ => State::ChunkData(left),
                    };
                    return Ok(Step::Data(data));
                }
                State::UntilClose => {
                    if buf.is_empty() {
                        return Ok(Step::NeedMore);
                    }
                    return Ok(Step::Data(buf.split().freeze()));
                }
                _ => {
                    if !self.frame(buf)? {
                        return Ok(Step::NeedMore);
                    }
                }
            }
        }
    }

    /// Moves past the framing between chunks that `buf` already holds (the CRLF after a
    /// chunk's data, size lines, trailers) without taking data: so the end of a body whose last
    /// bytes and terminator came together is known at its last byte.
    pub(crate) fn settle(&mut self, buf: &mut BytesMut) -> Result<(), DecodeError> {
        while matches!(
            self.state,
            State::ChunkDataEnd | State::ChunkSize | State::Trailers(_)
        ) {
            if !self.frame(buf)? {
                break;
            }
        }
        Ok(())
    }

    /// The connection closed: the end of a body that runs until then, an error for any other.
    pub(crate) fn closed(&mut self) -> Result<(), DecodeError> {
        match self.state {
            State::UntilClose | State::Done => {
                self.state = State::Done;
                Ok(())
            }
            _ => Err(DecodeError::Truncated),
        }
    }

    /// One framing element (a chunk's CRLF, a size line, a trailer line) from `buf`; false when
    /// `buf` does not hold all of it yet.
    fn frame(&mut self, buf: &mut BytesMut) -> Result<bool, DecodeError> {
        match self.state {
            State::ChunkDataEnd => {
                if buf.len() < 2 {
                    return Ok(false);
                }
                if &buf[..2] != b"\r\n" {
                    return Err(DecodeError::ChunkDataEnd);
                }
                buf.advance(2);
                self.state = State::ChunkSize;
            }
            State::ChunkSize => {
                let Some(end) = line_end(buf, MAX_CHUNK_LINE, DecodeError::ChunkLineTooLong)?
                else {
                    return Ok(false);
                };
                let (size, extensions) = chunk_size(&buf[..end])?;
                self.extensions += extensions;
                if self.extensions > MAX_EXTENSIONS {
                    return Err(DecodeError::ExtensionsTooLong);
                }
                buf.advance(end + 2);
                self.state = match size {
                    0 => State::Trailers(0),
                    n => State::ChunkData(n),
                };
            }
            State::Trailers(seen) => {
                let room = MAX_TRAILERS.saturating_sub(seen);
                let Some(end) = line_end(buf, room, DecodeError::TrailersTooLong)? else {
                    return Ok(false);
                };
                if end > 0 && seen + end + 2 > MAX_TRAILERS {
                    return Err(DecodeError::TrailersTooLong);
                }
                buf.advance(end + 2);
                self.state = match end {
                    0 => State::Done,
                    n => State::Trailers(seen + n + 2),
                };
            }
            _ => unreachable!("frame() is only called between chunks"),
        }
        Ok(true)
    }
}

/// Where the CRLF-ended line at the start of `buf` ends (before its CRLF), if `buf` holds it;
/// `too_long` when it is not within `max` bytes.
fn line_end(buf: &[u8], max: usize, too_long: DecodeError) -> Result<Option<usize>, DecodeError> {
    let window = &buf[..buf.len().min(max + 2)];
    match window.windows(2).position(|w| w == b"\r\n") {
        Some(end) => Ok(Some(end)),
        None if window.len() >= max + 2 => Err(too_long),
        None => Ok(None),
    }
}

/// The size of a chunk-size line, and how many bytes of extensions it carries: hex digits, then
/// optional whitespace and extensions (ignored, but no control bytes: a lone CR or LF in them is
/// a line end to some readers).
fn chunk_size(line: &[u8]) -> Result<(u64, usize), DecodeError> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 16 {
        return Err(DecodeError::ChunkSize);
    }
    let rest = &line[digits..];
    let after_space = rest.iter().position(|b| !matches!(b, b' ' | b'\t'));
    if let Some(i) = after_space {
        if rest[i] != b';' {
            return Err(DecodeError::ChunkSize);
        }
    }
    if rest.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err(DecodeError::ChunkSize);
    }
    let text = std::str::from_utf8(&line[..digits]).map_err(|_| DecodeError::ChunkSize)?;
    let size = u64::from_str_radix(text, 16).map_err(|_| DecodeError::ChunkSize)?;
    Ok((size, rest.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Decodes `input` fed in pieces cut at `cuts`, then the close when `close`: the body, and
    /// whether it ended, or the error.
    fn decode(
        framing: Framing,
        input: &[u8],
        cuts: &[usize],
    ) -> Result<(Vec<u8>, bool, usize), DecodeError> {
        let mut d = Decoder::new(framing);
        let mut buf = BytesMut::new();
        let mut body = Vec::new();
        let mut at = 0;
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
        points.sort_unstable();
        points.push(input.len());
        for point in points {
            buf.extend_from_slice(&input[at..point.max(at)]);
            at = point.max(at);
            loop {
                match d.step(&mut buf)? {
                    Step::Data(data) => {
                        body.extend_from_slice(&data);
                        d.settle(&mut buf)?;
                    }
                    Step::NeedMore => break,
                    Step::Done => return Ok((body, true, buf.len() + input.len() - at)),
                }
            }
        }
        Ok((body, d.is_done(), buf.len()))
    }

    #[test]
    fn a_chunked_body_with_extensions_and_trailers_decodes_to_its_data() {
        let input = b"5;name=value\r\nhello\r\n6 \r\n world\r\n0\r\nx-trailer: 1\r\n\r\n";
        assert_eq!(
            decode(Framing::Chunked, input, &[]),
            Ok((b"hello world".to_vec(), true, 0))
        );
    }

    #[test]
    fn bytes_after_the_end_are_left_in_the_buffer() {
        // The connection is then not reused: the caller sees them left.
        let (_, done, left) = decode(Framing::Length(3), b"abcdef", &[]).unwrap();
        assert!(done);
        assert_eq!(left, 3);
        let (_, done, left) =
            decode(Framing::Chunked, b"1\r\na\r\n0\r\n\r\nHTTP/1.1", &[]).unwrap();
        assert!(done);
        assert_eq!(left, 8);
    }

    #[test]
    fn malformed_chunk_framing_is_an_error() {
        for (input, error) in [
            (&b"x\r\n"[..], DecodeError::ChunkSize),
            (b"\r\n", DecodeError::ChunkSize),
            (b"5 x\r\nhello\r\n", DecodeError::ChunkSize),
            (b"-5\r\n", DecodeError::ChunkSize),
            (b"1ffffffffffffffff\r\n", DecodeError::ChunkSize),
            (b"5\r\nhelloXX", DecodeError::ChunkDataEnd),
            (b"5;a\nb\r\nhello\r\n", DecodeError::ChunkSize),
            (b"5;a\rb\r\nhello\r\n", DecodeError::ChunkSize),
            (b"5;a\0\r\nhello\r\n", DecodeError::ChunkSize),
        ] {
            assert_eq!(
                decode(Framing::Chunked, input, &[]),
                Err(error),
                "{input:?}"
            );
        }
        let long = [b"1;".as_slice(), &[b'x'; MAX_CHUNK_LINE]].concat();
        assert_eq!(
            decode(Framing::Chunked, &long, &[]),
            Err(DecodeError::ChunkLineTooLong)
        );
        let trailers = [b"0\r\n".as_slice(), &[b'x'; MAX_TRAILERS + 2]].concat();
        assert_eq!(
            decode(Framing::Chunked, &trailers, &[]),
            Err(DecodeError::TrailersTooLong)
        );
        // Lines that each fit, and together do not (the second one ends past the limit).
        let lines = [
            b"0\r\n".as_slice(),
            &[b'x'; 10_000],
            b"\r\n",
            &[b'y'; 6_382],
            b"\r\n\r\n",
        ]
        .concat();
        assert_eq!(
            decode(Framing::Chunked, &lines, &[]),
            Err(DecodeError::TrailersTooLong)
        );
        // A byte of data per 4 KiB of extensions: cut off once they pass 16 KiB in all.
        let ext = [b"1;".as_slice(), &[b'e'; 4000], b"\r\nx\r\n"].concat();
        let many = ext.repeat(5);
        assert_eq!(
            decode(Framing::Chunked, &many, &[]),
            Err(DecodeError::ExtensionsTooLong)
        );
    }

    #[test]
    fn a_close_ends_only_a_body_that_runs_until_it() {
        assert_eq!(Decoder::new(Framing::UntilClose).closed(), Ok(()));
        assert_eq!(Decoder::new(Framing::Length(0)).closed(), Ok(()));
        assert_eq!(
            Decoder::new(Framing::Length(1)).closed(),
            Err(DecodeError::Truncated)
        );
        assert_eq!(
            Decoder::new(Framing::Chunked).closed(),
            Err(DecodeError::Truncated)
        );
    }

    #[test]
    fn the_end_of_a_chunked_body_is_known_at_its_last_byte_when_the_terminator_came_with_it() {
        let mut d = Decoder::new(Framing::Chunked);
        let mut buf = BytesMut::from(&b"2\r\nok\r\n0\r\n\r\n"[..]);
        assert_eq!(d.step(&mut buf), Ok(Step::Data(Bytes::from_static(b"ok"))));
        d.settle(&mut buf).unwrap();
        assert!(d.is_done());
        assert!(buf.is_empty());
    }

    proptest! {
        /// However the bytes of a chunked body arrive, they decode to the same data, ending
        /// where the body ends and taking nothing after it.
        #[test]
        fn any_split_of_a_chunked_body_decodes_the_same(
            chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 1..40), 0..6),
            cuts in prop::collection::vec(any::<usize>(), 0..8),
            tail in prop::collection::vec(any::<u8>(), 0..8),
        ) {
            let mut input = Vec::new();
            for c in &chunks {
                input.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
                input.extend_from_slice(c);
                input.extend_from_slice(b"\r\n");
            }
            input.extend_from_slice(b"0\r\n\r\n");
            input.extend_from_slice(&tail);
            let (body, done, left) = decode(Framing::Chunked, &input, &cuts).unwrap();
            prop_assert_eq!(body, chunks.concat());
            prop_assert!(done);
            prop_assert_eq!(left, tail.len());
        }

        /// Any bytes as a chunked body either decode or fail: never a panic, never more data
        /// than they hold.
        #[test]
        fn any_bytes_as_a_chunked_body_never_panic(
            input in prop::collection::vec(any::<u8>(), 0..200),
            cuts in prop::collection::vec(any::<usize>(), 0..4),
        ) {
            if let Ok((body, _, _)) = decode(Framing::Chunked, &input, &cuts) {
                prop_assert!(body.len() <= input.len());
            }
        }

        /// A body of known length takes exactly that many bytes, however they arrive.
        #[test]
        fn a_known_length_takes_exactly_its_bytes(
            input in prop::collection::vec(any::<u8>(), 0..100),
            length in 0u64..100,
            cuts in prop::collection::vec(any::<usize>(), 0..4),
        ) {
            let (body, done, left) = decode(Framing::Length(length), &input, &cuts).unwrap();
            let taken = (length as usize).min(input.len());
            prop_assert_eq!(&body[..], &input[..taken]);
            prop_assert_eq!(done, input.len() >= length as usize);
            prop_assert_eq!(left, input.len() - taken);
        }
    }
}
