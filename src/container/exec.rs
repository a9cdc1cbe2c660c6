//! ExecSync: a command in a running container, its output capped, killed and reaped past
//! its timeout.

use std::time::Duration;

use super::status::require;
use crate::error::{Error, Result};
use crate::model::container::{ContainerState, ExecResult};
use crate::runtime::Runtime;

/// Longest ExecSync output kept per stream (kubelet's own limit is 16 MiB).
/// Most ExecSync output kept, stdout and stderr together: the answer must fit in a gRPC
/// message of 16 MiB (kubelet's limit, and ours), with room for its other fields.
pub const MAX_EXEC_OUTPUT: usize = (16 << 20) - 4096;

/// ExecSync: runs `cmd` in the container with the runtime's `exec` and returns its output
/// and exit code. Each stream keeps at most [`MAX_EXEC_OUTPUT`] bytes (the rest is read and
/// dropped while the command runs, so neither the command nor our memory grows with its
/// output). Past `timeout` (zero = none) the command, its process group and session (what it
/// started) are killed and, where the container's init reaps them, gone before the call
/// fails with `DeadlineExceeded`.
pub(crate) fn exec_sync(
    rt: &Runtime,
    id: &str,
    cmd: &[String],
    timeout: Duration,
    cancel: Option<std::sync::Arc<crate::process::Cancel>>,
) -> Result<ExecResult> {
    let entry = rt.container_entry(id)?;
    let rec = require(rt, &entry, &[ContainerState::Running], |r| {
        format!("container {} is not running ({:?})", r.id, r.state)
    })?;
    if cmd.is_empty() {
        return Err(Error::InvalidArgument("cmd must not be empty".into()));
    }
    let _slot = rt.exec_slots.take(
        &rec.id,
        rt.cfg.exec_sync_max_per_container,
        rt.cfg.exec_sync_max,
    )?;
    let runtime = rt.handler(&rec.runtime_handler)?;
    let pid_file = rec
        .dir
        .join(format!("exec-{}.pid", &crate::validate::new_id()[..12]));
    let (c, within) =
        runtime.exec_command(&rec.id, &rec.dir, &pid_file, None, cmd, !timeout.is_zero());
    let limits = crate::process::Limits {
        timeout: (!timeout.is_zero()).then_some(timeout),
        stdout_cap: MAX_EXEC_OUTPUT,
        stderr_cap: MAX_EXEC_OUTPUT,
        // A background process the command left behind may hold the pipes open forever:
        // take what arrives shortly after the exit, never wait for that process.
        drain: Duration::from_secs(1),
        budget: Some(rt.exec_output.clone()),
        cancel,
        within,
    };
    let mut killed: Vec<i32> = Vec::new();
    let inside = runtime.family.exec_pid_inside();
    let internal_pid_file = pid_file.with_extension("internal.pid");
    let r = crate::process::run_with(c, b"", &limits, |helper| {
        // The runtime may not have recorded the process yet (the deadline can come before
        // `runtime exec` is done: 1.5 s under emulation): wait for its pid, or for the
        // helper to be gone, before killing anything — killing only the helper would leave
        // the process running.
        let files: &[&std::path::Path] = if inside {
            &[&pid_file, &internal_pid_file]
        } else {
            &[&pid_file]
        };
        wait_pid_files(files, helper, EXEC_PID_WAIT);
        // Inside a sandbox (runsc) the process is out of a host signal's reach: the runtime
        // kills it there, by its pid inside.
        if let Some(ipid) = inside
            .then(|| crate::process::read_pid(&internal_pid_file))
            .flatten()
        {
            if let Err(e) = runtime.kill_process(&rec.id, ipid, "KILL", &rec.files().runtime_log) {
                tracing::warn!(container_id = %rec.id, pid = ipid, error = %e, "could not kill the timed-out exec inside the sandbox");
            }
        }
        // The exec'd process and what it started first (killing only the runtime's helper
        // would orphan them inside the container).
        if let Some(pid) = crate::process::read_pid(&pid_file).filter(|p| *p > 1) {
            killed = crate::process::group_members(pid);
            killed.push(pid);
            crate::process::kill_tree(pid);
        }
    });
    let _ = std::fs::remove_file(&internal_pid_file);
    let _ = std::fs::remove_file(&pid_file);
    let _ = std::fs::remove_file(pid_file.with_extension("process.json"));
    match r {
        Ok(out) => {
            if out.stdout_dropped + out.stderr_dropped > 0 {
                tracing::info!(container_id = %rec.id, dropped = out.stdout_dropped + out.stderr_dropped, "ExecSync output over its cap (or the daemon's budget) was dropped");
            }
            let (stdout, stderr) = fit_output(out.stdout, out.stderr);
            Ok(ExecResult {
                stdout,
                stderr,
                exit_code: crate::process::exit_code(&out.status),
            })
        }
        Err(crate::process::RunError::Timeout { .. }) => {
            // Killed processes are reaped by their parent (the helper for the command
            // itself, the container's init for orphans): wait until they are gone.
            let left = crate::process::wait_reaped(&killed, Duration::from_secs(2));
            if !left.is_empty() {
                tracing::warn!(container_id = %rec.id, pids = ?left, "killed exec processes are not reaped yet (the container's init does not reap)");
            }
            Err(Error::DeadlineExceeded(format!(
                "command {cmd:?} in container {} timed out after {timeout:?} and was killed",
                rec.id
            )))
        }
        Err(crate::process::RunError::Cancelled { .. }) => {
            crate::process::wait_reaped(&killed, Duration::from_secs(2));
            tracing::info!(container_id = %rec.id, "ExecSync's caller went away: its command was killed");
            Err(Error::DeadlineExceeded(format!(
                "command {cmd:?} in container {}: the caller went away; killed",
                rec.id
            )))
        }
        Err(e) => Err(Error::step("exec in container", &rec.id, e)),
    }
}

/// How long a timed-out ExecSync waits for the runtime to record the process it started.
const EXEC_PID_WAIT: Duration = Duration::from_secs(10);

/// Waits until every file in `files` holds a pid, or `helper` (the exec's monitor, our
/// child) has ended, or `limit` passed.
fn wait_pid_files(files: &[&std::path::Path], helper: i32, limit: Duration) {
    let deadline = std::time::Instant::now() + limit;
    while !files.iter().all(|f| crate::process::read_pid(f).is_some())
        && crate::process::alive(helper)
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Trims ExecSync output to [`MAX_EXEC_OUTPUT`] in all: stderr keeps up to 1 MiB first (it
/// usually says why), stdout what is left, then stderr the rest.
fn fit_output(mut stdout: Vec<u8>, mut stderr: Vec<u8>) -> (Vec<u8>, Vec<u8>) {
    if stdout.len() + stderr.len() <= MAX_EXEC_OUTPUT {
        return (stdout, stderr);
    }
    let err_first = stderr.len().min(1 << 20);
    stdout.truncate(MAX_EXEC_OUTPUT - err_first);
    stderr.truncate(MAX_EXEC_OUTPUT - stdout.len());
    (stdout, stderr)
}
