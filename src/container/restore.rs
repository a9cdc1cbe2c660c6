//! Restore after a restart. [`load`] registers every recorded container (rolling back the
//! half-created ones) before the sandboxes are restored; [`reconcile`] then folds in exits
//! that happened while the daemon was away, marks containers whose monitor vanished without
//! an exit as exited, and removes containers whose sandbox no longer exists.

use std::sync::{Arc, Mutex};

use super::create::update;
use super::*;
use crate::error::Result;
use crate::sandbox::now_nanos;
use crate::{lock, ContainerEntry, Runtime};

pub(crate) fn load(rt: &Runtime) -> Result<()> {
    let dir = rt.cfg.root.join("containers");
    for (id, path, rec) in crate::state::record_dirs::<ContainerRecord>(&dir, "container")? {
        match rec {
            Ok(Some(rec)) if rec.id == id => register(rt, rec),
            Ok(Some(_)) => {
                tracing::warn!(container_id = %id, "record names another id; leaving it alone")
            }
            Ok(None) => {
                // Created dir, crashed before the first record: nothing else exists yet but
                // possibly the rootfs mount.
                tracing::info!(container_id = %id, "removing container dir without a record");
                let _ = crate::mounts::unmount_all(&path.join("rootfs"));
                if let Err(e) = crate::state::remove_record_dir(&path) {
                    tracing::warn!(container_id = %id, error = %e, "cannot remove orphan container dir");
                }
            }
            Err(e) => {
                tracing::warn!(container_id = %id, error = %e, "unreadable container record; leaving it alone")
            }
        }
    }
    Ok(())
}

fn register(rt: &Runtime, rec: ContainerRecord) {
    let (id, name, state) = (rec.id.clone(), rec.name.clone(), rec.state);
    let entry = Arc::new(ContainerEntry {
        op: Mutex::new(()),
        record: Mutex::new(rec),
    });
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
        match super::lifecycle::teardown(rt, &entry) {
            Ok(()) => super::lifecycle::unregister(rt, &entry),
            Err(e) => {
                tracing::warn!(container_id = %id, error = %e, "rollback incomplete; RemoveContainer finishes it");
                let _ = update(&entry, |r| r.state = ContainerState::Unknown);
            }
        }
    }
}

pub(crate) fn reconcile(rt: &Runtime) {
    let entries: Vec<Arc<ContainerEntry>> =
        lock(&rt.registry).containers.values().cloned().collect();
    for entry in entries {
        let rec = lock(&entry.record).clone();
        if rt.lookup(&rec.sandbox_id).ok().flatten().is_none() {
            tracing::info!(container_id = %rec.id, sandbox_id = %rec.sandbox_id, "removing a container whose sandbox is gone");
            let _op = lock(&entry.op);
            if let Err(e) = super::lifecycle::remove_locked(rt, &entry) {
                tracing::warn!(container_id = %rec.id, error = %e, "cannot remove orphaned container");
            }
            continue;
        }
        let rec = super::lifecycle::refresh(&entry);
        if matches!(rec.state, ContainerState::Running | ContainerState::Created) {
            let files = rec.files();
            let monitor_alive = files.monitor_pid().is_some_and(crate::process::alive);
            if !monitor_alive && files.exit().is_none() {
                tracing::warn!(container_id = %rec.id, "container's monitor vanished while the daemon was down");
                let _ = update(&entry, |r| {
                    r.state = ContainerState::Exited;
                    r.exit_code = 255;
                    r.reason = "Unknown".into();
                    r.message = "the monitor exited without recording the container's exit (host reboot or kill)".into();
                    r.finished_at = now_nanos();
                });
            }
        }
    }
}
