//! The `x-ratelimit-*` headers, as OpenAI and Azure OpenAI send them, so that clients written
//! for those APIs (and their SDKs) pace themselves against spillway's limits unchanged.
//!
//! `x-ratelimit-limit-requests` / `-tokens`: the limit per minute; `x-ratelimit-remaining-*`:
//! what could be taken now; `x-ratelimit-reset-*`: how long until the bucket is full again, in
//! OpenAI's duration format (`20ms`, `1.5s`, `6m0s`). A dimension the tenant has no limit on is
//! left out.

use std::time::Duration;

use http::{HeaderName, HeaderValue};
use spillway_policy::{Quota, RateHeaders};

use crate::lines::Lines;

/// A dimension's names: limit, remaining, reset.
const NAMES: usize = 3;

/// The names, per dimension.
const REQUESTS: [HeaderName; NAMES] = [
    HeaderName::from_static("x-ratelimit-limit-requests"),
    HeaderName::from_static("x-ratelimit-remaining-requests"),
    HeaderName::from_static("x-ratelimit-reset-requests"),
];
const TOKENS: [HeaderName; NAMES] = [
    HeaderName::from_static("x-ratelimit-limit-tokens"),
    HeaderName::from_static("x-ratelimit-remaining-tokens"),
    HeaderName::from_static("x-ratelimit-reset-tokens"),
];

/// The most lines [`insert_rate_headers`] sets: each of the two dimensions' names.
pub(crate) const RATE_HEADERS: usize = 2 * NAMES;

/// Sets the headers of every limited dimension in `lines` (a relayed answer's, or a refusal's).
/// A dimension without a limit costs a test: its names are made only for a header written (an
/// array of both dimensions' names, built to be looped over, was six names made and dropped on
/// every answer).
pub(crate) fn insert_rate_headers(lines: &mut Lines, quotas: &RateHeaders) {
    if let Some(q) = quotas.requests {
        dimension(lines, REQUESTS, q);
    }
    if let Some(q) = quotas.tokens {
        dimension(lines, TOKENS, q);
    }
}

fn dimension(lines: &mut Lines, [limit, remaining, reset]: [HeaderName; NAMES], q: Quota) {
    lines.insert(limit, HeaderValue::from(q.limit));
    lines.insert(remaining, HeaderValue::from(q.remaining));
    if let Ok(value) = HeaderValue::try_from(duration_text(q.reset)) {
        lines.insert(reset, value);
    }
}

/// OpenAI's format: `0s`, `20ms` under a second, `1.5s` under a minute, `6m0s` above.
pub(crate) fn duration_text(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".to_owned();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = d.as_secs_f64();
    if secs < 60.0 {
        return trimmed(secs);
    }
    let minutes = d.as_secs() / 60;
    let rest = secs - (minutes * 60) as f64;
    format!("{minutes}m{}", trimmed(rest))
}

/// Seconds with at most three decimals and no trailing zeros: `1.5s`, `2s`.
fn trimmed(secs: f64) -> String {
    let text = format!("{secs:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text}s")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_openai_s() {
        let ms = Duration::from_millis;
        assert_eq!(duration_text(ms(0)), "0s");
        assert_eq!(duration_text(ms(20)), "20ms");
        assert_eq!(duration_text(ms(1500)), "1.5s");
        assert_eq!(duration_text(ms(2000)), "2s");
        assert_eq!(duration_text(ms(360_000)), "6m0s");
        assert_eq!(duration_text(ms(72_500)), "1m12.5s");
    }

    #[test]
    fn only_limited_dimensions_get_headers() {
        let mut h = Lines::default();
        let get = |h: &Lines, name: &'static str| {
            h.get(&HeaderName::from_static(name))
                .map(|v| String::from_utf8(v.to_vec()).unwrap())
        };
        let quota = Quota {
            limit: 60,
            remaining: 59,
            reset: Duration::from_secs(1),
        };
        insert_rate_headers(
            &mut h,
            &RateHeaders {
                requests: Some(quota),
                tokens: None,
            },
        );
        assert_eq!(get(&h, "x-ratelimit-limit-requests").unwrap(), "60");
        assert_eq!(get(&h, "x-ratelimit-remaining-requests").unwrap(), "59");
        assert_eq!(get(&h, "x-ratelimit-reset-requests").unwrap(), "1s");
        assert_eq!(get(&h, "x-ratelimit-limit-tokens"), None);
        let both = RateHeaders {
            requests: Some(quota),
            tokens: Some(Quota {
                limit: 90_000,
                remaining: 0,
                reset: Duration::from_millis(1500),
            }),
        };
        insert_rate_headers(&mut h, &both);
        assert_eq!(get(&h, "x-ratelimit-limit-tokens").unwrap(), "90000");
        assert_eq!(get(&h, "x-ratelimit-remaining-tokens").unwrap(), "0");
        assert_eq!(get(&h, "x-ratelimit-reset-tokens").unwrap(), "1.5s");
        // Set again, the first dimension's headers are replaced, not repeated: three of each.
        assert_eq!(h.len(), 6);
        assert!(
            h.len() <= RATE_HEADERS,
            "a refusal makes room for every line it sets"
        );
    }
}
