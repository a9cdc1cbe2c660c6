//! RemovePodSandbox: stop if needed (which closes the namespace files and unmounts the shm) →
//! delete containers from the runtime → remove the sandbox dir → release the name → drop the
//! record.
//! Best effort within a call (every step is tried, all errors are returned); an unknown id
//! is success.

use crate::error::{Error, HostError, Result};
use crate::oci::ContainerFiles;
use crate::{lock, Runtime, SandboxEntry};

pub(crate) fn remove(rt: &Runtime, id: &str) -> Result<()> {
    let Some(entry) = rt.lookup(id)? else {
        return Ok(());
    };
    let _op = lock(&entry.op);
    if !lock(&rt.registry)
        .sandboxes
        .contains_key(&lock(&entry.record).id)
    {
        return Ok(()); // removed while we waited for the lock
    }
    teardown(rt, &entry, false)?;
    unregister(rt, &entry);
    tracing::info!(sandbox_id = %lock(&entry.record).id, "pod sandbox removed");
    Ok(())
}

/// Stops, then removes every host resource the record names. Used by remove, by the
/// rollback of a failed run and by restore of a half-created sandbox.
pub(crate) fn teardown(rt: &Runtime, entry: &SandboxEntry, rollback: bool) -> Result<()> {
    super::stop::stop_locked(rt, entry, rollback)?;
    let rec = lock(&entry.record).clone();
    let mut errors = Vec::new();
    for c in rt.containers_of(&rec.id) {
        let _op = lock(&c.op);
        if let Err(e) = crate::container::lifecycle::remove_locked(rt, &c) {
            errors.push(e);
        }
    }
    if rec.infra.is_some() {
        match rt.handler(&rec.runtime_handler) {
            Ok(runtime) => {
                let files = ContainerFiles::in_dir(&rec.infra_dir(), None);
                if let Err(e) = runtime.delete(&rec.id, &files.runtime_log) {
                    errors.push(Error::step("delete infra container", &rec.id, e));
                }
            }
            Err(e) => errors.push(e),
        }
    }
    // The shm and the namespace files are gone: stop_locked returned Ok only after both.
    if !errors.is_empty() {
        return Error::collect(errors);
    }
    if rec.own_pod_cgroup {
        if let Err(e) = crate::cgroups::remove(&rec.pod_cgroup) {
            errors.push(Error::step("remove pod cgroup", &rec.id, e));
        }
    }
    if !rec.network.gave_up {
        if let Err(e) = rt.cni.remove_cache(&rec.id) {
            errors.push(Error::step("remove CNI cache", &rec.id, e));
        }
    }
    if let Err(e) = crate::state::remove_record_dir(&rec.dir) {
        errors.push(Error::step("remove sandbox dir", &rec.id, e));
    }
    Error::collect(errors)
}

/// Releases the name and drops the sandbox from the registries.
pub(crate) fn unregister(rt: &Runtime, entry: &SandboxEntry) {
    let (id, name) = {
        let r = lock(&entry.record);
        (r.id.clone(), r.name.clone())
    };
    let mut reg = lock(&rt.registry);
    reg.sandboxes.remove(&id);
    reg.ids.remove(&id);
    reg.names.release(&name, &id);
}

/// Removes a directory tree that may contain a mounted shm (unmounted first).
pub(crate) fn remove_orphan_dir(dir: &std::path::Path) -> Result<(), HostError> {
    crate::mounts::unmount_all(&dir.join("shm"))?;
    crate::state::remove_record_dir(dir)
}
