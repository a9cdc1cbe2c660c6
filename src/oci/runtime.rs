//! Runtime driver: `create` (through the monitor), `start`, `state`, `kill`, `delete`, each a
//! process call with `--root` and a json `--log`, so failures carry the runtime's own message.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::Deserialize;

use crate::process::{self, RunError};

/// A runtime call failed; `msg` is the runtime's (or the monitor's) own message.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("{runtime} {op} {id}: {msg}")]
    Failed {
        runtime: String,
        op: &'static str,
        id: String,
        msg: String,
    },
    #[error("{runtime} {op}: {source}")]
    Run {
        runtime: String,
        op: &'static str,
        #[source]
        source: RunError,
    },
}

/// The files one container's monitor reads and writes.
#[derive(Debug, Clone)]
pub struct ContainerFiles {
    pub pid_file: PathBuf,
    pub exit_file: PathBuf,
    pub monitor_pid_file: PathBuf,
    pub runtime_log: PathBuf,
    /// CRI log of the container's stdout/stderr, if it has one.
    pub log_path: Option<PathBuf>,
    /// The monitor's attach socket, if the container gets one.
    pub attach_socket: Option<PathBuf>,
    /// The container's stdin: `none`, `open` or `once` (see the monitor).
    pub stdin: &'static str,
    /// Where the runtime hands over the terminal of a container that has one.
    pub console_socket: Option<PathBuf>,
}

impl ContainerFiles {
    /// The standard layout inside a container's (or the infra's) own dir.
    pub fn in_dir(dir: &Path, log_path: Option<PathBuf>) -> Self {
        ContainerFiles {
            pid_file: dir.join("pid"),
            exit_file: dir.join("exit"),
            monitor_pid_file: dir.join("monitor.pid"),
            runtime_log: dir.join("runtime.log"),
            log_path,
            attach_socket: None,
            stdin: "none",
            console_socket: None,
        }
    }

    /// The container's exit as the monitor recorded it, if it has exited.
    pub fn exit(&self) -> Option<ExitInfo> {
        let data = std::fs::read(&self.exit_file).ok()?;
        serde_json::from_slice(&data).ok()
    }

    /// The monitor's pid, if recorded.
    pub fn monitor_pid(&self) -> Option<i32> {
        process::read_pid(&self.monitor_pid_file)
    }
}

/// The exit file's content.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct ExitInfo {
    pub exit_code: i32,
    #[serde(default)]
    pub signal: Option<i32>,
    #[serde(default)]
    pub exited_at: String,
}

/// `runtime state` output, the fields we use.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct RuntimeState {
    pub status: String,
    #[serde(default)]
    pub pid: i32,
}

/// One configured runtime handler.
#[derive(Debug, Clone)]
pub struct OciRuntime {
    pub name: String,
    pub path: PathBuf,
    pub root: PathBuf,
    pub monitor: PathBuf,
    pub timeout: Duration,
}

impl OciRuntime {
    fn base(&self, log: Option<&Path>) -> Command {
        let mut c = Command::new(&self.path);
        c.arg("--root").arg(&self.root);
        if let Some(log) = log {
            c.arg("--log").arg(log).arg("--log-format").arg("json");
        }
        c
    }

    fn call(
        &self,
        op: &'static str,
        id: &str,
        mut cmd: Command,
        log: Option<&Path>,
    ) -> Result<Vec<u8>, RuntimeError> {
        cmd.env_remove("NOTIFY_SOCKET");
        let started = std::time::Instant::now();
        let out = process::run(cmd, b"", self.timeout).map_err(|source| RuntimeError::Run {
            runtime: self.name.clone(),
            op,
            source,
        })?;
        tracing::debug!(
            container_id = id,
            runtime = %self.name,
            op,
            elapsed_ms = started.elapsed().as_secs_f64() * 1000.0,
            status = %out.status,
            "runtime call returned"
        );
        if out.status.success() {
            return Ok(out.stdout);
        }
        let mut msg = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if let Some(log_msg) = log.and_then(last_log_error) {
            if msg.is_empty() || !msg.contains(&log_msg) {
                msg = if msg.is_empty() {
                    log_msg
                } else {
                    format!("{log_msg} ({msg})")
                };
            }
        }
        if msg.is_empty() {
            msg = format!("exited with {}", out.status);
        }
        Err(RuntimeError::Failed {
            runtime: self.name.clone(),
            op,
            id: id.to_string(),
            msg,
        })
    }

    /// Creates the container under a new monitor; returns the container's pid once the
    /// runtime's `create` has finished.
    pub fn create(
        &self,
        id: &str,
        bundle: &Path,
        files: &ContainerFiles,
    ) -> Result<i32, RuntimeError> {
        let mut c = Command::new(&self.monitor);
        c.arg("--runtime")
            .arg(&self.path)
            .arg("--runtime-root")
            .arg(&self.root)
            .arg("--id")
            .arg(id)
            .arg("--bundle")
            .arg(bundle)
            .arg("--pid-file")
            .arg(&files.pid_file)
            .arg("--exit-file")
            .arg(&files.exit_file)
            .arg("--runtime-log")
            .arg(&files.runtime_log)
            .arg("--monitor-pid-file")
            .arg(&files.monitor_pid_file);
        if let Some(l) = &files.log_path {
            c.arg("--log-path").arg(l);
        }
        if let Some(a) = &files.attach_socket {
            c.arg("--attach-socket").arg(a);
        }
        if files.stdin != "none" {
            c.arg("--stdin").arg(files.stdin);
        }
        if let Some(s) = &files.console_socket {
            c.arg("--console-socket").arg(s);
        }
        let out = self.call("create", id, c, Some(&files.runtime_log))?;
        let text = String::from_utf8_lossy(&out);
        text.trim()
            .parse::<i32>()
            .map_err(|_| RuntimeError::Failed {
                runtime: self.name.clone(),
                op: "create",
                id: id.to_string(),
                msg: format!("monitor printed {text:?} instead of a pid"),
            })
    }

    pub fn start(&self, id: &str, log: &Path) -> Result<(), RuntimeError> {
        let mut c = self.base(Some(log));
        c.arg("start").arg(id);
        self.call("start", id, c, Some(log)).map(drop)
    }

    /// The runtime's view of the container; `None` if the runtime does not know it.
    pub fn state(&self, id: &str) -> Result<Option<RuntimeState>, RuntimeError> {
        let mut c = self.base(None);
        c.arg("state").arg(id);
        match self.call("state", id, c, None) {
            Ok(out) => serde_json::from_slice(&out)
                .map(Some)
                .map_err(|e| RuntimeError::Failed {
                    runtime: self.name.clone(),
                    op: "state",
                    id: id.to_string(),
                    msg: format!("unparsable state: {e}"),
                }),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Sends `signal` (e.g. "KILL", "TERM") to the container's init, or with `all` to every
    /// process in it (a container sharing a PID namespace is not killed with its init); a
    /// container that is gone or stopped is success.
    pub fn kill(&self, id: &str, signal: &str, all: bool, log: &Path) -> Result<(), RuntimeError> {
        let mut c = self.base(Some(log));
        c.arg("kill");
        if all {
            c.arg("--all");
        }
        c.arg(id).arg(signal);
        match self.call("kill", id, c, Some(log)) {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) || is_not_running(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `update --resources FILE`: applies new cgroup limits (an OCI `LinuxResources` JSON).
    pub fn update(&self, id: &str, resources: &Path, log: &Path) -> Result<(), RuntimeError> {
        let mut c = self.base(Some(log));
        c.arg("update").arg("--resources").arg(resources).arg(id);
        self.call("update", id, c, Some(log)).map(drop)
    }

    /// The command that runs `cmd` in container `id`: `sandboxd-monitor exec`, which runs the
    /// runtime's `exec --detach` (so the process gets our stdio itself, with no copier in
    /// between that would wait for pipes a background child keeps open), is the subreaper
    /// that reaps it, and exits with its status. With `console`, the process gets a terminal
    /// handed to that socket.
    pub fn exec_command(
        &self,
        id: &str,
        pid_file: &Path,
        console: Option<&Path>,
        cmd: &[String],
    ) -> Command {
        let mut c = Command::new(&self.monitor);
        c.arg("exec")
            .arg("--runtime")
            .arg(&self.path)
            .arg("--runtime-root")
            .arg(&self.root)
            .arg("--id")
            .arg(id)
            .arg("--pid-file")
            .arg(pid_file);
        if let Some(sock) = console {
            c.arg("--console-socket").arg(sock);
        }
        c.arg("--").args(cmd).env_remove("NOTIFY_SOCKET");
        c
    }

    /// `delete --force`; a container the runtime does not know is success.
    pub fn delete(&self, id: &str, log: &Path) -> Result<(), RuntimeError> {
        let mut c = self.base(Some(log));
        c.arg("delete").arg("--force").arg(id);
        match self.call("delete", id, c, Some(log)) {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn is_not_found(e: &RuntimeError) -> bool {
    match e {
        RuntimeError::Failed { msg, .. } => {
            let m = msg.to_ascii_lowercase();
            m.contains("does not exist") || m.contains("not found") || m.contains("no such file")
        }
        RuntimeError::Run { .. } => false,
    }
}

fn is_not_running(e: &RuntimeError) -> bool {
    match e {
        RuntimeError::Failed { msg, .. } => {
            let m = msg.to_ascii_lowercase();
            m.contains("not running")
                || m.contains("process already finished")
                || m.contains("container stopped")
        }
        RuntimeError::Run { .. } => false,
    }
}

/// The `msg` of the last error-level line of a json runtime log.
fn last_log_error(path: &Path) -> Option<String> {
    let data = std::fs::read_to_string(path).ok()?;
    data.lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| {
            matches!(
                v.get("level").and_then(|l| l.as_str()),
                Some("error" | "fatal")
            )
        })
        .and_then(|v| v.get("msg").and_then(|m| m.as_str()).map(str::to_string))
}
