//! Executes one CNI plugin with the spec's environment and parses its result or error.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::{config::plugin_type, Attachment, Cni, CniError};

/// Finds the plugin binary named `typ` in the first bin dir that has it.
pub fn find_plugin(dirs: &[PathBuf], typ: &str) -> Result<PathBuf, CniError> {
    if !typ.is_empty() && !typ.contains('/') {
        for d in dirs {
            let p = d.join(typ);
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    Err(CniError::PluginNotFound {
        plugin: typ.to_string(),
        dirs: join_dirs(dirs),
    })
}

fn join_dirs(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(":")
}

/// Runs `command` (ADD or DEL) of one plugin; returns its parsed stdout (ADD's result).
pub(super) fn invoke(
    cni: &Cni,
    plugin: &Value,
    command: &'static str,
    conf: &Value,
    att: &Attachment,
) -> Result<Value, CniError> {
    let typ = plugin_type(plugin);
    let _span = tracing::info_span!("cni", command, plugin = typ, container_id = %att.container_id)
        .entered();
    let bin = find_plugin(&cni.bin_dirs, typ)?;
    let mut cmd = Command::new(&bin);
    cmd.env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", &att.container_id)
        .env("CNI_NETNS", att.netns.as_deref().unwrap_or(Path::new("")))
        .env("CNI_IFNAME", &att.ifname)
        .env("CNI_PATH", join_dirs(&cni.bin_dirs))
        .env("CNI_ARGS", att.cni_args());
    let stdin = serde_json::to_vec(conf).unwrap_or_default();
    let started = std::time::Instant::now();
    let out = crate::process::run(cmd, &stdin, cni.timeout).map_err(|source| CniError::Run {
        plugin: typ.to_string(),
        command,
        source,
    })?;
    tracing::debug!(
        container_id = %att.container_id,
        plugin = typ,
        command,
        elapsed_ms = started.elapsed().as_secs_f64() * 1000.0,
        status = %out.status,
        "CNI plugin returned"
    );
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if !out.status.success() {
        let parsed: Option<Value> = serde_json::from_slice(&out.stdout).ok();
        let field = |k: &str| {
            parsed
                .as_ref()
                .and_then(|v| v.get(k))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let mut msg = field("msg");
        if msg.is_empty() {
            msg = match String::from_utf8_lossy(&out.stdout).trim() {
                "" => format!("exited with {}", out.status),
                s => s.to_string(),
            };
        }
        return Err(CniError::Plugin {
            plugin: typ.to_string(),
            command,
            code: parsed
                .as_ref()
                .and_then(|v| v.get("code"))
                .and_then(Value::as_u64),
            msg,
            details: field("details"),
            stderr,
        });
    }
    if command != "ADD" || out.stdout.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&out.stdout).map_err(|e| CniError::Plugin {
        plugin: typ.to_string(),
        command,
        code: None,
        msg: format!("result is not JSON: {e}"),
        details: String::new(),
        stderr,
    })
}
