//! Restore after a restart: load every record, roll back the half-created, re-reserve names,
//! and reconcile Ready sandboxes against the runtime (the audit's start-up sweep then collects
//! what no record references).

use crate::error::Result;
use crate::model::sandbox::{SandboxRecord, SandboxState};
use crate::runtime::{Runtime, SandboxEntry};
use crate::state::lock;

pub(crate) fn restore(rt: &Runtime) -> Result<()> {
    let dir = rt.cfg.root.join("sandboxes");
    for (id, path, rec) in
        crate::state::record_dirs::<SandboxRecord>(&dir, "sandbox", crate::model::RECORD_FORMAT)?
    {
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
    rt.cni.remove_partial_writes();
    Ok(())
}

/// Leaves a sandbox whose record cannot be trusted alone: nothing it may name is collected
/// (its namespace files carry its id, its CNI attachment is kept on its own) until an
/// explicit RemovePodSandbox of its id finishes the teardown.
fn quarantine(rt: &Runtime, id: &str, why: String) {
    tracing::error!(sandbox_id = %id, reason = %why, "sandbox quarantined: nothing it may own is collected; RemovePodSandbox of its id finishes its teardown");
    lock(&rt.quarantine).sandboxes.insert(id.to_string(), why);
}

fn restore_one(rt: &Runtime, mut rec: SandboxRecord) {
    // Records of older versions, brought to today's shape and written back at once.
    let migrated = rec.migrate();
    let id = rec.id.clone();
    let name = rec.name.clone();
    let state = rec.state;
    let entry = SandboxEntry::new(rec);
    if migrated {
        match entry.update(|_| {}) {
            Ok(()) => tracing::info!(sandbox_id = %id, "record migrated from an older format"),
            Err(e) => {
                tracing::warn!(sandbox_id = %id, error = %e, "cannot write the migrated record (kept in memory)")
            }
        }
    }
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
            match super::remove::undo(rt, &entry) {
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
    if let Some(kept) = rt.cni.load_cache(&rec.id) {
        // Its netns went with the given-up DEL's teardown: none is passed.
        if super::network::del(rt, &rec.id, Some(kept), None, None).is_ok() {
            let _ = rt.cni.remove_cache(&rec.id);
            let _ = entry.update(|r| {
                r.network.gave_up = false;
                r.network.last_del_error = None;
            });
        }
    }
}
