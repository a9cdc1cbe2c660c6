//! StartContainer: the runtime's `start`; a repeated start of a running container (kubelet's
//! retry after a daemon crash) is success, a failed one leaves the container exited with
//! `StartError`.

use super::status::{refresh, require};
use crate::error::{Error, Result};
use crate::events::EventKind;
use crate::failpoint;
use crate::model::container::ContainerState;
use crate::runtime::Runtime;
use crate::state::lock;
use crate::state::now_nanos;

/// How long lazy layers' completions give way to a container just started.
const LAZY_HOLD_START: std::time::Duration = std::time::Duration::from_secs(1);

/// How long StartContainer waits for the monitor to watch the container's OOM kills.
const OOM_WATCH_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

pub(crate) fn start(rt: &Runtime, id: &str) -> Result<()> {
    let entry = rt.container_entry(id)?;
    let _op = lock(&entry.op);
    // A start retried after it succeeded (kubelet's retry after a daemon crash) is success.
    if refresh(rt, &entry).state == ContainerState::Running {
        return Ok(());
    }
    let rec = require(rt, &entry, &[ContainerState::Created], |r| {
        format!(
            "container {} is {:?}, only a created container can be started",
            r.id, r.state
        )
    })?;
    let runtime = rt.handler(&rec.runtime_handler)?;
    let sb = rt
        .nri
        .active()
        .then(|| rt.sandbox_record(&rec.sandbox_id).ok())
        .flatten();
    if let Some(sb) = &sb {
        rt.nri.start_container(sb, &rec, &rt.cfg)?;
    }
    let files = rec.files();
    // Under the systemd driver the runtime may have returned from `create` before the
    // container was in its scope: started now, it could be OOM-killed and its scope gone
    // before its monitor watches it. The monitor says when it does (at once elsewhere).
    if !rt.host.wait_oom_watch(&files, OOM_WATCH_WAIT) {
        tracing::warn!(container_id = %rec.id, "the monitor does not watch the container's OOM kills yet; starting it anyway");
    }
    // Taken before the call: the process may run (and exit) before `start` returns.
    let started = now_nanos();
    let started_call = match monitor_stdio(&rec.dir, files.live_monitor()) {
        Some(stdio) => runtime.start_with_stdio(&rec.id, &files.runtime_log, stdio),
        None => rt.host.runtime_start(runtime, &rec.id, &files.runtime_log),
    };
    if let Err(e) = started_call {
        // It may have started anyway (an earlier start whose answer was lost): the runtime
        // says.
        if matches!(rt.host.runtime_state(runtime, &rec.id), Ok(Some(s)) if s.status == "running") {
            tracing::info!(container_id = %rec.id, error = %e, "start failed, but the container runs: it was started before");
            entry.update(|r| {
                r.state = ContainerState::Running;
                r.started_at = crate::process::start_time_nanos(r.pid).unwrap_or(started);
            })?;
            rt.emit(EventKind::Started, &rec.id, &rec.sandbox_id);
            return Ok(());
        }
        let msg = e.to_string();
        entry.update(|r| {
            r.state = ContainerState::Exited;
            r.exit_code = 128;
            r.reason = "StartError".into();
            r.message = msg;
            r.finished_at = now_nanos();
        })?;
        rt.emit(EventKind::Stopped, &rec.id, &rec.sandbox_id);
        return Err(Error::step("start container", &rec.id, e));
    }
    failpoint::hit("start:runtime");
    entry.update(|r| {
        r.state = ContainerState::Running;
        r.started_at = started;
    })?;
    failpoint::hit("start:recorded");
    // Measured once now, so that stats never walk a new container's layer in the call.
    rt.fs_usage.measure_now(&rec.id, &rec.upper_dir());
    // Its cgroup's usage files opened now (nine opens, about 0.1 ms here), not by the next
    // stats call (which would pay them for every container started since the last).
    rt.cgroup_files.open(&rec.cgroup);
    rt.emit(EventKind::Started, &rec.id, &rec.sandbox_id);
    // Its first second is its own: lazy layers' completions give way (its reads of the lazy
    // view hold them after that; reads of layers completed already do not).
    rt.images.give_way(&rec.layers, LAZY_HOLD_START, true);
    tracing::info!(container_id = %rec.id, pid = rec.pid, "container started");
    let now = refresh(rt, &entry);
    if let Some(sb) = &sb {
        rt.nri.post_start_container(sb, &now, &rt.cfg);
    }
    Ok(())
}

/// The container's stdio, for a runtime that takes it at `start` (runsc's containers inside
/// a sandbox): the monitor published its ends of the pipes in `stdio-fds`; they are opened
/// through `/proc/<monitor>/fd/N` (a new descriptor to the same pipe). `None` when the
/// monitor published nothing (the runtime took the stdio at create).
fn monitor_stdio(
    dir: &std::path::Path,
    monitor: Option<i32>,
) -> Option<[Option<std::os::fd::OwnedFd>; 3]> {
    use sandboxd_shim_common::files::{parse_stdio_fds, STDIO_FDS};
    let text = std::fs::read_to_string(dir.join(STDIO_FDS)).ok()?;
    let monitor = monitor?;
    // That pid is still this container's monitor (not a process that reused the pid): its
    // command line names the container's dir.
    let cmdline = std::fs::read(format!("/proc/{monitor}/cmdline")).ok()?;
    let dir_arg = dir.as_os_str().as_encoded_bytes();
    if !cmdline.split(|b| *b == 0).any(|a| a == dir_arg) {
        return None;
    }
    let fds = parse_stdio_fds(&text)?;
    let open = |fd: i32, write: bool| -> Option<std::os::fd::OwnedFd> {
        if fd < 0 {
            return None;
        }
        std::fs::OpenOptions::new()
            .read(!write)
            .write(write)
            .open(format!("/proc/{monitor}/fd/{fd}"))
            .ok()
            .map(Into::into)
    };
    Some([open(fds[0], false), open(fds[1], true), open(fds[2], true)])
}
