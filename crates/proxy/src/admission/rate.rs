//! A tenant's requests-per-minute and tokens-per-minute limits: decided in Redis when
//! `admission.redis` is set and answers, else in this process.
//!
//! With several instances, a limit kept in each one separately multiplies by the number of
//! instances. Redis holds one bucket per tenant for all of them (one script call per admission,
//! `shared_limits.rs`). When Redis is slow or down the request is not failed for it: the
//! instance decides locally, enforcing `1 / admission.instances` of each limit, so the instances
//! together still stay within it; `spillway_shared_limits_fallbacks_total` counts those
//! decisions and `spillway_shared_limits_up` says whether Redis answers.

use std::time::Duration;

use spillway_policy::{Dimension, RateHeaders, RateLimit};

use super::gate::Gate;
use super::metrics;
use crate::auth::TenantLimits;
use crate::shared_limits::SharedLimits;

/// What the limits said.
pub(super) enum Ruling {
    Admitted {
        tokens: u64,
        headers: RateHeaders,
        /// Decided in Redis: settle there too.
        shared: bool,
    },
    Refused {
        which: Dimension,
        /// `None`: the request can never pass.
        retry_after: Option<Duration>,
        headers: RateHeaders,
    },
}

pub(super) struct Rates {
    pub(super) shared: Option<SharedLimits>,
    /// The share of a limit enforced locally while Redis is meant to hold it.
    pub(super) instances: u32,
}

impl Rates {
    /// The limits the local limiter enforces for `limits`: all of them without Redis, this
    /// instance's share with it (used only while Redis does not answer).
    pub(super) fn local(&self, limits: &TenantLimits) -> (Option<RateLimit>, Option<RateLimit>) {
        let (requests, tokens) = full(limits);
        match self.shared {
            Some(_) => (
                requests.map(|r| r.share(self.instances)),
                tokens.map(|t| t.share(self.instances)),
            ),
            None => (requests, tokens),
        }
    }

    pub(super) async fn decide(&self, gate: &Gate, limits: &TenantLimits, estimate: u64) -> Ruling {
        if let Some(shared) = &self.shared {
            // Boxed: the exchange with Redis is a large future, and without shared limits (or
            // with Redis failing) the ruling is the local one, made without waiting.
            let ruled = Box::pin(Self::shared_ruling(shared, gate, limits, estimate)).await;
            if let Some(ruling) = ruled {
                return ruling;
            }
        }
        self.local_ruling(gate, limits, estimate)
    }

    /// The ruling of the limits shared through Redis; `None` when the tenant has none, or Redis
    /// did not answer (then the local limits rule).
    async fn shared_ruling(
        shared: &SharedLimits,
        gate: &Gate,
        limits: &TenantLimits,
        estimate: u64,
    ) -> Option<Ruling> {
        let (requests, tokens) = full(limits);
        if requests.is_none() && tokens.is_none() {
            return None;
        }
        match shared.admit(&gate.tenant, requests, tokens, estimate).await {
            Ok(d) => {
                metrics::shared_up(true);
                Some(match d.refused {
                    None if d.admitted => Ruling::Admitted {
                        tokens: estimate,
                        headers: d.headers,
                        shared: true,
                    },
                    refused => {
                        let (which, retry_after) = refused.unwrap_or((Dimension::Requests, None));
                        Ruling::Refused {
                            which,
                            retry_after,
                            headers: d.headers,
                        }
                    }
                })
            }
            Err(_) => {
                metrics::shared_up(false);
                metrics::shared_fallback();
                None
            }
        }
    }

    /// The ruling of the gateway's own limits.
    fn local_ruling(&self, gate: &Gate, limits: &TenantLimits, estimate: u64) -> Ruling {
        if let (None, None) = full(limits) {
            // No rate to hold it to: its limiter (which would admit it with no quota to tell)
            // is not taken. It is set to new limits when the tenant has some again.
            return Ruling::Admitted {
                tokens: estimate,
                headers: RateHeaders::default(),
                shared: false,
            };
        }
        let now = crate::clock::now();
        let mut rate = gate.rate.lock().unwrap_or_else(|e| e.into_inner());
        if rate.0 != *limits {
            let (requests, tokens) = self.local(limits);
            rate.1.set_limits(now, requests, tokens);
            rate.0 = *limits;
        }
        match rate.1.admit(now, estimate) {
            Ok(r) => Ruling::Admitted {
                tokens: r.tokens,
                headers: r.headers,
                shared: false,
            },
            Err(r) => Ruling::Refused {
                which: r.which,
                retry_after: r.retry_after,
                headers: r.headers,
            },
        }
    }

    /// Tells Redis the difference between what was reserved and what was used (in the
    /// background: the response is not held for it).
    pub(super) fn settle_shared(
        &self,
        tenant: &str,
        limits: &TenantLimits,
        reserved: u64,
        used: u64,
    ) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let delta = used as i64 - reserved as i64;
        let (requests, tokens) = full(limits);
        let tenant = tenant.to_owned();
        runtime.spawn(async move {
            let _ = shared.adjust(&tenant, requests, tokens, delta, false).await;
        });
    }
}

/// The tenant's whole limits. A limit of 0 has no GCRA rate, and never gets here: `admit`
/// refuses it first.
fn full(limits: &TenantLimits) -> (Option<RateLimit>, Option<RateLimit>) {
    let rate =
        |per_min: Option<u32>| per_min.and_then(|n| RateLimit::try_new(u64::from(n), None).ok());
    (rate(limits.requests_per_min), rate(limits.tokens_per_min))
}
