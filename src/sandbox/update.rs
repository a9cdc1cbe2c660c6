//! UpdatePodSandboxResources (in-place pod resize, CRI 1.33): the pod's new resources and
//! overhead are recorded (persisted, shown in the verbose status). Where kubelet gave the pod's
//! cgroup it sizes it itself before it calls this (containerd and CRI-O only record them too);
//! a pod cgroup made by the daemon is resized here. The call is a notice of what kubelet
//! already decided (the CRI says so), so it succeeds with what can be applied: a memory limit
//! below what the pod uses now is not written (the pod's current limit stays, logged) rather
//! than left to the OOM killer, and the rest is applied; the new values are recorded.

use super::SandboxState;
use crate::error::{Error, Result};
use crate::model::container::Resources;
use crate::runtime::Runtime;
use crate::state::lock;

pub(crate) fn update_resources(
    rt: &Runtime,
    id: &str,
    overhead: Option<Resources>,
    resources: Option<Resources>,
) -> Result<()> {
    let entry = rt.lookup(id)?.ok_or_else(|| Error::NotFound {
        kind: "sandbox",
        id: id.to_string(),
    })?;
    // Checked as RunPodSandbox checks them, before anything is written or recorded: a refused
    // call changes nothing.
    crate::container::spec::validate_pod_resources(resources.as_ref(), overhead.as_ref())?;
    let _op = lock(&entry.op);
    let rec = lock(&entry.record).clone();
    if rec.own_pod_cgroup && rec.state == SandboxState::Ready {
        let mut limits = crate::cgroups::PodLimits::of(resources.as_ref(), overhead.as_ref());
        let used = crate::cgroups::usage(&rec.pod_cgroup).memory_bytes;
        if let Some(used) = used.filter(|u| limits.memory > 0 && *u as i64 > limits.memory) {
            let kept = crate::cgroups::PodLimits::of(
                rec.config.resources.as_ref(),
                rec.config.overhead.as_ref(),
            )
            .memory;
            tracing::warn!(sandbox_id = %id, used, asked = limits.memory, kept,
                "the pod uses more memory than its new limit: the memory limit is left as it was (0: none), the rest applied");
            limits.memory = kept;
        }
        rt.host
            .set_cgroup_limits(&rec.pod_cgroup, &limits)
            .map_err(|e| Error::step("resize the pod's cgroup", id, e))?;
    }
    entry.update(|r| {
        r.config.overhead = overhead;
        r.config.resources = resources;
    })?;
    if !rt.nri.active() {
        return Ok(());
    }
    let snapshot = lock(&entry.record).clone();
    rt.nri.update_pod_sandbox(&snapshot, &rt.cfg)
}
