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

/// ReopenContainerLog: the monitor reopens the log file (after kubelet renamed it away). The
/// call returns once the monitor answered that the new file is open (and so exists); it fails,
/// with no new file, when the monitor could not open it, or did not answer in time.
pub(crate) fn reopen_log(rt: &Runtime, id: &str) -> Result<()> {
    use sandboxd_shim_common::files::{
        parse_log_reopen, write_atomic, Durability, LOG_REOPEN_DONE, LOG_REOPEN_REQUEST,
    };
    let entry = rt.container_entry(id)?;
    // One reopen at a time per container: each waits for the answer to its own token.
    let _op = lock(&entry.op);
    let rec = require(rt, &entry, &[ContainerState::Running], |r| {
        format!(
            "container {} is not running; its log cannot be reopened",
            r.id
        )
    })?;
    let files = rec.files();
    if files.log_path.is_none() {
        return Ok(()); // no log: nothing to reopen
    }
    let pid = files.live_monitor().ok_or_else(|| {
        Error::FailedPrecondition(format!("container {} has no live monitor", rec.id))
    })?;
    let step = |what: &'static str, e: std::io::Error| {
        Error::step("reopen log", &rec.id, HostError::io(what, &rec.dir, e))
    };
    let token = crate::validate::new_id()[..16].to_string();
    let done = rec.dir.join(LOG_REOPEN_DONE);
    let _ = std::fs::remove_file(&done);
    write_atomic(
        &rec.dir.join(LOG_REOPEN_REQUEST),
        token.as_bytes(),
        Durability::Rename,
    )
    .map_err(|e| step("write the reopen request", e.source))?;
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
    })?;
    let deadline = std::time::Instant::now() + REOPEN_LIMIT;
    loop {
        // One short line; read with a cap all the same.
        if let Some(r) = crate::untrusted_fs::read_file(&done, 4096)
            .ok()
            .and_then(|t| parse_log_reopen(&String::from_utf8_lossy(&t), &token))
        {
            return r.map_err(|why| {
                Error::step(
                    "reopen log",
                    &rec.id,
                    format!("the monitor could not reopen the log: {why}"),
                )
            });
        }
        if !crate::process::alive(pid) {
            return Err(Error::FailedPrecondition(format!(
                "container {}: its monitor exited before reopening the log",
                rec.id
            )));
        }
        if std::time::Instant::now() >= deadline {
            // A monitor of a release before the answer existed reopens without answering:
            // the new file is its answer.
            if files.log_path.as_ref().is_some_and(|p| p.exists()) {
                return Ok(());
            }
            return Err(Error::DeadlineExceeded(format!(
                "container {}: the monitor did not reopen the log within {REOPEN_LIMIT:?}",
                rec.id
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// How long ReopenContainerLog waits for the monitor's answer (it answers in microseconds;
/// a monitor of a release before the answer existed never does).
const REOPEN_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);
