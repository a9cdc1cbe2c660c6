//! RemoveContainer and the teardown shared with a failed create's rollback and restore.

use std::time::Duration;

use super::stop::stop_locked;
use crate::error::{Error, Result};
use crate::events::EventKind;
use crate::failpoint;
use crate::model::container::ContainerState;
use crate::runtime::{ContainerEntry, Runtime};
use crate::state::lock;

/// RemoveContainer: force-stops, deletes it from the runtime, unmounts the rootfs, removes
/// its dir and log, releases its name. An unknown id is success.
pub(crate) fn remove(rt: &Runtime, id: &str) -> Result<()> {
    let Some(entry) = rt.find_container(id)? else {
        let q = crate::state::Quarantine::find(&lock(&rt.quarantine).containers, id);
        return match q {
            Some(qid) => finish_quarantined(rt, &qid),
            None => Ok(()),
        };
    };
    let _op = lock(&entry.op);
    let cid = lock(&entry.record).id.clone();
    if !lock(&rt.registry).containers.contains_key(&cid) {
        return Ok(()); // removed while we waited
    }
    remove_locked(rt, &entry)
}

/// Removes a quarantined container (its record was unreadable) from what its id names: the
/// runtime's container (force-deleted, which kills it; its monitor then exits), the rootfs
/// mount, its dir and sockets.
fn finish_quarantined(rt: &Runtime, id: &str) -> Result<()> {
    tracing::info!(container_id = %id, "finishing the removal of a quarantined container");
    let mut errors = Vec::new();
    let dir = rt.cfg.root.join("containers").join(id);
    for runtime in rt.runtimes.values() {
        if runtime.root.join(id).exists() {
            if let Err(e) = rt
                .host
                .runtime_delete(runtime, id, &dir.join("runtime.log"))
            {
                errors.push(Error::step("delete container", id, e));
            }
        }
    }
    if let Err(e) = rt.host.unmount_all(&dir.join("rootfs")) {
        errors.push(Error::step("unmount rootfs", id, e));
    }
    if let Err(e) = crate::userns::remove_pod_root_dir(&rt.cfg.root, id) {
        errors.push(Error::step("remove user-namespace mount dir", id, e));
    }
    let short = &id[..16];
    for sock in [
        rt.cfg.root.join("attach").join(format!("{short}.sock")),
        rt.cfg.root.join("exec").join(format!("{short}.console")),
    ] {
        let _ = std::fs::remove_file(sock);
    }
    if errors.is_empty() {
        if let Err(e) = crate::mounts::remove_record_dir(&dir) {
            errors.push(Error::step("remove container dir", id, e));
        }
    }
    if errors.is_empty() {
        lock(&rt.quarantine).containers.remove(id);
    }
    Error::collect(errors)
}

pub(crate) fn remove_locked(rt: &Runtime, entry: &ContainerEntry) -> Result<()> {
    stop_locked(rt, entry, Duration::ZERO)?;
    failpoint::hit("removectr:stopped");
    let seen = rt.nri.seen(&lock(&entry.record).clone());
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
    if rt.nri.active() {
        if let Ok(sb) = rt.sandbox_record(&rec.sandbox_id) {
            rt.nri.remove_container(&sb, &rec, seen, &rt.cfg);
        }
    }
    tracing::info!(container_id = %rec.id, "container removed");
    rt.emit(EventKind::Deleted, &rec.id, &rec.sandbox_id);
    // Its image (or an image volume's) was removed while it ran: its layers can go now if
    // nothing else uses them.
    let gone = |image: &str| !image.is_empty() && rt.images.get(image).is_none();
    let volume_gone = rec
        .config
        .mounts
        .iter()
        .filter_map(|m| m.image.as_ref())
        .any(|v| gone(&v.image_ref) && gone(&v.image));
    if gone(&rec.image_id) || volume_gone {
        if let Err(e) = rt.images.collect(&rt.layers_in_use()) {
            tracing::warn!(error = %e, "cannot collect unused image content");
        }
    }
    Ok(())
}

/// Removes every host resource of a container that is not running: the runtime's container,
/// the rootfs mount, the container dir. Used by remove, by a failed create's rollback and by
/// restore of a half-created container.
pub(crate) fn teardown(rt: &Runtime, entry: &ContainerEntry) -> Result<()> {
    let rec = lock(&entry.record).clone();
    let mut errors = Vec::new();
    // A creation that never finished (a crash mid-create, a failed create): its monitor may
    // still be running `runtime create`, and would make the container after we deleted it.
    // It leads its own session with the runtime in it: kill them first.
    if matches!(
        rec.state,
        ContainerState::Creating | ContainerState::Unknown
    ) {
        if let Some(m) = rec.files().live_monitor() {
            crate::process::kill_tree(m);
            crate::process::wait_gone(&[m], Duration::from_secs(2));
        }
    }
    match rt.handler(&rec.runtime_handler) {
        Ok(runtime) => {
            let files = rec.files();
            if let Err(e) = rt.host.runtime_delete(runtime, &rec.id, &files.runtime_log) {
                errors.push(Error::step("delete container", &rec.id, e));
            }
        }
        Err(e) => errors.push(e),
    }
    failpoint::hit("removectr:runtime");
    // The runtime removes the container's cgroup with the container; one a create left
    // half-made (the runtime never recorded the container) is ours to remove.
    if !rec.cgroup.is_empty() {
        if let Err(e) = rt.host.remove_cgroup(&rec.cgroup) {
            errors.push(Error::step("remove container cgroup", &rec.id, e));
        }
    }
    if let Err(e) = rt.host.unmount_all(&rec.rootfs()) {
        errors.push(Error::step("unmount rootfs", &rec.id, e));
    }
    // Mounts staged for the runtime (recursively read-only, idmapped, image volumes): those
    // a create detached are no mounts any more, which is success.
    let staged = rec.dir.join("mounts");
    for name in crate::state::list_dir(&staged) {
        if let Err(e) = rt.host.unmount_all(&staged.join(name)) {
            errors.push(Error::step("unmount staged mount", &rec.id, e));
        }
    }
    if rec.userns_dir.is_some() {
        // `<root>/userns/<id>`, removed where the root's mode follows.
        if let Err(e) = crate::userns::remove_pod_root_dir(&rt.cfg.root, &rec.id) {
            errors.push(Error::step("remove user-namespace mount dir", &rec.id, e));
        }
    }
    if let Some(d) = &rec.storage_dir {
        if let Err(e) = crate::mounts::remove_record_dir(d) {
            errors.push(Error::step("remove writable layer", &rec.id, e));
        }
    }
    failpoint::hit("removectr:unmounted");
    for sock in [&rec.attach_socket, &rec.console_socket]
        .into_iter()
        .flatten()
    {
        let _ = std::fs::remove_file(sock);
    }
    Error::collect(errors)?;
    crate::mounts::remove_record_dir(&rec.dir)
        .map_err(|e| Error::step("remove container dir", &rec.id, e))?;
    failpoint::hit("removectr:dir");
    Ok(())
}

pub(crate) fn unregister(rt: &Runtime, entry: &ContainerEntry) {
    let (id, name, cgroup) = {
        let r = lock(&entry.record);
        (r.id.clone(), r.name.clone(), r.cgroup.clone())
    };
    rt.exit_watch.remove(&id);
    rt.fs_usage.forget(&id);
    rt.cgroup_files.forget(&cgroup);
    let mut reg = lock(&rt.registry);
    reg.containers.remove(&id);
    reg.container_ids.remove(&id);
    reg.names.release(&name, &id);
}
