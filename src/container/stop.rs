//! StopContainer: the stop signal, the grace, then SIGKILL; idempotent.

use std::time::Duration;

use super::status::{is_live, refresh};
use crate::error::{Error, Result};
use crate::events::EventKind;
use crate::failpoint;
use crate::model::container::ContainerState;
use crate::runtime::{ContainerEntry, Runtime};
use crate::state::lock;
use crate::state::now_nanos;

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
    let rec = refresh(rt, entry);
    if !matches!(
        rec.state,
        ContainerState::Running | ContainerState::Created | ContainerState::Unknown
    ) {
        return Ok(());
    }
    let runtime = rt.handler(&rec.runtime_handler)?;
    let files = rec.files();
    // In a pod sharing one PID namespace the container's other processes do not die with its
    // init: SIGKILL goes to all of them. The stop signal goes to the init alone, as the peers
    // send it, so a main process that handles it gets its grace.
    let all = rec.shared_pid;
    if rec.state == ContainerState::Running && !timeout.is_zero() {
        // By number: every runtime takes one, whatever names it knows. Whatever goes wrong
        // with the first signal, the grace and SIGKILL still follow.
        let signal = crate::signals::number(&rec.stop_signal)
            .map_or_else(|| rec.stop_signal.clone(), |n| n.to_string());
        match rt
            .host
            .runtime_kill(runtime, &rec.id, &signal, false, &files.runtime_log)
        {
            Ok(()) => {
                failpoint::hit("stopctr:signalled");
                if rt.host.wait_exit(&files, &rec.init_proc(), timeout).is_ok() {
                    if all {
                        // What the init left behind in the shared namespace goes with it.
                        if let Err(e) =
                            rt.host
                                .runtime_kill(runtime, &rec.id, "KILL", true, &files.runtime_log)
                        {
                            tracing::warn!(container_id = %rec.id, error = %e, "cannot kill what the container's init left running");
                        }
                    }
                    refresh(rt, entry);
                    return finish_stop(rt, entry);
                }
                tracing::info!(container_id = %rec.id, ?timeout, "container ignored its stop signal; killing it");
            }
            Err(e) => {
                tracing::warn!(container_id = %rec.id, signal = %rec.stop_signal, error = %e,
                    "cannot send the stop signal; killing the container");
            }
        }
    }
    rt.host
        .runtime_kill(runtime, &rec.id, "KILL", all, &files.runtime_log)
        .map_err(|e| Error::step("kill container", &rec.id, e))?;
    failpoint::hit("stopctr:killed");
    rt.host
        .wait_exit(&files, &rec.init_proc(), Duration::from_secs(10))
        .map_err(|e| Error::step("kill container", &rec.id, e))?;
    refresh(rt, entry);
    finish_stop(rt, entry)
}

/// After a kill: a container whose monitor died without an exit file still counts as exited.
fn finish_stop(rt: &Runtime, entry: &ContainerEntry) -> Result<()> {
    let rec = lock(&entry.record).clone();
    if rec.state == ContainerState::Exited {
        tracing::info!(container_id = %rec.id, exit_code = rec.exit_code, "container stopped");
        return Ok(());
    }
    let mut changed = false;
    let r = entry.update(|r| {
        if is_live(r.state) {
            changed = true;
            r.state = ContainerState::Exited;
            r.exit_code = 137;
            r.reason = "Error".into();
            r.message = "the container's processes are gone but its monitor did not record the exit (the monitor is stopped or dead): exit status unknown".into();
            r.finished_at = now_nanos();
        }
    });
    if changed {
        rt.emit(EventKind::Stopped, &rec.id, &rec.sandbox_id);
    }
    match r {
        // Kept in memory (update changed it before writing): a full disk must not keep a
        // stopped container from being reported stopped.
        Err(e) if e.is_no_space() => {
            tracing::warn!(container_id = %rec.id, error = %e, "no space to persist the stop");
            Ok(())
        }
        r => r,
    }
}
