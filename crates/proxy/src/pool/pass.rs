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
            if let Some(pending) = &self.pending {
                pending.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

impl Drop for ThrottlePass {
    fn drop(&mut self) {
        self.close();
    }
}
