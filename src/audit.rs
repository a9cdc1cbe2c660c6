//! The node's self-audit: what this daemon left on the host that no record owns any more.
//!
//! Each kind of host object the lifecycle makes is listed from the host and compared with the
//! records (readable or quarantined). The host is listed first and the owners read after, so an
//! object made while the audit runs is never taken for an orphan: every verb registers its id
//! before it touches the host, and unregisters it only after the teardown.
//!
//! The start-up sweep ([`collect`] with no grace) and `sandboxctl doctor --fix` remove orphans
//! through the same code, each kind in the seeds' teardown order: processes (runtime
//! containers), then the network (CNI DEL while the cache names it), mounts, namespace files,
//! dirs and sockets, what interrupted pulls left, image content nothing references, and last
//! the pod cgroups (empty by then).
//! Ownership is decided per kind once, just before that kind's removals: ids are never
//! reused, so an id registered after that cannot own an object already listed.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use crate::runtime::Runtime;
use crate::state::lock;
use crate::validate;

pub use crate::model::audit::{Kind, Orphan, Report};

/// The start-up sweep (see [`Runtime::sweep_left_over`]), once the records are restored: what
/// no record references now is an orphan of the last run (a crash between a host step and the
/// record naming it), collected at once by the audit's own finders, in teardown order. The
/// image store's kinds are left to its own start-up work (`tmp/` when it opens, unused
/// content right after this sweep). `sandboxctl doctor` lists what appears later.
pub(crate) fn sweep_at_start(rt: &Runtime) {
    let swept: usize = Kind::ALL
        .into_iter()
        .filter(|k| !matches!(k, Kind::PartialPull | Kind::UnusedImageContent))
        .map(|k| collect(rt, k, std::time::Duration::ZERO).len())
        .sum();
    if swept > 0 {
        tracing::info!(orphans = swept, "collected what the last run left");
    }
}

/// Lists every orphan, changing nothing.
pub fn audit(rt: &Runtime) -> Report {
    let start = Instant::now();
    let mut orphans = Vec::new();
    for kind in Kind::ALL {
        orphans.extend(find(rt, kind));
    }
    Report {
        orphans,
        took: start.elapsed(),
        at: Some(SystemTime::now()),
    }
}

/// Lists every orphan and removes those at least `grace` old, kind by kind in teardown order,
/// each kind's owners read again just before its removals.
pub fn fix(rt: &Runtime, grace: Duration) -> Report {
    let start = Instant::now();
    let mut orphans = Vec::new();
    for kind in Kind::ALL {
        orphans.extend(collect(rt, kind, grace));
    }
    Report {
        orphans,
        took: start.elapsed(),
        at: Some(SystemTime::now()),
    }
}

/// Finds the orphans of one kind and removes those at least `grace` old.
pub(crate) fn collect(rt: &Runtime, kind: Kind, grace: Duration) -> Vec<Orphan> {
    let mut found = find(rt, kind);
    let owners = Owners::read(rt);
    let due = |o: &Orphan| o.age.unwrap_or(Duration::MAX) >= grace && !owners.owns(o);
    // Unused image content goes in one collection under the store's lock, which reads what
    // is in use again: what became used since stays.
    if kind == Kind::UnusedImageContent && found.iter().any(due) {
        let collected = rt
            .images
            .collect(&rt.layers_in_use())
            .map_err(|e| e.to_string());
        for o in found.iter_mut().filter(|o| due(o)) {
            o.fixed = Some(match (&collected, o.path.exists()) {
                (Err(e), _) => Err(e.clone()),
                (Ok(_), false) => Ok(()),
                (Ok(_), true) => Err("in use again".into()),
            });
        }
        return found;
    }
    for o in &mut found {
        if !due(o) {
            continue;
        }
        let r = remove(rt, o);
        match &r {
            Ok(()) => {
                tracing::info!(kind = kind.as_str(), owner = %o.owner, path = %o.path.display(), "orphan removed")
            }
            Err(e) => {
                tracing::warn!(kind = kind.as_str(), owner = %o.owner, path = %o.path.display(), error = %e, "cannot remove orphan")
            }
        }
        o.fixed = Some(r);
    }
    found
}

/// Everything that owns host objects: ids with a record (readable or quarantined), and the
/// namespace files records name.
struct Owners {
    ids: HashSet<String>,
    namespace_files: HashSet<PathBuf>,
    /// The namespace file names of every sandbox id (see `Runtime::ns_name`).
    namespace_names: HashSet<String>,
    /// The first 16 characters of every id (attach and exec socket names).
    shorts: HashSet<String>,
}

impl Owners {
    fn read(rt: &Runtime) -> Owners {
        let reg = lock(&rt.registry);
        let q = lock(&rt.quarantine);
        let ids: HashSet<String> = reg
            .sandboxes
            .keys()
            .chain(reg.containers.keys())
            .chain(q.sandboxes.keys())
            .chain(q.containers.keys())
            .cloned()
            .collect();
        let namespace_files = reg
            .sandboxes
            .values()
            .flat_map(|e| {
                lock(&e.record)
                    .namespace_files()
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .collect();
        let namespace_names = reg
            .sandboxes
            .keys()
            .chain(q.sandboxes.keys())
            .filter(|id| id.len() >= 16)
            .map(|id| rt.ns_name(id))
            .collect();
        let shorts = ids
            .iter()
            .filter_map(|id: &String| id.get(..16).map(str::to_string))
            .collect();
        Owners {
            ids,
            namespace_files,
            namespace_names,
            shorts,
        }
    }

    fn owns(&self, o: &Orphan) -> bool {
        match o.kind {
            // Tmp entries have no id: their writer's liveness was the test; the store decides
            // what content is unused under its own lock.
            Kind::PartialPull | Kind::UnusedImageContent => false,
            Kind::Namespace => {
                self.namespace_files.contains(&o.path)
                    || o.path
                        .file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| self.namespace_names.contains(n))
            }
            Kind::Socket => self.shorts.contains(&o.owner),
            _ => self.ids.contains(&o.owner),
        }
    }
}

fn age(p: &Path) -> Option<Duration> {
    let m = std::fs::symlink_metadata(p).ok()?.modified().ok()?;
    Some(m.elapsed().unwrap_or_default())
}

/// A candidate: its age is read once it is known to be an orphan (`find`), not for each of
/// the thousands of owned objects listed with it.
fn orphan(kind: Kind, owner: &str, path: PathBuf) -> Orphan {
    Orphan {
        kind,
        owner: owner.to_string(),
        age: None,
        path,
        fixed: None,
    }
}

/// Full ids named by the entries of `dir`.
fn ids_in(dir: &Path) -> Vec<String> {
    crate::state::list_dir(dir)
        .into_iter()
        .filter(|n| validate::full_id(n).is_ok())
        .collect()
}

/// The orphans of one kind: the host listed first, the owners read after.
fn find(rt: &Runtime, kind: Kind) -> Vec<Orphan> {
    let root = &rt.cfg.root;
    let listed: Vec<Orphan> = match kind {
        Kind::RuntimeContainer => rt
            .runtimes
            .values()
            .flat_map(|r| {
                ids_in(&r.root)
                    .into_iter()
                    .map(|id| orphan(kind, &id, r.root.join(&id)))
            })
            .collect(),
        Kind::CniCache => rt
            .cni
            .cached_ids()
            .into_iter()
            .map(|id| orphan(kind, &id, rt.cni.cache_path(&id)))
            .collect(),
        Kind::IpamReservation => ipam_reservations(rt),
        Kind::Mount => {
            let dirs = [
                root.join("sandboxes"),
                root.join("containers"),
                root.join(crate::userns::DIR),
            ];
            crate::mounts::mountinfo()
                .unwrap_or_default()
                .into_iter()
                .filter_map(|m| {
                    let owner = dirs.iter().find_map(|d| {
                        let rest = m.mount_point.strip_prefix(d).ok()?;
                        let id = rest.components().next()?.as_os_str().to_str()?;
                        validate::full_id(id).is_ok().then(|| id.to_string())
                    })?;
                    Some(orphan(kind, &owner, m.mount_point))
                })
                .collect()
        }
        Kind::Namespace => {
            let prefix = rt.ns_prefix();
            rt.cfg
                .namespace_dirs()
                .into_iter()
                .flat_map(|d| {
                    crate::state::list_dir(d)
                        .into_iter()
                        .filter(|n| n.starts_with(&prefix))
                        .map(|n| orphan(kind, n.rsplit('-').next().unwrap_or(""), d.join(&n)))
                })
                .collect()
        }
        Kind::SandboxDir | Kind::ContainerDir | Kind::UsernsDir => {
            let dir = match kind {
                Kind::SandboxDir => root.join("sandboxes"),
                Kind::ContainerDir => root.join("containers"),
                _ => root.join(crate::userns::DIR),
            };
            ids_in(&dir)
                .into_iter()
                .map(|id| orphan(kind, &id, dir.join(&id)))
                .collect()
        }
        Kind::Socket => ["attach", "exec"]
            .iter()
            .flat_map(|d| {
                let dir = root.join(d);
                crate::state::list_dir(&dir)
                    .into_iter()
                    .filter_map(move |n| {
                        let short = n.split('.').next()?.to_string();
                        (short.len() == 16).then(|| orphan(kind, &short, dir.join(&n)))
                    })
            })
            .collect(),
        Kind::PartialPull => rt
            .images
            .abandoned_tmp(Duration::from_secs(3600))
            .into_iter()
            .map(|p| orphan(kind, "", p))
            .collect(),
        Kind::UnusedImageContent => rt
            .images
            .unused(&rt.layers_in_use())
            .unwrap_or_default()
            .into_iter()
            .map(|p| {
                let digest = p
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or("")
                    .to_string();
                orphan(kind, &format!("sha256:{digest}"), p)
            })
            .collect(),
        Kind::Cgroup => pod_cgroups(rt),
    };
    let owners = Owners::read(rt);
    let mut orphans: Vec<Orphan> = listed.into_iter().filter(|o| !owners.owns(o)).collect();
    if kind == Kind::Cgroup {
        orphans = orphans
            .into_iter()
            .filter_map(|o| cgroup_dir(rt, o))
            .collect();
    }
    for o in &mut orphans {
        o.age = age(&o.path);
    }
    if kind == Kind::RuntimeContainer {
        orphans.retain(|o| runtime_container_is_ours(rt, o));
    }
    if kind == Kind::Mount {
        // Innermost first, so each unmount finds its mount point.
        orphans.sort_by_key(|o| std::cmp::Reverse(o.path.components().count()));
    }
    orphans
}

/// The host-local reservations of today's network whose dir is under our state root (the
/// embedded default network's, or a config's `dataDir` there): one file per address, named
/// by it, its first line the container id. A dir elsewhere (`/var/lib/cni/networks` by
/// default) may hold another runtime's pods, which no record of ours can tell apart: never
/// listed. A reservation a CNI cache entry still names is that kind's.
fn ipam_reservations(rt: &Runtime) -> Vec<Orphan> {
    let Ok(list) = rt.network() else {
        return Vec::new();
    };
    let cached: HashSet<String> = rt.cni.cached_ids().into_iter().collect();
    let mut out = Vec::new();
    for p in &list.plugins {
        let ipam = &p["ipam"];
        if ipam["type"] != "host-local" {
            continue;
        }
        let data = ipam["dataDir"].as_str().unwrap_or("/var/lib/cni/networks");
        let dir = Path::new(data).join(&list.name);
        if !dir.starts_with(&rt.cfg.root) || list.name.contains('/') {
            continue;
        }
        for n in crate::state::list_dir(&dir) {
            if n.parse::<std::net::IpAddr>().is_err() {
                continue;
            }
            let path = dir.join(&n);
            let Ok(raw) = crate::untrusted_fs::read_file(&path, 512) else {
                continue;
            };
            let text = String::from_utf8_lossy(&raw);
            let id = text.lines().next().unwrap_or("").trim();
            if validate::full_id(id).is_ok() && !cached.contains(id) {
                out.push(orphan(Kind::IpamReservation, id, path));
            }
        }
    }
    out
}

/// A runtime container no record names is ours to delete when its runtime's state dir is
/// under our state root (the default), or, in a state dir configured elsewhere and perhaps
/// shared with another daemon, when its bundle is under our state root.
fn runtime_container_is_ours(rt: &Runtime, o: &Orphan) -> bool {
    let Some(runtime) = rt
        .runtimes
        .values()
        .find(|r| o.path.parent() == Some(r.root.as_path()))
    else {
        return false;
    };
    if runtime.root.starts_with(&rt.cfg.root) {
        return true;
    }
    match runtime.state(&o.owner) {
        Ok(Some(s)) => Path::new(&s.bundle).starts_with(&rt.cfg.root),
        _ => false,
    }
}

/// The pod cgroups this daemon made itself (pods whose config names no parent), as written
/// down under its state root (`cgroups::owned`), one entry per pod: never a cgroup merely
/// found under the parent, which another daemon may share. Each is listed at its note;
/// `cgroup_dir` reads the note, and finds the cgroup's dir, only for those that turn out to
/// be orphans.
fn pod_cgroups(rt: &Runtime) -> Vec<Orphan> {
    crate::cgroups::owned::noted(&rt.cfg.root)
        .into_iter()
        .map(|(id, note)| orphan(Kind::Cgroup, &id, note))
        .collect()
}

/// An orphan pod's cgroup dir (the first hierarchy holding it; its note where none does);
/// `None` for a note that names no plausible cgroup of the pod.
fn cgroup_dir(rt: &Runtime, o: Orphan) -> Option<Orphan> {
    let cgroup = crate::cgroups::owned::of(&rt.cfg.root, &o.owner)?;
    let fs = crate::cgroups::systemd::fs_path(&cgroup).into_owned();
    let at = crate::cgroups::hierarchies()
        .iter()
        .map(|h| h.mount_point.join(fs.trim_start_matches('/')))
        .find(|d| d.is_dir());
    Some(Orphan {
        path: at.unwrap_or(o.path),
        ..o
    })
}

fn remove(rt: &Runtime, o: &Orphan) -> std::result::Result<(), String> {
    match o.kind {
        Kind::RuntimeContainer => {
            let runtime = rt
                .runtimes
                .values()
                .find(|r| o.path.parent() == Some(r.root.as_path()))
                .ok_or("its runtime is no longer configured")?;
            let log = rt
                .cfg
                .root
                .join("runtime")
                .join(format!("{}-gc.log", runtime.name));
            rt.host
                .runtime_delete(runtime, &o.owner, &log)
                .map_err(|e| e.to_string())
        }
        Kind::CniCache => match rt.cni.load_cache(&o.owner) {
            Some(kept) => {
                // Its netns is gone or not ours to enter: DEL releases the IPAM reservation.
                crate::sandbox::network::del(rt, &o.owner, Some(kept), None, None)
                    .map_err(|e| format!("CNI DEL: {e}"))?;
                rt.cni.remove_cache(&o.owner).map_err(|e| e.to_string())
            }
            None => rt.cni.remove_cache(&o.owner).map_err(|e| e.to_string()),
        },
        Kind::IpamReservation => {
            // DEL as the attachment was made (container id, eth0), with today's config; the
            // plugins release the address, the file goes with it.
            crate::sandbox::network::del(rt, &o.owner, None, None, None)
                .map_err(|e| format!("CNI DEL: {e}"))?;
            match o.path.exists() {
                true => Err(format!("CNI DEL left {}", o.path.display())),
                false => Ok(()),
            }
        }
        Kind::Mount => rt.host.unmount_all(&o.path).map_err(|e| e.to_string()),
        Kind::Namespace => rt.host.remove_namespace(&o.path).map_err(|e| e.to_string()),
        Kind::SandboxDir => {
            crate::sandbox::remove::remove_orphan_dir(rt, &o.path).map_err(|e| e.to_string())
        }
        Kind::ContainerDir | Kind::UsernsDir => {
            rt.host
                .unmount_all(&o.path.join("rootfs"))
                .map_err(|e| e.to_string())?;
            crate::mounts::remove_record_dir(&o.path).map_err(|e| e.to_string())
        }
        Kind::Socket => {
            std::fs::remove_file(&o.path).map_err(|e| format!("remove {}: {e}", o.path.display()))
        }
        Kind::Cgroup => {
            let cgroup = crate::cgroups::owned::of(&rt.cfg.root, &o.owner)
                .ok_or("its note is gone: not ours to remove")?;
            rt.host.remove_cgroup(&cgroup).map_err(|e| e.to_string())?;
            crate::cgroups::owned::forget(&rt.cfg.root, &o.owner).map_err(|e| e.to_string())
        }
        // Collected as a whole (see `collect`).
        Kind::UnusedImageContent => Err("collected by the image store".into()),
        Kind::PartialPull => std::fs::remove_dir_all(&o.path)
            .or_else(|_| std::fs::remove_file(&o.path))
            .map_err(|e| format!("remove {}: {e}", o.path.display())),
    }
}

/// The longest an audit waits for the start-up sweep (each of its host calls is bounded; a
/// sweep stuck past this is the audit's to report on).
const START_UP_SWEEP_WAIT: Duration = Duration::from_secs(120);

impl Runtime {
    /// Lists what this daemon left on the host that no record owns (see [`audit`](self)),
    /// and publishes the counts as metrics.
    pub fn audit(&self) -> Report {
        self.start_up_swept.wait(START_UP_SWEEP_WAIT);
        let r = audit(self);
        self.metrics.record_audit(&r);
        r
    }

    /// [`Runtime::audit`], removing the orphans at least `grace` old. The metrics count what
    /// is left.
    pub fn audit_fix(&self, grace: Duration) -> Report {
        self.start_up_swept.wait(START_UP_SWEEP_WAIT);
        let r = fix(self, grace);
        let mut left = r.clone();
        left.orphans.retain(|o| !matches!(o.fixed, Some(Ok(()))));
        self.metrics.record_audit(&left);
        r
    }
}
