//! `/v1/embeddings`: deterministic unit vectors derived from a hash of each input.
//!
//! Equal inputs give equal vectors across requests and processes, so a test can check that a
//! gateway forwarded the input it was given. The official SDKs ask for `encoding_format:
//! "base64"` by default (little-endian f32 bytes) and decode it themselves, so both encodings are
//! served; the encoder is a dozen lines and not worth a dependency.

use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::request::tokens_for_chars;

/// A checked embeddings request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Embedding {
    /// One hash per input, in order.
    seeds: Vec<u64>,
    dimensions: u32,
    base64: bool,
    prompt_tokens: u32,
}

impl Embedding {
    /// Reads `input`, `encoding_format` and `dimensions`; `max_dim` is the profile's vector length.
    pub(crate) fn parse(body: &Map<String, Value>, max_dim: u32) -> Result<Self, ApiError> {
        let shape = || {
            ApiError::invalid_param(
                "input",
                "`input` must be a non-empty string, array of strings, array of token ids, or array of token arrays",
            )
        };
        let mut seeds = Vec::new();
        let mut prompt_tokens = 0u32;
        let mut add = |seed: u64, tokens: u32| {
            seeds.push(seed);
            prompt_tokens = prompt_tokens.saturating_add(tokens);
        };
        match body.get("input") {
            Some(Value::String(s)) => add(fnv1a(s.as_bytes()), tokens_for_chars(s.chars().count())),
            Some(Value::Array(items)) if !items.is_empty() && items.iter().all(Value::is_u64) => {
                add(token_seed(items), len_u32(items.len()));
            }
            Some(Value::Array(items)) if !items.is_empty() => {
                for item in items {
                    match item {
                        Value::String(s) => {
                            add(fnv1a(s.as_bytes()), tokens_for_chars(s.chars().count()))
                        }
                        Value::Array(ids) if !ids.is_empty() && ids.iter().all(Value::is_u64) => {
                            add(token_seed(ids), len_u32(ids.len()));
                        }
                        _ => return Err(shape()),
                    }
                }
            }
            _ => return Err(shape()),
        }
        let base64 = match body.get("encoding_format") {
            None | Some(Value::Null) => false,
            Some(Value::String(f)) if f == "float" => false,
            Some(Value::String(f)) if f == "base64" => true,
            Some(_) => {
                return Err(ApiError::invalid_param(
                    "encoding_format",
                    "`encoding_format` must be \"float\" or \"base64\"",
                ))
            }
        };
        let dimensions = match body.get("dimensions") {
            None | Some(Value::Null) => max_dim,
            Some(v) => v
                .as_u64()
                .filter(|d| (1..=u64::from(max_dim)).contains(d))
                .and_then(|d| u32::try_from(d).ok())
                .ok_or_else(|| {
                    ApiError::invalid_param(
                        "dimensions",
                        format!("`dimensions` must be between 1 and {max_dim}"),
                    )
                })?,
        };
        Ok(Self {
            seeds,
            dimensions,
            base64,
            prompt_tokens,
        })
    }

    pub(crate) fn prompt_tokens(&self) -> u32 {
        self.prompt_tokens
    }

    /// The OpenAI `list` of `embedding` objects.
    pub(crate) fn response(&self, model: &str) -> Value {
        let data: Vec<Value> = self
            .seeds
            .iter()
            .enumerate()
            .map(|(index, &seed)| {
                let v = vector(seed, self.dimensions);
                let embedding = if self.base64 {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    Value::String(base64(&bytes))
                } else {
                    json!(v)
                };
                json!({"object": "embedding", "index": index, "embedding": embedding})
            })
            .collect();
        json!({
            "object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": self.prompt_tokens, "total_tokens": self.prompt_tokens},
        })
    }
}

/// A unit vector of `dim` components drawn from `seed` with splitmix64.
fn vector(seed: u64, dim: u32) -> Vec<f32> {
    let mut state = seed;
    let raw: Vec<f64> = (0..dim)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            // The top 53 bits as a float in [-1, 1).
            (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        })
        .collect();
    let norm = raw.iter().map(|x| x * x).sum::<f64>().sqrt();
    let scale = if norm > 0.0 { 1.0 / norm } else { 0.0 };
    raw.iter().map(|x| (x * scale) as f32).collect()
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Token arrays hash their ids' little-endian bytes, after a tag so `[104, 105]` and `"hi"` differ.
fn token_seed(ids: &[Value]) -> u64 {
    let bytes: Vec<u8> = std::iter::once(0xffu8)
        .chain(
            ids.iter()
                .filter_map(Value::as_u64)
                .flat_map(u64::to_le_bytes),
        )
        .collect();
    fnv1a(&bytes)
}

/// Standard base64 (RFC 4648 section 4) with padding.
pub(crate) fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for group in bytes.chunks(3) {
        let n = group
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= group.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn len_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value, dim: u32) -> Result<Embedding, ApiError> {
        Embedding::parse(v.as_object().unwrap(), dim)
    }

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
        assert_eq!(base64(&[0xff, 0xfe, 0xfd]), "//79");
    }

    #[test]
    fn vectors_are_deterministic_unit_length() {
        let a = vector(fnv1a(b"hello"), 64);
        assert_eq!(a, vector(fnv1a(b"hello"), 64));
        assert_ne!(a, vector(fnv1a(b"hellp"), 64));
        let norm: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "{norm}");
        assert!(vector(1, 0).is_empty());
    }

    #[test]
    fn every_input_shape_gives_one_vector_each() {
        let count = |input: Value| parse(json!({"input": input}), 8).unwrap().seeds.len();
        assert_eq!(count(json!("a")), 1);
        assert_eq!(count(json!(["a", "b", "c"])), 3);
        assert_eq!(count(json!([1, 2, 3])), 1);
        assert_eq!(count(json!([[1, 2], [3]])), 2);
        for bad in [
            json!([]),
            json!([[]]),
            json!(null),
            json!([1, "a"]),
            json!({"a": 1}),
        ] {
            assert!(parse(json!({"input": bad}), 8).is_err(), "{bad}");
        }
    }

    #[test]
    fn encodings_and_dimensions() {
        let e = parse(
            json!({"input": "x", "encoding_format": "base64", "dimensions": 4}),
            8,
        )
        .unwrap();
        let v = e.response("m");
        let b64 = v["data"][0]["embedding"].as_str().unwrap();
        assert_eq!(b64.len(), 24); // 16 bytes -> 24 base64 characters
        let f = parse(json!({"input": "x", "dimensions": 4}), 8)
            .unwrap()
            .response("m");
        assert_eq!(f["data"][0]["embedding"].as_array().unwrap().len(), 4);
        assert!(parse(json!({"input": "x", "dimensions": 9}), 8).is_err());
        assert!(parse(json!({"input": "x", "encoding_format": "hex"}), 8).is_err());
    }
}
