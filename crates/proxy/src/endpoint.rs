//! The inference endpoints the gateway routes, the API surface each belongs to, and the dialect
//! its caller speaks.
//!
//! Three surfaces are OpenAI's classic endpoints; `/v1/responses` is the OpenAI Responses API and
//! `/v1/messages` (with `/v1/messages/count_tokens`) the Anthropic Messages API. All of them pass
//! through unchanged to backends that serve them, under the same protections; what differs is
//! only what the caller can see of the gateway itself: its error bodies and stream error events
//! are in the caller's dialect ([`Dialect`]).

pub use spillway_config::Surface;

/// An endpoint the gateway routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    ChatCompletions,
    Completions,
    Embeddings,
    Responses,
    /// `POST /v1/responses/compact`.
    ResponsesCompact,
    Messages,
    CountTokens,
}

/// How a caller expects the gateway's own answers (errors, stream error events) to look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dialect {
    /// `{"error": {"message", "type", "param", "code"}}`: chat, completions, embeddings and the
    /// Responses API.
    #[default]
    OpenAi,
    /// `{"type": "error", "error": {"type", "message"}}`: the Messages API.
    Anthropic,
}

impl Endpoint {
    pub const ALL: [Endpoint; 7] = [
        Endpoint::ChatCompletions,
        Endpoint::Completions,
        Endpoint::Embeddings,
        Endpoint::Responses,
        Endpoint::ResponsesCompact,
        Endpoint::Messages,
        Endpoint::CountTokens,
    ];

    /// The endpoint a `POST` to `path` (as the caller sent it, `/v1/...`) is, if any.
    pub fn of_inference_path(path: &str) -> Option<Endpoint> {
        let path = path.strip_prefix("/v1")?;
        Endpoint::ALL.into_iter().find(|e| e.path() == path)
    }

    /// Its path after a backend's base URL (which ends in `/v1` for OpenAI-compatible servers).
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "/chat/completions",
            Endpoint::Completions => "/completions",
            Endpoint::Embeddings => "/embeddings",
            Endpoint::Responses => "/responses",
            Endpoint::ResponsesCompact => "/responses/compact",
            Endpoint::Messages => "/messages",
            Endpoint::CountTokens => "/messages/count_tokens",
        }
    }

    /// The surface a backend must serve to be sent this endpoint's requests.
    pub fn surface(self) -> Surface {
        match self {
            Endpoint::ChatCompletions => Surface::Chat,
            Endpoint::Completions => Surface::Completions,
            Endpoint::Embeddings => Surface::Embeddings,
            Endpoint::Responses | Endpoint::ResponsesCompact => Surface::Responses,
            Endpoint::Messages | Endpoint::CountTokens => Surface::Messages,
        }
    }

    /// Whether a request may continue a stored response (`previous_response_id`), whose home
    /// backend it then goes to.
    pub fn continues_responses(self) -> bool {
        matches!(self, Endpoint::Responses | Endpoint::ResponsesCompact)
    }

    pub fn dialect(self) -> Dialect {
        match self.surface() {
            Surface::Messages => Dialect::Anthropic,
            _ => Dialect::OpenAi,
        }
    }

    /// Whether its answer generates tokens (and so reserves output tokens at admission).
    pub fn generates(self) -> bool {
        !matches!(self, Endpoint::Embeddings | Endpoint::CountTokens)
    }

    /// Its index in [`Endpoint::ALL`].
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl Dialect {
    /// The dialect of a request for `path` that reached no endpoint (an unknown route or
    /// method): the Messages API's paths get its shape, everything else OpenAI's.
    pub fn of_path(path: &str) -> Dialect {
        if path == "/v1/messages" || path.starts_with("/v1/messages/") {
            Dialect::Anthropic
        } else {
            Dialect::OpenAi
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Endpoint;

    #[test]
    fn each_inference_path_is_its_endpoint_and_nothing_else_is() {
        for e in Endpoint::ALL {
            assert_eq!(
                Endpoint::of_inference_path(&format!("/v1{}", e.path())),
                Some(e)
            );
        }
        for other in [
            "/chat/completions",
            "/v1/chat/completions/",
            "/v1/chat/completions/abc",
            "/v1/responses/resp_1/cancel",
            "/v2/messages",
            "/v1",
            "",
        ] {
            assert_eq!(Endpoint::of_inference_path(other), None, "{other}");
        }
    }
}
