//! Restore after a restart. [`load`] registers every recorded container (rolling back the
//! half-created ones) before the sandboxes are restored; [`reconcile`] then folds in exits
//! that happened while the daemon was away, marks containers whose monitor vanished without
//! an exit as exited, and removes containers whose sandbox no longer exists.

use std::sync::Arc;

use crate::error::Result;
use crate::model::container::{ContainerRecord, ContainerState};
use crate::runtime::{ContainerEntry, Runtime};
use crate::state::lock;
use crate::state::now_nanos;

pub(crate) fn load(rt: &Runtime) -> Result<()> {
    let dir = rt.cfg.root.join("containers");
    for (id, path, rec) in crate::state::record_dirs::<ContainerRecord>(
        &dir,
        "container",
        crate::model::RECORD_FORMAT,
    )? {
        match rec {
            Ok(Some(rec)) if rec.id == id => register(rt, rec),
            Ok(Some(rec)) => {
                quarantine(rt, &id, format!("its record names another id ({})", rec.id))
            }
            Ok(None) => {
                // Created dir, crashed before the first record: nothing else exists yet but
                // possibly the rootfs mount.
                tracing::info!(container_id = %id, "removing container dir without a record");
                let _ = crate::mounts::unmount_all(&path.join("rootfs"));
                if let Err(e) = crate::mounts::remove_record_dir(&path) {
                    tracing::warn!(container_id = %id, error = %e, "cannot remove orphan container dir");
                }
            }
            Err(e) => quarantine(rt, &id, format!("unreadable record: {e}")),
        }
    }
    Ok(())
}

/// Leaves a container whose record cannot be trusted alone (its runtime container, rootfs
/// and monitor) until an explicit RemoveContainer of its id.
fn quarantine(rt: &Runtime, id: &str, why: String) {
    tracing::error!(container_id = %id, reason = %why, "container quarantined: nothing it may own is collected; RemoveContainer of its id finishes its teardown");
    lock(&rt.quarantine).containers.insert(id.to_string(), why);
}

fn register(rt: &Runtime, mut rec: ContainerRecord) {
    // Formats 0 and 1 have the same shape: the number is written with the next update.
    rec.format = crate::model::RECORD_FORMAT;
    let (id, name, state) = (rec.id.clone(), rec.name.clone(), rec.state);
    let entry = ContainerEntry::new(rec);
    {
        let mut reg = lock(&rt.registry);
        if let Err(e) = reg.names.reserve(&name, &id) {
            tracing::warn!(container_id = %id, error = %e, "name conflict on restore");
        }
        reg.container_ids.insert(&id);
        reg.containers.insert(id.clone(), entry.clone());
    }
    if state == ContainerState::Creating {
        tracing::info!(container_id = %id, "rolling back a container whose creation was interrupted");
        match super::remove::teardown(rt, &entry) {
            Ok(()) => super::remove::unregister(rt, &entry),
            Err(e) => {
                tracing::warn!(container_id = %id, error = %e, "rollback incomplete; RemoveContainer finishes it");
                let _ = entry.update(|r| r.state = ContainerState::Unknown);
            }
        }
    }
}

pub(crate) fn reconcile(rt: &Runtime) {
    let entries: Vec<Arc<ContainerEntry>> =
        lock(&rt.registry).containers.values().cloned().collect();
    // Each container on its own (its record, files and processes), a few at once: at 1,000
    // pods the checks of the monitors' processes are a fifth of a restart.
    crate::metrics::par_map(entries, |entry| reconcile_one(rt, &entry));
}

fn reconcile_one(rt: &Runtime, entry: &ContainerEntry) {
    let rec = lock(&entry.record).clone();
    if lock(&rt.quarantine).sandboxes.contains_key(&rec.sandbox_id) {
        tracing::warn!(container_id = %rec.id, sandbox_id = %rec.sandbox_id, "its sandbox is quarantined; left as it is");
        return;
    }
    if rt.lookup(&rec.sandbox_id).ok().flatten().is_none() {
        tracing::info!(container_id = %rec.id, sandbox_id = %rec.sandbox_id, "removing a container whose sandbox is gone");
        let _op = lock(&entry.op);
        if let Err(e) = super::remove::remove_locked(rt, entry) {
            tracing::warn!(container_id = %rec.id, error = %e, "cannot remove orphaned container");
        }
        return;
    }
    // (The exit file is read once, below, after the watch is set: an exit it shows is
    // folded in there.)
    // What the runtime says, asked only for records whose step may have been in flight
    // (a crash between `runtime start` and the record saying so) or whose monitor is gone.
    let runtime_status = || {
        rt.handler(&rec.runtime_handler)
            .ok()
            .and_then(|r| r.state(&rec.id).ok().flatten())
            .map(|s| s.status)
    };
    if rec.state == ContainerState::Created && runtime_status().as_deref() == Some("running") {
        tracing::info!(container_id = %rec.id, "the container was started before the crash: recording it running");
        let _ = entry.update(|r| {
            r.state = ContainerState::Running;
            r.started_at = crate::process::start_time_nanos(r.pid).unwrap_or_else(now_nanos);
        });
        rt.emit(crate::events::EventKind::Started, &rec.id, &rec.sandbox_id);
    }
    // Watched before the last look at the exit file: an exit from now on wakes the watcher.
    if matches!(rec.state, ContainerState::Running | ContainerState::Created) {
        rt.exit_watch.add(&rec.id, &rec.dir);
    }
    let rec = super::status::refresh(rt, entry);
    if matches!(rec.state, ContainerState::Running | ContainerState::Created) {
        let gone = rec.files().monitor_gone_without_exit();
        if gone && runtime_status().as_deref() == Some("running") {
            tracing::warn!(container_id = %rec.id, "the container's monitor is gone but the container runs: its output is no longer logged");
        } else if gone {
            tracing::warn!(container_id = %rec.id, "container's monitor vanished while the daemon was down");
            super::status::mark_exited(rt, entry, |r| {
                r.exit_code = 255;
                r.reason = "Unknown".into();
                r.message = "the monitor exited without recording the container's exit (host reboot or kill)".into();
                r.finished_at = now_nanos();
            });
        }
    }
}
