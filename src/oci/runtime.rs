//! Runtime driver: `create` (through the monitor), `start`, `state`, `kill`, `delete`, each a
//! process call with `--root` and a json `--log`, so failures carry the runtime's own message.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use sandboxd_shim_common::cli::{ExecArgs, MonitorArgs};
use sandboxd_shim_common::runtime::{self, last_log_error, RuntimeState};

use super::files::ContainerFiles;
use super::mount_ns::RuntimeMountNs;
use crate::process::{self, RunError, Within};

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
    #[error("runtime handler {runtime} ({binary}): {op} of {id} did not finish within {limit:?}; it was killed with everything it started{}", if stderr.is_empty() { String::new() } else { format!(" (its stderr: {stderr})") })]
    TimedOut {
        runtime: String,
        binary: String,
        op: &'static str,
        id: String,
        limit: Duration,
        stderr: String,
    },
}

/// What `events --stats` says of a container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeStats {
    pub cpu_nanos: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub tasks: Option<u64>,
}

/// One configured runtime handler.
#[derive(Debug, Clone)]
pub struct OciRuntime {
    pub name: String,
    /// What kind of runtime it is (`handlers`): what the verbs must do differently for it.
    pub family: &'static dyn crate::handlers::Family,
    pub path: PathBuf,
    /// Flags before every subcommand (`runtime_args` of the handler).
    pub args: Vec<String>,
    pub root: PathBuf,
    pub monitor: PathBuf,
    pub timeout: Duration,
    /// The mount namespace the runtime's processes run in (see [`RuntimeMountNs`]); `None`:
    /// the daemon's own.
    pub mount_ns: Option<Arc<RuntimeMountNs>>,
}

impl OciRuntime {
    /// A call on an existing container: spawned in the runtime's mount namespace, umask 077
    /// (what the runtime writes under the state root is root's alone).
    fn base(&self, log: Option<&Path>) -> (Command, Within) {
        let (c, within) = self.base_in_host_ns(log);
        let mount_ns = self.mount_ns.as_ref().and_then(|ns| ns.current());
        (c, Within { mount_ns, ..within })
    }

    /// A call that must see the host's mounts as they are (CRIU's checkpoint).
    fn base_in_host_ns(&self, log: Option<&Path>) -> (Command, Within) {
        let mut c = runtime::command(&self.path, &self.args, &self.root);
        if let Some(log) = log {
            c.arg("--log").arg(log).arg("--log-format").arg("json");
        }
        (c, Within::private())
    }

    fn call(
        &self,
        op: &'static str,
        id: &str,
        (cmd, within): (Command, Within),
        log: Option<&Path>,
    ) -> Result<Vec<u8>, RuntimeError> {
        self.call_killing(op, id, cmd, Some(within), log, |_| {})
    }

    /// [`call`](Self::call) that also runs `on_timeout` (with the child's pid) before the
    /// child's process group is killed at the time limit; spawned `within` (`None`: by the
    /// calling thread).
    fn call_killing(
        &self,
        op: &'static str,
        id: &str,
        mut cmd: Command,
        within: Option<Within>,
        log: Option<&Path>,
        on_timeout: impl FnOnce(i32),
    ) -> Result<Vec<u8>, RuntimeError> {
        cmd.env_remove("NOTIFY_SOCKET");
        let _span = tracing::info_span!("oci_runtime", op, runtime = %self.name, container_id = id)
            .entered();
        let started = std::time::Instant::now();
        let limits = process::Limits {
            within,
            ..process::Limits::helper(self.timeout)
        };
        let out =
            process::run_with(cmd, b"", &limits, on_timeout).map_err(|source| match source {
                RunError::Timeout { limit, stderr, .. } => RuntimeError::TimedOut {
                    runtime: self.name.clone(),
                    binary: self.path.display().to_string(),
                    op,
                    id: id.to_string(),
                    limit,
                    stderr,
                },
                source => RuntimeError::Run {
                    runtime: self.name.clone(),
                    op,
                    source,
                },
            })?;
        // The op, runtime and container are the span's.
        tracing::debug!(
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
        // The small namespace `create` runs in.
        let ns = self
            .mount_ns
            .as_ref()
            .and_then(|m| m.for_create(id, bundle));
        // The monitor opens it by our fd's /proc path (no fd to inherit, so the spawn needs no
        // fork of the daemon); we hold it until the call returns.
        let ns_path = ns.as_ref().map(|fd| {
            PathBuf::from(format!(
                "/proc/{}/fd/{}",
                std::process::id(),
                fd.as_raw_fd()
            ))
        });
        let mut c = Command::new(&self.monitor);
        c.args(
            MonitorArgs {
                runtime: self.path.clone(),
                runtime_args: self.args.clone(),
                runtime_root: self.root.clone(),
                id: id.to_string(),
                bundle: bundle.to_path_buf(),
                pid_file: files.pid_file.clone(),
                exit_file: files.exit_file.clone(),
                runtime_log: files.runtime_log.clone(),
                monitor_pid_file: files.monitor_pid_file.clone(),
                log_path: files.log_path.clone(),
                attach_socket: files.attach_socket.clone(),
                stdin: files.stdin,
                console_socket: files.console_socket.clone(),
                runtime_mount_ns: ns_path,
            }
            .to_args(),
        );
        // Past the time limit: the monitor (it leads its own session and process group, with
        // the runtime and the runtime's children in it) is killed by the pid it wrote first,
        // then whatever the runtime made of the container is force-deleted.
        let monitor_pid = files.monitor_pid_file.clone();
        let out = self.call_killing("create", id, c, None, Some(&files.runtime_log), |_| {
            if let Some(pid) = process::read_pid(&monitor_pid).filter(|p| *p > 1) {
                process::kill_tree(pid);
            }
        });
        drop(ns);
        let out = match out {
            Ok(out) => out,
            Err(e) => {
                if matches!(e, RuntimeError::TimedOut { .. }) {
                    if let Err(d) = self.delete(id, &files.runtime_log) {
                        tracing::warn!(container_id = id, error = %d, "cannot delete the container of a timed-out create");
                    }
                }
                return Err(e);
            }
        };
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

    /// `create` without a monitor, the container's stdio on /dev/null: the start-up probe's
    /// trial container ([`delete`](Self::delete) removes it). Fails with the runtime's own
    /// message.
    pub fn create_detached(&self, id: &str, bundle: &Path, log: &Path) -> Result<(), RuntimeError> {
        // The umask is left alone, as the monitor leaves it for `create`: the cgroup dirs the
        // runtime makes (the pods' parent among them) must stay readable to containers.
        let mut c = runtime::command(&self.path, &self.args, &self.root);
        c.arg("--log").arg(log).arg("--log-format").arg("json");
        c.arg("create").arg("--bundle").arg(bundle).arg(id);
        c.env_remove("NOTIFY_SOCKET");
        // A file, not a pipe: the container's init would hold a pipe open past the call.
        let stderr_path = bundle.join("create.stderr");
        let stderr = std::fs::File::create(&stderr_path).ok().map(Into::into);
        let failed = |msg: String| RuntimeError::Failed {
            runtime: self.name.clone(),
            op: "create",
            id: id.to_string(),
            msg,
        };
        // From the spawner thread: no signal blocked in the container's init.
        let within = Within::default();
        match process::run_with_stdio(c, [None, None, stderr], self.timeout, Some(&within)) {
            Ok(st) if st.success() => Ok(()),
            Ok(st) => {
                // The runtime's stderr is read only as far as an error message goes.
                let mut text = Vec::new();
                if let Ok(f) = std::fs::File::open(&stderr_path) {
                    let _ =
                        std::io::Read::read_to_end(&mut std::io::Read::take(f, 4096), &mut text);
                }
                let text = String::from_utf8_lossy(&text);
                let msg = last_log_error(log)
                    .or_else(|| Some(text.trim().to_string()).filter(|t| !t.is_empty()))
                    .unwrap_or_else(|| format!("exited with {st}"));
                Err(failed(msg))
            }
            Err(RunError::Timeout { limit, stderr, .. }) => Err(RuntimeError::TimedOut {
                runtime: self.name.clone(),
                binary: self.path.display().to_string(),
                op: "create",
                id: id.to_string(),
                limit,
                stderr,
            }),
            Err(source) => Err(RuntimeError::Run {
                runtime: self.name.clone(),
                op: "create",
                source,
            }),
        }
    }

    pub fn start(&self, id: &str, log: &Path) -> Result<(), RuntimeError> {
        let (mut c, within) = self.base(Some(log));
        c.arg("start").arg(id);
        self.call("start", id, (c, within), Some(log)).map(drop)
    }

    /// `start` run with the container's stdio (a runtime that gives a container inside its
    /// sandbox the stdio of the `start` call: runsc). Errors come from the runtime's log.
    pub fn start_with_stdio(
        &self,
        id: &str,
        log: &Path,
        stdio: [Option<std::os::fd::OwnedFd>; 3],
    ) -> Result<(), RuntimeError> {
        let (mut c, within) = self.base(Some(log));
        c.arg("start").arg(id).env_remove("NOTIFY_SOCKET");
        let started = std::time::Instant::now();
        let status =
            process::run_with_stdio(c, stdio, self.timeout, Some(&within)).map_err(|source| {
                match source {
                    RunError::Timeout { limit, stderr, .. } => RuntimeError::TimedOut {
                        runtime: self.name.clone(),
                        binary: self.path.display().to_string(),
                        op: "start",
                        id: id.to_string(),
                        limit,
                        stderr,
                    },
                    source => RuntimeError::Run {
                        runtime: self.name.clone(),
                        op: "start",
                        source,
                    },
                }
            })?;
        tracing::debug!(container_id = id, runtime = %self.name, op = "start", elapsed_ms = started.elapsed().as_secs_f64() * 1000.0, %status, "runtime call returned");
        if status.success() {
            return Ok(());
        }
        Err(RuntimeError::Failed {
            runtime: self.name.clone(),
            op: "start",
            id: id.to_string(),
            msg: last_log_error(log).unwrap_or_else(|| format!("exited with {status}")),
        })
    }

    /// The runtime's view of the container; `None` if the runtime does not know it.
    pub fn state(&self, id: &str) -> Result<Option<RuntimeState>, RuntimeError> {
        let (mut c, within) = self.base(None);
        c.arg("state").arg(id);
        match self.call("state", id, (c, within), None) {
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
        let (mut c, within) = self.base(Some(log));
        c.arg("kill");
        if all {
            c.arg("--all");
        }
        c.arg(id).arg(signal);
        match self.call("kill", id, (c, within), Some(log)) {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) || is_not_running(&e) => Ok(()),
            // runsc cannot signal a created (never started) container; removing it is how it
            // is killed (runc signals its init instead).
            Err(e) if signal == "KILL" && is_created(&e) => self.delete(id, log),
            Err(e) => Err(e),
        }
    }

    /// Sends `signal` to one process of container `id`, by its pid inside the runtime's
    /// sandbox (`kill --pid`: an exec'd process of a sandboxed runtime); a process or
    /// container that is gone is success.
    pub fn kill_process(
        &self,
        id: &str,
        pid: i32,
        signal: &str,
        log: &Path,
    ) -> Result<(), RuntimeError> {
        let (mut c, within) = self.base(Some(log));
        c.arg("kill")
            .arg(format!("--pid={pid}"))
            .arg(id)
            .arg(signal);
        match self.call("kill", id, (c, within), Some(log)) {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) || is_not_running(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `update --resources FILE`: applies new cgroup limits (an OCI `LinuxResources` JSON).
    pub fn update(&self, id: &str, resources: &Path, log: &Path) -> Result<(), RuntimeError> {
        let (mut c, within) = self.base(Some(log));
        c.arg("update").arg("--resources").arg(resources).arg(id);
        self.call("update", id, (c, within), Some(log)).map(drop)
    }

    /// The command that runs `cmd` in container `id`: `sandboxd-monitor exec`, which runs the
    /// runtime's `exec --detach` (so the process gets our stdio itself, with no copier in
    /// between that would wait for pipes a background child keeps open), is the subreaper
    /// that reaps it, and exits with its status. With `console`, the process gets a terminal
    /// handed to that socket. `bounded`: the call ends within a time limit (ExecSync with a
    /// timeout: kubelet's probes), so it may run in the runtime's mount namespace, which it
    /// then holds that long; an open-ended session runs in the host's.
    ///
    /// The process is the container's own (its spec's `process`: user, groups, capabilities,
    /// env, cwd, no_new_privs, rlimits) with `cmd` as its args, written next to `pid_file`
    /// and passed whole (`exec --process`), as the peers do: runsc's exec would otherwise run
    /// as root. A bundle without a readable spec falls back to the runtime's defaults.
    pub fn exec_command(
        &self,
        id: &str,
        bundle: &Path,
        pid_file: &Path,
        console: Option<&Path>,
        cmd: &[String],
        bounded: bool,
    ) -> (Command, Option<Within>) {
        let process_file = pid_file.with_extension("process.json");
        let process_file = match exec_process(bundle, cmd, console.is_some()).and_then(|p| {
            crate::state::files::write_private(&process_file, p.to_string().as_bytes())
                .map_err(|e| e.to_string())
        }) {
            Ok(()) => Some(process_file),
            Err(e) => {
                tracing::warn!(container_id = %id, error = %e, "exec without the container's process spec");
                None
            }
        };
        let mut c = Command::new(&self.monitor);
        c.args(
            ExecArgs {
                runtime: self.path.clone(),
                runtime_args: self.args.clone(),
                runtime_root: self.root.clone(),
                id: id.to_string(),
                pid_file: pid_file.to_path_buf(),
                console_socket: console.map(Path::to_path_buf),
                process_file,
                internal_pid_file: self
                    .family
                    .exec_pid_inside()
                    .then(|| pid_file.with_extension("internal.pid")),
                cmd: cmd.to_vec(),
            }
            .to_args(),
        )
        .env_remove("NOTIFY_SOCKET");
        let within = self
            .mount_ns
            .as_ref()
            .filter(|_| bounded)
            .and_then(|ns| ns.current())
            .map(|ns| Within {
                umask: None,
                mount_ns: Some(ns),
            });
        (c, within)
    }

    /// `checkpoint`: CRIU dumps the running container's processes into `images` (`work` for
    /// CRIU's logs); with `leave_running` the container goes on running.
    pub fn checkpoint(
        &self,
        id: &str,
        images: &Path,
        work: &Path,
        leave_running: bool,
        log: &Path,
    ) -> Result<(), RuntimeError> {
        let (mut c, within) = self.base_in_host_ns(Some(log));
        c.arg("checkpoint")
            .arg("--image-path")
            .arg(images)
            .arg("--work-path")
            .arg(work);
        if leave_running {
            c.arg("--leave-running");
        }
        c.arg(id);
        self.call("checkpoint", id, (c, within), Some(log))
            .map(drop)
    }

    /// `events --stats`: the container's CPU (nanoseconds), memory (bytes) and task count as
    /// the runtime measures them — for runtimes whose containers leave their own cgroup
    /// empty (runsc runs every container inside its sandbox's).
    pub fn stats(&self, id: &str) -> Result<RuntimeStats, RuntimeError> {
        let (mut c, within) = self.base(None);
        c.arg("events").arg("--stats").arg(id);
        let out = self.call("events", id, (c, within), None)?;
        let v: serde_json::Value =
            serde_json::from_slice(&out).map_err(|e| RuntimeError::Failed {
                runtime: self.name.clone(),
                op: "events",
                id: id.to_string(),
                msg: format!("unparsable stats: {e}"),
            })?;
        let d = &v["data"];
        Ok(RuntimeStats {
            cpu_nanos: d["cpu"]["usage"]["total"].as_u64(),
            memory_bytes: d["memory"]["usage"]["usage"].as_u64(),
            tasks: d["pids"]["current"].as_u64(),
        })
    }

    /// `delete --force`; a container the runtime does not know is success.
    pub fn delete(&self, id: &str, log: &Path) -> Result<(), RuntimeError> {
        let (mut c, within) = self.base(Some(log));
        c.arg("delete").arg("--force").arg(id);
        match self.call("delete", id, (c, within), Some(log)) {
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
        RuntimeError::Run { .. } | RuntimeError::TimedOut { .. } => false,
    }
}

fn is_created(e: &RuntimeError) -> bool {
    matches!(e, RuntimeError::Failed { msg, .. } if msg.contains("in state created"))
}

fn is_not_running(e: &RuntimeError) -> bool {
    match e {
        RuntimeError::Failed { msg, .. } => {
            let m = msg.to_ascii_lowercase();
            m.contains("not running")
                || m.contains("process already finished")
                || m.contains("container stopped")
        }
        RuntimeError::Run { .. } | RuntimeError::TimedOut { .. } => false,
    }
}

/// The exec'd process: the container's spec's `process` with `cmd` as its args and a
/// terminal or not.
fn exec_process(bundle: &Path, cmd: &[String], tty: bool) -> Result<serde_json::Value, String> {
    let spec = super::spec::read_bundle(bundle)?;
    let mut p = spec
        .get("process")
        .cloned()
        .filter(serde_json::Value::is_object)
        .ok_or_else(|| format!("{}: no process", bundle.join("config.json").display()))?;
    p["args"] = serde_json::json!(cmd);
    p["terminal"] = serde_json::json!(tty);
    if let Some(o) = p.as_object_mut() {
        o.remove("consoleSize");
    }
    Ok(p)
}
