//! One inference request from arrival to answer.
//!
//! The order is the order a real, sometimes broken, backend would impose: the body is read and
//! remembered (so `/stats` shows what reached the server even when a fault then hits it), the
//! profile's drawn faults strike before the server looks at the request, then the key is
//! checked, a body using the profile's `reject_field` is refused as an engine refuses a
//! parameter it does not support (while reading the request, so before the model is looked
//! up), then the request and the model are checked, a generation slot is taken (or 429), the
//! prompt is looked up in the prefix cache, and only then is the reply generated at the
//! profile's pace: the uncached part of the prompt prefilled, then the tokens. Every exit
//! records exactly one outcome.
//!
//! Every API surface (OpenAI chat, completions, embeddings and Responses; Anthropic Messages)
//! takes this one path; the endpoint decides only how the request is read, what the reply
//! looks like, and the [`Dialect`](crate::error::Dialect) its errors and headers follow.
//! Anthropic's `count_tokens` takes it too, through the checks, and is answered at once,
//! without a generation slot, prefix-cache lookup or pacing. A Responses compaction holds a
//! slot and is paced as a plain reply is, without a prefix-cache lookup. A Responses create or
//! compaction that names a `previous_response_id` is checked against the stored responses
//! before the model (whose name it may supply), and a Responses or chat create to be stored is
//! stored when it is answered (`responses.rs`, `chats.rs`). The routes of what was stored
//! (`lifecycle.rs`) share the first steps: remembering, the drawn faults, the key.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::header::{AUTHORIZATION, CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE};
use http::request::Parts;
use http::{HeaderMap, HeaderValue};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde_json::{Map, Value};

use crate::chats;
use crate::compact::{self, Compaction};
use crate::embeddings::Embedding;
use crate::error::{ApiError, Dialect};
use crate::faults::{self, Injected};
use crate::generate::{self, Pace, Plan};
use crate::messages;
use crate::prefix::{Chunker, PromptBlocks};
use crate::request::{self, Endpoint, Generation, Surface, CHARS_PER_TOKEN};
use crate::responses::{self, Create};
use crate::slots::SlotPermit;
use crate::stats::{Event, Outcome, Remembered};
use crate::store::Earlier;
use crate::stream::{self, Keep, StreamParts};
use crate::{Live, MockServer};

/// Larger request bodies get 413, as from a real server's front proxy.
pub(crate) const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// Marks a response the connection layer must replace with a TCP reset.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ResetConnection;

/// Serves one inference request. `deployment` is set for Azure paths and names the model.
pub(crate) async fn infer(
    server: MockServer,
    endpoint: Endpoint,
    deployment: Option<String>,
    req: Request,
) -> Response {
    let (parts, body) = req.into_parts();
    let live = server.live();
    let outcome = server.recorder().arrive(parts.uri.path());
    let dialect = endpoint.dialect();
    match admit(&server, &live, endpoint, deployment, &parts, body, &outcome).await {
        Ok(admitted) => {
            let mut response = reply(&server, admitted, &live, outcome).await;
            dialect.stamp(&mut response);
            response
        }
        Err(refusal) => refuse(outcome, refusal, dialect),
    }
}

/// Settles a refused request's outcome and answers it: a reset, or the error in `dialect`.
pub(crate) fn refuse(mut outcome: Outcome, refusal: Refusal, dialect: Dialect) -> Response {
    match refusal {
        Refusal::Reset => {
            outcome.settle(Some(Event::ResetInjected));
            let mut r = Response::new(Body::empty());
            r.extensions_mut().insert(ResetConnection);
            r
        }
        Refusal::Error(error, event) => {
            outcome.settle(Some(event));
            dialect.answer(error)
        }
    }
}

/// The profile's faults, drawn for one request: a stall is waited out (and noted), a reset or
/// an injected error refuses the request.
pub(crate) async fn strike(live: &Live, outcome: &Outcome) -> Result<(), Refusal> {
    let draw = faults::draw(&live.profile.fault, &mut rand::rng());
    if let Some(stall) = draw.stall {
        outcome.note(Event::StallInjected);
        tokio::time::sleep(stall).await;
    }
    match draw.outcome {
        Injected::Reset => Err(Refusal::Reset),
        Injected::Error => {
            let f = &live.profile.fault;
            let error = ApiError::injected(f.error_status, f.retry_after);
            Err(Refusal::Error(error, Event::ErrorInjected))
        }
        Injected::None => Ok(()),
    }
}

/// The key check shared by inference, the stored-state routes and `/v1/models`: the key may
/// come as `Authorization: Bearer KEY` (OpenAI), `api-key: KEY` (Azure) or `x-api-key: KEY`
/// (Anthropic).
pub(crate) fn authorize(live: &Live, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(required) = live.required_key.as_deref() else {
        return Ok(());
    };
    let bearer = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, key) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
        });
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let presented = [bearer, header("api-key"), header("x-api-key")];
    if presented.contains(&Some(required)) {
        Ok(())
    } else if presented.iter().all(Option::is_none) {
        Err(ApiError::unauthorized(
            "missing_api_key",
            "You didn't provide an API key: send `Authorization: Bearer KEY`, `api-key: KEY` \
             or `x-api-key: KEY`.",
        ))
    } else {
        Err(ApiError::unauthorized(
            "invalid_api_key",
            "Incorrect API key provided.",
        ))
    }
}

/// Why a request is answered without its work being done.
pub(crate) enum Refusal {
    Reset,
    Error(ApiError, Event),
}

/// A refusal for a request the server cannot use, counted as rejected.
pub(crate) fn invalid(error: ApiError) -> Refusal {
    Refusal::Error(error, Event::RejectedInvalid)
}

/// What a checked request asks for.
enum Work {
    /// `prompt` is the prompt's blocks for the prefix cache, unless the cache is off.
    /// `create` is what a Responses or chat create asks to be stored.
    Generate {
        surface: Surface,
        g: Generation,
        prompt: Option<PromptBlocks>,
        create: Option<ToStore>,
    },
    Embed(Embedding),
    /// Anthropic's `count_tokens`: the prompt's tokens, counted without a generation slot.
    Count(u32),
    /// A Responses compaction.
    Compact(Compaction),
}

/// What a create asks to be stored of its reply, read with its other fields.
enum ToStore {
    Response(Create),
    Chat(chats::Create),
}

/// A request that passed every check and holds a generation slot if its work needs one.
struct Admitted {
    model: String,
    work: Work,
    permit: Option<SlotPermit>,
}

async fn admit(
    server: &MockServer,
    live: &Live,
    endpoint: Endpoint,
    deployment: Option<String>,
    parts: &Parts,
    body: Body,
    outcome: &Outcome,
) -> Result<Admitted, Refusal> {
    let read = read_body(&parts.headers, body).await;
    let body_bytes = read.as_ref().map_or(0, bytes::Bytes::len);
    let (body, json_error) = parse_json(&read);
    let model = deployment.or_else(|| body.get("model").and_then(Value::as_str).map(str::to_owned));
    server
        .recorder()
        .remember(remembered(parts, model.clone(), Arc::clone(&body)));
    read.map_err(invalid)?;
    strike(live, outcome).await?;

    authorize(live, &parts.headers).map_err(invalid)?;
    if parts.uri.path().starts_with("/openai/") && !has_api_version(parts.uri.query()) {
        return Err(invalid(ApiError::invalid(
            "missing_api_version",
            "the api-version query parameter is required (e.g. ?api-version=2024-10-21)",
        )));
    }
    let fields = json_object(&body, json_error).map_err(invalid)?;
    if let Some(field) = faults::rejected_field(&live.profile.fault, fields) {
        let error = ApiError::unsupported_parameter(field);
        return Err(Refusal::Error(error, Event::FieldRejected));
    }
    let earlier = match endpoint {
        Endpoint::Generate(Surface::Responses) | Endpoint::Compact => {
            earlier(server, fields).map_err(invalid)?
        }
        _ => None,
    };
    let model = model
        .or_else(|| earlier.as_ref().map(|e| e.model.clone()))
        .ok_or_else(|| invalid(ApiError::invalid_param("model", "`model` is required")))?;
    if !live.profile.models.contains(&model) {
        return Err(invalid(ApiError::model_not_found(&model)));
    }
    // Read before taking a slot, so a malformed request never holds one.
    let profile = &live.profile;
    // The KV-cache tokens the work holds with its slot; `None` needs no slot.
    let (work, kv_tokens) = match endpoint {
        Endpoint::Embeddings => {
            let e = Embedding::parse(fields, profile.embedding_dim).map_err(invalid)?;
            let kv = u64::from(e.prompt_tokens());
            (Work::Embed(e), Some(kv))
        }
        Endpoint::CountTokens => {
            let n = request::prompt_tokens(Surface::Messages, fields).map_err(invalid)?;
            (Work::Count(n), None)
        }
        Endpoint::Compact => {
            let c = Compaction::read(fields, earlier.as_ref(), profile).map_err(invalid)?;
            let kv = u64::from(c.input_tokens) + u64::from(c.output_tokens);
            (Work::Compact(c), Some(kv))
        }
        Endpoint::Generate(surface) => {
            let mut g = request::generation(surface, fields).map_err(invalid)?;
            let create = match surface {
                Surface::Responses => {
                    let create =
                        Create::read(fields, earlier.as_ref(), body_bytes).map_err(invalid)?;
                    let earlier_tokens = earlier.as_ref().map_or(0, |e| e.conversation_tokens);
                    g.prompt_tokens = g.prompt_tokens.saturating_add(earlier_tokens);
                    Some(ToStore::Response(create))
                }
                Surface::Chat => {
                    let create = chats::Create::read(fields, body_bytes).map_err(invalid)?;
                    Some(ToStore::Chat(create))
                }
                Surface::Completions | Surface::Messages => None,
            };
            let output = generate::output_length(&g, profile).0;
            let kv = u64::from(g.prompt_tokens) + u64::from(output);
            let entries = profile.prefix_cache_entries as usize;
            let prompt = (entries > 0).then(|| {
                let mut blocks = Chunker::new(&model, profile.prefix_chars as usize, entries);
                request::for_each_prompt_text(surface, fields, |text| blocks.push(text));
                blocks.finish()
            });
            let work = Work::Generate {
                surface,
                g,
                prompt,
                create,
            };
            (work, Some(kv))
        }
    };

    let permit = match kv_tokens {
        None => None,
        Some(kv) => Some(server.slots().acquire(kv).await.map_err(|full| {
            let error = ApiError::queue_full(full.capacity, full.queue);
            Refusal::Error(error, Event::RejectedQueueFull)
        })?),
    };
    Ok(Admitted {
        model,
        work,
        permit,
    })
}

async fn reply(server: &MockServer, a: Admitted, live: &Live, mut outcome: Outcome) -> Response {
    let profile = &live.profile;
    let response = match a.work {
        Work::Embed(embedding) => {
            let pace = Pace::start(profile, embedding.prompt_tokens());
            tokio::time::sleep_until(pace.due(0)).await;
            Json(embedding.response(&a.model)).into_response()
        }
        Work::Count(input_tokens) => Json(messages::token_count(input_tokens)).into_response(),
        Work::Compact(c) => {
            let pace = Pace::start(profile, c.input_tokens);
            tokio::time::sleep_until(pace.done(c.output_tokens)).await;
            Json(compact::object(&c)).into_response()
        }
        Work::Generate {
            surface,
            g,
            prompt,
            create,
        } => {
            let cached = cached_tokens(server, &g, prompt.as_ref(), profile);
            let pace = Pace::start(profile, g.prompt_tokens.saturating_sub(cached));
            let mut plan = Plan::new(surface, &a.model, &g, profile, cached);
            let keep = match create {
                Some(ToStore::Response(c)) => {
                    plan.store = c.store;
                    plan.previous_response_id = c.previous_response_id.clone();
                    c.keep(server.responses()).map(Keep::Response)
                }
                Some(ToStore::Chat(c)) => c.keep(server.chats()).map(Keep::Chat),
                None => None,
            };
            if g.stream {
                return event_stream(StreamParts {
                    plan,
                    pace,
                    break_after: profile.fault.break_stream_after,
                    permit: a.permit,
                    outcome,
                    keep,
                });
            }
            tokio::time::sleep_until(pace.done(plan.tokens)).await;
            let body = match keep {
                Some(keep) => keep.commit(&plan),
                None => plan.completion(),
            };
            Json(body).into_response()
        }
    };
    // The slot is free before the outcome is counted, so a client that sees `served` rise
    // never sees the request still in flight.
    drop(a.permit);
    outcome.settle(Some(Event::Served));
    response
}

/// The stored response a Responses create or compaction continues, if it names one.
fn earlier(
    server: &MockServer,
    fields: &serde_json::Map<String, Value>,
) -> Result<Option<Earlier>, ApiError> {
    let Some(id) = responses::previous_response_id(fields)? else {
        return Ok(None);
    };
    match server.responses().earlier(id) {
        Some(earlier) => Ok(Some(earlier)),
        None => Err(ApiError::previous_response_not_found(id)),
    }
}

/// The prompt tokens the prefix cache holds, at most all of them; the rest must be prefilled.
/// The lookup is counted; with the cache off there is none, and nothing is cached.
fn cached_tokens(
    server: &MockServer,
    g: &Generation,
    prompt: Option<&PromptBlocks>,
    profile: &spillway_config::MockProfile,
) -> u32 {
    let Some(prompt) = prompt else {
        return 0;
    };
    let capacity = profile.prefix_cache_entries as usize;
    let cached_chars = server.prefix_cache().lookup_and_insert(prompt, capacity);
    let hit = u32::try_from(cached_chars / CHARS_PER_TOKEN)
        .unwrap_or(u32::MAX)
        .min(g.prompt_tokens);
    server.recorder().prefix_lookup(g.prompt_tokens, hit);
    hit
}

fn event_stream(parts: StreamParts) -> Response {
    let mut response = Response::new(stream::body(parts));
    let h = response.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// The body as JSON: `null` when it could not be read or is not JSON, with the parse error then.
pub(crate) fn parse_json(
    read: &Result<bytes::Bytes, ApiError>,
) -> (Arc<Value>, Option<serde_json::Error>) {
    match read.as_ref().map(|b| serde_json::from_slice::<Value>(b)) {
        Ok(Ok(v)) => (Arc::new(v), None),
        Ok(Err(e)) => (Arc::new(Value::Null), Some(e)),
        Err(_) => (Arc::new(Value::Null), None),
    }
}

/// The body's fields, or the 400 for a body that is not a JSON object.
pub(crate) fn json_object(
    body: &Value,
    json_error: Option<serde_json::Error>,
) -> Result<&Map<String, Value>, ApiError> {
    body.as_object().ok_or_else(|| {
        let message = match json_error {
            Some(e) => format!("the request body is not valid JSON: {e}"),
            None => "the request body must be a JSON object".to_owned(),
        };
        ApiError::invalid("invalid_json", message)
    })
}

/// The body, at most [`MAX_BODY_BYTES`] of it (413 beyond).
pub(crate) async fn read_body(headers: &HeaderMap, body: Body) -> Result<bytes::Bytes, ApiError> {
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(ApiError::too_large(MAX_BODY_BYTES));
    }
    match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            Err(ApiError::too_large(MAX_BODY_BYTES))
        }
        Err(e) => Err(ApiError::invalid(
            "invalid_body",
            format!("could not read the request body: {e}"),
        )),
    }
}

/// What `/stats` shows of a request: its path, query, model, some headers and its body.
pub(crate) fn remembered(parts: &Parts, model: Option<String>, body: Arc<Value>) -> Remembered {
    let h = &parts.headers;
    let auth = if h.contains_key(AUTHORIZATION) {
        "bearer"
    } else if h.contains_key("api-key") {
        "api-key"
    } else if h.contains_key("x-api-key") {
        "x-api-key"
    } else {
        "none"
    };
    Remembered {
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().map(str::to_owned),
        model,
        request_id: h
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        host: header_text(h, "host"),
        auth,
        anthropic_version: header_text(h, "anthropic-version"),
        anthropic_beta: header_text(h, "anthropic-beta"),
        headers: h.clone(),
        body,
    }
}

/// Every value of header `name` that is text, joined with commas; `None` without any.
fn header_text(headers: &HeaderMap, name: &str) -> Option<String> {
    let values: Vec<&str> = headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    (!values.is_empty()).then(|| values.join(","))
}

fn has_api_version(query: Option<&str>) -> bool {
    query.into_iter().flat_map(|q| q.split('&')).any(|pair| {
        pair.strip_prefix("api-version=")
            .is_some_and(|v| !v.is_empty())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_version_must_be_present_and_non_empty() {
        assert!(has_api_version(Some("api-version=2024-10-21")));
        assert!(has_api_version(Some("x=1&api-version=2024-10-21")));
        assert!(!has_api_version(Some("api-version=")));
        assert!(!has_api_version(Some("apiversion=1")));
        assert!(!has_api_version(None));
    }

    #[tokio::test]
    async fn declared_oversize_body_is_refused_before_reading() {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_LENGTH, HeaderValue::from(MAX_BODY_BYTES + 1));
        let e = read_body(&headers, Body::empty()).await.unwrap_err();
        assert_eq!(e.into_response().status(), 413);
        headers.insert(CONTENT_LENGTH, HeaderValue::from(2));
        let ok = read_body(&headers, Body::from("{}")).await.unwrap();
        assert_eq!(&ok[..], b"{}");
    }

    #[test]
    fn any_of_the_three_headers_may_carry_the_required_key() {
        let live = Live {
            profile: Default::default(),
            required_key: Some("k1".to_owned()),
        };
        let headers = |pairs: &[(&'static str, &str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, v.parse().unwrap());
            }
            h
        };
        assert!(authorize(&live, &headers(&[("authorization", "Bearer k1")])).is_ok());
        assert!(authorize(&live, &headers(&[("authorization", "bearer  k1")])).is_ok());
        assert!(authorize(&live, &headers(&[("api-key", "k1")])).is_ok());
        assert!(authorize(&live, &headers(&[("api-key", "k2")])).is_err());
        assert!(authorize(&live, &headers(&[("x-api-key", "k1")])).is_ok());
        assert!(authorize(&live, &headers(&[("x-api-key", "k2")])).is_err());
        // A wrong key in one header does not hide the right one in another.
        assert!(authorize(&live, &headers(&[("api-key", "no"), ("x-api-key", "k1")])).is_ok());
        assert!(authorize(&live, &headers(&[("authorization", "k1")])).is_err());
        assert!(authorize(&live, &headers(&[])).is_err());
    }
}
