//! The client's request body: read under a size cap, checked as JSON, and rewritten only when a
//! backend knows the model by another name.
//!
//! The body is forwarded as the bytes the client sent, so fields spillway does not know (new
//! OpenAI parameters, vendor extensions, `encoding_format`) pass through untouched. Only `model`
//! and `stream` are read.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::error::{ApiError, ErrorKind};

mod held;
mod json;
mod read;
mod rewrite;

pub use json::{summarize, RequestSummary};
pub use read::read_body;
use rewrite::Plan;
pub use rewrite::{Changes, TENANT_TAG};

/// Request body bytes read or held by every request at once, under a cap: a flood of large
/// bodies is refused at once (503) rather than held until memory runs out (IL-0110). Each
/// tenant's bodies hold at most its share of it (429 beyond), so one slow tenant cannot keep
/// every other tenant's bodies out.
#[derive(Debug)]
pub struct BodyBudget {
    held: AtomicU64,
    max: u64,
    per_tenant: u64,
}

impl BodyBudget {
    /// The budget of a gateway, made once for the life of the process (a gateway's lives as
    /// long): every body's hold refers to it with no reference count to take and give back.
    pub fn new(max: u64, per_tenant: u64) -> &'static BodyBudget {
        Box::leak(Box::new(BodyBudget {
            held: AtomicU64::new(0),
            max,
            per_tenant: per_tenant.min(max),
        }))
    }

    /// Bytes held now, and the cap.
    pub fn usage(&self) -> (u64, u64) {
        (self.held.load(Ordering::Relaxed), self.max)
    }

    /// The most bytes one tenant's bodies may hold at once.
    pub fn tenant_share(&self) -> u64 {
        self.per_tenant
    }

    /// A place of `bytes` in the budget and in `tenant`'s share, refused as a body past
    /// either is (429, 503).
    pub fn hold(&'static self, tenant: &Arc<AtomicU64>, bytes: u64) -> Result<BodyHold, ApiError> {
        let mut hold = BodyHold::empty(self, tenant);
        hold.grow(bytes)?;
        Ok(hold)
    }
}

/// `body` rewritten by `changes` (`rewrite.rs`), holding no place of its own in the budget:
/// for a copy an attempt sends, inside the room its call holds for it (`Call::_rewrite_room`).
pub fn rewritten(body: &[u8], changes: &Changes<'_>) -> Result<Bytes, ApiError> {
    Ok(Plan::new(body, changes)?.apply(body).finish_unheld())
}

/// `body` rewritten by `changes`, the copy holding its own place in the budget (taken before
/// it is made), for a copy that takes the body's place.
pub fn rewritten_held(
    body: &[u8],
    changes: &Changes<'_>,
    budget: &'static BodyBudget,
    tenant: &Arc<AtomicU64>,
) -> Result<Bytes, ApiError> {
    let plan = Plan::new(body, changes)?;
    let hold = budget.hold(tenant, plan.size() as u64)?;
    Ok(plan.apply(body).finish(hold))
}

/// How a body may be read: its size cap, and when it must have arrived whole.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    pub cap: usize,
    pub deadline: Instant,
    /// `server.body_read_timeout`, for the message.
    pub timeout: Duration,
}

/// One body's bytes in the budget and in its tenant's share, given back on drop.
#[derive(Debug)]
pub struct BodyHold {
    budget: &'static BodyBudget,
    tenant: Arc<AtomicU64>,
    bytes: u64,
}

impl BodyHold {
    /// A hold of nothing yet in `budget` and `tenant`'s share.
    fn empty(budget: &'static BodyBudget, tenant: &Arc<AtomicU64>) -> BodyHold {
        BodyHold {
            budget,
            tenant: tenant.clone(),
            bytes: 0,
        }
    }

    fn grow(&mut self, more: u64) -> Result<(), ApiError> {
        let before = self.tenant.fetch_add(more, Ordering::AcqRel);
        if before.saturating_add(more) > self.budget.per_tenant {
            self.tenant.fetch_sub(more, Ordering::AcqRel);
            return Err(ApiError::new(
                ErrorKind::TenantBodyBudget,
                format!(
                    "this tenant's requests hold its maximum of {} bytes of request body; try again shortly",
                    self.budget.per_tenant
                ),
            )
            .retry_after(Duration::from_secs(1)));
        }
        let before = self.budget.held.fetch_add(more, Ordering::AcqRel);
        if before.saturating_add(more) > self.budget.max {
            self.budget.held.fetch_sub(more, Ordering::AcqRel);
            self.tenant.fetch_sub(more, Ordering::AcqRel);
            return Err(ApiError::new(
                ErrorKind::GatewayOverloaded,
                "the gateway holds its maximum of request body bytes; try again shortly",
            )
            .retry_after(Duration::from_secs(1)));
        }
        self.bytes += more;
        Ok(())
    }

    fn shrink(&mut self, less: u64) {
        let less = less.min(self.bytes);
        self.budget.held.fetch_sub(less, Ordering::AcqRel);
        self.tenant.fetch_sub(less, Ordering::AcqRel);
        self.bytes -= less;
    }
}

impl Drop for BodyHold {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::AcqRel);
        self.tenant.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn limits(cap: usize) -> BodyLimits {
        BodyLimits {
            cap,
            deadline: Instant::now() + Duration::from_secs(60),
            timeout: Duration::from_secs(60),
        }
    }

    #[tokio::test]
    async fn body_over_the_cap_is_413() {
        let budget = BodyBudget::new(1000, 1000);
        let tenant = Arc::default();
        let e = read_body(
            axum::body::Body::from(vec![b' '; 11]),
            limits(10),
            budget,
            &tenant,
        )
        .await
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::BodyTooLarge);
        let ok = read_body(
            axum::body::Body::from(vec![b' '; 10]),
            limits(10),
            budget,
            &tenant,
        )
        .await
        .unwrap();
        assert_eq!(ok.len(), 10);
    }

    #[tokio::test]
    async fn bodies_held_together_stay_under_the_budget_and_are_given_back() {
        let budget = BodyBudget::new(25, 25);
        let tenants: Vec<Arc<AtomicU64>> = (0..3).map(|_| Arc::default()).collect();
        let read = |n: usize, t: usize| {
            read_body(
                axum::body::Body::from(vec![b'x'; n]),
                limits(100),
                budget,
                &tenants[t],
            )
        };
        let first = read(10, 0).await.unwrap();
        let second = read(10, 1).await.unwrap();
        assert_eq!(budget.usage(), (20, 25));
        let e = read(10, 2).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::GatewayOverloaded);
        assert!(e.retry_after.is_some());
        assert_eq!(budget.usage().0, 20, "a refused body holds nothing");
        assert_eq!(tenants[2].load(Ordering::Relaxed), 0);
        drop((first, second));
        assert_eq!(budget.usage().0, 0);
        assert!(read(25, 2).await.is_ok());
    }

    #[tokio::test]
    async fn a_body_keeps_its_place_until_its_last_reference_is_dropped() {
        let budget = BodyBudget::new(1 << 20, 1 << 20);
        let tenant: Arc<AtomicU64> = Arc::default();
        for size in [10, held::MAPPED_ABOVE + 1] {
            let body = read_body(
                axum::body::Body::from(vec![b'x'; size]),
                limits(1 << 20),
                budget,
                &tenant,
            )
            .await
            .unwrap();
            let (copy, piece) = (body.clone(), body.slice(1..5));
            drop(body);
            assert_eq!(
                budget.usage().0,
                size as u64,
                "{size} bytes, two references"
            );
            drop(copy);
            assert_eq!(&piece[..], b"xxxx");
            assert_eq!(budget.usage().0, size as u64, "{size} bytes, a slice");
            drop(piece);
            assert_eq!((budget.usage().0, tenant.load(Ordering::Relaxed)), (0, 0));
        }
    }

    #[tokio::test]
    async fn one_tenant_holds_at_most_its_share_and_others_still_get_theirs() {
        let budget = BodyBudget::new(100, 30);
        let (greedy, other): (Arc<AtomicU64>, Arc<AtomicU64>) = (Arc::default(), Arc::default());
        let read = |n: usize, t: Arc<AtomicU64>| async move {
            read_body(
                axum::body::Body::from(vec![b'x'; n]),
                limits(100),
                budget,
                &t,
            )
            .await
        };
        let a = read(20, greedy.clone()).await.unwrap();
        let e = read(20, greedy.clone()).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::TenantBodyBudget);
        assert_eq!(e.status(), http::StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            budget.usage().0,
            20,
            "a body refused by its tenant's share holds nothing"
        );
        let b = read(30, other).await.unwrap();
        drop((a, b));
        assert_eq!((budget.usage().0, greedy.load(Ordering::Relaxed)), (0, 0));
    }
}
