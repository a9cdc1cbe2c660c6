//! RemovePodSandbox: stop if needed (which closes the namespace files and unmounts the shm) →
//! delete containers from the runtime → remove the sandbox dir → release the name → drop the
//! record.
//! Best effort within a call (every step is tried, all errors are returned); an unknown id
//! is success.

use crate::error::{Error, HostError, Result};
use crate::oci::ContainerFiles;
use crate::runtime::{Runtime, SandboxEntry};
use crate::state::lock;

pub(crate) fn remove(rt: &Runtime, id: &str) -> Result<()> {
    let Some(entry) = rt.lookup(id)? else {
        let q = crate::state::Quarantine::find(&lock(&rt.quarantine).sandboxes, id);
        return match q {
            Some(qid) => finish_quarantined(rt, &qid),
            None => Ok(()),
        };
    };
    let _op = lock(&entry.op);
    if !lock(&rt.registry)
        .sandboxes
        .contains_key(&lock(&entry.record).id)
    {
        return Ok(()); // removed while we waited for the lock
    }
    teardown(rt, &entry)?;
    unregister(rt, &entry);
    if rt.nri.active() {
        let snapshot = lock(&entry.record).clone();
        rt.nri.remove_pod_sandbox(&snapshot, &rt.cfg);
    }
    let status = lock(&entry.record).status();
    tracing::info!(sandbox_id = %status.id, "pod sandbox removed");
    rt.emit_pod(crate::events::EventKind::Deleted, status);
    Ok(())
}

/// RemovePodSandbox's teardown: stops the pod, removes its containers, then every host
/// resource the record names.
fn teardown(rt: &Runtime, entry: &SandboxEntry) -> Result<()> {
    super::stop::stop_locked(rt, entry)?;
    let id = lock(&entry.record).id.clone();
    let mut errors = Vec::new();
    for c in rt.containers_of(&id) {
        let _op = lock(&c.op);
        if let Err(e) = crate::container::remove::remove_locked(rt, &c) {
            errors.push(e);
        }
    }
    remove_pod_resources(rt, entry, errors)
}

/// Undoes a pod that never became ready (the rollback of a failed run, and restore of one
/// whose creation was interrupted): it has no containers (see [`super::stop::stop_pod`]), so
/// this stops and removes only what the pod itself holds.
pub(crate) fn undo(rt: &Runtime, entry: &SandboxEntry) -> Result<()> {
    super::stop::stop_pod(rt, entry, true)?;
    remove_pod_resources(rt, entry, Vec::new())
}

/// Removes what a stopped pod holds on the host: its infra container from the runtime, then
/// (unless that or `errors`, the failures of earlier steps, went wrong) its pod cgroup, CNI
/// cache, user-namespace mount dir and record dir. Every step is tried; all errors return.
fn remove_pod_resources(rt: &Runtime, entry: &SandboxEntry, mut errors: Vec<Error>) -> Result<()> {
    let rec = lock(&entry.record).clone();
    if rec.infra.is_some() {
        super::infra::unwatch(rt, &rec.id);
        match rt.handler(&rec.runtime_handler) {
            Ok(runtime) => {
                let files = ContainerFiles::in_dir(&rec.infra_dir(), None);
                if let Err(e) = rt.host.runtime_delete(runtime, &rec.id, &files.runtime_log) {
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
        match rt.host.remove_cgroup(&rec.pod_cgroup) {
            Ok(()) => {
                if let Err(e) = crate::cgroups::owned::forget(&rt.cfg.root, &rec.id) {
                    errors.push(Error::step("erase the pod cgroup's note", &rec.id, e));
                }
            }
            Err(e) => errors.push(Error::step("remove pod cgroup", &rec.id, e)),
        }
    }
    if !rec.network.gave_up {
        if let Err(e) = rt.cni.remove_cache(&rec.id) {
            errors.push(Error::step("remove CNI cache", &rec.id, e));
        }
    }
    if rec.userns.is_some() {
        if let Err(e) = crate::userns::remove_pod_root_dir(&rt.cfg.root, &rec.id) {
            errors.push(Error::step("remove user-namespace mount dir", &rec.id, e));
        }
    }
    if let Err(e) = crate::mounts::remove_record_dir(&rec.dir) {
        errors.push(Error::step("remove sandbox dir", &rec.id, e));
    }
    Error::collect(errors)
}

/// Tears down a quarantined sandbox (its record was unreadable) from what is known without
/// the record: its id names its namespace files, its dir, its infra container and its pod
/// cgroup; the CNI attachment (config and ADD result) was kept on its own, so DEL runs with
/// it. Its registered containers are removed first. Every step is tried; a failed DEL keeps
/// it quarantined for a retry.
fn finish_quarantined(rt: &Runtime, id: &str) -> Result<()> {
    tracing::info!(sandbox_id = %id, "finishing the teardown of a quarantined sandbox");
    let mut errors = Vec::new();
    for c in rt.containers_of(id) {
        let _op = lock(&c.op);
        if let Err(e) = crate::container::remove::remove_locked(rt, &c) {
            errors.push(e);
        }
    }
    for runtime in rt.runtimes.values() {
        if runtime.root.join(id).exists() {
            let log = rt
                .cfg
                .root
                .join("runtime")
                .join(format!("{}-gc.log", runtime.name));
            if let Err(e) = rt.host.runtime_delete(runtime, id, &log) {
                errors.push(Error::step("delete infra container", id, e));
            }
        }
    }
    let name = rt.ns_name(id);
    let netns = rt.cfg.netns_dir.join(&name);
    let del = super::network::del(rt, id, rt.cni.load_cache(id), None, Some(&netns));
    if let Err(e) = del {
        // The netns stays for the retry (DEL is best with it).
        errors.push(Error::step("tear down network", id, e));
        return Error::collect(errors);
    }
    for dir in rt.cfg.namespace_dirs() {
        if let Err(e) = rt.host.remove_namespace(&dir.join(&name)) {
            errors.push(Error::step("close namespace", id, e));
        }
    }
    let dir = rt.cfg.root.join("sandboxes").join(id);
    for d in [&dir, &rt.cfg.root.join(crate::userns::DIR).join(id)] {
        if let Err(e) = remove_orphan_dir(rt, d) {
            errors.push(Error::step("remove sandbox dir", id, e));
        }
    }
    let cgroup = crate::cgroups::owned::of(&rt.cfg.root, id)
        .unwrap_or_else(|| rt.cgroup_driver.own_pod_cgroup(&rt.cfg.cgroup_parent, id));
    match rt.host.remove_cgroup(&cgroup) {
        Ok(()) => {
            if let Err(e) = crate::cgroups::owned::forget(&rt.cfg.root, id) {
                errors.push(Error::step("erase the pod cgroup's note", id, e));
            }
        }
        Err(e) => errors.push(Error::step("remove pod cgroup", id, e)),
    }
    if errors.is_empty() {
        if let Err(e) = rt.cni.remove_cache(id) {
            errors.push(Error::step("remove CNI cache", id, e));
        }
    }
    if errors.is_empty() {
        lock(&rt.quarantine).sandboxes.remove(id);
        tracing::info!(sandbox_id = %id, "quarantined sandbox removed");
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
pub(crate) fn remove_orphan_dir(rt: &Runtime, dir: &std::path::Path) -> Result<(), HostError> {
    rt.host.unmount_all(&dir.join("shm"))?;
    crate::mounts::remove_record_dir(dir)
}
