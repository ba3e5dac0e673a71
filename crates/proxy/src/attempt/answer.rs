//! What a caller is told when its attempts end without a response worth relaying: which error,
//! which status and how long to wait, from the last failure and why no retry followed.

use std::time::{Duration, Instant};

use spillway_policy::{Class, Outcome, Pushback, Refusal, Stop};

use crate::error::{ApiError, ErrorKind, NO_CAPACITY_RETRY_AFTER};

/// The last failed attempt, for the answer when no retry follows.
pub(super) struct Failure {
    pub class: Class,
    pub outcome: Outcome,
    pub pushback: Pushback,
}

impl Failure {
    /// Whether the next attempt may go back to the same backend: not after a capacity answer
    /// or a refused credential.
    pub fn same_backend_ok(&self) -> bool {
        !matches!(self.class, Class::Capacity | Class::UpstreamAuth)
    }

    /// Whether a response with this failure is relayed as it is when no retry follows. A
    /// capacity answer becomes spillway's own 503 or 429, and a refused credential its own 502:
    /// neither is the caller's to see.
    pub fn is_relayed(&self) -> bool {
        self.same_backend_ok()
    }
}

/// The retry budget refused the retry of a `class` failure.
pub(super) fn budget_refused(model: &str, class: Class, refusal: Refusal) -> ApiError {
    ApiError::new(
        ErrorKind::RetryBudgetExhausted,
        format!(
            "the backend of the model {model:?} failed ({}) and no retry was allowed: {}",
            class.as_str(),
            refusal.describe()
        ),
    )
    .retry_after(NO_CAPACITY_RETRY_AFTER)
}

/// What the answer says of the call's attempts.
pub(super) struct Spent<'a> {
    pub model: &'a str,
    /// Attempts made.
    pub made: u32,
    pub started: Instant,
    /// `upstream.response_timeout`.
    pub response_timeout: Duration,
    /// `retry.deadline`.
    pub deadline: Duration,
}

impl Spent<'_> {
    /// The answer when no backend could be picked at all.
    pub(super) fn no_backend(&self, last: Option<Failure>) -> ApiError {
        match last {
            Some(failure) => self.give_up(failure, Stop::AttemptsExhausted),
            None => ApiError::new(
                ErrorKind::NoCapacity,
                format!(
                    "every backend of the model {:?} is at its concurrency limit, ejected or unreachable",
                    self.model
                ),
            )
            .retry_after(NO_CAPACITY_RETRY_AFTER),
        }
    }

    /// The answer when the last attempt failed without a response worth relaying.
    pub(super) fn give_up(&self, failure: Failure, stop: Stop) -> ApiError {
        let model = self.model;
        match (failure.class, failure.outcome) {
            (Class::Capacity, _) => ApiError::new(
                ErrorKind::NoCapacity,
                format!("the backends of the model {model:?} have no capacity left ({stop:?})"),
            )
            .retry_after(
                failure
                    .pushback
                    .retry_after
                    .unwrap_or(NO_CAPACITY_RETRY_AFTER)
                    .max(NO_CAPACITY_RETRY_AFTER),
            ),
            (Class::UpstreamAuth, _) => ApiError::new(
                ErrorKind::UpstreamAuth,
                format!(
                    "the backends of the model {model:?} refused spillway's own credentials for them; the gateway's operator must fix its backend keys"
                ),
            ),
            (_, Outcome::ConnectFailed) => ApiError::new(
                ErrorKind::NoCapacity,
                format!("no backend of the model {model:?} could be reached"),
            )
            .retry_after(NO_CAPACITY_RETRY_AFTER),
            (_, Outcome::TimedOut) => {
                ApiError::new(ErrorKind::UpstreamTimeout, self.timed_out(model, stop))
            }
            _ => ApiError::new(
                ErrorKind::UpstreamUnavailable,
                "the backend closed the connection before answering",
            ),
        }
    }

    /// What happened to a call whose last attempt timed out: how many attempts were made and
    /// how long they took in all, not just one attempt's timeout.
    fn timed_out(&self, model: &str, stop: Stop) -> String {
        let spent = crate::clock::since(self.started);
        let attempts = self.made;
        let plural = if attempts == 1 { "" } else { "s" };
        let mut message = format!(
            "no backend of the model {model:?} answered in time: {attempts} attempt{plural} \
             in {:.1}s, each allowed at most {:?} (upstream.response_timeout)",
            spent.as_secs_f64(),
            self.response_timeout,
        );
        if stop == Stop::Deadline {
            message += &format!(
                "; the request's deadline of {:?} (retry.deadline) left no time for another",
                self.deadline
            );
        }
        message
    }
}
