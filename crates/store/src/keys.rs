//! How an API key is made and named: its secret, public id, display prefix and digest.
//!
//! This is the only place that sees a secret. A secret is 43 base62 characters (~256 bits) after
//! a fixed, greppable prefix, so a leaked key is recognisable by secret scanners and cannot be
//! guessed. The store keeps the SHA-256 of the secret (a fast hash is enough: the secret has full
//! entropy, so there is nothing to brute-force) and a short display prefix. The random source is
//! an argument, so tests can use a seeded one; the store passes rand's OS-seeded CSPRNG.

use rand::distr::Alphanumeric;
use rand::{CryptoRng, Rng};
use sha2::{Digest, Sha256};

use crate::KeyDigest;

/// The start of every secret this store issues.
pub const SECRET_PREFIX: &str = "sk-spw-";

/// Random characters after [`SECRET_PREFIX`]: 43 × log2(62) ≈ 256 bits.
const SECRET_RANDOM_CHARS: usize = 43;

/// Characters of the secret kept for display: the fixed prefix and 4 random ones (~24 bits,
/// useless to an attacker, enough for an operator to tell keys apart).
const DISPLAY_PREFIX_CHARS: usize = SECRET_PREFIX.len() + 4;

/// Display prefix of keys registered by digest from the config file, whose secret is unknown.
pub(crate) const CONFIG_KEY_PREFIX: &str = "(config)";

/// The SHA-256 digest of a key's secret: what the store indexes keys by.
pub fn digest_secret(secret: &str) -> KeyDigest {
    Sha256::digest(secret.as_bytes()).into()
}

/// A freshly generated key, before it is stored.
pub(crate) struct NewKey {
    pub secret: String,
    pub id: String,
    pub prefix: String,
    pub digest: KeyDigest,
}

impl NewKey {
    pub fn generate<R: Rng + CryptoRng + ?Sized>(rng: &mut R) -> NewKey {
        let mut secret = String::with_capacity(SECRET_PREFIX.len() + SECRET_RANDOM_CHARS);
        secret.push_str(SECRET_PREFIX);
        for _ in 0..SECRET_RANDOM_CHARS {
            secret.push(char::from(rng.sample(Alphanumeric)));
        }
        let id_bytes: [u8; 8] = rng.random();
        NewKey {
            id: format!("key_{}", hex::encode(id_bytes)),
            prefix: secret[..DISPLAY_PREFIX_CHARS].to_owned(),
            digest: digest_secret(&secret),
            secret,
        }
    }
}

/// The id of a key registered by digest: derived from the digest, so registering the same key
/// twice (every start of a gateway with that config) names it the same way.
pub(crate) fn config_key_id(digest: &KeyDigest) -> String {
    format!("key_{}", hex::encode(&digest[..8]))
}

/// A digest shortened for log lines: enough to correlate, never the whole value.
pub(crate) fn short_digest(digest: &KeyDigest) -> String {
    hex::encode(&digest[..4])
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn generated_key_has_documented_shape() {
        let mut rng = StdRng::seed_from_u64(7);
        let key = NewKey::generate(&mut rng);
        assert_eq!(key.secret.len(), 7 + 43);
        assert!(key.secret.starts_with(SECRET_PREFIX));
        assert!(key.secret[7..].chars().all(|c| c.is_ascii_alphanumeric()));
        assert_eq!(key.prefix, key.secret[..11]);
        assert_eq!(key.id.len(), 4 + 16);
        assert!(key.id.starts_with("key_"));
        assert!(key.id[4..].chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(key.digest, digest_secret(&key.secret));
    }

    #[test]
    fn generated_keys_differ() {
        let mut rng = StdRng::seed_from_u64(7);
        let a = NewKey::generate(&mut rng);
        let b = NewKey::generate(&mut rng);
        assert_ne!(a.secret, b.secret);
        assert_ne!(a.id, b.id);
    }

    #[test]
    fn digest_is_sha256() {
        // sha256("abc"), FIPS 180-2 appendix B.1.
        assert_eq!(
            hex::encode(digest_secret("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn config_key_id_is_stable_and_short() {
        let digest = digest_secret("sk-from-config");
        assert_eq!(config_key_id(&digest), config_key_id(&digest));
        assert_eq!(config_key_id(&digest).len(), 20);
        assert_eq!(short_digest(&digest).len(), 8);
    }
}
