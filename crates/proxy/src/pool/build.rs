//! Building the model pools from a config, at start and again at every reload.
//!
//! A reload must not throw away what the gateway has learnt about its backends (who is ejected,
//! each adaptive limit, the engines' readings, requests outstanding), or every reload would be a
//! small restart: a backend ejected a second ago would be sent traffic again, and a limit cut
//! under overload would jump back to its maximum. So each backend and each pool remembers what it
//! was built from (its recipe), and a rebuild keeps the very same `Arc` for every backend whose
//! recipe is unchanged, and for every pool whose recipe and backends are. A pool that changed
//! (a backend added, a weight or a fallback changed) is built anew around the unchanged backends
//! it keeps, and takes over the old pool's retry budget and throttling state when their settings
//! are the same. A backend whose own settings changed starts fresh: what was learnt about it may
//! not hold for what it now is.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use foldhash::HashMap;
use http::Uri;
use spillway_config::{
    AdaptiveConfig, BackendConfig, Config, EngineMetricsConfig, ModelConfig, OutlierSettings,
};
use spillway_policy::concurrency::AimdConfig;
use spillway_policy::{BudgetConfig, RetryBudget, Saturation, Throttle, ThrottleConfig};

use super::{Backend, Freed, ModelPool};
use crate::engine::EngineLoads;
use crate::health::BackendHealth;
use crate::metrics::PoolMetrics;
use crate::rollout::RolloutCell;

/// Every configured model's pool, by client-facing model name.
#[derive(Debug, Default)]
pub struct Models {
    pools: HashMap<String, Arc<ModelPool>>,
    /// Model names in configuration order, for `GET /v1/models`.
    pub names: Vec<String>,
}

/// Everything a backend is built from: equal recipes build equal backends.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct BackendRecipe {
    config: BackendConfig,
    base: Uri,
    outlier: OutlierSettings,
    adaptive: AdaptiveConfig,
    stale_after: Duration,
    anomaly: spillway_policy::AnomalyConfig,
}

/// Everything a pool is built from, besides its backends.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct PoolRecipe {
    model: ModelConfig,
    budget: BudgetConfig,
    throttle: Option<ThrottleConfig>,
    outlier: OutlierSettings,
    engine: EngineMetricsConfig,
}

/// What a rebuild kept and what it made anew, for the reload's answer and log.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Rebuilt {
    /// Models whose pool was kept as it was.
    pub models_kept: Vec<String>,
    /// Models new in this config, and models whose pool was rebuilt.
    pub models_added: Vec<String>,
    pub models_changed: Vec<String>,
    pub models_removed: Vec<String>,
    /// Backends (`model/backend`) kept with their live state, and those built fresh.
    pub backends_kept: Vec<String>,
    pub backends_fresh: Vec<String>,
}

impl Models {
    /// Builds the pools; `base_of` resolves each backend's base URL.
    pub fn new(
        config: &Config,
        base_of: impl FnMut(&ModelConfig, &BackendConfig) -> Result<Uri, String>,
    ) -> Result<Self, String> {
        Ok(Self::rebuilt(config, base_of, &Models::default(), &|_| None)?.0)
    }

    /// Builds the pools of `config`, keeping from `previous` every backend and pool that would
    /// be built the same (see the module's doc), and says what was kept; `rollout_of` gives
    /// each model with a rollout its rollout.
    pub fn rebuilt(
        config: &Config,
        mut base_of: impl FnMut(&ModelConfig, &BackendConfig) -> Result<Uri, String>,
        previous: &Models,
        rollout_of: &dyn Fn(&ModelConfig) -> Option<Arc<RolloutCell>>,
    ) -> Result<(Self, Rebuilt), String> {
        let epoch = crate::clock::now();
        let mut engines = EngineLoads::new(config.engine_metrics.stale_after);
        for pool in previous.pools.values() {
            for b in &pool.backends {
                if let Some(load) = &b.engine {
                    engines.keep(load);
                }
            }
        }
        let mut out = Models::default();
        let mut report = Rebuilt::default();
        for m in &config.models {
            let old = previous.get(&m.name);
            let name: Arc<str> = Arc::from(m.name.as_str());
            // The old pool's notifier, which the backends kept from it wake.
            let freed = old.map_or_else(Arc::default, |p| p.freed.clone());
            let mut backends = Vec::with_capacity(m.backends.len());
            let mut all_kept = old.is_some_and(|p| p.backends.len() == m.backends.len());
            for b in &m.backends {
                let recipe = BackendRecipe {
                    config: b.clone(),
                    base: base_of(m, b)?,
                    outlier: config.outlier.clone(),
                    adaptive: config.adaptive_concurrency.clone(),
                    stale_after: config.engine_metrics.stale_after,
                    anomaly: config.anomaly,
                };
                let label = format!("{}/{}", m.name, b.name);
                let kept = old.and_then(|p| {
                    p.backends
                        .iter()
                        .find(|o| o.recipe.as_ref() == Some(&recipe))
                });
                match kept {
                    Some(backend) => {
                        backends.push(backend.clone());
                        report.backends_kept.push(label);
                    }
                    None => {
                        all_kept = false;
                        backends.push(fresh_backend(config, &name, recipe, &freed, &mut engines)?);
                        report.backends_fresh.push(label);
                    }
                }
            }
            let recipe = PoolRecipe {
                model: m.clone(),
                budget: config.retry.budget,
                throttle: config.retry.throttle,
                outlier: config.outlier.clone(),
                engine: config.engine_metrics.clone(),
            };
            let pool = match old {
                Some(p) if all_kept && p.recipe == recipe => {
                    report.models_kept.push(m.name.clone());
                    p.clone()
                }
                _ => {
                    match old {
                        Some(_) => report.models_changed.push(m.name.clone()),
                        None => report.models_added.push(m.name.clone()),
                    }
                    let mut pool = pool(config, name, recipe, backends, freed, old, epoch);
                    pool.rollout = rollout_of(m);
                    Arc::new(pool)
                }
            };
            out.pools.insert(m.name.clone(), pool);
            out.names.push(m.name.clone());
        }
        report.models_removed = previous
            .names
            .iter()
            .filter(|n| !out.pools.contains_key(*n))
            .cloned()
            .collect();
        Ok((out, report))
    }

    /// The rollouts of the models that have one.
    pub fn rollouts(&self) -> Vec<Arc<RolloutCell>> {
        self.pools()
            .iter()
            .filter_map(|p| p.rollout.clone())
            .collect()
    }

    pub fn get(&self, model: &str) -> Option<&Arc<ModelPool>> {
        self.pools.get(model)
    }

    /// Every pool, in configuration order.
    pub fn pools(&self) -> Vec<Arc<ModelPool>> {
        self.names
            .iter()
            .filter_map(|n| self.get(n).cloned())
            .collect()
    }
}

fn fresh_backend(
    config: &Config,
    model: &Arc<str>,
    recipe: BackendRecipe,
    freed: &Arc<Freed>,
    engines: &mut EngineLoads,
) -> Result<Arc<Backend>, String> {
    let b = &recipe.config;
    let outlier = config
        .outlier
        .enabled
        .then(|| config.outlier.detector.clone());
    let four_xx = spillway_policy::FourXxDetector::try_new(config.anomaly, crate::clock::now())
        .map_err(|e| e.to_string())?;
    let health = BackendHealth::new(
        b.max_concurrency,
        outlier,
        aimd(&config.adaptive_concurrency, b),
        four_xx,
    );
    let base = recipe.base.clone();
    let mut backend = Backend::new(model, b, &base, crate::clock::now(), health, freed.clone())?;
    backend.engine = engines.for_backend(b, &base, backend.auth_header.as_ref())?;
    backend.recipe = Some(recipe);
    Ok(Arc::new(backend))
}

/// The adaptive limit of a backend, when `[adaptive_concurrency]` is on.
fn aimd(adaptive: &AdaptiveConfig, b: &BackendConfig) -> Option<AimdConfig> {
    adaptive.enabled.then(|| {
        let min_limit = adaptive.min_limit.min(b.max_concurrency);
        AimdConfig {
            min_limit,
            max_limit: b.max_concurrency,
            initial_limit: adaptive
                .initial_limit
                .unwrap_or(b.max_concurrency)
                .clamp(min_limit, b.max_concurrency),
            backoff_ratio: adaptive.backoff_ratio,
            recovery: adaptive.recovery,
            ..AimdConfig::with_max_limit(b.max_concurrency)
        }
    })
}

/// A pool of `backends`; the retry budget and throttling of `old` carry over when their settings
/// did not change, so a reload cannot hand a failing pool a fresh budget.
fn pool(
    config: &Config,
    name: Arc<str>,
    recipe: PoolRecipe,
    backends: Vec<Arc<Backend>>,
    freed: Arc<Freed>,
    old: Option<&Arc<ModelPool>>,
    epoch: std::time::Instant,
) -> ModelPool {
    let budget = match old {
        Some(p) if p.recipe.budget == recipe.budget => {
            p.budget.lock().unwrap_or_else(|e| e.into_inner()).clone()
        }
        _ => RetryBudget::new(config.retry.budget, epoch),
    };
    let throttle = config.retry.throttle.map(|t| {
        let kept = old
            .filter(|p| p.recipe.throttle == Some(t))
            .and_then(|p| p.throttle.as_ref())
            .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()).clone());
        Mutex::new(kept.unwrap_or_else(|| Throttle::new(t, epoch)))
    });
    let m = &recipe.model;
    ModelPool {
        metrics: PoolMetrics::new(&name),
        genai: crate::genai::GenAiSeries::new(&name),
        name,
        backends,
        budget: Mutex::new(budget),
        throttle,
        throttle_pending: crate::counters::Level::new(),
        in_flight: crate::counters::Level::new(),
        retrying: AtomicU64::new(0),
        max_ejected_share: config.outlier.max_ejected_share,
        panic_threshold: config.outlier.panic_threshold,
        freed,
        balance: m.balance.clone(),
        saturation: Saturation {
            max_queue: config.engine_metrics.max_queue,
            max_kv_usage: config.engine_metrics.max_kv_usage,
        },
        fallbacks: m.fallbacks.clone(),
        turn: AtomicU64::new(0),
        rollout: None,
        recipe,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_config::BackendKind;

    const TWO: &str = r#"
[[models]]
name = "m"
[[models.backends]]
name = "a"
url = "http://127.0.0.1:9/v1"
engine = "none"
[[models.backends]]
name = "b"
url = "http://127.0.0.1:10/v1"
engine = "none"
"#;

    fn build(toml: &str, previous: &Models) -> (Models, Rebuilt) {
        let config = Config::from_toml(toml).unwrap();
        let base = |_: &ModelConfig, b: &BackendConfig| match &b.kind {
            BackendKind::OpenAi { url } => Ok(url.clone()),
            other => Err(format!("unexpected {other:?}")),
        };
        Models::rebuilt(&config, base, previous, &|_| None).unwrap()
    }

    #[test]
    fn an_unchanged_model_is_kept_whole_and_a_changed_one_keeps_its_unchanged_backends() {
        let (first, _) = build(TWO, &Models::default());
        let old = first.get("m").unwrap().clone();
        // The same config again: the very same pool.
        let (same, report) = build(TWO, &first);
        assert!(Arc::ptr_eq(same.get("m").unwrap(), &old));
        assert_eq!(report.models_kept, ["m"]);
        // b's weight changes and a model is added: m is rebuilt around the a it keeps.
        let changed = TWO.replace(
            "url = \"http://127.0.0.1:10/v1\"",
            "url = \"http://127.0.0.1:10/v1\"\nweight = 3",
        ) + "[[models]]\nname = \"n\"\n[[models.backends]]\nname = \"c\"\nurl = \"http://127.0.0.1:11/v1\"\nengine = \"none\"\n";
        let (next, report) = build(&changed, &same);
        let pool = next.get("m").unwrap();
        assert!(!Arc::ptr_eq(pool, &old));
        assert!(
            Arc::ptr_eq(&pool.backends[0], &old.backends[0]),
            "a is kept"
        );
        assert!(
            !Arc::ptr_eq(&pool.backends[1], &old.backends[1]),
            "b is new"
        );
        assert_eq!(pool.backends[1].weight, 3);
        // The backends kept wake the waiters of the new pool.
        assert!(Arc::ptr_eq(&pool.freed, &old.freed));
        assert_eq!(report.models_changed, ["m"]);
        assert_eq!(report.models_added, ["n"]);
        assert_eq!(report.backends_kept, ["m/a"]);
        assert_eq!(report.backends_fresh, ["m/b", "n/c"]);
        // Dropping a model says so.
        let (_, report) = build(TWO, &next);
        assert_eq!(report.models_removed, ["n"]);
    }

    #[test]
    fn changed_outlier_settings_rebuild_every_backend() {
        let (first, _) = build(TWO, &Models::default());
        let (next, report) = build(
            &format!("[outlier]\nconsecutive_failures = 9\n{TWO}"),
            &first,
        );
        assert!(report.backends_kept.is_empty(), "{report:?}");
        assert!(!Arc::ptr_eq(
            &next.get("m").unwrap().backends[0],
            &first.get("m").unwrap().backends[0]
        ));
    }
}
