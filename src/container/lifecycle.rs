//! Start, Stop, Remove, status refresh, ExecSync and log reopening. Stop and Remove are
//! idempotent, as the CRI asks; the exit is learnt from the monitor's exit file.

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::create::update;
use super::*;
use crate::error::{Error, HostError, Result};
use crate::sandbox::now_nanos;
use crate::{lock, ContainerEntry, Runtime};

/// Longest ExecSync output kept per stream (kubelet's own limit is 16 MiB).
const MAX_EXEC_OUTPUT: usize = 16 << 20;

pub(crate) fn start(rt: &Runtime, id: &str) -> Result<()> {
    let entry = rt.container_entry(id)?;
    let _op = lock(&entry.op);
    let rec = require(&entry, &[ContainerState::Created], |r| {
        format!(
            "container {} is {:?}, only a created container can be started",
            r.id, r.state
        )
    })?;
    let runtime = rt.handler(&rec.runtime_handler)?;
    // Taken before the call: the process may run (and exit) before `start` returns.
    let started = now_nanos();
    if let Err(e) = runtime.start(&rec.id, &rec.files().runtime_log) {
        let msg = e.to_string();
        update(&entry, |r| {
            r.state = ContainerState::Exited;
            r.exit_code = 128;
            r.reason = "StartError".into();
            r.message = msg;
            r.finished_at = now_nanos();
        })?;
        return Err(Error::step("start container", &rec.id, e));
    }
    update(&entry, |r| {
        r.state = ContainerState::Running;
        r.started_at = started;
    })?;
    tracing::info!(container_id = %rec.id, pid = rec.pid, "container started");
    refresh(&entry);
    Ok(())
}

/// Folds an exit the monitor recorded into the record (persisted once).
pub(crate) fn refresh(entry: &ContainerEntry) -> ContainerRecord {
    let rec = lock(&entry.record).clone();
    if !matches!(
        rec.state,
        ContainerState::Created | ContainerState::Running | ContainerState::Unknown
    ) {
        return rec;
    }
    let files = rec.files();
    let Some(exit) = files.exit() else {
        return rec;
    };
    let finished = std::fs::metadata(&files.exit_file)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or_else(now_nanos, |d| d.as_nanos() as i64);
    let oom = exit.signal == Some(9) && crate::cgroups::oom_killed(&rec.cgroup);
    let reason = if oom {
        "OOMKilled"
    } else if exit.exit_code == 0 {
        "Completed"
    } else {
        "Error"
    };
    let _ = update(entry, |r| {
        r.state = ContainerState::Exited;
        r.exit_code = exit.exit_code;
        r.finished_at = finished.max(r.started_at);
        if r.reason.is_empty() {
            r.reason = reason.into();
        }
    });
    lock(&entry.record).clone()
}

/// The refreshed record, if the container is in one of the `ok` states; else
/// FailedPrecondition with `msg`.
fn require(
    entry: &ContainerEntry,
    ok: &[ContainerState],
    msg: impl FnOnce(&ContainerRecord) -> String,
) -> Result<ContainerRecord> {
    let rec = refresh(entry);
    if ok.contains(&rec.state) {
        Ok(rec)
    } else {
        Err(Error::FailedPrecondition(msg(&rec)))
    }
}

/// StopContainer: the stop signal, `timeout` to exit, then SIGKILL. Zero timeout kills now.
/// A container that is not running (or unknown) is success.
pub(crate) fn stop(rt: &Runtime, id: &str, timeout: Duration) -> Result<()> {
    let Some(entry) = rt.find_container(id)? else {
        return Ok(());
    };
    let _op = lock(&entry.op);
    stop_locked(rt, &entry, timeout)
}

pub(crate) fn stop_locked(rt: &Runtime, entry: &ContainerEntry, timeout: Duration) -> Result<()> {
    let rec = refresh(entry);
    if !matches!(
        rec.state,
        ContainerState::Running | ContainerState::Created | ContainerState::Unknown
    ) {
        return Ok(());
    }
    let runtime = rt.handler(&rec.runtime_handler)?;
    let files = rec.files();
    let all = rec.shared_pid;
    if rec.state == ContainerState::Running && !timeout.is_zero() {
        runtime
            .kill(&rec.id, &rec.stop_signal, all, &files.runtime_log)
            .map_err(|e| Error::step("signal container", &rec.id, e))?;
        if crate::sandbox::stop::wait_exit(&files, rec.pid, timeout).is_ok() {
            refresh(entry);
            return finish_stop(entry);
        }
        tracing::info!(container_id = %rec.id, ?timeout, "container ignored its stop signal; killing it");
    }
    runtime
        .kill(&rec.id, "KILL", all, &files.runtime_log)
        .map_err(|e| Error::step("kill container", &rec.id, e))?;
    crate::sandbox::stop::wait_exit(&files, rec.pid, Duration::from_secs(10))
        .map_err(|e| Error::step("kill container", &rec.id, e))?;
    refresh(entry);
    finish_stop(entry)
}

/// After a kill: a container whose monitor died without an exit file still counts as exited.
fn finish_stop(entry: &ContainerEntry) -> Result<()> {
    let rec = lock(&entry.record).clone();
    if rec.state == ContainerState::Exited {
        tracing::info!(container_id = %rec.id, exit_code = rec.exit_code, "container stopped");
        return Ok(());
    }
    update(entry, |r| {
        r.state = ContainerState::Exited;
        r.exit_code = 137;
        r.reason = "Error".into();
        r.message = "the container's monitor exited without recording the exit".into();
        r.finished_at = now_nanos();
    })
}

/// RemoveContainer: force-stops, deletes it from the runtime, unmounts the rootfs, removes
/// its dir and log, releases its name. An unknown id is success.
pub(crate) fn remove(rt: &Runtime, id: &str) -> Result<()> {
    let Some(entry) = rt.find_container(id)? else {
        return Ok(());
    };
    let _op = lock(&entry.op);
    let cid = lock(&entry.record).id.clone();
    if !lock(&rt.registry).containers.contains_key(&cid) {
        return Ok(()); // removed while we waited
    }
    remove_locked(rt, &entry)
}

pub(crate) fn remove_locked(rt: &Runtime, entry: &ContainerEntry) -> Result<()> {
    stop_locked(rt, entry, Duration::ZERO)?;
    teardown(rt, entry)?;
    let rec = lock(&entry.record).clone();
    if let Some(log) = &rec.log_path {
        match std::fs::remove_file(log) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(container_id = %rec.id, error = %e, "cannot remove container log")
            }
        }
    }
    unregister(rt, entry);
    tracing::info!(container_id = %rec.id, "container removed");
    Ok(())
}

/// Removes every host resource of a container that is not running: the runtime's container,
/// the rootfs mount, the container dir. Used by remove, by a failed create's rollback and by
/// restore of a half-created container.
pub(crate) fn teardown(rt: &Runtime, entry: &ContainerEntry) -> Result<()> {
    let rec = lock(&entry.record).clone();
    let mut errors = Vec::new();
    match rt.handler(&rec.runtime_handler) {
        Ok(runtime) => {
            let files = rec.files();
            if let Err(e) = runtime.delete(&rec.id, &files.runtime_log) {
                errors.push(Error::step("delete container", &rec.id, e));
            }
        }
        Err(e) => errors.push(e),
    }
    if let Err(e) = crate::mounts::unmount_all(&rec.rootfs()) {
        errors.push(Error::step("unmount rootfs", &rec.id, e));
    }
    for sock in [&rec.attach_socket, &rec.console_socket]
        .into_iter()
        .flatten()
    {
        let _ = std::fs::remove_file(sock);
    }
    Error::collect(errors)?;
    crate::state::remove_record_dir(&rec.dir)
        .map_err(|e| Error::step("remove container dir", &rec.id, e))
}

pub(crate) fn unregister(rt: &Runtime, entry: &ContainerEntry) {
    let (id, name) = {
        let r = lock(&entry.record);
        (r.id.clone(), r.name.clone())
    };
    let mut reg = lock(&rt.registry);
    reg.containers.remove(&id);
    reg.container_ids.remove(&id);
    reg.names.release(&name, &id);
}

/// ExecSync: runs `cmd` in the container with the runtime's `exec` and returns its output
/// and exit code. Past `timeout` (zero = none) the process is killed and the call fails with
/// `DeadlineExceeded`.
pub(crate) fn exec_sync(
    rt: &Runtime,
    id: &str,
    cmd: &[String],
    timeout: Duration,
) -> Result<ExecResult> {
    let entry = rt.container_entry(id)?;
    let rec = require(&entry, &[ContainerState::Running], |r| {
        format!("container {} is not running ({:?})", r.id, r.state)
    })?;
    if cmd.is_empty() {
        return Err(Error::InvalidArgument("cmd must not be empty".into()));
    }
    let runtime = rt.handler(&rec.runtime_handler)?;
    let pid_file = rec
        .dir
        .join(format!("exec-{}.pid", &crate::validate::new_id()[..12]));
    let mut c = runtime.exec_command(&rec.id, &pid_file, None, cmd);
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().map_err(|e| {
        Error::step(
            "exec in container",
            &rec.id,
            HostError::io("spawn", &runtime.path, e),
        )
    })?;
    // Each reader drains its pipe to EOF (so the command never blocks on a full pipe) and
    // hands over chunks as they come.
    let reader = |r: Option<Box<dyn Read + Send>>| {
        let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
        std::thread::spawn(move || {
            if let Some(mut r) = r {
                let mut chunk = [0u8; 16 * 1024];
                while let Ok(n) = r.read(&mut chunk) {
                    if n == 0 || tx.send(chunk[..n].to_vec()).is_err() {
                        break;
                    }
                }
            }
        });
        rx
    };
    let out = reader(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let err = reader(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let deadline = (!timeout.is_zero()).then(|| Instant::now() + timeout);
    let status = match deadline {
        Some(d) => crate::process::wait_until(&mut child, d).map_err(|e| {
            Error::step(
                "exec in container",
                &rec.id,
                HostError::io("wait", &runtime.path, e),
            )
        })?,
        None => Some(child.wait().map_err(|e| {
            Error::step(
                "exec in container",
                &rec.id,
                HostError::io("wait", &runtime.path, e),
            )
        })?),
    };
    let Some(status) = status else {
        // The exec'd process itself first, then its helper.
        crate::process::kill_pid_file(&pid_file);
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_file(&pid_file);
        return Err(Error::DeadlineExceeded(format!(
            "command {cmd:?} in container {} timed out after {timeout:?} and was killed",
            rec.id
        )));
    };
    let _ = std::fs::remove_file(&pid_file);
    // A background process the command left behind may hold the pipes open forever: take
    // what arrives until EOF or shortly after the exit, never wait for that process.
    let until = Instant::now() + Duration::from_secs(1);
    let collect = |rx: std::sync::mpsc::Receiver<Vec<u8>>| {
        let mut buf = Vec::new();
        while let Ok(chunk) = rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
            let room = MAX_EXEC_OUTPUT.saturating_sub(buf.len());
            buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
        }
        buf
    };
    let stdout = collect(out);
    let stderr = collect(err);
    let exit_code = crate::process::exit_code(&status);
    Ok(ExecResult {
        stdout,
        stderr,
        exit_code,
    })
}

/// UpdateContainerResources: the runtime's `update` applies the new limits to the cgroup;
/// the record keeps them for status.
pub(crate) fn update_resources(rt: &Runtime, id: &str, res: &Resources) -> Result<()> {
    super::spec::validate_resources(res)?;
    let entry = rt.container_entry(id)?;
    let _op = lock(&entry.op);
    let ok = [ContainerState::Created, ContainerState::Running];
    let rec = require(&entry, &ok, |r| {
        format!(
            "container {} is {:?}; only a created or running container can be updated",
            r.id, r.state
        )
    })?;
    // A one-off input of `runtime update`, not state: no fsync.
    let file = rec.dir.join("resources.json");
    std::fs::write(&file, super::spec::resources_json(res).to_string())
        .map_err(|e| Error::step("write resources", &rec.id, HostError::io("write", &file, e)))?;
    let runtime = rt.handler(&rec.runtime_handler)?;
    runtime
        .update(&rec.id, &file, &rec.files().runtime_log)
        .map_err(|e| Error::step("update container resources", &rec.id, e))?;
    update(&entry, |r| r.config.resources = res.clone())
}

/// ReopenContainerLog: the monitor reopens the log file (after kubelet rotated it).
pub(crate) fn reopen_log(rt: &Runtime, id: &str) -> Result<()> {
    let entry = rt.container_entry(id)?;
    let rec = require(&entry, &[ContainerState::Running], |r| {
        format!(
            "container {} is not running; its log cannot be reopened",
            r.id
        )
    })?;
    let pid = rec
        .files()
        .monitor_pid()
        .ok_or_else(|| Error::FailedPrecondition(format!("container {} has no monitor", rec.id)))?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGUSR1,
    )
    .map_err(|e| {
        Error::step(
            "reopen log",
            &rec.id,
            HostError::sys("signal monitor", "", e),
        )
    })
}
