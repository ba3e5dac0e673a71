//! What the operator would watch from the reload on: the rollout's state on the gateway, and
//! the requests reaching the new version's backends.
//!
//! Two times tell a bad rollout's cost: until it is halted, and until no request reaches the new
//! version any more. The first is the gateway's own word (`GET /admin/rollouts`); the second is
//! measured at the backends, since a halt that left some traffic on the new version would not
//! be one. Both are polled every [`POLL`], so each time is known to within one poll (and the
//! gateway judges its rollouts once a second, which a halt's time includes).

use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use tokio::time::Instant;

use super::fleet::{Fleet, NewCounters};
use crate::http::HttpClient;
use crate::incident::say;
use crate::plan::Mode;

/// How often the rollout and the new backends' counters are read.
pub(crate) const POLL: Duration = Duration::from_millis(200);
/// A new-version request seen this close to the end of the run means the new version was
/// still serving when the run ended: it never stopped (a naive deployment never rolls back).
/// So does a share above zero at the last poll: a gateway that still routes to the new version
/// has not gone back to the old one, even when every new backend is ejected for a while (their
/// callers then get 503s, not the old version).
const STILL_SERVING: Duration = Duration::from_secs(1);

/// What was seen from the reload to the end of the run.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Watched {
    /// From the reload's answer to the first poll that saw the rollout halted.
    #[serde(rename = "halted_after_ms", serialize_with = "opt_millis")]
    pub(crate) halted_after: Option<Duration>,
    /// The halt's evidence, as `/admin/rollouts` gives it.
    pub(crate) halt_reason: Option<Value>,
    /// From the reload's answer to the last poll at which the new version's backends had
    /// received more requests than at the poll before; `None` if they received none.
    #[serde(
        rename = "last_new_version_request_after_ms",
        serialize_with = "opt_millis"
    )]
    pub(crate) last_new_request: Option<Duration>,
    /// Whether the new version was still receiving requests in the run's last second, or the
    /// gateway still gave it a share of them at the last poll.
    pub(crate) new_version_serving_at_end: bool,
    /// The rollout's status at the last poll: `running`, `halted`, ..., or `replace`.
    pub(crate) status_at_end: Option<String>,
    /// The new version's share of first attempts at the last poll, in percent.
    pub(crate) share_percent_at_end: Option<f64>,
    /// Polls that got no answer (each is simply skipped).
    pub(crate) polls_failed: u64,
}

impl Watched {
    /// The time after which every request was served by the old version again; `None` when
    /// the new version was still serving at the end (never back) or never served at all.
    pub(crate) fn back_on_old(&self) -> Option<Duration> {
        self.last_new_request
            .filter(|_| !self.new_version_serving_at_end)
    }
}

/// Polls `fleet` from `reloaded` until `end`; `before` is what the new version's backends had
/// received before the reload.
pub(crate) async fn follow(
    mode: Mode,
    fleet: &Fleet,
    before: NewCounters,
    reloaded: Instant,
    end: Instant,
) -> Watched {
    let control = HttpClient::new(2);
    let mut watched = Watched::default();
    let mut received = before.received;
    let mut last_growth = None;
    let mut tick = tokio::time::interval_at(reloaded, POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let at = Instant::now();
        if at >= end {
            break;
        }
        match fleet.rollout_view(&control).await {
            Ok(Some(view)) => {
                let status = view["state"]["status"].as_str().unwrap_or("replace");
                if status == "halted" && watched.halted_after.is_none() {
                    let after = at.saturating_duration_since(reloaded);
                    say(
                        mode,
                        &format!(
                            "the gateway halted the rollout {:.1} s after the reload",
                            after.as_secs_f64()
                        ),
                    );
                    watched.halted_after = Some(after);
                    watched.halt_reason = Some(view["state"]["reason"].clone());
                }
                watched.status_at_end = Some(status.to_owned());
                watched.share_percent_at_end = view["share_percent"].as_f64();
            }
            Ok(None) | Err(_) => watched.polls_failed += 1,
        }
        match fleet.new_counters(&control).await {
            Ok(now) => {
                if now.received > received {
                    last_growth = Some(at);
                }
                received = now.received;
            }
            Err(_) => watched.polls_failed += 1,
        }
    }
    watched.last_new_request = last_growth.map(|at| at.saturating_duration_since(reloaded));
    watched.new_version_serving_at_end =
        serving_at_end(last_growth, end, watched.share_percent_at_end);
    watched
}

/// Whether the new version, last seen receiving at `last_growth`, was still serving at `end`:
/// it received within [`STILL_SERVING`] of it, or the gateway still gave it a share.
fn serving_at_end(last_growth: Option<Instant>, end: Instant, share: Option<f64>) -> bool {
    let Some(at) = last_growth else { return false };
    share.is_some_and(|share| share > 0.0) || end.saturating_duration_since(at) <= STILL_SERVING
}

fn opt_millis<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&d.as_millis()),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_still_routed_to_is_serving_even_when_its_backends_went_quiet() {
        let end = Instant::now() + Duration::from_secs(20);
        let quiet = Some(end - Duration::from_secs(3));
        let recent = Some(end - Duration::from_millis(500));
        // Replaced, with every new backend ejected over the last seconds: still the new one.
        assert!(serving_at_end(quiet, end, Some(100.0)));
        // Halted: the share went to zero and nothing reached it since.
        assert!(!serving_at_end(quiet, end, Some(0.0)));
        assert!(!serving_at_end(quiet, end, None));
        // Still receiving at the end, whatever the last poll said.
        assert!(serving_at_end(recent, end, Some(0.0)));
        // Never received anything: never served, so never "still serving".
        assert!(!serving_at_end(None, end, Some(100.0)));
    }
}
