//! Where a backend's requests go: the upstream URL of each endpoint (Azure OpenAI's per
//! deployment, with its API version), its stored chat completions, its health check, and the
//! origin form a request line names.

use http::Uri;
use spillway_config::BackendKind;

use crate::endpoint::Endpoint;

pub(super) fn join(base: &Uri, path: &str) -> Result<Uri, String> {
    let text = format!("{}{path}", base.to_string().trim_end_matches('/'));
    text.parse()
        .map_err(|e| format!("cannot build health check URL {text:?}: {e}"))
}

pub(super) fn upstream_uri(
    kind: &BackendKind,
    base: &Uri,
    endpoint: Endpoint,
) -> Result<Uri, String> {
    let root = base.to_string();
    let root = root.trim_end_matches('/');
    let text = match kind {
        BackendKind::Azure {
            api_version,
            deployment,
            ..
        } => format!(
            "{root}/openai/deployments/{deployment}{}?api-version={api_version}",
            endpoint.path()
        ),
        BackendKind::OpenAi { .. } | BackendKind::Mock(_) => format!("{root}{}", endpoint.path()),
    };
    text.parse()
        .map_err(|e| format!("cannot build upstream URL {text:?}: {e}"))
}

/// Where a backend's stored chat completions are: beside its chat completions, but for Azure
/// OpenAI, which keeps them per resource (`/openai/chat/completions`), not per deployment.
pub(super) fn stored_chat_uri(kind: &BackendKind, base: &Uri) -> Result<Uri, String> {
    match kind {
        BackendKind::Azure { api_version, .. } => {
            let root = base.to_string();
            let text = format!(
                "{}/openai/chat/completions?api-version={api_version}",
                root.trim_end_matches('/')
            );
            text.parse()
                .map_err(|e| format!("cannot build upstream URL {text:?}: {e}"))
        }
        _ => upstream_uri(kind, base, Endpoint::ChatCompletions),
    }
}

/// `uri`'s path and query alone (origin form, RFC 9112 section 3.2.1), as an HTTP/1 request line
/// names its target; `/` when it has none.
pub(crate) fn origin_form(uri: &Uri) -> Uri {
    match uri.path_and_query() {
        Some(pq) => Uri::from(pq.clone()),
        None => Uri::from_static("/"),
    }
}
