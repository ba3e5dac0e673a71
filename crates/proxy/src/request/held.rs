//! A request body's bytes and its place in the body budget, in one value.
//!
//! The place is given back when the last reference to the bytes is dropped, wherever that is
//! (an attempt's upstream write, a retry, a fallback), so the budget counts exactly the bodies
//! that are alive. A body larger than a connection's read buffer is put together in a mapping
//! of its own, returned to the system when it is dropped: the allocator keeps none of it, so
//! what the budget counts of such bodies is what is resident.

use bytes::Bytes;
use memmap2::{MmapMut, MmapOptions};

use super::BodyHold;

/// Bodies larger than this (a server connection's read buffer, `HTTP1_MAX_BUF`) get a mapping
/// of their own; smaller ones are allocated as any buffer is.
pub(super) const MAPPED_ABOVE: usize = 64 * 1024;

/// Where the bytes of a buffer being filled are.
enum Store {
    Heap(Vec<u8>),
    Mapped(MmapMut),
}

/// Where a body's bytes are.
enum Body {
    /// The one frame it arrived in, as hyper read it.
    Frame(Bytes),
    /// A buffer it was put together in, of which the first `len` bytes are the body.
    Filled(Store, usize),
}

/// The owner of a body's bytes: the bytes, and their place in the budget.
struct Held {
    body: Body,
    _hold: Option<BodyHold>,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        match &self.body {
            Body::Frame(b) => b,
            Body::Filled(Store::Heap(v), _) => v,
            Body::Filled(Store::Mapped(m), len) => &m[..*len],
        }
    }
}

/// `frame` as the whole body, holding `hold` until its last reference is dropped.
pub(super) fn frame(frame: Bytes, hold: BodyHold) -> Bytes {
    Bytes::from_owner(Held {
        body: Body::Frame(frame),
        _hold: Some(hold),
    })
}

/// A body's buffer of a known size, being filled.
pub(super) struct Filling {
    store: Store,
    len: usize,
}

impl Filling {
    /// A buffer for `size` bytes: mapped above `MAPPED_ABOVE` (a page becomes resident when
    /// the body's bytes reach it, so a client that stalls holds only what it sent), from the
    /// allocator otherwise or when the system refuses the mapping.
    pub(super) fn new(size: usize) -> Filling {
        let store = if size > MAPPED_ABOVE {
            match MmapOptions::new().len(size).map_anon() {
                Ok(map) => Store::Mapped(map),
                Err(_) => Store::Heap(Vec::with_capacity(size)),
            }
        } else {
            Store::Heap(Vec::with_capacity(size))
        };
        Filling { store, len: 0 }
    }

    /// Whether the bytes are in a mapping of their own.
    #[cfg(test)]
    pub(super) fn is_mapped(&self) -> bool {
        matches!(self.store, Store::Mapped(_))
    }

    pub(super) fn extend(&mut self, data: &[u8]) {
        let end = self.len + data.len();
        match &mut self.store {
            Store::Mapped(map) if end <= map.len() => map[self.len..end].copy_from_slice(data),
            Store::Mapped(map) => {
                // More than the size it was made for (the reader checks a declared length,
                // so this is not expected): the rest goes on in an allocated buffer.
                let mut heap = Vec::with_capacity(end);
                heap.extend_from_slice(&map[..self.len]);
                heap.extend_from_slice(data);
                self.store = Store::Heap(heap);
            }
            Store::Heap(v) => v.extend_from_slice(data),
        }
        self.len = end;
    }

    /// The bytes, holding `hold` until their last reference is dropped.
    pub(super) fn finish(self, hold: BodyHold) -> Bytes {
        self.into_bytes(Some(hold))
    }

    /// The bytes, holding no place of their own (what holds them is counted elsewhere).
    pub(super) fn finish_unheld(self) -> Bytes {
        self.into_bytes(None)
    }

    fn into_bytes(self, hold: Option<BodyHold>) -> Bytes {
        Bytes::from_owner(Held {
            body: Body::Filled(self.store, self.len),
            _hold: hold,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_above_a_read_buffer_are_mapped_and_read_back_as_written() {
        for (size, mapped) in [(0, false), (MAPPED_ABOVE, false), (MAPPED_ABOVE + 1, true)] {
            let mut f = Filling::new(size);
            assert_eq!(f.is_mapped(), mapped, "{size} bytes");
            let data: Vec<u8> = (0..size).map(|i| i as u8).collect();
            for piece in data.chunks(1000) {
                f.extend(piece);
            }
            let bytes = f.finish_unheld();
            assert_eq!(&bytes[..], &data[..], "{size} bytes");
        }
    }

    #[test]
    fn a_mapped_buffer_given_more_than_its_size_keeps_every_byte() {
        let mut f = Filling::new(MAPPED_ABOVE + 1);
        f.extend(&vec![1; MAPPED_ABOVE]);
        f.extend(&[2; 10]);
        assert!(!f.is_mapped());
        let bytes = f.finish_unheld();
        assert_eq!(bytes.len(), MAPPED_ABOVE + 10);
        assert_eq!((bytes[0], bytes[MAPPED_ABOVE + 9]), (1, 2));
    }
}
