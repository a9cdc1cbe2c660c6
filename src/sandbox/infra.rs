//! The infra process's liveness: a Ready sandbox whose infra exited (a container of a
//! shared-PID pod signalled the pause process, a VM runtime's sandbox process crashed) is
//! NotReady at once, so kubelet recreates the pod and CreateContainer in it answers
//! FailedPrecondition instead of a runtime error about a namespace of a dead pid (or, with the
//! pid reused, joining whatever holds it now).
//!
//! Learned the way container exits are: the exit watcher watches the infra dir for the
//! monitor's exit file (and its sweep calls [`check`] for every watched sandbox, which also
//! catches a monitor killed before it could write one); PodSandboxStatus checks where the
//! watcher does not run.

use crate::model::sandbox::SandboxState;
use crate::oci::ContainerFiles;
use crate::runtime::{Runtime, SandboxEntry};
use crate::state::lock;

/// The exit watcher's key of a sandbox's infra (container ids are hex: no clash).
const PREFIX: &str = "infra:";

fn key(sandbox_id: &str) -> String {
    format!("{PREFIX}{sandbox_id}")
}

/// Starts watching the infra of `entry` (a started, not stopped one).
pub(crate) fn watch(rt: &Runtime, entry: &SandboxEntry) {
    let rec = lock(&entry.record).clone();
    if rec.infra.as_ref().is_some_and(|i| i.started && !i.stopped) {
        rt.exit_watch.add(&key(&rec.id), &rec.infra_dir());
    }
}

/// Stops watching the infra of `sandbox_id` (its dir is going away).
pub(crate) fn unwatch(rt: &Runtime, sandbox_id: &str) {
    rt.exit_watch.remove(&key(sandbox_id));
}

/// The exit watcher's callback for `key`, if it names an infra; `false` for a container's.
pub(crate) fn on_watch_event(rt: &Runtime, key: &str) -> bool {
    let Some(id) = key.strip_prefix(PREFIX) else {
        return false;
    };
    if let Ok(Some(entry)) = rt.lookup(id) {
        check(&entry);
    }
    true
}

/// [`check`], for a query: only where the exit watcher does not already (a library user that
/// never started it), so that PodSandboxStatus stays a read of memory in the daemon.
pub(crate) fn check_unwatched(rt: &Runtime, entry: &SandboxEntry) {
    let id = lock(&entry.record).id.clone();
    if !rt.exit_watch.covers(&key(&id)) {
        check(entry);
    }
}

/// Makes a Ready sandbox whose infra is gone NotReady (persisted; logged with how it ended).
/// Only the record lock is taken: a StopPodSandbox in progress (which holds the op lock and
/// ends the infra itself) is not waited for.
pub(crate) fn check(entry: &SandboxEntry) {
    let rec = lock(&entry.record).clone();
    let Some(infra) = rec.infra.as_ref() else {
        return;
    };
    if rec.state != SandboxState::Ready || !infra.started || infra.stopped {
        return;
    }
    let exit = ContainerFiles::in_dir(&rec.infra_dir(), None).exit();
    let gone = exit.is_some() || (infra.pid > 0 && !rec.infra_proc(infra).alive());
    if !gone {
        return;
    }
    let how = match exit {
        Some(e) => format!("exit code {}, signal {:?}", e.exit_code, e.signal),
        None => "its monitor left no exit status".to_string(),
    };
    tracing::warn!(
        sandbox_id = %rec.id,
        pid = infra.pid,
        exit = %how,
        "the sandbox's infra process exited: sandbox NotReady"
    );
    let _ = entry.update(|r| {
        if r.state == SandboxState::Ready {
            r.state = SandboxState::NotReady;
        }
    });
}
