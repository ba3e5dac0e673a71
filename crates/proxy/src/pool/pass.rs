//! A call's pass through its model's adaptive throttling (see `learn.rs`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// A call let through adaptive throttling. Until its first attempt is recorded it counts as sent,
/// so that concurrent calls cannot all pass before the first of them is answered.
#[derive(Debug, Default)]
pub struct ThrottlePass {
    pub(super) pending: Option<Arc<AtomicU64>>,
    pub(super) open: AtomicBool,
}

impl ThrottlePass {
    /// The call's first attempt was recorded, or the call ends without one.
    pub fn close(&self) {
        if self.open.swap(false, Ordering::AcqRel) {
            self.release();
        }
    }

    /// No longer counted as pending: called once, by whichever closes it first.
    fn release(&self) {
        if let Some(pending) = &self.pending {
            pending.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for ThrottlePass {
    fn drop(&mut self) {
        // Owned here: whether it is open is read and cleared without a locked swap (most
        // passes were closed by their first attempt already).
        if std::mem::take(self.open.get_mut()) {
            self.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass(pending: &Arc<AtomicU64>) -> ThrottlePass {
        pending.fetch_add(1, Ordering::AcqRel);
        ThrottlePass {
            pending: Some(pending.clone()),
            open: AtomicBool::new(true),
        }
    }

    #[test]
    fn a_pass_counts_as_pending_until_closed_or_dropped_and_only_once() {
        let pending = Arc::new(AtomicU64::new(0));
        let closed = pass(&pending);
        let dropped = pass(&pending);
        assert_eq!(pending.load(Ordering::Acquire), 2);
        closed.close();
        closed.close();
        assert_eq!(pending.load(Ordering::Acquire), 1);
        drop(closed);
        assert_eq!(pending.load(Ordering::Acquire), 1, "closed before its drop");
        drop(dropped);
        assert_eq!(pending.load(Ordering::Acquire), 0, "dropped unclosed");
        drop(ThrottlePass::default());
        assert_eq!(
            pending.load(Ordering::Acquire),
            0,
            "a pass without throttling"
        );
    }
}
