//! The attempt loop in-process, against a scripted upstream, on paused time: what guarantee G1
//! promises, for any sequence of upstream outcomes.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use proptest::prelude::*;
use spillway_config::Config;
use spillway_policy::Outcome;
use tokio::time::Instant;

use crate::answer::Answer;

use super::{run, Retries};
use crate::auth::{Tenant, TenantLimits};
use crate::call::Call;
use crate::endpoint::Endpoint;
use crate::lines::Lines;
use crate::pool::{Backend, InFlight, Models};
use crate::relay::{BodyEnd, EndObserver, RelayBody};
use crate::traffic::TenantTraffic;
use crate::upstream::{Attempt, Upstream};

/// What the scripted upstream does with one attempt.
#[derive(Debug, Clone)]
pub(super) enum Step {
    /// Answers with this status after `after`.
    Status(u16, Duration),
    /// Gives no response head: the outcome, after `after`.
    Fail(Outcome, Duration),
    /// Answers with this status and body at once.
    Body(u16, &'static str),
}

/// One attempt as the upstream saw it.
#[derive(Debug, Clone)]
pub(super) struct Sent {
    pub(super) backend: Arc<str>,
    pub(super) at: Instant,
}

/// An upstream that plays its script, one step per attempt, and then answers 200.
#[derive(Default)]
pub(super) struct Scripted {
    steps: Mutex<VecDeque<Step>>,
    sent: Mutex<Vec<Sent>>,
}

impl Scripted {
    pub(super) fn new(steps: impl IntoIterator<Item = Step>) -> Self {
        Scripted {
            steps: Mutex::new(steps.into_iter().collect()),
            sent: Mutex::default(),
        }
    }

    pub(super) fn sent(&self) -> Vec<Sent> {
        self.sent.lock().unwrap().clone()
    }
}

type Frames =
    futures_util::stream::Iter<std::vec::IntoIter<Result<http_body::Frame<Bytes>, std::io::Error>>>;

impl Upstream for Scripted {
    type Body = Full<Bytes>;

    async fn send(
        &self,
        backend: &Arc<Backend>,
        _attempt: Attempt<'_>,
    ) -> Result<Answer<Self::Body>, Outcome> {
        self.sent.lock().unwrap().push(Sent {
            backend: backend.name.clone(),
            at: Instant::now(),
        });
        let step = self.steps.lock().unwrap().pop_front();
        let step = step.unwrap_or(Step::Status(200, Duration::ZERO));
        if let Step::Status(_, after) | Step::Fail(_, after) = &step {
            tokio::time::sleep(*after).await;
        }
        let answer = |status, body| {
            Ok(Answer::from(
                http::Response::builder()
                    .status(status)
                    .body(Full::new(Bytes::from_static(body)))
                    .unwrap(),
            ))
        };
        match step {
            Step::Status(status, _) => answer(status, b"{}"),
            Step::Body(status, body) => answer(status, body.as_bytes()),
            Step::Fail(outcome, _) => Err(outcome),
        }
    }
}

/// A stream that sends one event and then breaks off, as a backend that dies mid-stream.
#[derive(Default)]
struct BreaksMidStream {
    sent: std::sync::atomic::AtomicU32,
}

impl Upstream for BreaksMidStream {
    type Body = StreamBody<Frames>;

    async fn send(
        &self,
        _backend: &Arc<Backend>,
        _attempt: Attempt<'_>,
    ) -> Result<Answer<Self::Body>, Outcome> {
        self.sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let frames = vec![
            Ok(http_body::Frame::data(Bytes::from_static(b"data: {}\n\n"))),
            Err(std::io::Error::other("the backend went away")),
        ];
        Ok(Answer::from(
            http::Response::builder()
                .header("content-type", "text/event-stream")
                .body(StreamBody::new(futures_util::stream::iter(frames)))
                .unwrap(),
        ))
    }
}

/// Remembers how a relayed body ended.
struct Ending(Arc<Mutex<Option<BodyEnd>>>);

impl EndObserver for Ending {
    fn ended(&mut self, end: BodyEnd, _: &Backend) {
        *self.0.lock().unwrap() = Some(end);
    }
}

pub(super) const BUDGET_RATIO: f64 = 0.1;
pub(super) const BUDGET_MIN_PER_SEC: f64 = 1.0;
pub(super) const BUDGET_WINDOW_SECS: u64 = 60;

/// Three backends of one model, with the retry settings of the test.
fn pool(extra: &str) -> (Models, Retries) {
    pool_with(extra, "")
}

/// Three backends of model `m`, whose `fallbacks` line is `fallbacks` (none when empty), and
/// model `f` with one backend, `x`.
pub(super) fn pool_with(extra: &str, fallbacks: &str) -> (Models, Retries) {
    models_from(&format!(
        r#"
[retry]
max_attempts = 5
budget_ratio = {BUDGET_RATIO}
budget_min_per_sec = {BUDGET_MIN_PER_SEC}
budget_window = "{BUDGET_WINDOW_SECS}s"
deadline = "120s"
{extra}
[[models]]
name = "f"
[[models.backends]]
name = "x"
url = "http://127.0.0.1:9/v1"
engine = "none"
[[models]]
name = "m"
{fallbacks}
[[models.backends]]
name = "a"
url = "http://127.0.0.1:9/v1"
engine = "none"
[[models.backends]]
name = "b"
url = "http://127.0.0.1:9/v1"
engine = "none"
[[models.backends]]
name = "c"
url = "http://127.0.0.1:9/v1"
engine = "none"
"#
    ))
}

/// The models and retry settings of a configuration.
pub(super) fn models_from(toml: &str) -> (Models, Retries) {
    let config = Config::from_toml(toml).unwrap();
    let models = crate::pool::tests::models(&config);
    let retries = Retries::new(&config.retry, &config.upstream, Duration::from_secs(1));
    (models, retries)
}

pub(super) fn call<'m>(models: &'m Models, retries: &Retries) -> Call<'m> {
    let started = crate::clock::now();
    Call {
        endpoint: Endpoint::ChatCompletions,
        query: None,
        started,
        deadline: started + retries.deadline,
        tenant: Arc::new(Tenant {
            name: Arc::from("t"),
            allowed_models: None,
            enabled: true,
            limits: TenantLimits::default(),
            pool: None,
            default_model: None,
        }),
        headers: Lines::default(),
        body: Bytes::from_static(br#"{"model":"m"}"#),
        summary: crate::request::summarize(br#"{"model":"m"}"#, false).unwrap(),
        pool: models.get("m").unwrap(),
        region: None,
        priority: Default::default(),
        affinity_key: None,
        home: None,
        client_retry: false,
        model_named: true,
        backend_label: None,
        throttle_pass: None,
        trace: crate::trace::CallTrace::none(),
        entered: None,
        _rewrite_room: None,
    }
}

/// A tenant's counters, for a call of the tests.
pub(super) fn traffic() -> TenantTraffic {
    TenantTraffic::new()
}

/// Runs `f` on a current-thread runtime whose clock is paused: sleeps and timeouts pass at
/// once, in order, as the loop's backoffs and the script's latencies ask.
pub(super) fn paused<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
        .block_on(f)
}

/// One call of model `m` (made by [`call`], with its tenant's counters) through the loop.
pub(super) async fn attempt_once<'m, U: Upstream>(
    models: &'m Models,
    retries: &Retries,
    upstream: &U,
) -> super::Attempted<'m, U::Body> {
    run(
        &call(models, retries),
        &traffic(),
        retries,
        upstream,
        models,
    )
    .await
}

/// One call through the loop to the answer it chose; the test fails if it chose none.
pub(super) async fn chosen<U: Upstream>(
    models: &Models,
    retries: &Retries,
    upstream: &U,
) -> super::Chosen<U::Body> {
    attempt_once(models, retries, upstream)
        .await
        .result
        .unwrap_or_else(|e| panic!("{}", e.message))
}

pub(super) fn step() -> impl Strategy<Value = Step> {
    let after = (0u64..20).prop_map(Duration::from_millis);
    prop_oneof![
        (
            prop::sample::select(vec![200u16, 400, 404, 429, 500, 502, 503, 504]),
            after.clone()
        )
            .prop_map(|(s, a)| Step::Status(s, a)),
        (
            prop::sample::select(vec![
                Outcome::ConnectFailed,
                Outcome::ResetBeforeResponse,
                Outcome::TimedOut
            ]),
            after
        )
            .prop_map(|(o, a)| Step::Fail(o, a)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// G1: whatever the backends answer and however often callers resend, the attempts that
    /// reach a backend stay within requests x (1 + ratio) + floor over the budget's window.
    /// (A refused connection reached no backend and is not counted: it costs no budget.)
    #[test]
    fn attempts_that_reach_a_backend_stay_within_the_budget(
        steps in prop::collection::vec(step(), 0..400),
        callers in 1usize..60,
        caller_retries in 0u32..4,
    ) {
        let (models, retries) = pool("transient_backoff_base = \"0s\"\ncapacity_backoff_base = \"0s\"");
        let upstream = Scripted::new(steps.clone());
        let requests = paused(async {
            let start = Instant::now();
            let mut requests = 0u64;
            for _ in 0..callers {
                for _ in 0..=caller_retries {
                    requests += 1;
                    let ok = attempt_once(&models, &retries, &upstream)
                        .await
                        .result
                        .is_ok_and(|c| c.response.status().is_success());
                    if ok {
                        break;
                    }
                }
            }
            assert!(start.elapsed() < Duration::from_secs(BUDGET_WINDOW_SECS / 2),
                "the run fits in one budget window, so the bound below is the budget's");
            requests
        });
        let sent = upstream.sent().len();
        let refused: usize = steps
            .iter()
            .take(sent)
            .filter(|s| matches!(s, Step::Fail(Outcome::ConnectFailed, _)))
            .count();
        let loaded = (sent - refused) as f64;
        let bound = requests as f64 * (1.0 + BUDGET_RATIO)
            + BUDGET_MIN_PER_SEC * BUDGET_WINDOW_SECS as f64;
        prop_assert!(loaded <= bound, "{loaded} attempts reached a backend for {requests} requests (bound {bound})");
    }

    /// No attempt starts once the request's deadline has passed, however slow the backends.
    #[test]
    fn no_attempt_starts_past_the_deadline(
        steps in prop::collection::vec(
            (prop::sample::select(vec![502u16, 503, 504]), 0u64..90_000)
                .prop_map(|(s, ms)| Step::Status(s, Duration::from_millis(ms))),
            1..10,
        ),
    ) {
        let (models, retries) = pool("");
        let upstream = Scripted::new(steps);
        let deadline = paused(async {
            let call = call(&models, &retries);
            let deadline = Instant::from_std(call.deadline);
            let _ = run(&call, &traffic(), &retries, &upstream, &models).await;
            deadline
        });
        for s in upstream.sent() {
            prop_assert!(s.at < deadline, "an attempt started {:?} past the deadline", s.at - deadline);
        }
    }

    /// A capacity answer never sends the call back to the backend that gave it.
    #[test]
    fn a_capacity_failure_is_never_retried_on_the_same_backend(
        steps in prop::collection::vec(
            prop::sample::select(vec![429u16, 503, 502, 200])
                .prop_map(|s| Step::Status(s, Duration::ZERO)),
            1..6,
        ),
    ) {
        let (models, retries) = pool("");
        let upstream = Scripted::new(steps.clone());
        paused(async {
            let _ = attempt_once(&models, &retries, &upstream).await;
        });
        let sent = upstream.sent();
        for (i, (s, step)) in sent.iter().zip(&steps).enumerate() {
            if matches!(step, Step::Status(429 | 503, _)) {
                prop_assert!(
                    sent[i + 1..].iter().all(|later| later.backend != s.backend),
                    "attempt {i} got a capacity answer from {} and a later one went back to it",
                    s.backend
                );
            }
        }
    }
}

#[test]
fn a_client_error_is_never_retried() {
    let (models, retries) = pool("");
    // 429 is a capacity answer and 401/403 the backend refusing the gateway's own key: those
    // are about the backend, not the request, and tried elsewhere.
    for status in (400u16..500).filter(|s| ![401, 403, 429].contains(s)) {
        let upstream = Scripted::new([Step::Status(status, Duration::ZERO)]);
        let chosen = paused(attempt_once(&models, &retries, &upstream))
            .result
            .unwrap_or_else(|e| panic!("{status}: {}", e.message));
        assert_eq!(chosen.response.status(), status, "relayed as it came");
        assert_eq!(upstream.sent().len(), 1, "{status} was retried");
    }
}

#[test]
fn nothing_is_retried_after_the_first_streamed_byte() {
    let (models, retries) = pool("");
    let upstream = BreaksMidStream::default();
    let ending = Arc::new(Mutex::new(None));
    let frames = paused(async {
        let chosen = chosen(&models, &retries, &upstream).await;
        // Relayed as the respond stage relays it, to its end.
        let relay = RelayBody::new(
            chosen.response.into_body(),
            true,
            Endpoint::ChatCompletions,
            Duration::from_secs(60),
            Box::new((chosen.hold, Ending(ending.clone()))),
        );
        let mut relay = std::pin::pin!(relay);
        let mut frames = Vec::new();
        while let Some(frame) = relay.frame().await {
            frames.push(frame.unwrap().into_data().unwrap());
        }
        frames
    });
    assert_eq!(frames.len(), 2, "{frames:?}");
    assert!(
        frames[1].starts_with(b"event: error"),
        "the break is told as an error event, never a clean end: {frames:?}"
    );
    assert_eq!(*ending.lock().unwrap(), Some(BodyEnd::UpstreamBroke));
    assert_eq!(
        upstream.sent.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "the break was not retried"
    );
    let pool = models.get("m").unwrap();
    let totals = pool.budget.lock().unwrap().totals(crate::clock::now());
    assert_eq!(totals, (1, 0), "nor drawn from the budget");
}

#[test]
fn refused_connections_move_on_without_drawing_on_the_budget() {
    let (models, retries) = pool("");
    let upstream = Scripted::new([
        Step::Fail(Outcome::ConnectFailed, Duration::ZERO),
        Step::Fail(Outcome::ConnectFailed, Duration::ZERO),
        Step::Status(200, Duration::ZERO),
    ]);
    paused(async {
        let chosen = chosen(&models, &retries, &upstream).await;
        assert_eq!(chosen.response.status(), 200);
        let pool = models.get("m").unwrap();
        let (requests, retried) = pool.budget.lock().unwrap().totals(crate::clock::now());
        assert_eq!((requests, retried), (1, 0), "the budget paid for nothing");
    });
    let backends: Vec<_> = upstream.sent().iter().map(|s| s.backend.clone()).collect();
    assert_eq!(backends.len(), 3);
    assert!(
        backends[0] != backends[1] && backends[1] != backends[2] && backends[0] != backends[2],
        "each attempt went to another backend: {backends:?}"
    );
}

#[test]
fn a_failure_after_sending_draws_one_retry_from_the_budget() {
    let (models, retries) = pool("");
    let upstream = Scripted::new([Step::Status(502, Duration::ZERO)]);
    paused(async {
        let chosen = chosen(&models, &retries, &upstream).await;
        assert_eq!(chosen.response.status(), 200);
        let pool = models.get("m").unwrap();
        let totals = pool.budget.lock().unwrap().totals(crate::clock::now());
        assert_eq!(totals, (1, 1));
    });
    assert_eq!(upstream.sent().len(), 2);
}

/// Notes what a relay shows its observer, in order, in a log the test writes to as well.
struct Noted(Arc<Mutex<Vec<String>>>);

impl EndObserver for Noted {
    fn arrived(&mut self, data: &Bytes) {
        self.0
            .lock()
            .unwrap()
            .push(format!("arrived {}", data.len()));
    }
    fn frame(&mut self, data: &Bytes) {
        self.0.lock().unwrap().push(format!("read {}", data.len()));
    }
    fn ended(&mut self, end: BodyEnd, _: &Backend) {
        self.0.lock().unwrap().push(format!("ended {end:?}"));
    }
}

/// The chosen answer, its body boxed so that those of different upstreams relay alike.
fn boxed<B>(chosen: super::Chosen<B>) -> (Answer<UnsyncBoxBody<Bytes, String>>, InFlight)
where
    B: http_body::Body<Data = Bytes, Error: std::fmt::Display> + Send + Unpin + 'static,
{
    let response = chosen
        .response
        .map(|b| b.map_err(|e| e.to_string()).boxed_unsync());
    (response, chosen.hold)
}

/// An answer is read by the relay's observer (the usage scan) only after it was passed on, so
/// the client connection writes it first; yet every frame is read before the end is told:
/// asked to its end, dropped once its length was passed on (no last poll), or broken off.
#[test]
fn the_observer_reads_each_frame_after_it_was_passed_on_and_before_the_end() {
    let (models, retries) = pool("");
    let through = |last_poll: bool, upstream: &dyn Fn() -> Option<Step>| {
        let log = Arc::new(Mutex::new(Vec::new()));
        paused(async {
            let call = call(&models, &retries);
            let chosen = match upstream() {
                Some(step) => run(&call, &traffic(), &retries, &Scripted::new([step]), &models)
                    .await
                    .result
                    .map(boxed),
                None => run(
                    &call,
                    &traffic(),
                    &retries,
                    &BreaksMidStream::default(),
                    &models,
                )
                .await
                .result
                .map(boxed),
            };
            let (response, hold) = chosen.unwrap_or_else(|e| panic!("{}", e.message));
            let relay = RelayBody::new(
                response.into_body(),
                false,
                Endpoint::ChatCompletions,
                Duration::from_secs(60),
                Box::new((hold, Noted(log.clone()))),
            );
            let mut relay = Box::pin(relay);
            while let Some(frame) = relay.frame().await {
                let passed = match frame {
                    Ok(f) => format!("passed {}", f.into_data().map_or(0, |d| d.len())),
                    Err(e) => format!("failed: {e}"),
                };
                log.lock().unwrap().push(passed);
                // The answer is one frame: dropped before the poll that would find its end.
                if !last_poll {
                    break;
                }
            }
        });
        let noted = log.lock().unwrap().clone();
        noted
    };
    let answer = || Some(Step::Body(200, r#"{"usage":{"prompt_tokens":1}}"#));
    let whole = ["arrived 29", "passed 29", "read 29", "ended Complete"];
    assert_eq!(through(true, &answer), whole);
    assert_eq!(
        through(false, &answer),
        whole,
        "dropped without a last poll"
    );
    assert_eq!(
        through(true, &|| None),
        [
            "arrived 10",
            "passed 10",
            "read 10",
            "ended UpstreamBroke",
            "failed: the backend went away"
        ]
    );
}
