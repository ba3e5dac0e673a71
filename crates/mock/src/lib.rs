//! spillway-mock: a simulated OpenAI- and Anthropic-compatible inference server.
//!
//! A gateway is only as trustworthy as the failures it has been tested against, and real backends
//! fail rarely and never on demand. This server answers chat, completions, embeddings and models
//! like vLLM or OpenAI (also under Azure deployment paths; chat completions stored with
//! `store: true` are listed, retrieved, updated, deleted and their messages listed), OpenAI's
//! Responses API (with the responses it stores: retrieve, delete, cancel, input items,
//! `previous_response_id`, and compaction), and Anthropic's Messages API (with `count_tokens`) in Anthropic's shapes and
//! errors, and a [`MockProfile`] makes it slow, saturated or broken on purpose: limited generation
//! slots and a bounded queue, time to first token and tokens per second, injected error statuses,
//! stalls, connection resets, streams broken off mid-way, and a 400 for every request using a
//! field the simulated engine does not support. The profile can be swapped while it
//! runs (`PUT`/`PATCH /control`), and `/stats` reports what it saw and did, so a test or an
//! incident replay can flip a healthy backend into a failure mode and then check what reached it.
//!
//! It also gives the load signals a gateway reads from a real vLLM, from its own state: `GET
//! /metrics` in vLLM's Prometheus names (requests running and waiting, KV-cache usage, prefix
//! cache queries and hits), and a prefix cache that makes a prompt sharing its start with one
//! served recently prefill faster, on this server only.
//!
//! It serves three callers: `spillway mock-backend` ([`MockArgs`], [`run`]), the gateway's
//! in-process mock backends ([`MockServer::serve`]) and tests ([`spawn`]).
//!
//! Architecture Invariant: this crate knows nothing about the gateway; it depends only on the
//! profile type in `spillway-config`.

// Tests may time real processes and sockets on the system clock (see clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

mod api;
mod chats;
mod cli;
mod compact;
mod control;
mod embeddings;
mod error;
mod faults;
mod generate;
mod lifecycle;
mod messages;
mod metrics;
mod page;
mod plan;
mod prefix;
mod prompt;
mod request;
mod responses;
mod routes;
mod server;
mod slots;
mod stats;
mod store;
mod stream;

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, PoisonError, RwLock};

pub use cli::{run, MockArgs};
pub use spillway_config::{MockFault, MockProfile};
pub use stats::{LastRequest, MockStats};

use chats::ChatStore;
use prefix::PrefixCache;
use slots::Slots;
use stats::Recorder;
use store::ResponseStore;

/// A simulated inference server. Cheap to clone; clones share the profile and the counters.
#[derive(Clone)]
pub struct MockServer {
    shared: Arc<Shared>,
}

struct Shared {
    live: RwLock<Arc<Live>>,
    slots: Arc<Slots>,
    stats: Arc<Recorder>,
    prefix: PrefixCache,
    responses: Arc<ResponseStore>,
    chats: Arc<ChatStore>,
}

/// The settings requests read when they arrive; replaced whole, never edited in place, so a
/// request sees one consistent profile.
pub(crate) struct Live {
    pub(crate) profile: MockProfile,
    /// The key clients must present, if any.
    pub(crate) required_key: Option<String>,
}

impl MockServer {
    /// A server with this profile. The profile is used as given; check it with
    /// [`MockProfile::problems`] first (a capacity of 0, for one, queues every request forever).
    pub fn new(profile: MockProfile) -> MockServer {
        let slots = Slots::new(profile.capacity, profile.queue);
        MockServer {
            shared: Arc::new(Shared {
                live: RwLock::new(Arc::new(Live {
                    profile,
                    required_key: None,
                })),
                slots: Arc::new(slots),
                stats: Arc::new(Recorder::default()),
                prefix: PrefixCache::default(),
                responses: Arc::new(ResponseStore::default()),
                chats: Arc::new(ChatStore::default()),
            }),
        }
    }

    /// Requires inference, stored-state and model requests to carry `Authorization: Bearer
    /// KEY`, `api-key: KEY` or `x-api-key: KEY`, as a real upstream does; others get 401.
    /// `None` accepts any request.
    /// Like the profile, the key is shared by every clone of this server.
    pub fn with_required_key(self, key: Option<String>) -> MockServer {
        self.replace_live(|live| Live {
            profile: live.profile.clone(),
            required_key: key,
        });
        self
    }

    /// Serves on `listener` until `shutdown` resolves; in-flight requests are dropped then.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        server::serve(self, listener, shutdown).await
    }

    /// What the server has seen and done so far.
    pub fn stats(&self) -> MockStats {
        let (in_flight, queued) = self.shared.slots.occupancy();
        self.shared.stats.snapshot(in_flight, queued)
    }

    /// Zeroes the counters and forgets the last request.
    pub fn reset_stats(&self) {
        self.shared.stats.reset();
    }

    pub fn profile(&self) -> MockProfile {
        self.live().profile.clone()
    }

    /// Replaces the profile for requests that arrive from now on; requests already generating
    /// finish under the old one. Like [`MockServer::new`], it does not validate.
    pub fn set_profile(&self, profile: MockProfile) {
        let Ok(_) = self.try_update_profile(|_| Ok::<_, std::convert::Infallible>(profile));
    }

    /// Replaces the profile with `next(current)` if that succeeds, atomically with respect to
    /// other changes, so two concurrent `PATCH /control` calls cannot lose one another's edit.
    /// Turning the prefix cache off, or changing its block length, forgets what it held.
    pub(crate) fn try_update_profile<E>(
        &self,
        next: impl FnOnce(&MockProfile) -> Result<MockProfile, E>,
    ) -> Result<MockProfile, E> {
        let profile = {
            let mut live = self
                .shared
                .live
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            let profile = next(&live.profile)?;
            if profile.prefix_cache_entries == 0
                || profile.prefix_chars != live.profile.prefix_chars
            {
                self.shared.prefix.clear();
            }
            *live = Arc::new(Live {
                profile: profile.clone(),
                required_key: live.required_key.clone(),
            });
            profile
        };
        self.shared.slots.resize(profile.capacity, profile.queue);
        Ok(profile)
    }

    pub(crate) fn live(&self) -> Arc<Live> {
        let live = self
            .shared
            .live
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        Arc::clone(&live)
    }

    pub(crate) fn slots(&self) -> &Arc<Slots> {
        &self.shared.slots
    }

    pub(crate) fn recorder(&self) -> &Arc<Recorder> {
        &self.shared.stats
    }

    pub(crate) fn prefix_cache(&self) -> &PrefixCache {
        &self.shared.prefix
    }

    /// The Responses API's stored responses, shared by every clone.
    pub(crate) fn responses(&self) -> &Arc<ResponseStore> {
        &self.shared.responses
    }

    /// The stored chat completions, shared by every clone.
    pub(crate) fn chats(&self) -> &Arc<ChatStore> {
        &self.shared.chats
    }

    fn replace_live(&self, next: impl FnOnce(&Live) -> Live) {
        let mut live = self
            .shared
            .live
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        *live = Arc::new(next(&live));
    }
}

impl fmt::Debug for MockServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let live = self.live();
        f.debug_struct("MockServer")
            .field("profile", &live.profile)
            .field("requires_key", &live.required_key.is_some())
            .finish()
    }
}

/// Binds `addr` (e.g. `127.0.0.1:0`), serves `profile` on a task of the current runtime, and
/// returns the bound address with a handle for stats and profile changes. The server runs until
/// the runtime shuts down.
pub async fn spawn(
    profile: MockProfile,
    addr: SocketAddr,
) -> std::io::Result<(SocketAddr, MockServer)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let server = MockServer::new(profile);
    let serving = server.clone();
    tokio::spawn(async move {
        if let Err(e) = serving.serve(listener, std::future::pending()).await {
            tracing::warn!("mock backend on {bound} stopped: {e}");
        }
    });
    Ok((bound, server))
}
