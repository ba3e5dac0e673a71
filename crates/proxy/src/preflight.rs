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
    problems
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
    fn without_the_environment_only_the_file_is_judged() {
        let config = Config::from_toml(FILE).unwrap();
        assert_eq!(preflight(&config, None), Vec::new());
    }
}
