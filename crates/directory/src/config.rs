//! The one check of the directory's settings, `spillway_config::CacheConfig`.
//!
//! The config crate owns the settings of the `[cache]` table and their defaults, and validates
//! the table it reads; [`check`] keeps the directory safe when its settings are built another
//! way (a test, a replay). It is applied once, by `Directory::new`.

use spillway_config::CacheConfig;

use crate::DirectoryError;

/// Every problem at once, so a bad config is fixed in one go.
pub fn check(config: &CacheConfig) -> Result<(), DirectoryError> {
    let mut problems = Vec::new();
    if config.ttl.is_zero() {
        problems.push("ttl must be more than zero".to_owned());
    }
    if !(config.ttl_jitter.is_finite() && (0.0..1.0).contains(&config.ttl_jitter)) {
        problems.push(format!(
            "ttl_jitter must be in [0, 1), not {}",
            config.ttl_jitter
        ));
    }
    if config.negative_ttl.is_zero() {
        problems.push("negative_ttl must be more than zero".to_owned());
    }
    if config.max_entries == 0 {
        problems.push("max_entries must be at least 1".to_owned());
    }
    if config.max_concurrent_loads == 0
        || config.max_concurrent_loads > tokio::sync::Semaphore::MAX_PERMITS
    {
        problems.push(format!(
            "max_concurrent_loads must be at least 1 (and sane), not {}",
            config.max_concurrent_loads
        ));
    }
    if config.load_timeout.is_zero() {
        problems.push("load_timeout must be more than zero".to_owned());
    }
    if config.redis_timeout.is_zero() {
        problems.push("redis_timeout must be more than zero".to_owned());
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(DirectoryError::InvalidConfig(problems.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn defaults_are_valid() {
        check(&CacheConfig::default()).unwrap();
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let config = CacheConfig {
            ttl: Duration::ZERO,
            ttl_jitter: 1.0,
            max_concurrent_loads: 0,
            ..CacheConfig::default()
        };
        let DirectoryError::InvalidConfig(why) = check(&config).unwrap_err() else {
            panic!("expected InvalidConfig");
        };
        assert!(why.contains("ttl must"), "{why}");
        assert!(why.contains("ttl_jitter"), "{why}");
        assert!(why.contains("max_concurrent_loads"), "{why}");
    }

    #[test]
    fn nan_jitter_is_rejected() {
        let config = CacheConfig {
            ttl_jitter: f64::NAN,
            ..CacheConfig::default()
        };
        assert!(check(&config).is_err());
    }
}
