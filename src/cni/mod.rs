//! CNI: picks the network config as kubelet does, runs plugins per the CNI spec (ADD in
//! order with `prevResult` chaining, DEL in reverse), caches the exact config and the ADD
//! result so DEL works after the conf dir changed or the netns vanished, and reports plugin
//! errors with the plugin's own `code`/`msg`/`details` and stderr.

mod config;
mod exec;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

/// The data CNI calls take and the record keeps (defined with the other record types).
pub use crate::model::network::{Attachment, CacheEntry, NetworkList, PortMapping};
pub use config::{embedded_default, load};
pub use exec::find_plugin;

/// CNI failures, each naming the config file or the plugin and the command.
#[derive(Debug, thiserror::Error)]
pub enum CniError {
    #[error("CNI config {file}: {reason}")]
    BadConfig { file: String, reason: String },
    #[error("CNI plugin {plugin:?} not found in {dirs}")]
    PluginNotFound { plugin: String, dirs: String },
    #[error("{plugin}: {command}: {msg}{}{}{}", code.map(|c| format!(" (code {c})")).unwrap_or_default(), if details.is_empty() { String::new() } else { format!(": {details}") }, if stderr.is_empty() { String::new() } else { format!("; stderr: {stderr}") })]
    Plugin {
        plugin: String,
        command: &'static str,
        code: Option<u64>,
        msg: String,
        details: String,
        stderr: String,
    },
    #[error("{plugin}: {command}: {source}")]
    Run {
        plugin: String,
        command: &'static str,
        #[source]
        source: crate::process::RunError,
    },
    #[error("CNI cache {path}: {reason}")]
    Cache { path: PathBuf, reason: String },
    /// Several plugins failed (DEL runs them all): every error, in the order they ran.
    #[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Several(Vec<CniError>),
}

/// Executes network lists with one set of plugin dirs and one per-plugin time limit.
#[derive(Debug, Clone)]
pub struct Cni {
    pub bin_dirs: Vec<PathBuf>,
    pub timeout: Duration,
    pub cache_dir: PathBuf,
}

impl Cni {
    /// Every plugin of `list` must be present before anything is run.
    pub fn check_plugins(&self, list: &NetworkList) -> Result<(), CniError> {
        for p in &list.plugins {
            find_plugin(&self.bin_dirs, config::plugin_type(p))?;
        }
        Ok(())
    }

    /// Runs ADD for each plugin in order, chaining `prevResult`; returns the final result.
    pub fn add(&self, list: &NetworkList, att: &Attachment) -> Result<Value, CniError> {
        let mut prev: Option<Value> = None;
        for plugin in &list.plugins {
            let conf = list.plugin_stdin(plugin, prev.as_ref(), att);
            let out = exec::invoke(self, plugin, "ADD", &conf, att)?;
            prev = Some(out);
        }
        Ok(prev.unwrap_or(Value::Null))
    }

    /// Runs DEL for each plugin in reverse order with the cached result as `prevResult`
    /// (versions ≥ 0.4.0, as libcni does). Every plugin is tried; every error is returned.
    pub fn del(
        &self,
        list: &NetworkList,
        att: &Attachment,
        result: Option<&Value>,
    ) -> Result<(), CniError> {
        let prev = if list.supports_prev_result_on_del() {
            result.filter(|r| !r.is_null())
        } else {
            None
        };
        let mut errors = Vec::new();
        for plugin in list.plugins.iter().rev() {
            let conf = list.plugin_stdin(plugin, prev, att);
            if let Err(e) = exec::invoke(self, plugin, "DEL", &conf, att) {
                tracing::warn!(container_id = %att.container_id, error = %e, "CNI DEL failed");
                errors.push(e);
            }
        }
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(CniError::Several(errors)),
        }
    }

    pub(crate) fn cache_path(&self, id: &str) -> PathBuf {
        self.cache_dir.join(format!("{id}.json"))
    }

    /// Stores the cache entry for `id` atomically.
    pub fn save_cache(&self, id: &str, entry: &CacheEntry) -> Result<(), CniError> {
        let path = self.cache_path(id);
        crate::state::files::private_dir_all(&self.cache_dir).map_err(|e| CniError::Cache {
            path: self.cache_dir.clone(),
            reason: e.to_string(),
        })?;
        crate::state::write_json_atomic(&path, entry).map_err(|e| CniError::Cache {
            path,
            reason: e.to_string(),
        })
    }

    /// Loads the cache entry for `id`. A missing, empty or corrupt file counts as absent.
    pub fn load_cache(&self, id: &str) -> Option<CacheEntry> {
        let path = self.cache_path(id);
        match crate::state::read_json::<CacheEntry>(&path) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(sandbox_id = id, error = %e, "ignoring unreadable CNI cache");
                None
            }
        }
    }

    pub fn remove_cache(&self, id: &str) -> Result<(), CniError> {
        let path = self.cache_path(id);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(CniError::Cache {
                path,
                reason: e.to_string(),
            }),
        }
    }

    /// Removes what a crash mid-write left (the entry it was replacing, if any, is intact).
    /// Only at start-up: while the daemon runs, a `.tmp` may be a write in progress.
    pub fn remove_partial_writes(&self) {
        for e in std::fs::read_dir(&self.cache_dir)
            .into_iter()
            .flatten()
            .flatten()
        {
            if e.file_name().to_string_lossy().ends_with(".tmp") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    /// Ids of every cache entry on disk (read only: the audit lists them while pods come and go).
    pub fn cached_ids(&self) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(&self.cache_dir) else {
            return Vec::new();
        };
        rd.filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                name.strip_suffix(".json").map(str::to_string)
            })
            .filter(|id| crate::validate::full_id(id).is_ok())
            .collect()
    }
}

/// The IP addresses (without prefix length) in a CNI result of any version 0.3.0–1.0.0.
pub fn result_ips(result: &Value) -> Vec<String> {
    result
        .get("ips")
        .and_then(Value::as_array)
        .map(|ips| {
            ips.iter()
                .filter_map(|ip| ip.get("address").and_then(Value::as_str))
                .map(|a| a.split('/').next().unwrap_or(a).to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ips_from_results() {
        let v1: Value = serde_json::json!({"cniVersion":"1.0.0","ips":[{"address":"10.1.0.5/24","gateway":"10.1.0.1","interface":0}]});
        assert_eq!(result_ips(&v1), vec!["10.1.0.5".to_string()]);
        let v03: Value = serde_json::json!({"cniVersion":"0.3.1","ips":[{"version":"4","address":"10.2.0.7/16"},{"version":"6","address":"fd00::7/64"}]});
        assert_eq!(
            result_ips(&v03),
            vec!["10.2.0.7".to_string(), "fd00::7".to_string()]
        );
        assert!(result_ips(&Value::Null).is_empty());
    }

    #[test]
    fn plugin_error_message() {
        let e = CniError::Plugin {
            plugin: "bridge".into(),
            command: "DEL",
            code: Some(11),
            msg: "boom".into(),
            details: "more".into(),
            stderr: String::new(),
        };
        assert_eq!(e.to_string(), "bridge: DEL: boom (code 11): more");
    }

    /// DEL runs every plugin, in reverse order, and keeps every plugin's error.
    #[test]
    fn del_keeps_every_plugins_error() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("sandboxd-cni-del-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, code) in [("first", 11), ("second", 12), ("fine", 0)] {
            let p = dir.join(name);
            let body = if code == 0 {
                "#!/bin/sh\nexit 0\n".to_string()
            } else {
                format!("#!/bin/sh\necho '{{\"cniVersion\":\"1.0.0\",\"code\":{code},\"msg\":\"{name} failed\"}}'\nexit 1\n")
            };
            std::fs::write(&p, body).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let conf = br#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"first"},{"type":"fine"},{"type":"second"}]}"#;
        let list = NetworkList::parse("t.conflist", conf, false).unwrap();
        let cni = Cni {
            bin_dirs: vec![dir.clone()],
            timeout: Duration::from_secs(10),
            cache_dir: dir.join("cache"),
        };
        let att = Attachment {
            container_id: "abc".into(),
            netns: None,
            ifname: "eth0".into(),
            pod_name: "p".into(),
            pod_namespace: "ns".into(),
            pod_uid: "u".into(),
            port_mappings: Vec::new(),
        };
        let e = cni.del(&list, &att, None).unwrap_err();
        let _ = std::fs::remove_dir_all(&dir);
        let CniError::Several(es) = &e else {
            panic!("{e}")
        };
        assert_eq!(es.len(), 2, "{e}");
        let text = e.to_string();
        let (second, first) = (text.find("second failed"), text.find("first failed"));
        assert!(
            second.is_some() && first.is_some() && second < first,
            "{text}"
        );
    }
}
