//! The prefix cache: how much of a prompt's start this server prefilled recently.
//!
//! vLLM's automatic prefix caching keeps the KV blocks of recent prompts and reuses them when a
//! new prompt starts the same way, so requests sharing a long system prompt reach their first
//! token sooner, but only on the server that saw it. A gateway that routes on cache affinity is
//! only testable against a backend that behaves so. The mock keeps no KV, only one hash per
//! block: the prompt text is cut into blocks of `prefix_chars` characters (the last may be
//! short), each block's hash covers the whole prompt up to its end (a chain, so a block matches
//! only after the same text), and a bounded set of those hashes, least recently used evicted
//! first, stands for the cache. A lookup counts the blocks matched from the start.
//!
//! Two simplifications: a prompt's blocks count as cached from the moment its prefill starts,
//! not when it ends, which slightly flatters a repeat sent moments later; and only the text is
//! hashed, not the roles and message boundaries a real chat template adds, so the same text
//! matches whichever messages it was split into.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// A prompt cut into blocks, each with its chain hash and the characters up to its end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PromptBlocks {
    blocks: Vec<Block>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Block {
    hash: u64,
    end: usize,
}

/// Cuts text, given in pieces, into [`PromptBlocks`].
pub(crate) struct Chunker {
    state: u64,
    block_chars: usize,
    max_blocks: usize,
    /// Characters in the block being filled.
    filled: usize,
    /// Characters in the blocks already closed.
    chars: usize,
    blocks: Vec<Block>,
}

impl Chunker {
    /// Blocks of `block_chars` characters (at least one), at most `max_blocks` of them: a chain
    /// longer than the cache cannot be held, so hashing stops there. The chain starts from the
    /// model name, since a server keeps one cache per model.
    pub(crate) fn new(model: &str, block_chars: usize, max_blocks: usize) -> Self {
        Self {
            // 0xff never occurs in UTF-8, so the model name cannot run into the prompt.
            state: fnv1a(fnv1a(FNV_OFFSET, model.as_bytes()), &[0xff]),
            block_chars: block_chars.max(1),
            max_blocks,
            filled: 0,
            chars: 0,
            blocks: Vec::new(),
        }
    }

    /// Appends the next piece of the prompt's text.
    pub(crate) fn push(&mut self, text: &str) {
        let bytes = text.as_bytes();
        let mut start = 0;
        for (i, c) in text.char_indices() {
            if self.blocks.len() >= self.max_blocks {
                return;
            }
            self.filled += 1;
            if self.filled == self.block_chars {
                let end = i + c.len_utf8();
                self.state = fnv1a(self.state, &bytes[start..end]);
                start = end;
                self.close();
            }
        }
        self.state = fnv1a(self.state, &bytes[start..]);
    }

    /// The blocks, the short last one included.
    pub(crate) fn finish(mut self) -> PromptBlocks {
        if self.filled > 0 && self.blocks.len() < self.max_blocks {
            self.close();
        }
        PromptBlocks {
            blocks: self.blocks,
        }
    }

    fn close(&mut self) {
        self.chars += self.filled;
        self.filled = 0;
        self.blocks.push(Block {
            hash: self.state,
            end: self.chars,
        });
    }
}

/// The block hashes this server has prefilled recently, with their last use.
#[derive(Debug, Default)]
pub(crate) struct PrefixCache {
    lru: Mutex<Lru>,
}

#[derive(Debug, Default)]
struct Lru {
    /// Block hash to the tick of its last use.
    last_used: HashMap<u64, u64>,
    /// Tick to block hash, oldest first: the eviction order.
    by_age: BTreeMap<u64, u64>,
    tick: u64,
}

impl PrefixCache {
    /// The characters of `prompt`'s start already cached; then caches all of its blocks and
    /// evicts the least recently used beyond `capacity` (the profile's bound, which may have
    /// shrunk since the last call).
    pub(crate) fn lookup_and_insert(&self, prompt: &PromptBlocks, capacity: usize) -> usize {
        let mut lru = self.lock();
        let matched = prompt
            .blocks
            .iter()
            .take_while(|b| lru.last_used.contains_key(&b.hash))
            .count();
        // Tail first, so a chain's first block is its most recently used and goes last: without
        // it, the blocks after it could never match again.
        for block in prompt.blocks.iter().rev() {
            lru.touch(block.hash);
        }
        while lru.last_used.len() > capacity {
            let Some((_, oldest)) = lru.by_age.pop_first() else {
                break;
            };
            lru.last_used.remove(&oldest);
        }
        matched.checked_sub(1).map_or(0, |i| prompt.blocks[i].end)
    }

    /// Forgets every block, as a restarted server would.
    pub(crate) fn clear(&self) {
        *self.lock() = Lru::default();
    }

    fn lock(&self) -> MutexGuard<'_, Lru> {
        self.lru.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Lru {
    fn touch(&mut self, hash: u64) {
        self.tick += 1;
        let tick = self.tick;
        if let Some(previous) = self.last_used.insert(hash, tick) {
            self.by_age.remove(&previous);
        }
        self.by_age.insert(tick, hash);
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a continued from `state`: byte by byte, so hashing text in pieces gives the same hash as
/// hashing it whole, which a chain hash over message boundaries needs.
fn fnv1a(state: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(state, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(pieces: &[&str], block_chars: usize, max_blocks: usize) -> PromptBlocks {
        let mut c = Chunker::new("m", block_chars, max_blocks);
        for p in pieces {
            c.push(p);
        }
        c.finish()
    }

    fn ends(p: &PromptBlocks) -> Vec<usize> {
        p.blocks.iter().map(|b| b.end).collect()
    }

    #[test]
    fn blocks_count_characters_and_ignore_how_the_text_was_split() {
        let whole = blocks(&["héllo wörld!"], 5, 100);
        assert_eq!(ends(&whole), [5, 10, 12]);
        assert_eq!(blocks(&["hél", "lo w", "", "örld!"], 5, 100), whole);
        assert_eq!(ends(&blocks(&["abcdefghij"], 5, 100)), [5, 10]);
        assert_eq!(ends(&blocks(&["abcdefghijkl"], 5, 2)), [5, 10]);
        assert!(blocks(&[""], 5, 100).blocks.is_empty());
    }

    #[test]
    fn a_block_matches_only_after_the_same_text_for_the_same_model() {
        let a = blocks(&["aaaaabbbbb"], 5, 100);
        let b = blocks(&["cccccbbbbb"], 5, 100);
        assert_ne!(a.blocks[1].hash, b.blocks[1].hash);
        let mut other_model = Chunker::new("n", 5, 100);
        other_model.push("aaaaabbbbb");
        assert_ne!(other_model.finish().blocks[0].hash, a.blocks[0].hash);
    }

    #[test]
    fn lookup_finds_the_longest_shared_prefix_in_whole_blocks() {
        let cache = PrefixCache::default();
        let first = blocks(&["system prompt!", " question one"], 5, 100);
        assert_eq!(cache.lookup_and_insert(&first, 100), 0);
        // Shares "system prompt! quest" (four blocks), then differs.
        let second = blocks(&["system prompt! quest", "ion two"], 5, 100);
        assert_eq!(cache.lookup_and_insert(&second, 100), 20);
        // An exact repeat is cached whole, its short last block included.
        assert_eq!(cache.lookup_and_insert(&first, 100), 27);
    }

    #[test]
    fn eviction_drops_the_least_recently_used_chain_tail_first() {
        let cache = PrefixCache::default();
        let chain = |text: &str| blocks(&[text], 5, 100);
        let (a, b, c) = (
            chain("aaaaaAAAAA"),
            chain("bbbbbBBBBB"),
            chain("cccccCCCCC"),
        );
        cache.lookup_and_insert(&a, 4);
        cache.lookup_and_insert(&b, 4);
        // A third chain of two blocks evicts the two oldest: all of `a`.
        cache.lookup_and_insert(&c, 4);
        assert_eq!(cache.lookup_and_insert(&b, 4), 10);
        assert_eq!(cache.lookup_and_insert(&a, 4), 0);

        cache.clear();
        assert_eq!(cache.lookup_and_insert(&b, 3), 0);
        cache.lookup_and_insert(&chain("ddddd"), 3);
        // One block too many: `b`'s tail goes, its head stays.
        cache.lookup_and_insert(&chain("eeeee"), 3);
        assert_eq!(cache.lookup_and_insert(&b, 3), 5);
    }
}
