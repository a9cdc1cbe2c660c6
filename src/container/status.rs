//! Container status: folds the exit the monitor recorded into the record (publishing the
//! STOPPED event once), and the state checks the other verbs make.

use crate::error::{Error, Result};
use crate::model::container::{ContainerFilter, ContainerRecord, ContainerState};
use crate::runtime::{ContainerEntry, Runtime};
use crate::state::lock;
use crate::state::now_nanos;

/// A list re-checks a container the exit watcher covers only when the watcher's own sweep
/// (every [`crate::events::watch::SWEEP`]) has not for this long.
const LIST_RECHECK_MS: u64 = 15_000;

/// ContainerStatus (with the exit folded in if the container has exited); an unknown id
/// is `NotFound`.
pub(crate) fn status(rt: &Runtime, id: &str) -> Result<ContainerRecord> {
    let e = rt.container_entry(id)?;
    if rt.nri.hides(&lock(&e.record).id) {
        return Err(Error::NotFound {
            kind: "container",
            id: id.to_string(),
        });
    }
    Ok(refresh(rt, &e))
}

/// ListContainers, oldest first.
pub(crate) fn list(rt: &Runtime, filter: &ContainerFilter) -> Vec<ContainerRecord> {
    let entries: Vec<_> = lock(&rt.registry).containers.values().cloned().collect();
    let mut out: Vec<ContainerRecord> = entries
        .iter()
        .map(|e| refresh_within(rt, e, LIST_RECHECK_MS))
        .filter(|r| filter.matches(r) && !rt.nri.hides(&r.id))
        .collect();
    // (Compared in place: a key of an owned id cloned two strings per comparison.)
    out.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    out
}

/// Folds an exit the monitor recorded into the record (persisted once), publishing the
/// STOPPED event when this call made the transition.
pub(crate) fn refresh(rt: &Runtime, entry: &ContainerEntry) -> ContainerRecord {
    refresh_within(rt, entry, 0)
}

/// [`refresh`] for lists: a container whose exit the exit watcher folds in as it happens (and
/// whose monitor it checks on its sweep) is checked against the host (its exit file, a dead
/// monitor) only when nothing has for `interval_ms`, so that a list of a thousand containers
/// does not open two thousand files.
pub(crate) fn refresh_within(
    rt: &Runtime,
    entry: &ContainerEntry,
    interval_ms: u64,
) -> ContainerRecord {
    use std::sync::atomic::Ordering;
    let rec = lock(&entry.record).clone();
    if !is_live(rec.state) {
        return rec;
    }
    let now = crate::state::monotonic_ms();
    let last = entry.checked_ms.load(Ordering::Relaxed);
    // Once per interval, at a phase of the container's own (from its id): a thousand
    // containers checked together at start are not all due in one later list, which would
    // pay for all of them at once (the p99 of ListContainerStats at 1,000 pods); spread,
    // each list checks its share.
    let phase = u64::from_str_radix(rec.id.get(..8).unwrap_or("0"), 16).unwrap_or(0);
    let window = |t: u64| (t + phase % interval_ms.max(1)) / interval_ms.max(1);
    if interval_ms > 0 && window(now) == window(last) && rt.exit_watch.covers(&rec.id) {
        return rec;
    }
    entry.checked_ms.store(now, Ordering::Relaxed);
    let files = rec.files();
    let Some(exit) = files.exit() else {
        // No exit recorded: if the monitor died and the container's processes are gone too,
        // nothing will ever record it.
        if rec.state == ContainerState::Running
            && !rec.init_proc().alive()
            && files.monitor_pid().is_some()
            && files.monitor_gone_without_exit()
        {
            tracing::warn!(container_id = %rec.id, "the container's monitor died and its process is gone; exit status unknown");
            mark_exited(rt, entry, |r| {
                r.exit_code = 255;
                r.reason = "Unknown".into();
                r.message = "the monitor died without recording the container's exit".into();
                r.finished_at = now_nanos();
            });
        }
        return lock(&entry.record).clone();
    };
    // The reap's time, not the exit file's: that is written after the output is drained.
    let finished = files.exited_at_nanos(&exit).unwrap_or_else(now_nanos);
    // The monitor saw the kills while the cgroup existed (a systemd scope is gone with the
    // container); a cgroupfs dir still holds them.
    let oom =
        exit.signal == Some(9) && (exit.oom_kills > 0 || crate::cgroups::oom_killed(&rec.cgroup));
    let reason = if oom {
        "OOMKilled"
    } else if exit.exit_code == 0 {
        "Completed"
    } else {
        "Error"
    };
    let message =
        oom.then(|| crate::cgroups::oom_level(&rec.cgroup, exit.oom_at_limit > 0).message());
    mark_exited(rt, entry, |r| {
        r.exit_code = exit.exit_code;
        r.finished_at = finished.max(r.started_at);
        if r.reason.is_empty() {
            r.reason = reason.into();
            if let Some(m) = message {
                r.message = m.into();
            }
        }
    });
    lock(&entry.record).clone()
}

pub(crate) fn is_live(s: ContainerState) -> bool {
    matches!(
        s,
        ContainerState::Created | ContainerState::Running | ContainerState::Unknown
    )
}

/// Records the container exited (with `f`'s details) unless another caller did first;
/// publishes STOPPED if this call did. Returns whether it did. A failure to persist keeps
/// the change in memory (it is written with the next update).
pub(crate) fn mark_exited(
    rt: &Runtime,
    entry: &ContainerEntry,
    f: impl FnOnce(&mut ContainerRecord),
) -> bool {
    let mut changed = false;
    let r = entry.update(|r| {
        if is_live(r.state) {
            r.state = ContainerState::Exited;
            f(r);
            changed = true;
        }
    });
    if let Err(e) = r {
        tracing::warn!(error = %e, "cannot persist a container's exit; kept in memory");
    }
    if changed {
        let rec = lock(&entry.record).clone();
        rt.emit(crate::events::EventKind::Stopped, &rec.id, &rec.sandbox_id);
        // Plugins hear of the exit once, whether it was asked for or not.
        if rt.nri.active() {
            if let Ok(sb) = rt.sandbox_record(&rec.sandbox_id) {
                rt.nri.stop_container(&sb, &rec, &rt.cfg);
            }
        }
    }
    changed
}

/// The refreshed record, if the container is in one of the `ok` states; else
/// FailedPrecondition with `msg`.
pub(crate) fn require(
    rt: &Runtime,
    entry: &ContainerEntry,
    ok: &[ContainerState],
    msg: impl FnOnce(&ContainerRecord) -> String,
) -> Result<ContainerRecord> {
    let rec = refresh(rt, entry);
    if ok.contains(&rec.state) {
        Ok(rec)
    } else {
        Err(Error::FailedPrecondition(msg(&rec)))
    }
}
