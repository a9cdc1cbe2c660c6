//! Restore after a restart: load every record, roll back the half-created, re-reserve names,
//! reconcile Ready sandboxes against the runtime, and collect what no record references
//! (namespace files with our prefix, record-less dirs, CNI cache entries, runtime containers).

use std::collections::HashSet;

use super::*;
use crate::cni::CacheEntry;
use crate::error::Result;
use crate::{lock, validate, Runtime, SandboxEntry};

pub(crate) fn restore(rt: &Runtime) -> Result<()> {
    let dir = rt.cfg.root.join("sandboxes");
    for (id, path, rec) in crate::state::record_dirs::<SandboxRecord>(&dir, "sandbox")? {
        match rec {
            Ok(Some(rec)) if rec.id == id => {
                restore_one(rt, rec);
            }
            Ok(Some(rec)) => {
                quarantine(rt, &id, format!("its record names another id ({})", rec.id))
            }
            Ok(None) => {
                tracing::info!(sandbox_id = %id, "removing sandbox dir without a record");
                if let Err(e) = super::remove::remove_orphan_dir(rt, &path) {
                    tracing::warn!(sandbox_id = %id, error = %e, "cannot remove orphan sandbox dir");
                }
            }
            Err(e) => quarantine(rt, &id, format!("unreadable record: {e}")),
        }
    }
    collect_namespaces(rt);
    collect_cni(rt);
    collect_runtime_containers(rt);
    collect_userns_dirs(rt);
    Ok(())
}

/// Leaves a sandbox whose record cannot be trusted alone: nothing it may name is collected
/// (its namespace files carry its id, its CNI attachment is kept on its own) until an
/// explicit RemovePodSandbox of its id finishes the teardown.
fn quarantine(rt: &Runtime, id: &str, why: String) {
    tracing::error!(sandbox_id = %id, reason = %why, "sandbox quarantined: nothing it may own is collected; RemovePodSandbox of its id finishes its teardown");
    lock(&rt.quarantine).sandboxes.insert(id.to_string(), why);
}

fn restore_one(rt: &Runtime, rec: SandboxRecord) {
    let id = rec.id.clone();
    let name = rec.name.clone();
    let state = rec.state;
    let entry = SandboxEntry::new(rec);
    {
        let mut reg = lock(&rt.registry);
        if let Err(e) = reg.names.reserve(&name, &id) {
            tracing::warn!(sandbox_id = %id, error = %e, "name conflict on restore");
        }
        reg.ids.insert(&id);
        reg.sandboxes.insert(id.clone(), entry.clone());
    }
    match state {
        SandboxState::Creating => {
            tracing::info!(sandbox_id = %id, "rolling back a sandbox whose creation was interrupted");
            match super::remove::teardown(rt, &entry, true) {
                Ok(()) => super::remove::unregister(rt, &entry),
                Err(e) => {
                    tracing::warn!(sandbox_id = %id, error = %e, "rollback incomplete; left NotReady for Stop/Remove")
                }
            }
        }
        SandboxState::Ready => reconcile_ready(rt, &entry),
        SandboxState::NotReady => {}
    }
    retry_given_up_network(rt, &entry);
}

/// A Ready sandbox whose infra process died while we were away is NotReady now (kubelet
/// then recreates the pod), as is one whose network namespace is gone.
fn reconcile_ready(rt: &Runtime, entry: &SandboxEntry) {
    let rec = lock(&entry.record).clone();
    let mut healthy = rec.netns.as_ref().is_none_or(|p| rt.host.is_namespace(p));
    if let (Some(infra), Ok(runtime)) = (&rec.infra, rt.handler(&rec.runtime_handler)) {
        let state = rt.host.runtime_state(runtime, &infra.id);
        let running = matches!(state, Ok(Some(s)) if s.status == "running");
        healthy &= running;
    }
    if !healthy {
        tracing::warn!(sandbox_id = %rec.id, "sandbox lost its infra process or netns while the daemon was down");
        let _ = entry.update(|r| r.state = SandboxState::NotReady);
    } else {
        super::infra::watch(rt, entry);
    }
}

fn retry_given_up_network(rt: &Runtime, entry: &SandboxEntry) {
    let rec = lock(&entry.record).clone();
    if !rec.network.gave_up {
        return;
    }
    if let Some(CacheEntry {
        list,
        mut attachment,
        result,
    }) = rt.cni.load_cache(&rec.id)
    {
        attachment.netns = None;
        if rt
            .host
            .cni_del(&rt.cni, &list, &attachment, result.as_ref())
            .is_ok()
        {
            let _ = rt.cni.remove_cache(&rec.id);
            let _ = entry.update(|r| {
                r.network.gave_up = false;
                r.network.last_del_error = None;
            });
        }
    }
}

/// Namespace files carrying this root's prefix that no record references.
fn collect_namespaces(rt: &Runtime) {
    let referenced: HashSet<std::path::PathBuf> = lock(&rt.registry)
        .sandboxes
        .values()
        .flat_map(|e| {
            let r = lock(&e.record);
            r.namespace_files().cloned().collect::<Vec<_>>()
        })
        .collect();
    let quarantined: HashSet<String> = lock(&rt.quarantine)
        .sandboxes
        .keys()
        .map(|id| rt.ns_name(id))
        .collect();
    let prefix = rt.ns_prefix();
    for dir in rt.cfg.namespace_dirs() {
        let Ok(rd) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in rd.filter_map(|e| e.ok()) {
            let p = e.path();
            let ours = e
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(&prefix) && !quarantined.contains(n));
            if ours && !referenced.contains(&p) {
                tracing::info!(path = %p.display(), "removing unreferenced namespace file");
                if let Err(err) = rt.host.remove_namespace(&p) {
                    tracing::warn!(path = %p.display(), error = %err, "cannot remove namespace file");
                }
            }
        }
    }
}

/// CNI cache entries without a sandbox: their network was set up (or half set up) and never
/// torn down. DEL them with an empty netns so IPAM reservations are released.
fn collect_cni(rt: &Runtime) {
    let mut registered: HashSet<String> = lock(&rt.registry).sandboxes.keys().cloned().collect();
    registered.extend(lock(&rt.quarantine).sandboxes.keys().cloned());
    for id in rt.cni.cached_ids() {
        if registered.contains(&id) {
            continue;
        }
        match rt.cni.load_cache(&id) {
            Some(CacheEntry {
                list,
                mut attachment,
                result,
            }) => {
                attachment.netns = None;
                match rt
                    .host
                    .cni_del(&rt.cni, &list, &attachment, result.as_ref())
                {
                    Ok(()) => {
                        let _ = rt.cni.remove_cache(&id);
                    }
                    Err(e) => {
                        tracing::warn!(sandbox_id = %id, error = %e, "CNI DEL of an orphaned network failed; will retry at next start")
                    }
                }
            }
            None => {
                let _ = rt.cni.remove_cache(&id);
            }
        }
    }
}

/// The ids of every sandbox and container with a record, readable or quarantined.
fn known_ids(rt: &Runtime) -> HashSet<String> {
    let reg = lock(&rt.registry);
    let q = lock(&rt.quarantine);
    reg.sandboxes
        .keys()
        .chain(reg.containers.keys())
        .chain(q.sandboxes.keys())
        .chain(q.containers.keys())
        .cloned()
        .collect()
}

/// User-namespace mount dirs (`<root>/userns/<id>`) of ids no record names (a crash between
/// making one and the first record, say): unmounted and removed.
fn collect_userns_dirs(rt: &Runtime) {
    let known = known_ids(rt);
    let Ok(rd) = std::fs::read_dir(rt.cfg.root.join(crate::userns::DIR)) else {
        return;
    };
    for e in rd.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        if known.contains(&name) {
            continue;
        }
        tracing::info!(path = %e.path().display(), "removing unreferenced user-namespace mount dir");
        if let Err(err) = crate::state::remove_record_dir(&e.path()) {
            tracing::warn!(path = %e.path().display(), error = %err, "cannot remove user-namespace mount dir");
        }
    }
}

/// Runtime containers under our runtime roots that no record references.
fn collect_runtime_containers(rt: &Runtime) {
    let registered = known_ids(rt);
    for runtime in rt.runtimes.values() {
        let Ok(rd) = std::fs::read_dir(&runtime.root) else {
            continue;
        };
        for e in rd.filter_map(|e| e.ok()) {
            let Some(id) = e.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if validate::full_id(&id).is_err() || registered.contains(&id) {
                continue;
            }
            tracing::info!(container_id = %id, runtime = %runtime.name, "deleting unreferenced runtime container");
            let log = rt
                .cfg
                .root
                .join("runtime")
                .join(format!("{}-gc.log", runtime.name));
            if let Err(err) = rt.host.runtime_delete(runtime, &id, &log) {
                tracing::warn!(container_id = %id, error = %err, "cannot delete runtime container");
            }
        }
    }
}
