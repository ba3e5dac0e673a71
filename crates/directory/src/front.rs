//! A per-thread front for the known keys' cache: the entries this thread found fresh lately,
//! answered without moka's look-up (its hashing, its read log and upkeep, some ten locked
//! operations a hit), which every request with a key makes.
//!
//! It answers only what moka would answer the same: never an entry moka let go (its eviction
//! listener marks each, [`Entry::retire`]: before a revoke or a replacement returns, at moka's
//! upkeep for an eviction or expiry), and only one fresh at the time asked by the same rules as
//! moka's answer (flush epoch, TTL). Anything else goes to moka. It holds at most
//! [`SLOTS`] entries a thread, a slot per digest (the last one found wins it), so a thread keeps
//! at most that many retired entries alive until their slots are taken.
//!
//! moka's eviction keeps the keys read most; reads answered here it does not see. So the front
//! is used only while the cache has room to spare ([`State::front_allowed`]): near its bound,
//! every look-up goes to moka as before.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use spillway_store::KeyDigest;

use crate::entry::Entry;

/// Slots a thread has.
pub(crate) const SLOTS: usize = 64;
const _: () = assert!(SLOTS.is_power_of_two());

struct Slot {
    /// The directory it belongs to ([`next_owner`]).
    owner: u64,
    digest: KeyDigest,
    entry: Arc<Entry>,
}

thread_local! {
    static FRONT: RefCell<[Option<Slot>; SLOTS]> = const { RefCell::new([const { None }; SLOTS]) };
}

/// A number for a new directory, never given to another in this process (an address could be).
pub(crate) fn next_owner() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The slot of `digest`: a SHA-256 digest's bits are spread evenly, but any digest's words are
/// mixed in so that digests alike in their first bytes still spread.
fn slot_of(digest: &KeyDigest) -> usize {
    let word = |i: usize| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&digest[i * 8..i * 8 + 8]);
        u64::from_le_bytes(bytes)
    };
    let mixed = (word(0) ^ word(1) ^ word(2) ^ word(3)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    // The product's highest bits, the best mixed, as many as number the slots.
    (mixed >> (u64::BITS - SLOTS.ilog2())) as usize
}

/// What `answer` makes of the entry this thread holds for `digest` of directory `owner`, unless
/// it holds none or it was let go (borrowed: no reference is counted).
pub(crate) fn answer<R>(
    owner: u64,
    digest: &KeyDigest,
    answer: impl FnOnce(&Entry) -> Option<R>,
) -> Option<R> {
    FRONT.with_borrow(|slots| {
        let slot = slots[slot_of(digest)].as_ref()?;
        let ours = slot.owner == owner && slot.digest == *digest && !slot.entry.retired();
        ours.then(|| answer(&slot.entry))?
    })
}

/// Keeps `entry`, found fresh in moka, for `digest` of directory `owner`.
pub(crate) fn put(owner: u64, digest: &KeyDigest, entry: &Arc<Entry>) {
    FRONT.with_borrow_mut(|slots| {
        slots[slot_of(digest)] = Some(Slot {
            owner,
            digest: *digest,
            entry: entry.clone(),
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_48_bytes_as_docs_admission_states() {
        assert_eq!(std::mem::size_of::<Option<Slot>>(), 48);
    }

    #[test]
    fn digests_alike_in_their_first_bytes_spread_over_the_slots() {
        let used: std::collections::HashSet<usize> = (0..1024u32)
            .map(|i| {
                let mut digest = [0u8; 32];
                digest[28..].copy_from_slice(&i.to_le_bytes());
                slot_of(&digest)
            })
            .collect();
        assert!(used.len() > SLOTS * 3 / 4, "{} slots used", used.len());
    }
}
