//! cgroup inspection for what the runtime does not tell us: whether a container was
//! OOM-killed, its CPU and memory use, and removing the per-pod parent cgroups we created.
//! The layout is detected from `/proc/self/mountinfo` (v1, v2 or hybrid: never assumed).

use std::path::{Path, PathBuf};

use crate::error::HostError;

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

fn join(mp: &Path, cgroup: &str) -> PathBuf {
    mp.join(cgroup.trim_start_matches('/'))
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

/// CPU and memory use of one cgroup, as CRI stats report them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    pub cpu_nanos: Option<u64>,
    pub memory_bytes: Option<u64>,
    /// Memory use minus inactive file cache (what kubelet evicts on).
    pub working_set_bytes: Option<u64>,
}

/// Reads the usage of `cgroup` from whichever hierarchies hold cpu accounting and memory.
pub fn usage(cgroup: &str) -> Usage {
    let read = |p: PathBuf| std::fs::read_to_string(p).ok();
    let mut u = Usage::default();
    if let Some(d) = controller_dir("cpuacct", cgroup) {
        u.cpu_nanos = read(d.join("cpuacct.usage")).and_then(|s| s.trim().parse().ok());
    }
    if u.cpu_nanos.is_none() {
        if let Some(d) = controller_dir("cpu", cgroup) {
            u.cpu_nanos = read(d.join("cpu.stat"))
                .and_then(|t| key_value(&t, "usage_usec"))
                .map(|us| us * 1000);
        }
    }
    if let Some(d) = controller_dir("memory", cgroup) {
        let (usage, inactive) = match read(d.join("memory.usage_in_bytes")) {
            Some(v1) => (
                v1.trim().parse::<u64>().ok(),
                read(d.join("memory.stat")).and_then(|t| key_value(&t, "total_inactive_file")),
            ),
            None => (
                read(d.join("memory.current")).and_then(|s| s.trim().parse().ok()),
                read(d.join("memory.stat")).and_then(|t| key_value(&t, "inactive_file")),
            ),
        };
        u.memory_bytes = usage;
        u.working_set_bytes = usage.map(|m| m.saturating_sub(inactive.unwrap_or(0)));
    }
    u
}

/// What cAdvisor reports of one cgroup (for CRI metrics), v1 or v2; `None` where the
/// hierarchy does not say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
}

impl Detail {
    /// The CPU and memory part, as CRI stats report it.
    pub fn usage(&self) -> Usage {
        Usage {
            cpu_nanos: self.cpu_nanos,
            memory_bytes: self.memory_bytes,
            working_set_bytes: self.working_set_bytes,
        }
    }
}

impl From<Usage> for Detail {
    fn from(u: Usage) -> Detail {
        Detail {
            cpu_nanos: u.cpu_nanos,
            memory_bytes: u.memory_bytes,
            working_set_bytes: u.working_set_bytes,
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
    }
    if let Some(dir) = controller_dir("memory", cgroup) {
        let stat = read(dir.join("memory.stat")).unwrap_or_default();
        let k = |key| key_value(&stat, key);
        if dir.join("memory.usage_in_bytes").exists() {
            d.rss_bytes = k("total_rss");
            d.cache_bytes = k("total_cache");
            d.mapped_file_bytes = k("total_mapped_file");
            d.swap_bytes = k("total_swap");
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
            d.swap_bytes = num(dir.join("memory.swap.current"));
            d.max_usage_bytes = num(dir.join("memory.peak"));
            d.oom_kills = read(dir.join("memory.events")).and_then(|t| key_value(&t, "oom_kill"));
            d.memory_limit_bytes = num(dir.join("memory.max"));
        }
    }
    if let Some(dir) = controller_dir("pids", cgroup) {
        d.tasks = num(dir.join("pids.current"));
        d.tasks_max = num(dir.join("pids.max"));
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

/// A pod's cgroup limits: its pod-level resources plus its overhead (CRI
/// `LinuxPodSandboxConfig.resources` and `overhead`), as kubelet sizes a pod's cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodLimits {
    /// Bytes; 0: no limit.
    pub memory: i64,
    /// CFS quota in µs per `cpu_period`; 0: no limit.
    pub cpu_quota: i64,
    /// CFS period in µs.
    pub cpu_period: i64,
    /// cgroup v1 shares (converted to `cpu.weight` on v2); 0: not set.
    pub cpu_shares: i64,
}

impl PodLimits {
    /// The limits for `resources` with `overhead` added (a resource the pod does not limit
    /// stays unlimited, overhead or not).
    pub fn of(
        resources: Option<&crate::model::container::Resources>,
        overhead: Option<&crate::model::container::Resources>,
    ) -> PodLimits {
        let d = crate::model::container::Resources::default();
        let (r, o) = (resources.unwrap_or(&d), overhead.unwrap_or(&d));
        let period = if r.cpu_period > 0 {
            r.cpu_period
        } else {
            100_000
        };
        let o_period = if o.cpu_period > 0 {
            o.cpu_period
        } else {
            100_000
        };
        let o_quota = o.cpu_quota.max(0).saturating_mul(period) / o_period;
        PodLimits {
            memory: if r.memory_limit_in_bytes > 0 {
                r.memory_limit_in_bytes
                    .saturating_add(o.memory_limit_in_bytes.max(0))
            } else {
                0
            },
            cpu_quota: if r.cpu_quota > 0 {
                r.cpu_quota.saturating_add(o_quota)
            } else {
                0
            },
            cpu_period: period,
            cpu_shares: if r.cpu_shares > 0 {
                r.cpu_shares.saturating_add(o.cpu_shares.max(0))
            } else {
                0
            },
        }
    }
}

/// Writes `l` to `cgroup` (made where missing): v1 `memory.limit_in_bytes`,
/// `cpu.cfs_period_us`/`cpu.cfs_quota_us`/`cpu.shares`; v2 `memory.max`, `cpu.max`,
/// `cpu.weight` (with the controllers enabled on the way down).
pub fn set_limits(cgroup: &str, l: &PodLimits) -> Result<(), HostError> {
    if cgroup.split('/').any(|c| c == "..") || cgroup.trim_matches('/').is_empty() {
        return Err(HostError::Refused {
            op: "set cgroup limits",
            path: cgroup.into(),
            reason: "not a cgroup path of ours".into(),
        });
    }
    let write = |d: &Path, f: &str, v: String| {
        std::fs::write(d.join(f), &v).map_err(|e| HostError::io("write", d.join(f), e))
    };
    let make = |d: &Path| std::fs::create_dir_all(d).map_err(|e| HostError::io("create", d, e));
    let hs = hierarchies();
    let v1 = |ctl: &str| {
        hs.iter().find(|h| {
            h.controllers
                .as_ref()
                .is_some_and(|c| c.iter().any(|c| c == ctl))
        })
    };
    if let (Some(m), Some(c)) = (v1("memory"), v1("cpu")) {
        let md = join(&m.mount_point, cgroup);
        make(&md)?;
        let mem = if l.memory > 0 { l.memory } else { -1 };
        write(&md, "memory.limit_in_bytes", mem.to_string())?;
        let cd = join(&c.mount_point, cgroup);
        make(&cd)?;
        write(&cd, "cpu.cfs_period_us", l.cpu_period.to_string())?;
        let quota = if l.cpu_quota > 0 { l.cpu_quota } else { -1 };
        write(&cd, "cpu.cfs_quota_us", quota.to_string())?;
        if l.cpu_shares > 0 {
            write(&cd, "cpu.shares", l.cpu_shares.max(2).to_string())?;
        }
        return Ok(());
    }
    let Some(h) = hs.iter().find(|h| h.controllers.is_none()) else {
        return Err(HostError::Other(
            "no cgroup hierarchy with the memory and cpu controllers".into(),
        ));
    };
    let mut at = h.mount_point.clone();
    for part in cgroup.trim_matches('/').split('/') {
        // Best effort: a parent that already delegates them answers the same.
        let _ = std::fs::write(at.join("cgroup.subtree_control"), "+cpu +memory");
        at = at.join(part);
        make(&at)?;
    }
    let mem = if l.memory > 0 {
        l.memory.to_string()
    } else {
        "max".into()
    };
    write(&at, "memory.max", mem)?;
    let quota = if l.cpu_quota > 0 {
        l.cpu_quota.to_string()
    } else {
        "max".into()
    };
    write(&at, "cpu.max", format!("{quota} {}", l.cpu_period))?;
    if l.cpu_shares > 0 {
        // runc's and kubelet's conversion of shares (2..262144) to weight (1..10000).
        let shares = l.cpu_shares.clamp(2, 262_144);
        write(
            &at,
            "cpu.weight",
            (1 + ((shares - 2) * 9999) / 262_142).to_string(),
        )?;
    }
    Ok(())
}

/// Removes `cgroup` (an empty directory once its containers are deleted) from every
/// hierarchy; each is tried. A missing one is fine; a busy one is an error naming it.
pub fn remove(cgroup: &str) -> Result<(), HostError> {
    if cgroup.split('/').any(|c| c == "..") || cgroup.trim_matches('/').is_empty() {
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
