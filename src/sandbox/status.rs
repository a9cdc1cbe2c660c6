//! PodSandboxStatus and ListPodSandbox: the records as they stand (an unwatched infra
//! checked first), and what is known of quarantined pods.

use crate::error::{Error, Result};
use crate::model::sandbox::{
    InfraMode, PodSandboxMetadata, SandboxFilter, SandboxState, SandboxStatus,
};
use crate::runtime::Runtime;
use crate::state::{self, lock};

/// PodSandboxStatus; an unknown id is `NotFound`.
pub(crate) fn status(rt: &Runtime, id: &str) -> Result<SandboxStatus> {
    if let Some(entry) = rt.lookup(id)? {
        let full = lock(&entry.record).id.clone();
        if rt.nri.hides(&full) {
            return Err(Error::NotFound {
                kind: "sandbox",
                id: id.to_string(),
            });
        }
        super::infra::check_unwatched(rt, &entry);
        return Ok(lock(&entry.record).status());
    }
    let q = lock(&rt.quarantine).sandboxes.clone();
    match state::Quarantine::find(&q, id) {
        Some(full) => Ok(quarantined_status(rt, &full, &q[&full])),
        None => Err(Error::NotFound {
            kind: "sandbox",
            id: id.to_string(),
        }),
    }
}

/// ListPodSandbox, oldest first.
pub(crate) fn list(rt: &Runtime, filter: &SandboxFilter) -> Vec<SandboxStatus> {
    let entries: Vec<_> = lock(&rt.registry).sandboxes.values().cloned().collect();
    // Each status made under its record's lock: a clone of the whole record (its network
    // cache entry and config) for each pod was most of a list at 1,000 pods.
    let mut out: Vec<SandboxStatus> = entries
        .iter()
        .filter_map(|e| {
            let r = lock(&e.record);
            filter.matches(&r).then(|| r.status())
        })
        .filter(|s| !rt.nri.hides(&s.id))
        .collect();
    // Quarantined pods too, NotReady with what is known, so that kubelet's garbage
    // collector removes them (RemovePodSandbox finishes their teardown).
    let quarantined = lock(&rt.quarantine).sandboxes.clone();
    out.extend(
        quarantined
            .iter()
            .filter(|(id, _)| {
                filter
                    .id_prefix
                    .as_ref()
                    .is_none_or(|p| id.starts_with(p.as_str()))
                    && filter.state.is_none_or(|s| s == SandboxState::NotReady)
                    && filter.labels.is_empty()
            })
            .map(|(id, why)| quarantined_status(rt, id, why)),
    );
    out.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    out
}

/// What is known of a quarantined sandbox (its record unreadable): NotReady, the pod's
/// name, namespace and uid from its CNI attachment (kept apart from the record), created
/// when its dir was, and why in the annotation `io.sandboxd.quarantined`.
fn quarantined_status(rt: &Runtime, id: &str, why: &str) -> SandboxStatus {
    let att = rt.cni.load_cache(id).map(|c| c.attachment);
    let created_at = std::fs::metadata(rt.cfg.root.join("sandboxes").join(id))
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as i64);
    SandboxStatus {
        id: id.to_string(),
        metadata: PodSandboxMetadata {
            name: att.as_ref().map(|a| a.pod_name.clone()).unwrap_or_default(),
            namespace: att
                .as_ref()
                .map(|a| a.pod_namespace.clone())
                .unwrap_or_default(),
            uid: att.as_ref().map(|a| a.pod_uid.clone()).unwrap_or_default(),
            attempt: 0,
        },
        state: SandboxState::NotReady,
        created_at,
        ips: Vec::new(),
        netns_path: None,
        namespace_options: Default::default(),
        labels: Default::default(),
        annotations: [("io.sandboxd.quarantined".to_string(), why.to_string())].into(),
        runtime_handler: String::new(),
        infra_mode: InfraMode::Pinned,
        infra_pid: None,
        network_error: None,
        user_namespace: None,
    }
}
