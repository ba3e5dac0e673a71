//! The pods the manifests would run: each workload's pod template, its containers with their
//! key paths, how many replicas may run at once, and for each spillway container the config it
//! runs with.
//!
//! A container is spillway's when its image is named `spillway` (any registry, tag or digest)
//! or its command is the `spillway` binary; every other container is treated as an inference
//! server or a neighbour, to which only the rules for any container apply.

use serde_json::Value;

use crate::sources::{ConfigSource, Object, Sources};

/// A workload's pod template.
#[derive(Debug, Clone, Copy)]
pub struct Pod<'a> {
    pub object: &'a Object,
    pub spec: &'a Value,
    /// The pod spec's key path in the object (`spec.template.spec`).
    pub path: &'static str,
}

/// One container of a pod, with its key path (`spec.template.spec.containers[0]`).
#[derive(Debug, Clone)]
pub struct Container<'a> {
    pub value: &'a Value,
    pub key: String,
}

/// A spillway container and the config it runs (`None` when the audit was given none).
#[derive(Debug, Clone)]
pub struct Gateway<'a> {
    pub pod: Pod<'a>,
    pub container: Container<'a>,
    pub config: Option<&'a ConfigSource>,
}

/// Every pod template in the manifests.
pub fn pods(sources: &Sources) -> Vec<Pod<'_>> {
    sources
        .objects
        .iter()
        .filter_map(|o| {
            let (path, spec) = match o.kind.as_str() {
                "Pod" => ("spec", o.value.get("spec")?),
                "CronJob" => (
                    "spec.jobTemplate.spec.template.spec",
                    o.value.pointer("/spec/jobTemplate/spec/template/spec")?,
                ),
                "Deployment"
                | "StatefulSet"
                | "DaemonSet"
                | "ReplicaSet"
                | "Job"
                | "ReplicationController" => (
                    "spec.template.spec",
                    o.value.pointer("/spec/template/spec")?,
                ),
                _ => return None,
            };
            Some(Pod {
                object: o,
                spec,
                path,
            })
        })
        .collect()
}

impl<'a> Pod<'a> {
    /// Its containers, init containers included.
    pub fn containers(&self) -> Vec<Container<'a>> {
        let mut all = Vec::new();
        for list in ["initContainers", "containers"] {
            if let Some(items) = self.spec.get(list).and_then(Value::as_array) {
                for (i, c) in items.iter().enumerate() {
                    all.push(Container {
                        value: c,
                        key: format!("{}.{list}[{i}]", self.path),
                    });
                }
            }
        }
        all
    }

    /// Its long-running containers, which probes and shutdown apply to.
    pub fn main_containers(&self) -> Vec<Container<'a>> {
        self.containers()
            .into_iter()
            .filter(|c| !c.key.contains(".initContainers["))
            .collect()
    }

    /// The most replicas that may run at once: `spec.replicas` (default 1), or the
    /// `maxReplicas` of a HorizontalPodAutoscaler that scales it, if more. `None` for kinds whose
    /// count the manifests do not say (a DaemonSet runs one per node).
    pub fn max_replicas(&self, sources: &Sources) -> Option<u64> {
        let o = self.object;
        let replicas = match o.kind.as_str() {
            "Deployment" | "StatefulSet" | "ReplicaSet" | "ReplicationController" => o
                .value
                .pointer("/spec/replicas")
                .and_then(Value::as_u64)
                .unwrap_or(1),
            "Pod" => 1,
            _ => return None,
        };
        let scaled = sources
            .objects
            .iter()
            .filter(|h| h.kind == "HorizontalPodAutoscaler" && h.namespace == o.namespace)
            .filter(|h| {
                let target = |k: &str| h.value.pointer(&format!("/spec/scaleTargetRef/{k}"));
                target("kind").and_then(Value::as_str) == Some(o.kind.as_str())
                    && target("name").and_then(Value::as_str) == Some(o.name.as_str())
            })
            .filter_map(|h| h.value.pointer("/spec/maxReplicas").and_then(Value::as_u64))
            .max()
            .unwrap_or(0);
        Some(replicas.max(scaled))
    }

    /// The ConfigMaps its volumes mount (directly or projected).
    fn configmaps(&self) -> Vec<String> {
        let mut names = Vec::new();
        for v in self
            .spec
            .get("volumes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(n) = v.pointer("/configMap/name").and_then(Value::as_str) {
                names.push(n.to_owned());
            }
            for s in v
                .pointer("/projected/sources")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(n) = s.pointer("/configMap/name").and_then(Value::as_str) {
                    names.push(n.to_owned());
                }
            }
        }
        names
    }
}

/// Whether a container runs spillway.
pub fn is_spillway(container: &Value) -> bool {
    let image = container.get("image").and_then(Value::as_str).unwrap_or("");
    let image = image.split('@').next().unwrap_or("");
    let name = image.rsplit('/').next().unwrap_or("");
    let name = name.split(':').next().unwrap_or("");
    let command = container
        .pointer("/command/0")
        .and_then(Value::as_str)
        .map(|c| c.rsplit('/').next().unwrap_or(c));
    name == "spillway" || command == Some("spillway")
}

/// The ConfigMaps mounted by pods that run spillway, with the pods' namespaces.
pub(crate) fn spillway_configmaps(sources: &Sources) -> Vec<(String, Option<String>)> {
    pods(sources)
        .into_iter()
        .filter(|p| p.main_containers().iter().any(|c| is_spillway(c.value)))
        .flat_map(|p| {
            p.configmaps()
                .into_iter()
                .map(move |n| (n, p.object.namespace.clone()))
        })
        .collect()
}

/// Every spillway container with the config it runs: one from a ConfigMap its pod mounts
/// (the key its command line names, if it names one), else the `--config` file.
pub fn gateways(sources: &Sources) -> Vec<Gateway<'_>> {
    let given = sources.configs.iter().find(|c| c.configmap.is_none());
    let mut out = Vec::new();
    for pod in pods(sources) {
        let mounted = pod.configmaps();
        for container in pod.main_containers() {
            if !is_spillway(container.value) {
                continue;
            }
            let words = command_line(container.value);
            let candidates: Vec<&ConfigSource> = sources
                .configs
                .iter()
                .filter(|c| {
                    c.configmap.as_ref().is_some_and(|(name, ns)| {
                        mounted.contains(name) && (ns.is_none() || *ns == pod.object.namespace)
                    })
                })
                .collect();
            let named = candidates.iter().copied().find(|c| {
                c.key
                    .as_ref()
                    .is_some_and(|k| words.iter().any(|w| w.ends_with(&format!("/{k}"))))
            });
            let config = named.or(candidates.first().copied()).or(given);
            out.push(Gateway {
                pod,
                container,
                config,
            });
        }
    }
    out
}

/// A container's command and arguments, word by word.
pub fn command_line(container: &Value) -> Vec<String> {
    ["command", "args"]
        .iter()
        .filter_map(|k| container.get(*k).and_then(Value::as_array))
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect()
}
