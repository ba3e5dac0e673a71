//! The load client: the stacked naive callers of IL-0248, offering requests at a fixed rate.
//!
//! The incident's amplification came from callers, not from the gateway: several layers that
//! each resent a failed request at once, up to 48 extra attempts in all. This client does the
//! same on purpose. New requests are offered on a fixed schedule whatever happened to earlier
//! ones (an open loop, like independent users); each one starts a chain that resends
//! immediately on any 5xx or connection error, stops on 2xx (success) or 4xx (failure), and
//! honours nothing the gateway says (`Retry-After`, `x-should-retry`). What keeps the client
//! itself bounded is the number of chains in flight: a new request that finds them all taken is
//! dropped and counted, never queued.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Uri};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::http::{request, HttpClient};
use crate::plan::LoadPlan;
use crate::tally::{Attempt, ChainEnd, Schedule, Tally};

/// How long chains still in flight after the last phase may run before they are abandoned
/// (and counted as unfinished).
pub(crate) const DRAIN_GRACE: Duration = Duration::from_secs(5);

/// Where the client sends its requests and how it presents itself.
pub(crate) struct Target {
    pub(crate) uri: Uri,
    /// One per caller; each request chain picks one at random (never empty).
    authorizations: Vec<HeaderValue>,
    body: Bytes,
    /// Another body and the share of requests (0 to 1) that send it instead: callers of one
    /// endpoint do not all send the same request, and an incident may hit only some of them.
    variant: Option<(Bytes, f64)>,
}

impl Target {
    /// A small non-streaming chat completion for `model` on the gateway at `uri`, sent with
    /// one of `keys` (uniformly at random per request), or with no key if there are none.
    pub(crate) fn chat(uri: Uri, keys: &[String], model: &str) -> Target {
        let authorizations = keys
            .iter()
            .filter_map(|key| HeaderValue::from_str(&format!("Bearer {key}")).ok())
            .collect();
        Target {
            uri,
            authorizations,
            body: Bytes::from(chat_body(model).to_string()),
            variant: None,
        }
    }

    /// The same target, with a `share` (0 to 1) of its requests, drawn per request, sending
    /// `body` instead.
    pub(crate) fn with_variant(self, body: &serde_json::Value, share: f64) -> Target {
        Target {
            variant: Some((Bytes::from(body.to_string()), share.clamp(0.0, 1.0))),
            ..self
        }
    }

    /// The body of a new request: the variant with its share, else the usual one. A request's
    /// resends keep the body it was given.
    fn pick_body(&self) -> Bytes {
        match &self.variant {
            Some((variant, share)) if rand::random::<f64>() < *share => variant.clone(),
            _ => self.body.clone(),
        }
    }

    /// One of the callers' credentials, at random.
    fn authorization(&self) -> Option<&HeaderValue> {
        if self.authorizations.is_empty() {
            return None;
        }
        self.authorizations
            .get(rand::random_range(0..self.authorizations.len()))
    }
}

/// The body [`Target::chat`] sends for `model`, for a scenario to derive a variant from.
pub(crate) fn chat_body(model: &str) -> serde_json::Value {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "Summarise the incident in one line."}],
        "max_tokens": 4,
    })
}

/// What was left when the load stopped.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Drained {
    /// Chains still in flight when the last phase ended.
    pub(crate) in_flight_at_end: usize,
    /// Chains abandoned when the drain grace ran out.
    pub(crate) abandoned: usize,
    /// How long the drain took.
    pub(crate) took: Duration,
}

/// Offers new requests at `plan.rate` from the schedule's start to its end, then lets the
/// chains in flight finish for up to [`DRAIN_GRACE`] and abandons the rest.
pub(crate) async fn offer(
    plan: LoadPlan,
    target: Arc<Target>,
    schedule: Schedule,
    tally: Arc<Tally>,
) -> Drained {
    let client = HttpClient::new(plan.max_outstanding);
    let slots = Arc::new(Semaphore::new(plan.max_outstanding));
    let mut chains = JoinSet::new();
    let mut next = schedule.start();
    loop {
        // An open loop keeps its offered rate: sends missed while the machine was busy are
        // caught up at once rather than lost.
        tokio::time::sleep_until(next).await;
        let now = next;
        if now >= schedule.end() {
            break;
        }
        let rate = match plan.surge {
            Some((phase, rate)) if schedule.slot(now) == phase => rate,
            _ => plan.rate,
        };
        next += Duration::from_secs_f64(1.0 / rate);
        while chains.try_join_next().is_some() {}
        let slot = schedule.slot(now);
        match Arc::clone(&slots).try_acquire_owned() {
            Ok(permit) => {
                tally.started(slot, now);
                let chain = Chain {
                    client: client.clone(),
                    target: Arc::clone(&target),
                    schedule,
                    tally: Arc::clone(&tally),
                    plan,
                };
                chains.spawn(async move {
                    chain.run(slot).await;
                    drop(permit);
                });
            }
            Err(_) => tally.dropped(slot, now),
        }
    }
    drain(chains).await
}

async fn drain(mut chains: JoinSet<()>) -> Drained {
    while chains.try_join_next().is_some() {}
    let in_flight_at_end = chains.len();
    let started = Instant::now();
    let deadline = started + DRAIN_GRACE;
    while let Ok(Some(_)) = tokio::time::timeout_at(deadline, chains.join_next()).await {}
    let abandoned = chains.len();
    chains.abort_all();
    while chains.join_next().await.is_some() {}
    Drained {
        in_flight_at_end,
        abandoned,
        took: started.elapsed(),
    }
}

/// One request and its resends.
struct Chain {
    client: HttpClient,
    target: Arc<Target>,
    schedule: Schedule,
    tally: Arc<Tally>,
    plan: LoadPlan,
}

impl Chain {
    /// Sends the request until it gets an answer not worth resending or runs out of resends;
    /// records every attempt in the phase it was sent and the chain's end in `started_in`.
    async fn run(self, started_in: usize) {
        let started = Instant::now();
        let authorization = self.target.authorization();
        let body = self.target.pick_body();
        let mut resends = 0;
        let end = loop {
            let sent = Instant::now();
            let sent_in = self.schedule.slot(sent);
            let req = request(
                Method::POST,
                self.target.uri.clone(),
                authorization,
                body.clone(),
            );
            let attempt = match self.client.exchange(req, self.plan.attempt_timeout).await {
                Ok((status, _)) => Attempt::Status(status),
                Err(failure) => Attempt::Failed(failure),
            };
            self.tally.attempt(sent_in, attempt, sent, Instant::now());
            match verdict(attempt, self.plan.resend_429) {
                Verdict::Done(end) => break end,
                Verdict::Resend if resends < self.plan.client_retries => resends += 1,
                Verdict::Resend => break ChainEnd::Exhausted,
            }
        };
        self.tally.ended(started_in, end, started.elapsed());
    }
}

/// What a naive caller does after an attempt.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Done(ChainEnd),
    Resend,
}

fn verdict(attempt: Attempt, resend_429: bool) -> Verdict {
    match attempt {
        Attempt::Status(s) if s.is_success() => Verdict::Done(ChainEnd::Succeeded),
        Attempt::Status(s) if s.is_server_error() => Verdict::Resend,
        Attempt::Status(s) if resend_429 && s == http::StatusCode::TOO_MANY_REQUESTS => {
            Verdict::Resend
        }
        Attempt::Status(_) => Verdict::Done(ChainEnd::Failed),
        Attempt::Failed(_) => Verdict::Resend,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::Failure;
    use http::StatusCode;

    #[test]
    fn naive_callers_resend_every_5xx_and_connection_error_and_nothing_else() {
        let status =
            |code: u16| verdict(Attempt::Status(StatusCode::from_u16(code).unwrap()), false);
        assert_eq!(status(200), Verdict::Done(ChainEnd::Succeeded));
        for code in [500, 502, 503, 504] {
            assert_eq!(status(code), Verdict::Resend, "{code}");
        }
        for code in [400, 401, 404, 429] {
            assert_eq!(status(code), Verdict::Done(ChainEnd::Failed), "{code}");
        }
        for failure in [Failure::Connect, Failure::Connection, Failure::Timeout] {
            assert_eq!(verdict(Attempt::Failed(failure), false), Verdict::Resend);
        }
        let too_many = Attempt::Status(StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(verdict(too_many, true), Verdict::Resend);
    }

    #[test]
    fn a_variant_is_sent_with_its_share_and_none_without_one() {
        let uri: Uri = "http://127.0.0.1:9/v1/chat/completions".parse().unwrap();
        let plain = Target::chat(uri.clone(), &[], "m");
        let mut tools = chat_body("m");
        tools["tools"] = serde_json::json!([]);
        let (usual, variant) = (plain.body.clone(), Bytes::from(tools.to_string()));
        assert!((0..100).all(|_| plain.pick_body() == usual));
        let always = Target::chat(uri.clone(), &[], "m").with_variant(&tools, 1.0);
        assert!((0..100).all(|_| always.pick_body() == variant));
        let never = Target::chat(uri.clone(), &[], "m").with_variant(&tools, 0.0);
        assert!((0..100).all(|_| never.pick_body() == usual));
        // 2,000 draws at 30 %: 600 expected, a standard deviation of about 20.
        let mixed = Target::chat(uri, &[], "m").with_variant(&tools, 0.3);
        let sent = (0..2000).filter(|_| mixed.pick_body() == variant).count();
        assert!((480..=720).contains(&sent), "{sent}");
    }
}
