//! What is audited, read once: spillway configs (a file given with `--config`, and every
//! `*.toml` a ConfigMap in the manifests holds for a spillway container) and the Kubernetes
//! objects of the manifests, each with the file it came from.
//!
//! YAML is read with `yaml-rust2` and turned into `serde_json::Value`s, so the rules index
//! objects the way the Kubernetes API documents them. A document that is not an object, YAML
//! that does not parse and a config spillway would refuse are errors, not findings: what cannot
//! be read cannot be judged, and saying nothing about it would read as a clean audit.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use spillway_config::Config;
use yaml_rust2::{Yaml, YamlLoader};

use crate::AuditError;

/// A spillway config and where it came from.
#[derive(Debug)]
pub struct ConfigSource {
    pub file: String,
    /// The ConfigMap and key that held it (`ConfigMap/spillway data[spillway.toml]`), or `None`
    /// for a file given with `--config`.
    pub object: Option<String>,
    /// The ConfigMap's name and namespace, to pair it with the pods that mount it.
    pub configmap: Option<(String, Option<String>)>,
    /// The ConfigMap's key (`spillway.toml`).
    pub key: Option<String>,
    pub config: Config,
}

/// One Kubernetes object of a manifest.
#[derive(Debug)]
pub struct Object {
    pub file: String,
    pub kind: String,
    pub name: String,
    pub namespace: Option<String>,
    pub value: Value,
}

impl Object {
    /// `Kind/name`, as kubectl names it.
    pub fn label(&self) -> String {
        format!("{}/{}", self.kind, self.name)
    }
}

/// Everything one audit looks at.
#[derive(Debug, Default)]
pub struct Sources {
    pub configs: Vec<ConfigSource>,
    pub objects: Vec<Object>,
}

impl Sources {
    /// Adds the objects of one manifest's text (several documents, `List`s flattened).
    pub fn add_manifest(&mut self, file: &str, text: &str) -> Result<(), AuditError> {
        let docs = YamlLoader::load_from_str(text)
            .map_err(|e| AuditError::new(file, format!("not YAML: {e}")))?;
        for (i, doc) in docs.iter().enumerate() {
            let value = to_json(doc)
                .map_err(|e| AuditError::new(file, format!("document {}: {e}", i + 1)))?;
            if value.is_null() {
                continue;
            }
            let items = match value.get("kind").and_then(Value::as_str) {
                Some("List") => value
                    .get("items")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default(),
                _ => vec![value],
            };
            for item in items {
                self.objects.push(object(file, i, item)?);
            }
        }
        Ok(())
    }

    /// The configs held by ConfigMaps: a key `spillway.toml`, or any `*.toml` key of a ConfigMap
    /// that a spillway container's pod mounts.
    /// `mounted`: the ConfigMaps (name, namespace) that spillway pods mount.
    pub(crate) fn read_configmaps(
        &mut self,
        mounted: &[(String, Option<String>)],
    ) -> Result<(), AuditError> {
        let mut found = Vec::new();
        for o in self.objects.iter().filter(|o| o.kind == "ConfigMap") {
            let Some(data) = o.value.get("data").and_then(Value::as_object) else {
                continue;
            };
            let is_mounted = mounted
                .iter()
                .any(|(name, ns)| *name == o.name && (ns.is_none() || *ns == o.namespace));
            for (key, text) in data {
                let wanted = key == "spillway.toml" || (is_mounted && key.ends_with(".toml"));
                let Some(text) = text.as_str().filter(|_| wanted) else {
                    continue;
                };
                let at = format!("{} data[{key}]", o.label());
                found.push(ConfigSource {
                    config: parse_config(&o.file, Some(&at), text)?,
                    file: o.file.clone(),
                    object: Some(at),
                    configmap: Some((o.name.clone(), o.namespace.clone())),
                    key: Some(key.clone()),
                });
            }
        }
        self.configs.extend(found);
        Ok(())
    }
}

pub(crate) fn read(path: &Path) -> Result<String, AuditError> {
    std::fs::read_to_string(path)
        .map_err(|e| AuditError::new(path.display().to_string(), format!("cannot read: {e}")))
}

pub(crate) fn manifest_files(path: &Path) -> Result<Vec<PathBuf>, AuditError> {
    if !path.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let entries = std::fs::read_dir(path)
        .map_err(|e| AuditError::new(path.display().to_string(), format!("cannot read: {e}")))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    Ok(files)
}

pub(crate) fn parse_config(file: &str, at: Option<&str>, text: &str) -> Result<Config, AuditError> {
    let within = at.map(|a| format!("{a}: ")).unwrap_or_default();
    Config::from_toml(text).map_err(|e| {
        let why = match e {
            spillway_config::ConfigError::Invalid(problems) => {
                let first = problems
                    .first()
                    .map(ToString::to_string)
                    .unwrap_or_default();
                match problems.len() {
                    1 => first,
                    n => format!("{first} (and {} more problem(s))", n - 1),
                }
            }
            spillway_config::ConfigError::Parse(errors) => errors
                .join(" ")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" "),
            other => other.to_string(),
        };
        AuditError::new(file, format!("{within}not a valid spillway config: {why}"))
    })
}

fn object(file: &str, doc: usize, value: Value) -> Result<Object, AuditError> {
    let at = |what: &str| AuditError::new(file, format!("document {}: {what}", doc + 1));
    if !value.is_object() {
        return Err(at("not a Kubernetes object (a YAML mapping)"));
    }
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .ok_or_else(|| at("has no kind"))?
        .to_owned();
    let meta = value.get("metadata");
    let name = meta
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let namespace = meta
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    Ok(Object {
        file: file.to_owned(),
        kind,
        name,
        namespace,
        value,
    })
}

/// A YAML value as JSON; keys that are not strings are written as YAML would print them.
fn to_json(y: &Yaml) -> Result<Value, String> {
    Ok(match y {
        Yaml::Null => Value::Null,
        Yaml::Boolean(b) => Value::Bool(*b),
        Yaml::Integer(i) => Value::from(*i),
        Yaml::Real(r) => r
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map(Value::Number)
            .unwrap_or_else(|| Value::String(r.clone())),
        Yaml::String(s) => Value::String(s.clone()),
        Yaml::Array(items) => Value::Array(items.iter().map(to_json).collect::<Result<_, _>>()?),
        Yaml::Hash(h) => {
            let mut m = Map::new();
            for (k, v) in h {
                let key = match k {
                    Yaml::String(s) => s.clone(),
                    Yaml::Integer(i) => i.to_string(),
                    Yaml::Boolean(b) => b.to_string(),
                    Yaml::Real(r) => r.clone(),
                    Yaml::Null => "null".to_owned(),
                    _ => return Err("a mapping key that is not a scalar".to_owned()),
                };
                m.insert(key, to_json(v)?);
            }
            Value::Object(m)
        }
        Yaml::Alias(_) => return Err("YAML aliases are not supported".to_owned()),
        Yaml::BadValue => return Err("a value that is not YAML".to_owned()),
    })
}
