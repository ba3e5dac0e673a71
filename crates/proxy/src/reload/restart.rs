//! The settings a running gateway cannot change, and what a reload does with them.
//!
//! They belong to things made once per process: the listeners and their connection handling,
//! the runtime's threads, the store's pool, the key cache, the admin token, the shared limits'
//! Redis connection, the body budget, the upstream client's connection pool and the trace
//! exporter. A reload that changes one keeps its running value (so what the admin API shows as
//! running is what runs) and names it as needing a restart, and applies everything else. Refusing the whole reload
//! instead would make an unrelated edit in the same file block an urgent change.

use spillway_config::Config;

/// Puts back into `next` the running value of every setting that needs a restart to change, and
/// returns the key paths of those that differed.
pub(super) fn pin(running: &Config, next: &mut Config) -> Vec<String> {
    let mut differed = Vec::new();
    macro_rules! pin {
        ($($section:ident . $field:ident),* $(,)?) => {$(
            if next.$section.$field != running.$section.$field {
                differed.push(concat!(stringify!($section), ".", stringify!($field)).to_owned());
                next.$section.$field = running.$section.$field.clone();
            }
        )*};
    }
    macro_rules! pin_section {
        ($($section:ident),* $(,)?) => {$(
            if next.$section != running.$section {
                differed.push(stringify!($section).to_owned());
                next.$section = running.$section.clone();
            }
        )*};
    }
    pin!(
        server.listen,
        server.admin_listen,
        server.max_connections,
        server.admin_max_connections,
        server.worker_threads,
        server.header_read_timeout,
        server.idle_timeout,
        server.http2_keepalive_interval,
        server.http2_keepalive_timeout,
        server.http2_max_concurrent_streams,
        upstream.connect_timeout,
        upstream.response_timeout,
        upstream.pool_idle_timeout,
        upstream.pool_max_idle_per_host,
        upstream.unreachable_cooldown,
        admin.token_env,
        admission.redis,
        admission.redis_timeout,
        admission.instances,
        admission.max_buffered_body_bytes,
        admission.max_buffered_body_bytes_per_tenant,
    );
    pin_section!(store, cache, telemetry);
    differed
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
[server]
listen = "127.0.0.1:8080"
[[models]]
name = "m"
[[models.backends]]
name = "a"
kind = "mock"
"#;

    fn config(extra: &str) -> Config {
        Config::from_toml(&format!("{extra}\n{BASE}")).expect("valid test config")
    }

    #[test]
    fn live_settings_pass_and_restart_only_ones_keep_their_running_values() {
        let running = config("");
        let mut next = Config::from_toml(&BASE.replace("127.0.0.1:8080", "127.0.0.1:8081"))
            .expect("valid test config");
        next.server.max_body_bytes = 1234;
        next.store.max_connections = 3;
        next.retry.deadline = std::time::Duration::from_secs(7);
        let differed = pin(&running, &mut next);
        assert_eq!(differed, ["server.listen", "store"]);
        assert_eq!(next.server.listen, running.server.listen);
        assert_eq!(next.store, running.store);
        // What may change live does.
        assert_eq!(next.server.max_body_bytes, 1234);
        assert_eq!(next.retry.deadline, std::time::Duration::from_secs(7));
    }

    #[test]
    fn an_unchanged_config_needs_no_restart() {
        let running = config("");
        let mut next = running.clone();
        assert!(pin(&running, &mut next).is_empty());
        assert_eq!(next, running);
    }
}
