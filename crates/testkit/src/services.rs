//! The external services tests use, found one way: PostgreSQL and Redis.
//!
//! Each is named by one environment variable, with a default that is the local server the
//! README asks for. A test that needs a service and does not find it fails, with a message
//! that names the variable: a test that skipped itself would pass in CI while testing nothing,
//! and nobody would notice the database had gone. Whether the server is there is checked once
//! per test process, with a TCP connection to its host and port.

use std::net::{TcpStream, ToSocketAddrs};
use std::sync::OnceLock;
use std::time::Duration;

/// The variable naming the tests' PostgreSQL (a database the tests may create schemas in).
pub const POSTGRES_URL_VAR: &str = "SPILLWAY_TEST_POSTGRES_URL";
/// PostgreSQL when the variable is unset: local, trust authentication, database `test`.
pub const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
/// The variable naming the tests' Redis (tests use keys of their own and delete them).
pub const REDIS_URL_VAR: &str = "SPILLWAY_TEST_REDIS_URL";
/// Redis when the variable is unset.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

struct Service {
    name: &'static str,
    var: &'static str,
    default_url: &'static str,
    default_port: u16,
    found: OnceLock<Result<Found, String>>,
}

#[derive(Clone)]
struct Found {
    url: String,
    authority: String,
}

static POSTGRES: Service = Service {
    name: "PostgreSQL",
    var: POSTGRES_URL_VAR,
    default_url: DEFAULT_POSTGRES_URL,
    default_port: 5432,
    found: OnceLock::new(),
};

static REDIS: Service = Service {
    name: "Redis",
    var: REDIS_URL_VAR,
    default_url: DEFAULT_REDIS_URL,
    default_port: 6379,
    found: OnceLock::new(),
};

/// The tests' PostgreSQL: `$SPILLWAY_TEST_POSTGRES_URL`, else [`DEFAULT_POSTGRES_URL`].
///
/// # Panics
/// When nothing accepts connections there, with a message naming the variable.
pub fn postgres_url() -> String {
    POSTGRES.found().url
}

/// The tests' Redis: `$SPILLWAY_TEST_REDIS_URL`, else [`DEFAULT_REDIS_URL`].
///
/// # Panics
/// When nothing accepts connections there, with a message naming the variable.
pub fn redis_url() -> String {
    REDIS.found().url
}

/// The `host:port` of [`redis_url`], for tests that put a TCP proxy in front of it.
///
/// # Panics
/// As [`redis_url`].
pub fn redis_authority() -> String {
    REDIS.found().authority
}

impl Service {
    fn found(&self) -> Found {
        match self.found.get_or_init(|| self.look()) {
            Ok(found) => found.clone(),
            Err(why) => panic!("{why}"),
        }
    }

    fn look(&self) -> Result<Found, String> {
        let (url, from) = match std::env::var(self.var) {
            Ok(url) => {
                let from = format!("{}={url:?}", self.var);
                (url, from)
            }
            Err(std::env::VarError::NotPresent) => (
                self.default_url.to_owned(),
                format!("{} is unset, so {}", self.var, self.default_url),
            ),
            Err(e) => return Err(format!("{}: {e}", self.var)),
        };
        let authority = authority(&url, self.default_port)
            .ok_or_else(|| format!("{from}: not a URL with a host"))?;
        if !accepts(&authority) {
            return Err(format!(
                "these tests need {} at {authority} ({from}), and nothing accepts connections \
                 there: start it, or set {} to one that runs",
                self.name, self.var
            ));
        }
        Ok(Found { url, authority })
    }
}

/// `host:port` of `scheme://[user[:password]@]host[:port][/path][?query]`.
fn authority(url: &str, default_port: u16) -> Option<String> {
    let (_, rest) = url.split_once("://")?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let hostport = rest[..end]
        .rsplit_once('@')
        .map_or(&rest[..end], |(_, h)| h);
    // An IPv6 literal keeps its brackets; its colons are not a port separator.
    let host_end = if hostport.starts_with('[') {
        hostport.find(']')? + 1
    } else {
        hostport.find(':').unwrap_or(hostport.len())
    };
    let (host, port) = hostport.split_at(host_end);
    if host.is_empty() {
        return None;
    }
    let port = match port.strip_prefix(':') {
        Some(p) => p.parse::<u16>().ok()?,
        None if port.is_empty() => default_port,
        None => return None,
    };
    Some(format!("{host}:{port}"))
}

/// Whether any address of `authority` accepts a TCP connection.
fn accepts(authority: &str) -> bool {
    let Ok(addrs) = authority.to_socket_addrs() else {
        return false;
    };
    addrs
        .into_iter()
        .any(|addr| TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_authority_is_the_host_and_port_with_the_scheme_s_default() {
        let cases = [
            ("postgres://postgres@127.0.0.1:5432/test", "127.0.0.1:5432"),
            (
                "postgres://u:p@w@db.local/test?sslmode=disable",
                "db.local:5432",
            ),
            ("redis://127.0.0.1:6380", "127.0.0.1:6380"),
            ("redis://[::1]:7000/0", "[::1]:7000"),
            ("redis://[::1]", "[::1]:5432"),
            ("postgresql://localhost?x=1", "localhost:5432"),
        ];
        for (url, expected) in cases {
            assert_eq!(authority(url, 5432).as_deref(), Some(expected), "{url}");
        }
        for bad in [
            "127.0.0.1:5432",
            "postgres://",
            "postgres://h:port/x",
            "redis://@:1",
        ] {
            assert_eq!(authority(bad, 5432), None, "{bad}");
        }
    }

    #[test]
    fn a_service_that_is_not_there_is_a_failure_naming_its_variable() {
        let closed = crate::closed_port();
        let absent = Service {
            name: "PostgreSQL",
            var: "SPILLWAY_TESTKIT_NEVER_SET",
            default_url: "postgres://postgres@127.0.0.1:1/test",
            default_port: 5432,
            found: OnceLock::new(),
        };
        let why = absent.look().err().expect("nothing listens on port 1");
        assert!(why.contains("SPILLWAY_TESTKIT_NEVER_SET"), "{why}");
        assert!(why.contains("127.0.0.1:1"), "{why}");
        assert!(!accepts(&format!("127.0.0.1:{closed}")));
    }

    #[test]
    fn the_running_services_are_found_where_the_variables_say() {
        let expected = |var, default: &str| std::env::var(var).unwrap_or(default.to_owned());
        assert_eq!(
            postgres_url(),
            expected(POSTGRES_URL_VAR, DEFAULT_POSTGRES_URL)
        );
        assert_eq!(redis_url(), expected(REDIS_URL_VAR, DEFAULT_REDIS_URL));
        assert!(
            redis_url().ends_with(&redis_authority()),
            "{}",
            redis_authority()
        );
    }
}
