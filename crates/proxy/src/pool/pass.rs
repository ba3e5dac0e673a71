//! A call's pass through its model's adaptive throttling (see `learn.rs`).

use std::sync::atomic::{AtomicBool, Ordering};

use crate::counters::Level;

/// A call let through adaptive throttling. Until its first attempt is recorded it counts as sent
/// (in its pool's `throttle_pending`), so that concurrent calls cannot all pass before the first
/// of them is answered.
///
/// It holds no reference to that count: the call that holds the pass holds its pool too, and
/// hands the count in when its first attempt closes the pass (`close`) or
/// when the call ends (`end`, from `Call`'s drop).
#[derive(Debug, Default)]
pub struct ThrottlePass {
    /// Counted in its pool's pending passes and not yet taken off.
    open: AtomicBool,
}

impl ThrottlePass {
    /// A pass counted in its pool's pending passes.
    pub(super) fn counted() -> ThrottlePass {
        ThrottlePass {
            open: AtomicBool::new(true),
        }
    }

    /// The call's first attempt was recorded: taken off `pending`, its pool's count, if it was
    /// still on it. Only the call's own attempts close it, one after another on the call's task:
    /// its flag is read and cleared with a load and a store, not a locked swap.
    pub(crate) fn close(&self, pending: &Level) {
        if self.open.load(Ordering::Relaxed) {
            self.open.store(false, Ordering::Relaxed);
            pending.down();
        }
    }

    /// The call ends: as [`close`](ThrottlePass::close), from the call that owns it.
    pub(crate) fn end(&mut self, pending: &Level) {
        if std::mem::take(self.open.get_mut()) {
            pending.down();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass(pending: &Level) -> ThrottlePass {
        pending.up();
        ThrottlePass::counted()
    }

    #[test]
    fn a_pass_counts_as_pending_until_closed_or_ended_and_only_once() {
        let pending = Level::new();
        let mut closed = pass(&pending);
        let mut ended = pass(&pending);
        assert_eq!(pending.now(), 2);
        closed.close(&pending);
        closed.close(&pending);
        assert_eq!(pending.now(), 1);
        closed.end(&pending);
        assert_eq!(pending.now(), 1, "closed before its end");
        ended.end(&pending);
        ended.end(&pending);
        assert_eq!(pending.now(), 0, "ended unclosed, once");
        ThrottlePass::default().end(&pending);
        ThrottlePass::default().close(&pending);
        assert_eq!(pending.now(), 0, "a pass without throttling");
    }
}
