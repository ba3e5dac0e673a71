//! Fallbacks to other models: which model a request goes to next when its own model cannot
//! answer it, and what counts as "cannot".
//!
//! A model lists its fallbacks in order, each with the failures it is for ([`Trigger`]). A
//! fallback is not a fresh request: it is one more attempt of the same request, drawn from the
//! same retry budget and counted against the same per-request attempt cap, so a chain of
//! fallbacks can never multiply load the way a gateway that starts each fallback with a fresh
//! retry allowance does. This module decides only *which* model is next; the attempt loop asks
//! the budget and the cap whether there may be a next at all.

/// Why a request's own model could not answer it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Trigger {
    /// No backend of the model could take the request: all full, or they answered with capacity
    /// statuses.
    Capacity,
    /// A backend said the prompt is longer than the model's context window.
    ContextWindow,
    /// Every backend of the model is ejected, unreachable or failing.
    Unavailable,
}

impl Trigger {
    pub const ALL: [Trigger; 3] = [
        Trigger::Capacity,
        Trigger::ContextWindow,
        Trigger::Unavailable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Capacity => "capacity",
            Trigger::ContextWindow => "context_window",
            Trigger::Unavailable => "unavailable",
        }
    }

    pub fn parse(text: &str) -> Option<Trigger> {
        Trigger::ALL.into_iter().find(|t| t.as_str() == text)
    }
}

/// One fallback of a model: the model to try, and the triggers it is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fallback<M> {
    pub model: M,
    pub on: Vec<Trigger>,
}

/// The index of the fallback a request goes to after `trigger`: the first in the list, past
/// those at or before `after` (the fallback it is on now, if any), that is for `trigger` and that
/// the caller may use. Only the request's own model's list is followed (a fallback's own
/// fallbacks are not), and the configuration refuses a list naming its model or a model twice,
/// so a request is on each model at most once. `None`: the request ends with the answer it has.
pub fn next<M>(
    fallbacks: &[Fallback<M>],
    trigger: Trigger,
    after: Option<usize>,
    mut usable: impl FnMut(&M) -> bool,
) -> Option<usize> {
    let start = after.map_or(0, |i| i + 1);
    (start..fallbacks.len()).find(|&i| {
        let f = &fallbacks[i];
        f.on.contains(&trigger) && usable(&f.model)
    })
}

/// Whether an upstream's 400 body says the prompt did not fit the model's context window, in the
/// words the engines and APIs use: OpenAI's and vLLM's `context_length_exceeded` and "maximum
/// context length", llama.cpp's `exceed_context_size_error`, SGLang's and TGI's "longer than the
/// model's context length" and "must have less than", the Anthropic API's "prompt is too long".
/// Only the first [`MAX_ERROR_BODY`] bytes are looked at.
pub fn is_context_window_error(body: &[u8]) -> bool {
    const MARKERS: [&[u8]; 6] = [
        b"context_length_exceeded",
        b"maximum context length",
        b"exceed_context_size",
        b"context length",
        b"prompt is too long",
        b"must have less than",
    ];
    let body = &body[..body.len().min(MAX_ERROR_BODY)];
    let lower = body.to_ascii_lowercase();
    MARKERS
        .iter()
        .any(|m| lower.windows(m.len()).any(|w| w == *m))
}

/// The most of an error body read to tell a context-window error.
pub const MAX_ERROR_BODY: usize = 16 * 1024;

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn f(model: &'static str, on: &[Trigger]) -> Fallback<&'static str> {
        Fallback {
            model,
            on: on.to_vec(),
        }
    }

    #[test]
    fn the_first_fallback_for_the_trigger_that_may_be_used_is_next() {
        use Trigger::*;
        let list = [
            f("small", &[Capacity, Unavailable]),
            f("long", &[ContextWindow]),
            f("other", &[Capacity]),
        ];
        assert_eq!(next(&list, Capacity, None, |_| true), Some(0));
        assert_eq!(next(&list, ContextWindow, None, |_| true), Some(1));
        assert_eq!(next(&list, Capacity, Some(0), |_| true), Some(2));
        assert_eq!(next(&list, Capacity, None, |m| *m != "small"), Some(2));
        assert_eq!(next(&list, Unavailable, Some(0), |_| true), None);
        assert_eq!(next::<&str>(&[], Capacity, None, |_| true), None);
    }

    #[test]
    fn context_window_errors_are_told_in_each_engines_words() {
        for body in [
            &br#"{"error":{"message":"This model's maximum context length is 8192 tokens","code":"context_length_exceeded"}}"#[..],
            br#"{"error":{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error"}}"#,
            br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#,
            br#"{"object":"error","message":"The prompt is longer than the model's context length","type":"BadRequestError"}"#,
        ] {
            assert!(is_context_window_error(body), "{}", String::from_utf8_lossy(body));
        }
        for body in [
            &br#"{"error":{"message":"temperature must be at most 2","code":"invalid_value"}}"#[..],
            b"",
            b"\xff\xfe not text",
        ] {
            assert!(!is_context_window_error(body));
        }
    }

    fn trigger() -> impl Strategy<Value = Trigger> {
        prop::sample::select(Trigger::ALL.to_vec())
    }

    proptest! {
        /// Following `next` from the model's own answer on, whatever the triggers and whatever
        /// the caller may use: every step moves forward in the list (so a request visits each
        /// fallback at most once and the chain ends within the list's length), lands on a
        /// fallback for that step's trigger, and never on one the caller may not use.
        #[test]
        fn a_chain_of_fallbacks_moves_forward_matches_its_trigger_and_respects_the_caller(
            list in prop::collection::vec(
                (0u8..6, prop::collection::vec(trigger(), 0..3)), 0..8),
            triggers in prop::collection::vec(trigger(), 0..20),
            denied in prop::collection::vec(0u8..6, 0..3),
        ) {
            let list: Vec<Fallback<u8>> =
                list.into_iter().map(|(model, on)| Fallback { model, on }).collect();
            let mut at: Option<usize> = None;
            let mut steps = 0;
            for t in triggers {
                let Some(i) = next(&list, t, at, |m| !denied.contains(m)) else { break };
                prop_assert!(at.is_none_or(|a| i > a));
                prop_assert!(list[i].on.contains(&t));
                prop_assert!(!denied.contains(&list[i].model));
                at = Some(i);
                steps += 1;
            }
            prop_assert!(steps <= list.len());
        }
    }
}
