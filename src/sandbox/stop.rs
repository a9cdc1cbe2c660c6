//! StopPodSandbox, in the seed order: containers → infra → CNI DEL → close namespaces →
//! unmount shm → record stopped. Each completed step is recorded, so a retry skips it and a
//! repeated stop is a no-op. CNI DEL is attempted until it succeeds (with an empty
//! `CNI_NETNS` when the netns is gone); a failed DEL keeps the netns for the retry, and after
//! `cni_del_max_attempts` failures the network is recorded as given up (start-up retries it).

use std::time::{Duration, Instant};

use super::run::update;
use super::*;
use crate::cni::Attachment;
use crate::error::{Error, Result};
use crate::oci::ContainerFiles;
use crate::{failpoint, lock, Runtime, SandboxEntry};

pub(crate) fn stop(rt: &Runtime, id: &str) -> Result<()> {
    let Some(entry) = rt.lookup(id)? else {
        return Ok(());
    };
    let _op = lock(&entry.op);
    stop_locked(rt, &entry, false)
}

/// Runs the stop steps that have not completed yet. `rollback` retries a failing CNI DEL a
/// few times on the spot (nobody else will call stop for a sandbox that never existed).
pub(crate) fn stop_locked(rt: &Runtime, entry: &SandboxEntry, rollback: bool) -> Result<()> {
    let rec = lock(&entry.record).clone();
    let id = rec.id.clone();
    if rec.state != SandboxState::NotReady {
        update(entry, |r| r.state = SandboxState::NotReady)?;
    }

    if !rec.stop.containers_stopped {
        // Application containers belong to the container layer; none can exist without it.
        update(entry, |r| r.stop.containers_stopped = true)?;
        failpoint::hit("stop:containers");
    }

    if let Some(infra) = rec.infra.as_ref().filter(|i| !i.stopped) {
        stop_infra(rt, &rec, infra)?;
        update(entry, |r| {
            if let Some(i) = r.infra.as_mut() {
                i.stopped = true;
            }
        })?;
        failpoint::hit("stop:infra");
    }

    if rec.network.setup_started && !rec.network.stopped {
        let attempts = if rollback { 3 } else { 1 };
        let mut result = Ok(());
        for _ in 0..attempts {
            result = teardown_network(rt, &rec);
            if result.is_ok() {
                break;
            }
        }
        match result {
            Ok(()) => {
                update(entry, |r| {
                    r.network.stopped = true;
                    r.network.last_del_error = None;
                })?;
                rt.cni
                    .remove_cache(&id)
                    .map_err(|e| Error::step("remove CNI cache", &id, e))?;
            }
            Err(e) => {
                let msg = e.to_string();
                let max = rt.cfg.cni_del_max_attempts;
                let mut gave_up = false;
                update(entry, |r| {
                    r.network.del_failures += 1;
                    r.network.last_del_error = Some(msg.clone());
                    if max > 0 && r.network.del_failures >= max {
                        r.network.stopped = true;
                        r.network.gave_up = true;
                        gave_up = true;
                    }
                })?;
                if !gave_up {
                    return Err(Error::step("tear down network", &id, e));
                }
                tracing::warn!(sandbox_id = %id, error = %msg, "giving up on CNI DEL after {max} attempts; start-up cleanup will retry it");
            }
        }
        failpoint::hit("stop:cni-del");
    }

    if !rec.stop.netns_closed {
        let mut errors = Vec::new();
        for p in [&rec.netns, &rec.ipcns, &rec.utsns].into_iter().flatten() {
            if let Err(e) = crate::netns::remove(p) {
                errors.push(Error::step("close namespace", &id, e));
            }
        }
        Error::collect(errors)?;
        update(entry, |r| r.stop.netns_closed = true)?;
        failpoint::hit("stop:netns");
    }

    if !rec.stop.shm_unmounted {
        if let Some(shm) = &rec.shm {
            crate::mounts::unmount_all(shm).map_err(|e| Error::step("unmount shm", &id, e))?;
        }
        update(entry, |r| r.stop.shm_unmounted = true)?;
        failpoint::hit("stop:shm");
    }
    tracing::info!(sandbox_id = %id, "pod sandbox stopped");
    Ok(())
}

/// CNI DEL with the cached config and result; an empty `CNI_NETNS` if the netns is gone.
fn teardown_network(rt: &Runtime, rec: &SandboxRecord) -> Result<(), crate::cni::CniError> {
    let netns = rec.netns.clone().filter(|p| crate::netns::is_nsfs(p));
    let (list, mut att, result) = match rt.cni.load_cache(&rec.id) {
        Some(c) => (c.list, c.attachment, c.result),
        None => {
            // No usable cache: DEL with today's config is the best that can be done.
            let list = rt.network()?;
            let att = Attachment {
                container_id: rec.id.clone(),
                netns: None,
                ifname: "eth0".into(),
                pod_name: rec.config.metadata.name.clone(),
                pod_namespace: rec.config.metadata.namespace.clone(),
                pod_uid: rec.config.metadata.uid.clone(),
                port_mappings: rec.config.port_mappings.clone(),
            };
            (list, att, None)
        }
    };
    att.netns = netns;
    rt.cni.del(&list, &att, result.as_ref())
}

/// Stops the infra container with SIGKILL (it holds no state, and a PID-namespace init may
/// drop a SIGTERM that arrives before its handlers exist), then waits for the monitor to
/// record the exit.
fn stop_infra(rt: &Runtime, rec: &SandboxRecord, infra: &InfraRecord) -> Result<()> {
    let runtime = rt.handler(&rec.runtime_handler)?;
    let files = ContainerFiles::in_dir(&rec.infra_dir(), None);
    if files.exit().is_some() {
        return Ok(());
    }
    runtime
        .kill(&infra.id, "KILL", &files.runtime_log)
        .map_err(|e| Error::step("stop infra container", &rec.id, e))?;
    wait_exit(&files, infra.pid, Duration::from_secs(10))
        .map_err(|e| Error::step("stop infra container", &rec.id, e))
}

/// Waits until the monitor wrote the exit file, or (monitor gone) the process is gone.
pub(crate) fn wait_exit(files: &ContainerFiles, pid: i32, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    let mut delay = Duration::from_micros(200);
    loop {
        if files.exit().is_some() {
            return Ok(());
        }
        let monitor_alive = files.monitor_pid().is_some_and(alive);
        if !monitor_alive && (pid <= 0 || !alive(pid)) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("process {pid} did not exit within {limit:?}"));
        }
        std::thread::sleep(delay);
        delay = (delay * 2).min(Duration::from_millis(20));
    }
}

fn alive(pid: i32) -> bool {
    pid > 0 && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}
