//! What `serve` would refuse in a checked configuration, found before anything is opened.
//!
//! The config crate checks the file on its own terms and never reads the environment. What
//! remains is known only here: whether the environment variables named for keys hold usable
//! keys, whether the store would take each tenant as declared, and whether two tenants declare
//! the same key. `serve` meets each of these while it starts (bootstrapping the store, building
//! the backends) and stops at the first; `spillway check-config` and `serve` both call
//! [`preflight`] first, so each is found without opening the store or binding a port, and all
//! of them are reported at once.

use std::collections::HashMap;

use spillway_config::{Config, KeySource, Problem};
use spillway_store::StoreError;

/// Reads an environment variable: `std::env::var(..).ok()` in the binary, a table in tests.
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Every problem `serve` would stop at in `config`, in the config check's location format.
/// Without `env`, nothing that needs the environment is checked (for checking a file away from
/// its secrets).
pub fn preflight(config: &Config, env: Option<Env<'_>>) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut add = |location: String, message: String| problems.push(Problem { location, message });
    let set = |var: &str| env.and_then(|read| read(var)).filter(|v| !v.is_empty());
    // Where each key digest was declared first, so a key given to two tenants is found.
    let mut declared: HashMap<[u8; 32], (usize, String)> = HashMap::new();
    for (i, t) in config.tenants.iter().enumerate() {
        let at = format!("tenants[{i}] ({:?})", t.name);
        match crate::tenants::spec(t).check() {
            Err(StoreError::Invalid(why)) => add(at.clone(), why),
            Err(other) => add(at.clone(), other.to_string()),
            Ok(()) => {}
        }
        for (j, key) in t.keys.iter().enumerate() {
            let key_at = format!("{at}.keys[{j}]");
            let digest = match key {
                KeySource::Sha256(d) => *d,
                KeySource::Env(var) if env.is_some() => match set(var) {
                    Some(k) => spillway_config::key_digest(&k),
                    None => {
                        add(format!("{key_at}.env"), not_set(var));
                        continue;
                    }
                },
                KeySource::Env(_) => continue,
            };
            match declared.get(&digest) {
                Some((other, other_at)) if *other != i => add(
                    key_at,
                    format!("the same key as {other_at}: a key belongs to one tenant"),
                ),
                Some(_) => {}
                None => {
                    declared.insert(digest, (i, key_at));
                }
            }
        }
    }
    if env.is_some() {
        for m in &config.models {
            for (i, b) in m.backends.iter().enumerate() {
                let Some(var) = &b.api_key_env else { continue };
                let at = format!(
                    "models[{:?}].backends[{i}] ({:?}).api_key_env",
                    m.name, b.name
                );
                match set(var) {
                    None => add(at, not_set(var)),
                    Some(k) if http::HeaderValue::from_str(&k).is_err() => add(
                        at,
                        format!("the key in {var} cannot be sent in a header (a control character or a line break?)"),
                    ),
                    Some(_) => {}
                }
            }
        }
    }
    if let Some(env) = env {
        for url in secret_urls(config) {
            if let Err(p) = url.read(env) {
                problems.push(p);
            }
        }
    }
    problems
}

/// Puts the URLs named by `store.url_env`, `cache.redis_env` and `admission.redis_env` into
/// `config`, read from `env`: what `serve` (at start and at each reload) and the store commands
/// run with. A URL with a password in it then lives in the environment (a Kubernetes Secret),
/// never in the file. Returns the problems [`preflight`] reports for them; `config` is complete
/// when there are none.
pub fn resolve_secrets(config: &mut Config, env: Env<'_>) -> Vec<Problem> {
    let mut problems = Vec::new();
    for url in secret_urls(config) {
        match url.read(env) {
            Ok(value) => match url.at {
                "store.url" => config.store.url = value,
                "cache.redis" => config.cache.redis = Some(value),
                _ => config.admission.redis = Some(value),
            },
            Err(p) => problems.push(p),
        }
    }
    problems
}

/// A URL the file names an environment variable for.
struct SecretUrl {
    /// The key it stands for (`store.url`); the file's key is this with `_env`.
    at: &'static str,
    var: String,
    schemes: &'static [&'static str],
}

impl SecretUrl {
    /// The variable's value, checked like the file's key would be, without ever quoting it.
    fn read(&self, env: Env<'_>) -> Result<String, Problem> {
        let problem = |message: String| Problem {
            location: format!("{}_env", self.at),
            message,
        };
        let value = env(&self.var)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| problem(not_set(&self.var)))?;
        if !self.schemes.iter().any(|k| value.starts_with(k)) {
            return Err(problem(format!(
                "the URL in {} must start with {}",
                self.var,
                self.schemes.join(" or ")
            )));
        }
        Ok(value)
    }
}

fn secret_urls(config: &Config) -> Vec<SecretUrl> {
    let named = [
        (
            "store.url",
            &config.store.url_env,
            &spillway_config::STORE_URL_SCHEMES[..],
        ),
        (
            "cache.redis",
            &config.cache.redis_env,
            &spillway_config::REDIS_URL_SCHEMES[..],
        ),
        (
            "admission.redis",
            &config.admission.redis_env,
            &spillway_config::REDIS_URL_SCHEMES[..],
        ),
    ];
    named
        .into_iter()
        .filter_map(|(at, var, schemes)| {
            var.as_ref().map(|var| SecretUrl {
                at,
                var: var.clone(),
                schemes,
            })
        })
        .collect()
}

fn not_set(var: &str) -> String {
    format!("environment variable {var} is not set (or is empty)")
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
[[tenants]]
name = "a"
keys = [{ env = "A_KEY" }, { env = "MISSING_KEY" }]
[[tenants]]
name = "b"
keys = [{ env = "B_KEY" }]
[[models]]
name = "m"
[[models.backends]]
name = "x"
url = "http://127.0.0.1:1/v1"
api_key_env = "UPSTREAM_KEY"
"#;

    fn env(var: &str) -> Option<String> {
        match var {
            "A_KEY" | "B_KEY" => Some("sk-same".to_owned()),
            "UPSTREAM_KEY" => Some("line\nbreak".to_owned()),
            _ => None,
        }
    }

    #[test]
    fn every_problem_serve_would_meet_is_found_at_once() {
        let config = Config::from_toml(FILE).unwrap();
        let found: Vec<String> = preflight(&config, Some(&env))
            .iter()
            .map(ToString::to_string)
            .collect();
        let expect = [
            "tenants[0] (\"a\").keys[1].env: environment variable MISSING_KEY is not set",
            "tenants[1] (\"b\").keys[0]: the same key as tenants[0] (\"a\").keys[0]",
            "models[\"m\"].backends[0] (\"x\").api_key_env: the key in UPSTREAM_KEY cannot be sent",
        ];
        for e in expect {
            assert!(
                found.iter().any(|f| f.starts_with(e)),
                "missing {e:?} in {found:#?}"
            );
        }
        assert_eq!(found.len(), expect.len(), "{found:#?}");
    }

    #[test]
    fn urls_named_by_environment_variables_are_checked_and_filled_in() {
        let file = "[store]\nurl_env = \"STORE_URL\"\n[cache]\nredis_env = \"CACHE_REDIS\"\n\
                    [admission]\nredis_env = \"LIMITS_REDIS\"\n\
                    [[models]]\nname = \"m\"\n[[models.backends]]\nname = \"b\"\nkind = \"mock\"\n";
        let config = Config::from_toml(file).unwrap();
        assert_eq!(config.store.url, "");
        let env = |var: &str| match var {
            "STORE_URL" => Some("postgres://u:secret@db/spillway".to_owned()),
            "CACHE_REDIS" => Some("http://not-redis".to_owned()),
            _ => None,
        };
        let found: Vec<String> = preflight(&config, Some(&env))
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            found,
            [
                "cache.redis_env: the URL in CACHE_REDIS must start with redis:// or rediss://",
                "admission.redis_env: environment variable LIMITS_REDIS is not set (or is empty)",
            ],
            "a problem never quotes the secret"
        );
        let good = |var: &str| match var {
            "STORE_URL" => Some("postgres://u:secret@db/spillway".to_owned()),
            _ => Some("redis://:pw@redis:6379".to_owned()),
        };
        let mut config = config;
        assert_eq!(resolve_secrets(&mut config, &good), Vec::new());
        assert_eq!(config.store.url, "postgres://u:secret@db/spillway");
        assert_eq!(
            config.cache.redis.as_deref(),
            Some("redis://:pw@redis:6379")
        );
        assert_eq!(
            config.admission.redis.as_deref(),
            Some("redis://:pw@redis:6379")
        );
    }

    #[test]
    fn without_the_environment_only_the_file_is_judged() {
        let config = Config::from_toml(FILE).unwrap();
        assert_eq!(preflight(&config, None), Vec::new());
    }
}
