//! The API surfaces a backend serves: which of the gateway's inference endpoints may be routed
//! to it.
//!
//! OpenAI-compatible engines differ in what they serve beyond chat completions: vLLM and
//! llama.cpp's server also answer the OpenAI Responses API and the Anthropic Messages API,
//! OpenAI's own service answers Responses but not Messages, Azure OpenAI deployments answer the
//! three classic endpoints. Each backend declares its surfaces (`surfaces = [...]`), with a
//! default per kind, and a request is only ever sent to a backend that serves its surface.

use std::fmt;

/// One API surface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Surface {
    /// `POST /v1/chat/completions`.
    #[default]
    Chat,
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/embeddings`.
    Embeddings,
    /// `POST /v1/responses` (the OpenAI Responses API).
    Responses,
    /// `POST /v1/messages` and `POST /v1/messages/count_tokens` (the Anthropic Messages API).
    Messages,
    /// Stored chat completions (`store: true`): `GET /v1/chat/completions` and its `{id}` routes,
    /// as OpenAI's and Azure OpenAI's APIs serve them. Declared, never assumed: inference
    /// engines do not keep completions.
    StoredChat,
}

impl Surface {
    pub const ALL: [Surface; 6] = [
        Surface::Chat,
        Surface::Completions,
        Surface::Embeddings,
        Surface::Responses,
        Surface::Messages,
        Surface::StoredChat,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Surface::Chat => "chat",
            Surface::Completions => "completions",
            Surface::Embeddings => "embeddings",
            Surface::Responses => "responses",
            Surface::Messages => "messages",
            Surface::StoredChat => "stored_chat",
        }
    }

    pub fn parse(text: &str) -> Option<Surface> {
        Surface::ALL.into_iter().find(|s| s.as_str() == text)
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

impl fmt::Display for Surface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of surfaces.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Surfaces(u8);

impl Surfaces {
    pub const NONE: Surfaces = Surfaces(0);

    /// Every surface.
    pub fn all() -> Surfaces {
        Surface::ALL.into_iter().collect()
    }

    /// What a backend of `kind` (`openai`, `azure` or `mock`) serves when it does not say: an
    /// OpenAI-compatible engine (vLLM, SGLang, llama.cpp) every inference surface, an Azure
    /// deployment the classic three, the mock everything.
    pub fn default_for(kind: &str) -> Surfaces {
        match kind {
            "azure" => [Surface::Chat, Surface::Completions, Surface::Embeddings]
                .into_iter()
                .collect(),
            "mock" => Surfaces::all(),
            _ => Surface::ALL
                .into_iter()
                .filter(|s| *s != Surface::StoredChat)
                .collect(),
        }
    }

    pub fn contains(self, surface: Surface) -> bool {
        self.0 & surface.bit() != 0
    }

    pub fn with(self, surface: Surface) -> Surfaces {
        Surfaces(self.0 | surface.bit())
    }

    pub fn union(self, other: Surfaces) -> Surfaces {
        Surfaces(self.0 | other.0)
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn iter(self) -> impl Iterator<Item = Surface> {
        Surface::ALL.into_iter().filter(move |s| self.contains(*s))
    }
}

impl FromIterator<Surface> for Surfaces {
    fn from_iter<I: IntoIterator<Item = Surface>>(iter: I) -> Surfaces {
        iter.into_iter().fold(Surfaces::NONE, Surfaces::with)
    }
}

impl fmt::Debug for Surfaces {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sets_hold_what_was_put_in() {
        for s in Surface::ALL {
            assert_eq!(Surface::parse(s.as_str()), Some(s));
        }
        assert_eq!(Surface::parse("chat_completions"), None);
        let set: Surfaces = [Surface::Chat, Surface::Messages].into_iter().collect();
        assert!(set.contains(Surface::Chat) && set.contains(Surface::Messages));
        assert!(!set.contains(Surface::Responses));
        assert_eq!(set.iter().count(), 2);
        assert!(Surfaces::NONE.is_empty());
    }

    #[test]
    fn azure_serves_the_classic_endpoints_by_default_and_others_everything() {
        let azure = Surfaces::default_for("azure");
        assert!(azure.contains(Surface::Chat) && !azure.contains(Surface::Messages));
        assert!(!azure.contains(Surface::Responses));
        let openai = Surfaces::default_for("openai");
        assert!(openai.contains(Surface::Messages) && !openai.contains(Surface::StoredChat));
        assert_eq!(Surfaces::default_for("mock"), Surfaces::all());
    }
}
