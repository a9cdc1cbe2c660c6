//! StopPodSandbox, in the seed order: containers → infra → CNI DEL → close namespaces →
//! unmount shm → record stopped. Each completed step is recorded, so a retry skips it and a
//! repeated stop is a no-op. CNI DEL is attempted until it succeeds (with an empty
//! `CNI_NETNS` when the netns is gone); a failed DEL keeps the netns for the retry, and after
//! `cni_del_max_attempts` failures the network is recorded as given up (start-up retries it).

use std::time::Duration;

use crate::error::{Error, Result};
use crate::failpoint;
use crate::model::sandbox::{InfraRecord, SandboxRecord, SandboxState, StopRecord};
use crate::oci::ContainerFiles;
use crate::runtime::{Runtime, SandboxEntry};
use crate::state::lock;

pub(crate) fn stop(rt: &Runtime, id: &str) -> Result<()> {
    let Some(entry) = rt.lookup(id)? else {
        return Ok(());
    };
    let _op = lock(&entry.op);
    stop_locked(rt, &entry)
}

/// StopPodSandbox's steps that have not completed yet: the pod is marked not ready, its
/// containers stopped, then [`stop_pod`] stops what the pod itself holds.
pub(crate) fn stop_locked(rt: &Runtime, entry: &SandboxEntry) -> Result<()> {
    let rec = lock(&entry.record).clone();
    if is_stopped(&rec) {
        return Ok(()); // already stopped: a repeated stop is a no-op
    }
    mark_not_ready(rt, entry, false)?;
    if !rec.stop.containers_stopped {
        stop_containers(rt, &rec.id)?;
        entry.note(|r| r.stop.containers_stopped = true);
        failpoint::hit("stop:containers");
        // Once per pod that was ready, with every container of it exited.
        if rec.state == SandboxState::Ready && rt.nri.active() {
            let snapshot = lock(&entry.record).clone();
            rt.nri.stop_pod_sandbox(&snapshot, &rt.cfg);
        }
    }
    stop_pod(rt, entry, false)
}

/// Every stop step is done and the record says so.
fn is_stopped(rec: &SandboxRecord) -> bool {
    rec.stop
        == (StopRecord {
            containers_stopped: true,
            netns_closed: true,
            shm_unmounted: true,
        })
        && rec.network.stopped == rec.network.setup_started
        && rec.state == SandboxState::NotReady
}

/// A stop step's change to the record: persisted (see [`persist_or_note`]), or only noted in
/// a rollback. A rollback (the sandbox never became ready) persists nothing: its record is
/// removed at the end, so it must not depend on writing (a full disk is a common cause of
/// the failure it rolls back).
fn record_step(entry: &SandboxEntry, rollback: bool, f: &dyn Fn(&mut SandboxRecord)) -> Result<()> {
    if rollback {
        entry.note(f);
        return Ok(());
    }
    persist_or_note(entry, f)
}

/// The pod is not ready from here on; a pod that was ready says so in a Stopped event.
fn mark_not_ready(rt: &Runtime, entry: &SandboxEntry, rollback: bool) -> Result<()> {
    if lock(&entry.record).state == SandboxState::Ready {
        record_step(entry, rollback, &|r| r.state = SandboxState::NotReady)?;
        let status = lock(&entry.record).status();
        rt.emit_pod(crate::events::EventKind::Stopped, status);
    } else {
        entry.note(|r| r.state = SandboxState::NotReady);
    }
    Ok(())
}

/// Runs the pod's own stop steps that have not completed yet: infra → CNI DEL → namespaces →
/// shm. Every step is idempotent, so progress is kept in memory and persisted once at the
/// end; only a CNI DEL outcome is persisted on the spot (its failure count drives the give-up
/// policy). `rollback` is the undoing of a pod that never became ready (a failed run, or one
/// whose creation a restart interrupted): it has no containers, since CreateContainer takes
/// only a ready pod, under the pod's op lock that the rollback holds. It retries a failing
/// DEL a few times right away (nobody else will call stop for it).
pub(crate) fn stop_pod(rt: &Runtime, entry: &SandboxEntry, rollback: bool) -> Result<()> {
    if rollback {
        mark_not_ready(rt, entry, true)?;
        entry.note(|r| r.stop.containers_stopped = true);
    }
    // Each step below is guarded by its own flag, so a finished stop only persists again.
    let rec = lock(&entry.record).clone();
    let id = rec.id.clone();
    let persist = |f: &dyn Fn(&mut SandboxRecord)| record_step(entry, rollback, f);

    if let Some(infra) = rec.infra.as_ref().filter(|i| !i.stopped) {
        stop_infra(rt, &rec, infra)?;
        entry.note(|r| {
            if let Some(i) = r.infra.as_mut() {
                i.stopped = true;
            }
        });
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
            // Persisted with the final update: a crash before it only repeats an idempotent DEL.
            Ok(()) => entry.note(|r| {
                r.network.stopped = true;
                r.network.last_del_error = None;
            }),
            Err(e) => {
                let msg = e.to_string();
                let max = rt.cfg.cni_del_max_attempts;
                persist(&|r| {
                    r.network.del_failures += 1;
                    r.network.last_del_error = Some(msg.clone());
                    if max > 0 && r.network.del_failures >= max {
                        r.network.stopped = true;
                        r.network.gave_up = true;
                    }
                })?;
                let gave_up = lock(&entry.record).network.gave_up;
                if !gave_up {
                    return Err(Error::step("tear down network", &id, e));
                }
                // Keep what DEL needs beyond the sandbox's life: start-up retries it.
                if let Some(cache) = &rec.network.cache {
                    rt.host
                        .cni_save_cache(&rt.cni, &id, cache)
                        .map_err(|e| Error::step("keep CNI cache", &id, e))?;
                }
                tracing::warn!(sandbox_id = %id, error = %msg, "giving up on CNI DEL after {max} attempts; start-up cleanup will retry it");
            }
        }
        failpoint::hit("stop:cni-del");
    }

    if !rec.stop.netns_closed {
        let mut errors = Vec::new();
        for p in rec.namespace_files() {
            if let Err(e) = rt.host.remove_namespace(p) {
                errors.push(Error::step("close namespace", &id, e));
            }
        }
        Error::collect(errors)?;
        entry.note(|r| r.stop.netns_closed = true);
        failpoint::hit("stop:netns");
    }

    if !rec.stop.shm_unmounted {
        if let Some(shm) = &rec.shm {
            rt.host
                .unmount_all(shm)
                .map_err(|e| Error::step("unmount shm", &id, e))?;
        }
        entry.note(|r| r.stop.shm_unmounted = true);
        failpoint::hit("stop:shm");
    }
    persist(&|_| {})?;
    tracing::info!(sandbox_id = %id, "pod sandbox stopped");
    Ok(())
}

/// Persists a change, or on a full disk keeps it in memory with a warning: every stop step
/// is idempotent, so a record that lags behind only makes a restart redo some of them (and
/// a sandbox whose namespaces are gone is reported not ready).
pub(crate) fn persist_or_note(entry: &SandboxEntry, f: &dyn Fn(&mut SandboxRecord)) -> Result<()> {
    match entry.update(f) {
        Err(e) if e.is_no_space() => {
            tracing::warn!(sandbox_id = %lock(&entry.record).id, error = %e, "no space to persist the stop's progress; kept in memory");
            Ok(())
        }
        r => r,
    }
}

/// Stops the sandbox's containers side by side: stop signal, `stop_grace`, SIGKILL.
fn stop_containers(rt: &Runtime, id: &str) -> Result<()> {
    let containers = rt.containers_of(id);
    let grace = rt.cfg.stop_grace;
    if let [c] = containers.as_slice() {
        let _op = lock(&c.op);
        return crate::container::stop::stop_locked(rt, c, grace);
    }
    let errors: Vec<Error> = std::thread::scope(|s| {
        let handles: Vec<_> = containers
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let _op = lock(&c.op);
                    crate::container::stop::stop_locked(rt, c, grace)
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::step("stop containers", id, "worker panicked")))
                    .err()
            })
            .collect()
    });
    Error::collect(errors)
}

/// CNI DEL with the recorded config and result (or a cache file kept from a given-up
/// attempt); an empty `CNI_NETNS` if the netns is gone.
fn teardown_network(rt: &Runtime, rec: &SandboxRecord) -> Result<(), crate::cni::CniError> {
    let kept = rec
        .network
        .cache
        .clone()
        .or_else(|| rt.cni.load_cache(&rec.id));
    super::network::del(rt, &rec.id, kept, Some(&rec.config), rec.netns.as_deref())
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
    rt.host
        .runtime_kill(runtime, &infra.id, "KILL", false, &files.runtime_log)
        .map_err(|e| Error::step("stop infra container", &rec.id, e))?;
    rt.host
        .wait_exit(&files, &rec.infra_proc(infra), Duration::from_secs(10))
        .map_err(|e| Error::step("stop infra container", &rec.id, e))
}
