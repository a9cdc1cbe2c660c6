//! UpdateContainerResources and ReopenContainerLog.

use super::status::require;
use crate::error::{Error, HostError, Result};
use crate::model::container::{ContainerState, Resources};
use crate::runtime::Runtime;
use crate::state::lock;

/// UpdateContainerResources: the runtime's `update` applies the new limits to the cgroup;
/// the record keeps them for status.
/// NRI plugins subscribed to UpdateContainer see the request first and may change it.
pub(crate) fn update_resources(rt: &Runtime, id: &str, res: &Resources) -> Result<()> {
    super::spec::validate_resources(res)?;
    if !rt.nri.active() {
        return apply_resources(rt, id, res);
    }
    let rec = rt.container_record(id)?;
    let sb = rt.sandbox_record(&rec.sandbox_id)?;
    let res = rt.nri.update_container(&sb, &rec, &rt.cfg, res)?;
    super::spec::validate_resources(&res)?;
    apply_resources(rt, id, &res)?;
    let rec = rt.container_record(id)?;
    rt.nri.post_update_container(&sb, &rec, &rt.cfg);
    Ok(())
}

/// Applies new resources to a created or running container (what an NRI plugin's own
/// update does too, without asking the plugins again).
pub(crate) fn apply_resources(rt: &Runtime, id: &str, res: &Resources) -> Result<()> {
    let entry = rt.container_entry(id)?;
    let _op = lock(&entry.op);
    let ok = [ContainerState::Created, ContainerState::Running];
    let rec = require(rt, &entry, &ok, |r| {
        format!(
            "container {} is {:?}; only a created or running container can be updated",
            r.id, r.state
        )
    })?;
    // A one-off input of `runtime update`, not state: no fsync.
    let file = rec.dir.join("resources.json");
    crate::state::files::write_private(
        &file,
        super::spec::resources_json(res).to_string().as_bytes(),
    )
    .map_err(|e| Error::step("write resources", &rec.id, e))?;
    let runtime = rt.handler(&rec.runtime_handler)?;
    runtime
        .update(&rec.id, &file, &rec.files().runtime_log)
        .map_err(|e| Error::step("update container resources", &rec.id, e))?;
    entry.update(|r| r.config.resources = res.clone())
}

/// ReopenContainerLog: the monitor reopens the log file (after kubelet rotated it).
pub(crate) fn reopen_log(rt: &Runtime, id: &str) -> Result<()> {
    let entry = rt.container_entry(id)?;
    let rec = require(rt, &entry, &[ContainerState::Running], |r| {
        format!(
            "container {} is not running; its log cannot be reopened",
            r.id
        )
    })?;
    let pid = rec
        .files()
        .monitor_pid()
        .ok_or_else(|| Error::FailedPrecondition(format!("container {} has no monitor", rec.id)))?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGUSR1,
    )
    .map_err(|e| {
        Error::step(
            "reopen log",
            &rec.id,
            HostError::sys("signal monitor", "", e),
        )
    })
}
