//! The ticket of an admitted call: what it holds while it runs, and how it settles itself.
//!
//! It holds the call's places in the in-flight counts, its token reservation and its queue seat
//! until the response ends. At the end it reconciles the reservation with the usage the backend
//! reported (read by the relay), for tenants with a tokens-per-minute limit. Dropped before then (the call failed before a response, or the
//! client went away before its body began), it refunds the reserved tokens.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use spillway_policy::{Priority, RateHeaders};

use super::gate::Entered;
use super::queue::Seat;
use super::rate::Rates;
use crate::auth::TenantLimits;
use crate::usage::Usage;

/// An admitted call's hold on the gateway's capacity.
pub(crate) struct Ticket {
    places: Places,
    /// Its seat in the pool, once it has one.
    seat: Option<Seat>,
    /// How long it waited for its seat.
    waited: Duration,
    /// Data frames relayed (tokens-per-minute tenants): the charge of a stream cut short.
    data_frames: u64,
    sse: bool,
    settled: bool,
}

/// What admission hands a ticket.
pub(super) struct Places {
    /// Its places in the gateway's cap and in its tenant's concurrency, and its tenant's gate.
    pub entered: Entered,
    /// Set when Redis decided: the reservation is settled there.
    pub rates: Option<(Arc<Rates>, TenantLimits)>,
    pub reserved: u64,
    /// The prompt's share of the reservation.
    pub prompt: u64,
    /// The tenant's quotas after this admission, for the response's `x-ratelimit-*` headers.
    pub headers: RateHeaders,
    /// The tenant has a tokens-per-minute limit: its reservation is reconciled with the usage
    /// reported.
    pub meters_tokens: bool,
}

impl Ticket {
    pub(super) fn new(places: Places) -> Self {
        Ticket {
            places,
            seat: None,
            waited: Duration::ZERO,
            data_frames: 0,
            sse: false,
            settled: false,
        }
    }

    /// A ticket that holds the call's place in the gateway's cap and nothing of its tenant's
    /// limits (a gateway without admission, for replays).
    pub(super) fn unlimited(entered: Entered) -> Self {
        let mut ticket = Ticket::new(Places {
            entered,
            rates: None,
            reserved: 0,
            prompt: 0,
            headers: RateHeaders::default(),
            meters_tokens: false,
        });
        ticket.settled = true;
        ticket
    }

    pub(super) fn seated(&mut self, seat: Seat, tenant: &str, class: Priority, waited: Duration) {
        self.places
            .entered
            .gate
            .series
            .queue_wait(tenant, class, waited);
        self.seat = Some(seat);
        self.waited = waited;
    }

    /// How long it waited for its seat.
    pub(crate) fn waited(&self) -> Duration {
        self.waited
    }

    /// The tenant's traffic counters (its gate's).
    pub(crate) fn traffic(&self) -> &Arc<crate::traffic::TenantTraffic> {
        self.places.entered.traffic()
    }

    /// The tenant's quotas after this admission.
    pub(crate) fn rate_headers(&self) -> &RateHeaders {
        &self.places.headers
    }

    /// The ticket of a call whose response is about to be relayed, as an event stream or not.
    pub(crate) fn relayed(mut self, sse: bool) -> Self {
        self.sse = sse;
        self
    }

    /// A data frame of the relayed body passed.
    pub(crate) fn frame(&mut self, _data: &Bytes) {
        self.data_frames += 1;
    }

    /// The relayed body ended, `complete` or not, with the usage the backend `reported` (read
    /// by the relay, `crate::usage`). A report is counted for every tenant
    /// (`spillway_tokens_reported_total`); a tenant with a tokens limit has its reservation
    /// reconciled with it. Without a report the estimate stands for a response that completed;
    /// a metered stream cut short is charged its prompt and about a token per event it carried.
    pub(crate) fn ended(&mut self, complete: bool, reported: Option<Usage>) {
        if self.settled {
            return;
        }
        let used = match reported {
            Some(usage) => Some(usage.total_tokens),
            None if !complete && self.sse && self.places.meters_tokens => {
                Some(self.places.prompt + self.data_frames)
            }
            None => None,
        };
        self.settle(used);
    }

    /// Settles the ticket: `used` tokens if known (the backend's report, or a count of what was
    /// streamed) are counted, and reconciled with the reservation of a tenant with a tokens
    /// limit; `None` keeps the reservation as it is.
    pub(super) fn settle(&mut self, used: Option<u64>) {
        self.settled = true;
        if let Some(used) = used {
            self.places
                .entered
                .gate
                .series
                .tokens_reported
                .increment(used);
            if self.places.meters_tokens {
                self.reconcile(used);
            }
        }
    }

    fn reconcile(&self, used: u64) {
        let p = &self.places;
        if let Some((rates, limits)) = &p.rates {
            rates.settle_shared(&p.entered.gate.tenant, limits, p.reserved, used);
            return;
        }
        let mut rate = p
            .entered
            .gate
            .rate
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        rate.1.reconcile(crate::clock::now(), p.reserved, used);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.settled {
            // Nothing was generated: give the tokens back (the request itself still counts).
            self.reconcile(0);
        }
    }
}
