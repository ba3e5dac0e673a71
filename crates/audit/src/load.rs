//! Reading what is audited: the config and the manifests, then the configs in the ConfigMaps
//! that spillway pods mount (which needs the pods, `pods.rs`, read from the manifests first).

use std::path::{Path, PathBuf};

use crate::sources::{manifest_files, parse_config, read, ConfigSource, Sources};
use crate::AuditError;

impl Sources {
    /// Reads `config` (if any) and the manifests: YAML files, or directories whose `*.yaml` and
    /// `*.yml` files are read in name order.
    pub fn load(config: Option<&Path>, manifests: &[PathBuf]) -> Result<Sources, AuditError> {
        let mut sources = Sources::default();
        if let Some(path) = config {
            let file = path.display().to_string();
            let text = read(path)?;
            sources.configs.push(ConfigSource {
                config: parse_config(&file, None, &text)?,
                file,
                object: None,
                configmap: None,
                key: None,
            });
        }
        for path in manifests {
            for file in manifest_files(path)? {
                let text = read(&file)?;
                sources.add_manifest(&file.display().to_string(), &text)?;
            }
        }
        let mounted = crate::pods::spillway_configmaps(&sources);
        sources.read_configmaps(&mounted)?;
        Ok(sources)
    }
}
