//! CNI config discovery as kubelet does it: `.conf`, `.conflist` and `.json` files in the conf
//! dir, sorted by name, the first valid one wins; invalid files are skipped with a warning
//! naming them. With no valid file, the embedded default network is used.

use std::path::Path;

use serde_json::{json, Map, Value};

use super::{Attachment, CniError, NetworkList};
use crate::config::DefaultNetwork;

/// CNI versions whose results we understand (Debian's plugins speak up to 1.0.0).
const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0"];

pub(super) fn plugin_type(p: &Value) -> &str {
    p.get("type").and_then(Value::as_str).unwrap_or("")
}

impl NetworkList {
    /// Parses a `.conflist` document or a single `.conf` plugin config.
    pub fn parse(source: &str, data: &[u8], single: bool) -> Result<Self, CniError> {
        let bad = |reason: String| CniError::BadConfig {
            file: source.to_string(),
            reason,
        };
        let v: Value = serde_json::from_slice(data).map_err(|e| bad(format!("not JSON: {e}")))?;
        let obj = v
            .as_object()
            .ok_or_else(|| bad("not a JSON object".into()))?;
        let name = obj
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| bad("missing \"name\"".into()))?
            .to_string();
        let cni_version = obj
            .get("cniVersion")
            .and_then(Value::as_str)
            .unwrap_or("0.3.1")
            .to_string();
        if !SUPPORTED_VERSIONS.contains(&cni_version.as_str()) {
            return Err(bad(format!(
                "cniVersion {cni_version:?} is not one of {SUPPORTED_VERSIONS:?}"
            )));
        }
        let plugins = if single {
            vec![v.clone()]
        } else {
            obj.get("plugins")
                .and_then(Value::as_array)
                .cloned()
                .ok_or_else(|| bad("missing \"plugins\" list".into()))?
        };
        if plugins.is_empty() {
            return Err(bad("\"plugins\" is empty".into()));
        }
        for (i, p) in plugins.iter().enumerate() {
            let t = plugin_type(p);
            if t.is_empty() {
                return Err(bad(format!("plugin {i} has no \"type\"")));
            }
            if t.contains('/') || t.starts_with('.') {
                return Err(bad(format!("plugin type {t:?} is not a plain file name")));
            }
        }
        Ok(NetworkList {
            name,
            cni_version,
            plugins,
            source: source.to_string(),
        })
    }

    pub(super) fn supports_prev_result_on_del(&self) -> bool {
        !self.cni_version.starts_with("0.3.")
    }

    /// The stdin of one plugin: its config plus `name`, `cniVersion`, `prevResult` and the
    /// `runtimeConfig` of the capabilities it declares.
    pub fn plugin_stdin(&self, plugin: &Value, prev: Option<&Value>, att: &Attachment) -> Value {
        let mut conf: Map<String, Value> = plugin.as_object().cloned().unwrap_or_default();
        conf.insert("name".into(), json!(self.name));
        conf.insert("cniVersion".into(), json!(self.cni_version));
        conf.remove("prevResult");
        if let Some(prev) = prev {
            conf.insert("prevResult".into(), prev.clone());
        }
        let caps = plugin.get("capabilities").and_then(Value::as_object);
        let mut runtime = Map::new();
        if caps
            .and_then(|c| c.get("portMappings"))
            .and_then(Value::as_bool)
            .unwrap_or(false)
        {
            runtime.insert("portMappings".into(), json!(att.port_mappings));
        }
        if !runtime.is_empty() {
            conf.insert("runtimeConfig".into(), Value::Object(runtime));
        }
        Value::Object(conf)
    }
}

/// The embedded default network: bridge (with host-local IPAM whose reservations live under
/// `ipam_dir`) + portmap, then loopback, which passes the chained result through.
pub fn embedded_default(net: &DefaultNetwork, ipam_dir: &Path) -> NetworkList {
    let plugins = vec![
        json!({
            "type": "bridge",
            "bridge": net.bridge,
            "isGateway": true,
            "ipMasq": net.ip_masq,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": net.subnet}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": ipam_dir,
            }
        }),
        json!({"type": "portmap", "capabilities": {"portMappings": true}}),
        json!({"type": "loopback"}),
    ];
    NetworkList {
        name: net.name.clone(),
        cni_version: "1.0.0".into(),
        plugins,
        source: "embedded".into(),
    }
}

/// Picks the network: the first valid config file in `dir` (sorted by name). `Ok(None)` when
/// the dir holds no candidate file at all (the caller then uses the embedded default); an
/// error naming every file when candidates exist but none is valid, so a broken config is
/// reported instead of silently replaced.
pub fn load(dir: &Path) -> Result<Option<NetworkList>, CniError> {
    let mut files: Vec<_> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("conf" | "conflist" | "json")
                )
            })
            .collect(),
        Err(_) => return Ok(None),
    };
    files.sort();
    let mut reasons = Vec::new();
    for path in &files {
        let single = path.extension().and_then(|e| e.to_str()) != Some("conflist");
        let parsed = std::fs::read(path)
            .map_err(|e| CniError::BadConfig {
                file: path.display().to_string(),
                reason: e.to_string(),
            })
            .and_then(|data| NetworkList::parse(&path.display().to_string(), &data, single));
        match parsed {
            Ok(list) => return Ok(Some(list)),
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "skipping invalid CNI config");
                reasons.push(e.to_string());
            }
        }
    }
    if files.is_empty() {
        Ok(None)
    } else {
        Err(CniError::BadConfig {
            file: dir.display().to_string(),
            reason: format!("no valid network config: {}", reasons.join("; ")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn att() -> Attachment {
        Attachment {
            container_id: "c".into(),
            netns: None,
            ifname: "eth0".into(),
            pod_name: "p".into(),
            pod_namespace: "n".into(),
            pod_uid: "u".into(),
            port_mappings: vec![super::super::PortMapping {
                host_port: 8080,
                container_port: 80,
                protocol: "tcp".into(),
                host_ip: String::new(),
            }],
        }
    }

    #[test]
    fn discovery_order_and_skips() {
        let dir = std::env::temp_dir().join(format!("sandboxd-cniconf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("00-bad.conflist"), b"{not json").unwrap();
        std::fs::write(
            dir.join("05-notype.conf"),
            br#"{"cniVersion":"0.4.0","name":"x"}"#,
        )
        .unwrap();
        std::fs::write(
            dir.join("07-ignored.txt"),
            br#"{"cniVersion":"0.4.0","name":"t","type":"bridge"}"#,
        )
        .unwrap();
        std::fs::write(
            dir.join("10-good.conf"),
            br#"{"cniVersion":"0.4.0","name":"good","type":"bridge"}"#,
        )
        .unwrap();
        std::fs::write(
            dir.join("20-later.conflist"),
            br#"{"cniVersion":"1.0.0","name":"later","plugins":[{"type":"bridge"}]}"#,
        )
        .unwrap();
        let l = load(&dir).unwrap().unwrap();
        assert_eq!(l.name, "good");
        assert_eq!(l.plugins.len(), 1);
        std::fs::remove_file(dir.join("10-good.conf")).unwrap();
        std::fs::remove_file(dir.join("20-later.conflist")).unwrap();
        let e = load(&dir).unwrap_err().to_string();
        assert!(
            e.contains("00-bad.conflist") && e.contains("05-notype.conf"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(load(&dir).unwrap().is_none());
    }

    #[test]
    fn rejects_bad_lists() {
        for doc in [
            r#"{"cniVersion":"1.0.0","name":"x","plugins":[]}"#,
            r#"{"cniVersion":"1.0.0","plugins":[{"type":"bridge"}]}"#,
            r#"{"cniVersion":"9.9.9","name":"x","plugins":[{"type":"bridge"}]}"#,
            r#"{"cniVersion":"1.0.0","name":"x","plugins":[{"type":"../../bin/sh"}]}"#,
        ] {
            assert!(
                NetworkList::parse("t", doc.as_bytes(), false).is_err(),
                "{doc}"
            );
        }
    }

    #[test]
    fn stdin_has_chaining_and_capabilities() {
        let l = embedded_default(&DefaultNetwork::default(), Path::new("/x"));
        let prev = json!({"cniVersion":"1.0.0","ips":[]});
        let s = l.plugin_stdin(&l.plugins[1], Some(&prev), &att());
        assert_eq!(s["name"], json!("sandboxd-default"));
        assert_eq!(s["prevResult"], prev);
        assert_eq!(
            s["runtimeConfig"]["portMappings"][0]["hostPort"],
            json!(8080)
        );
        let s0 = l.plugin_stdin(&l.plugins[0], None, &att());
        assert!(s0.get("runtimeConfig").is_none());
        assert!(s0.get("prevResult").is_none());
    }
}
