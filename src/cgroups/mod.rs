//! cgroup inspection for what the runtime does not tell us: whether a container was
//! OOM-killed, its CPU and memory use, and removing the per-pod parent cgroups we created.
//! The layout is detected from `/proc/self/mountinfo` (v1, v2 or hybrid: never assumed).

use std::path::{Path, PathBuf};

use crate::error::HostError;

mod extra;
mod limits;
pub(crate) mod owned;
pub mod systemd;
mod usage;

pub use extra::{BlkioDevice, Hugetlb, Pressure, Procs};
pub use limits::{set_limits, PodLimits};
pub use usage::{usage, Psi, Usage, UsageCache};

/// The cgroup driver in use (the config's `auto` resolved at start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    Cgroupfs,
    Systemd,
}

/// The last component of a cgroup path (`/a.slice/a-b.slice/` → `a-b.slice`).
fn last_name(path: &str) -> &str {
    path.trim_end_matches('/').rsplit('/').next().unwrap_or("")
}

impl Driver {
    /// The driver `asked` for, here: `auto` is systemd where systemd is the init system.
    pub fn resolve(asked: crate::config::CgroupDriver) -> Result<Driver, String> {
        use crate::config::CgroupDriver as C;
        match asked {
            C::Cgroupfs => Ok(Driver::Cgroupfs),
            C::Systemd if systemd::booted() => Ok(Driver::Systemd),
            C::Systemd => Err(
                "cgroup_driver = \"systemd\", but systemd is not the init system here \
                 (no /run/systemd/system)"
                    .into(),
            ),
            C::Auto if systemd::booted() => Ok(Driver::Systemd),
            C::Auto => Ok(Driver::Cgroupfs),
        }
    }

    /// The cgroup made for pod `id` when its config names no parent, under the configured
    /// `parent`: `<parent>/pod-<id>`, or the slice `<parent's name>-pod<id>.slice`.
    pub fn own_pod_cgroup(self, parent: &str, id: &str) -> String {
        match self {
            Driver::Cgroupfs => format!("{}/pod-{id}", parent.trim_end_matches('/')),
            Driver::Systemd => {
                let base = last_name(parent);
                let stem = base.strip_suffix(".slice").unwrap_or(base);
                let stem = if stem.is_empty() || stem == "-" {
                    "sandboxd"
                } else {
                    stem
                };
                format!("{stem}-pod{id}.slice")
            }
        }
    }

    /// The pod cgroup for a pod whose config names `parent` (not empty): a path (cgroupfs),
    /// or the slice that ends it (systemd; kubelet sends the slice's whole path).
    pub fn pod_cgroup(self, parent: &str) -> Result<String, String> {
        match self {
            Driver::Cgroupfs => Ok(parent.trim_end_matches('/').to_string()),
            Driver::Systemd => {
                let base = last_name(parent);
                if systemd::is_slice(base) && systemd::expand_slice(base).is_some() {
                    Ok(base.to_string())
                } else {
                    Err(format!(
                        "linux.cgroup_parent {parent:?}: the systemd cgroup driver takes a slice \
                         (\"…/name.slice\")"
                    ))
                }
            }
        }
    }
}

/// The cgroup of container (or infra) `id` in the pod cgroup `pod`: `<pod>/sandboxd-<id>`, or
/// under a slice the scope `sandboxd-<id>.scope` the OCI runtime makes
/// (`<slice>:sandboxd:<id>`).
pub fn child(pod: &str, id: &str) -> String {
    if systemd::is_slice(pod) {
        format!("{pod}:{}:{id}", systemd::SCOPE_PREFIX)
    } else {
        format!("{pod}/sandboxd-{id}")
    }
}

/// One mounted cgroup hierarchy.
#[derive(Debug, Clone)]
pub struct Hierarchy {
    pub mount_point: PathBuf,
    /// `None` for cgroup2; the v1 controllers (from the mount's super options) otherwise.
    pub controllers: Option<Vec<String>>,
}

/// Every cgroup hierarchy mounted in this mount namespace (read once: the layout does not
/// change while the daemon runs).
pub fn hierarchies() -> &'static [Hierarchy] {
    static CACHE: std::sync::OnceLock<Vec<Hierarchy>> = std::sync::OnceLock::new();
    CACHE.get_or_init(read_hierarchies)
}

fn read_hierarchies() -> Vec<Hierarchy> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut out: Vec<Hierarchy> = Vec::new();
    for line in text.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let Some(mp) = pre.split(' ').nth(4) else {
            continue;
        };
        let mut post = post.split(' ');
        let fs = post.next().unwrap_or("");
        let opts = post.nth(1).unwrap_or("");
        let controllers = match fs {
            "cgroup2" => None,
            "cgroup" => Some(
                opts.split(',')
                    .filter(|o| !matches!(*o, "rw" | "ro") && !o.contains('='))
                    .map(str::to_string)
                    .collect(),
            ),
            _ => continue,
        };
        if out.iter().any(|h| h.mount_point == Path::new(mp)) {
            continue;
        }
        out.push(Hierarchy {
            mount_point: PathBuf::from(mp),
            controllers,
        });
    }
    out
}

/// The dir of `cgroup` (a path, or a systemd slice or scope: see [`systemd::fs_path`]) in the
/// hierarchy mounted at `mp`.
fn join(mp: &Path, cgroup: &str) -> PathBuf {
    mp.join(systemd::fs_path(cgroup).trim_start_matches('/'))
}

/// The directory of `cgroup` in the hierarchy that holds `controller` (v1), else in the v2
/// hierarchy when it has that controller enabled.
pub fn controller_dir(controller: &str, cgroup: &str) -> Option<PathBuf> {
    let hs = hierarchies();
    if let Some(h) = hs.iter().find(|h| {
        h.controllers
            .as_ref()
            .is_some_and(|c| c.iter().any(|c| c == controller))
    }) {
        return Some(join(&h.mount_point, cgroup));
    }
    hs.iter()
        .filter(|h| h.controllers.is_none())
        .map(|h| join(&h.mount_point, cgroup))
        .find(|d| {
            std::fs::read_to_string(d.join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|x| x == controller))
        })
}

fn key_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Did the kernel OOM-kill a process of `cgroup`? (v1 `memory.oom_control`, v2 `memory.events`.)
pub fn oom_killed(cgroup: &str) -> bool {
    let Some(dir) = controller_dir("memory", cgroup) else {
        return false;
    };
    ["memory.oom_control", "memory.events"].iter().any(|f| {
        std::fs::read_to_string(dir.join(f))
            .ok()
            .and_then(|t| key_value(&t, "oom_kill"))
            .is_some_and(|n| n > 0)
    })
}

/// Whose memory limit an OOM kill answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OomLevel {
    /// The container's own (its cgroup's `memory.events` counts `oom`).
    Container,
    /// The pod's (its cgroup's `memory.events.local` counts `oom`, the container's does not).
    Pod,
    /// Neither: a cgroup above the pod (kubepods, the node's allocatable) or the whole node.
    Node,
    /// The hierarchy does not tell (cgroup v1).
    Unknown,
}

impl OomLevel {
    /// The CRI `message` of an `OOMKilled` container.
    pub fn message(self) -> &'static str {
        match self {
            OomLevel::Container => "OOM-killed at the container's memory limit",
            OomLevel::Pod => "OOM-killed at the pod's memory limit",
            OomLevel::Node => {
                "OOM-killed: memory ran out above the pod (the node's or kubepods' limit)"
            }
            OomLevel::Unknown => "OOM-killed",
        }
    }
}

/// The cgroup a container's cgroup `child` (see [`child`]) is in: its pod's.
pub fn parent_of(child: &str) -> Option<&str> {
    match child.split_once(':') {
        Some((slice, _)) => Some(slice),
        None => child
            .rsplit_once('/')
            .map(|(p, _)| p)
            .filter(|p| !p.is_empty()),
    }
}

/// Whose limit OOM-killed a process of container cgroup `cgroup`; `hit_limit`: the
/// container's own `oom` count, as its monitor saw it.
pub fn oom_level(cgroup: &str, hit_limit: bool) -> OomLevel {
    // `memory.events` counts its descendants too, `.local` the cgroup's own limit alone (a
    // pod's other containers hitting theirs must not count as the pod's).
    let oom_count = |cg: &str, file: &str| -> Option<u64> {
        let d = controller_dir("memory", cg)?;
        let t = std::fs::read_to_string(d.join(file)).ok()?;
        key_value(&t, "oom")
    };
    if hit_limit || oom_count(cgroup, "memory.events").is_some_and(|n| n > 0) {
        return OomLevel::Container;
    }
    match parent_of(cgroup).map(|p| oom_count(p, "memory.events.local")) {
        Some(Some(n)) if n > 0 => OomLevel::Pod,
        Some(Some(_)) => OomLevel::Node,
        _ => OomLevel::Unknown,
    }
}

/// What cAdvisor reports of one cgroup (for CRI metrics), v1 or v2; `None` where the
/// hierarchy does not say.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Detail {
    pub cpu_nanos: Option<u64>,
    pub cpu_user_nanos: Option<u64>,
    pub cpu_system_nanos: Option<u64>,
    pub cfs_periods: Option<u64>,
    pub cfs_throttled_periods: Option<u64>,
    pub cfs_throttled_nanos: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub working_set_bytes: Option<u64>,
    pub rss_bytes: Option<u64>,
    pub cache_bytes: Option<u64>,
    pub mapped_file_bytes: Option<u64>,
    pub swap_bytes: Option<u64>,
    pub max_usage_bytes: Option<u64>,
    pub failcnt: Option<u64>,
    pub oom_kills: Option<u64>,
    pub memory_limit_bytes: Option<u64>,
    /// Tasks (threads) now, and the limit.
    pub tasks: Option<u64>,
    pub tasks_max: Option<u64>,
    /// Processes in the cgroup and its descendants.
    pub processes: Option<u64>,
    /// Limits as set (cAdvisor's `container_spec_*`): CFS period and quota (µs; quota `None`
    /// when unlimited), shares (v2: from `cpu.weight`), memory reservation and swap limit.
    pub cpu_period: Option<u64>,
    pub cpu_quota: Option<u64>,
    pub cpu_shares: Option<u64>,
    pub memory_reservation_bytes: Option<u64>,
    pub memory_swap_limit_bytes: Option<u64>,
    pub kernel_bytes: Option<u64>,
    /// Page faults, minor and major: of the cgroup alone, and of it with its descendants.
    pub pgfault: Option<(u64, u64)>,
    pub hierarchy_pgfault: Option<(u64, u64)>,
    pub blkio: Vec<BlkioDevice>,
    pub hugetlb: Vec<Hugetlb>,
    pub psi: Psi,
    pub procs: Option<Procs>,
}

impl Detail {
    /// The CPU and memory part, as CRI stats report it.
    pub fn usage(&self) -> Usage {
        Usage {
            cpu_nanos: self.cpu_nanos,
            memory_bytes: self.memory_bytes,
            working_set_bytes: self.working_set_bytes,
            psi: self.psi,
        }
    }
}

impl From<Usage> for Detail {
    fn from(u: Usage) -> Detail {
        Detail {
            cpu_nanos: u.cpu_nanos,
            memory_bytes: u.memory_bytes,
            working_set_bytes: u.working_set_bytes,
            psi: u.psi,
            ..Default::default()
        }
    }
}

/// The most cgroup dirs [`detail`] walks to count processes (a pod holds a few).
const MAX_WALK: usize = 1024;

/// Reads [`Detail`] for `cgroup` from whichever hierarchies hold each controller.
pub fn detail(cgroup: &str) -> Detail {
    let read = |p: PathBuf| std::fs::read_to_string(p).ok();
    let num = |p: PathBuf| read(p).and_then(|s| s.trim().parse::<u64>().ok());
    let u = usage(cgroup);
    let mut d = Detail {
        cpu_nanos: u.cpu_nanos,
        memory_bytes: u.memory_bytes,
        working_set_bytes: u.working_set_bytes,
        psi: u.psi,
        blkio: extra::blkio(cgroup),
        hugetlb: extra::hugetlb(cgroup),
        procs: extra::procs(cgroup),
        ..Default::default()
    };
    if let Some(dir) = controller_dir("cpuacct", cgroup) {
        // v1: USER_HZ ticks.
        if let Some(t) = read(dir.join("cpuacct.stat")) {
            let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
                .ok()
                .flatten()
                .map_or(100, |h| h.max(1) as u64);
            let ticks = |k| key_value(&t, k).map(|v| v * (1_000_000_000 / hz));
            d.cpu_user_nanos = ticks("user");
            d.cpu_system_nanos = ticks("system");
        }
    }
    if let Some(dir) = controller_dir("cpu", cgroup) {
        if let Some(t) = read(dir.join("cpu.stat")) {
            let us = |k| key_value(&t, k).map(|v| v * 1000);
            d.cpu_user_nanos = d.cpu_user_nanos.or_else(|| us("user_usec"));
            d.cpu_system_nanos = d.cpu_system_nanos.or_else(|| us("system_usec"));
            d.cfs_periods = key_value(&t, "nr_periods");
            d.cfs_throttled_periods = key_value(&t, "nr_throttled");
            d.cfs_throttled_nanos =
                key_value(&t, "throttled_time").or_else(|| us("throttled_usec"));
        }
        match read(dir.join("cpu.max")) {
            // v2: "max 100000" or "50000 100000"; weight 1..10000 back to shares.
            Some(max) => {
                let mut f = max.split_whitespace();
                d.cpu_quota = f.next().and_then(|q| q.parse().ok());
                d.cpu_period = f.next().and_then(|p| p.parse().ok());
                d.cpu_shares = num(dir.join("cpu.weight"))
                    .map(|w| 2 + ((w.saturating_sub(1)) * 262_142) / 9999);
            }
            None => {
                d.cpu_period = num(dir.join("cpu.cfs_period_us"));
                d.cpu_quota = read(dir.join("cpu.cfs_quota_us"))
                    .and_then(|q| q.trim().parse::<i64>().ok())
                    .and_then(|q| u64::try_from(q).ok());
                d.cpu_shares = num(dir.join("cpu.shares"));
            }
        }
    }
    if let Some(dir) = controller_dir("memory", cgroup) {
        let stat = read(dir.join("memory.stat")).unwrap_or_default();
        let k = |key| key_value(&stat, key);
        d.kernel_bytes = extra::kernel_memory(&dir, &stat);
        if dir.join("memory.usage_in_bytes").exists() {
            d.rss_bytes = k("total_rss");
            d.cache_bytes = k("total_cache");
            d.mapped_file_bytes = k("total_mapped_file");
            // No swap accounting: nothing can be swapped out of the cgroup's account (as
            // cAdvisor reports it).
            d.swap_bytes = k("total_swap").or(Some(0));
            d.pgfault = k("pgfault").zip(k("pgmajfault"));
            d.hierarchy_pgfault = k("total_pgfault").zip(k("total_pgmajfault"));
            d.memory_reservation_bytes = num(dir.join("memory.soft_limit_in_bytes"));
            d.memory_swap_limit_bytes = num(dir.join("memory.memsw.limit_in_bytes"));
            d.max_usage_bytes = num(dir.join("memory.max_usage_in_bytes"));
            d.failcnt = num(dir.join("memory.failcnt"));
            d.oom_kills =
                read(dir.join("memory.oom_control")).and_then(|t| key_value(&t, "oom_kill"));
            // v1 says "no limit" with a huge number.
            d.memory_limit_bytes =
                num(dir.join("memory.limit_in_bytes")).filter(|l| *l < (1 << 62));
        } else {
            d.rss_bytes = k("anon");
            d.cache_bytes = k("file");
            d.mapped_file_bytes = k("file_mapped");
            d.swap_bytes = num(dir.join("memory.swap.current")).or(Some(0));
            d.pgfault = k("pgfault").zip(k("pgmajfault"));
            d.hierarchy_pgfault = d.pgfault;
            let limit = |f: &str| {
                read(dir.join(f)).and_then(|v| match v.trim() {
                    "max" => Some(u64::MAX),
                    v => v.parse().ok(),
                })
            };
            d.memory_reservation_bytes = limit("memory.low");
            d.memory_swap_limit_bytes = limit("memory.swap.max");
            d.max_usage_bytes = num(dir.join("memory.peak"));
            let events = read(dir.join("memory.events")).unwrap_or_default();
            d.oom_kills = key_value(&events, "oom_kill");
            // Times the usage hit memory.max (what runc and cAdvisor report as failcnt).
            d.failcnt = key_value(&events, "max");
            d.memory_limit_bytes = num(dir.join("memory.max"));
        }
    }
    if let Some(dir) = controller_dir("pids", cgroup) {
        d.tasks = num(dir.join("pids.current"));
        // "max": no limit, which cAdvisor reports as 0.
        d.tasks_max = read(dir.join("pids.max")).and_then(|m| match m.trim() {
            "max" => Some(0),
            m => m.parse().ok(),
        });
        d.processes = Some(count_procs(&dir));
    }
    d
}

/// Lines of `cgroup.procs` in `dir` and its descendants (at most [`MAX_WALK`] dirs).
fn count_procs(dir: &Path) -> u64 {
    let mut todo = vec![dir.to_path_buf()];
    let (mut n, mut walked) = (0u64, 0usize);
    while let Some(d) = todo.pop() {
        walked += 1;
        if walked > MAX_WALK {
            break;
        }
        if let Ok(t) = std::fs::read_to_string(d.join("cgroup.procs")) {
            n += t.lines().count() as u64;
        }
        if let Ok(rd) = std::fs::read_dir(&d) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    todo.push(e.path());
                }
            }
        }
    }
    n
}

/// Whether `cgroup` can name a cgroup of ours: not the root, nothing above it.
fn is_ours(cgroup: &str) -> bool {
    !cgroup.split('/').any(|c| c == "..") && !cgroup.trim_matches('/').is_empty()
}

/// Sends SIGKILL to every process in `cgroup`'s own `cgroup.procs`, in every hierarchy
/// (for a cgroup of ours that must be emptied: a trial a killed daemon left half-made).
pub fn kill_all(cgroup: &str) {
    if !is_ours(cgroup) {
        return;
    }
    let mut pids = std::collections::BTreeSet::new();
    for h in hierarchies() {
        let d = join(&h.mount_point, cgroup);
        if let Ok(t) = std::fs::read_to_string(d.join("cgroup.procs")) {
            pids.extend(t.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        }
    }
    for p in pids.into_iter().filter(|&p| p > 1) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Removes `cgroup` (an empty directory once its containers are deleted) from every
/// hierarchy; each is tried. A missing one is fine; a busy one is an error naming it. A
/// systemd slice or scope is stopped instead (and gone when this returns).
pub fn remove(cgroup: &str) -> Result<(), HostError> {
    if let Some(unit) = systemd::unit_of(cgroup) {
        return systemd::stop(&unit, &systemd::fs_path(cgroup));
    }
    if !is_ours(cgroup) {
        return Err(HostError::Refused {
            op: "remove cgroup",
            path: cgroup.into(),
            reason: "not a cgroup path of ours".into(),
        });
    }
    let mut first_err = None;
    for h in hierarchies() {
        let d = join(&h.mount_point, cgroup);
        match std::fs::remove_dir(&d) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                first_err.get_or_insert(HostError::io("remove cgroup", &d, e));
            }
        }
    }
    first_err.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_hierarchy() {
        // Every Linux host running the tests has at least one cgroup hierarchy mounted.
        assert!(!hierarchies().is_empty());
        assert!(remove("/").is_err());
        assert!(remove("/a/../b").is_err());
        assert_eq!(key_value("oom 0\noom_kill 3\n", "oom_kill"), Some(3));
    }
}
