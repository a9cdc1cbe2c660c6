//! The pod's CNI attachment. Its network namespace path has one owner, the record's `netns`:
//! the attachment recorded before ADD (and the CNI cache file) leaves it empty, and every
//! ADD and DEL is given the path here — a DEL only while the file is still a namespace (the
//! spec lets plugins clean up without one).

use std::path::Path;

use crate::cni::{Attachment, CacheEntry, CniError};
use crate::model::sandbox::PodSandboxConfig;
use crate::runtime::Runtime;

/// The attachment recorded for a pod at RunPodSandbox, its netns left to the record.
pub(crate) fn attachment(id: &str, config: Option<&PodSandboxConfig>) -> Attachment {
    let meta = config.map(|c| &c.metadata);
    Attachment {
        container_id: id.to_string(),
        netns: None,
        ifname: "eth0".into(),
        pod_name: meta.map(|m| m.name.clone()).unwrap_or_default(),
        pod_namespace: meta.map(|m| m.namespace.clone()).unwrap_or_default(),
        pod_uid: meta.map(|m| m.uid.clone()).unwrap_or_default(),
        port_mappings: config.map(|c| c.port_mappings.clone()).unwrap_or_default(),
    }
}

/// CNI ADD in the pod's netns; returns the result.
pub(crate) fn add(
    rt: &Runtime,
    entry: &CacheEntry,
    netns: &Path,
) -> Result<serde_json::Value, CniError> {
    let att = Attachment {
        netns: Some(netns.to_path_buf()),
        ..entry.attachment.clone()
    };
    rt.host.cni_add(&rt.cni, &entry.list, &att)
}

/// CNI DEL of pod `id`: with `kept` (the list, attachment and ADD result recorded or cached),
/// else with today's network config and what `config` says of the pod. `netns` is passed
/// only while it is a namespace.
pub(crate) fn del(
    rt: &Runtime,
    id: &str,
    kept: Option<CacheEntry>,
    config: Option<&PodSandboxConfig>,
    netns: Option<&Path>,
) -> Result<(), CniError> {
    let netns = netns
        .filter(|p| rt.host.is_namespace(p))
        .map(Path::to_path_buf);
    let (list, att, result) = match kept {
        Some(c) => (c.list, c.attachment, c.result),
        None => {
            tracing::warn!(sandbox_id = %id, "no CNI attachment was kept for it; DEL with today's network config");
            (rt.network()?, attachment(id, config), None)
        }
    };
    let att = Attachment { netns, ..att };
    rt.host.cni_del(&rt.cni, &list, &att, result.as_ref())
}
