//! OOM kills in the container's cgroup, learned while it runs. With the systemd cgroup driver
//! the container's scope, and its `memory.events`, are gone as soon as its last process is:
//! before the daemon could read them. So the monitor keeps `memory.events` (cgroup v2) open,
//! polls it for the kernel's change notification, and records the counters with the exit.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// The counters of `memory.events` the exit file carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OomCounts {
    /// `oom`: times the cgroup hit its own memory limit (or a descendant's).
    pub at_limit: u64,
    /// `oom_kill`: processes of the cgroup the OOM killer killed, whoever's limit it was.
    pub kills: u64,
}

/// `memory.events` of one cgroup, open for the container's life.
pub struct OomWatch {
    file: File,
    /// The parent cgroup's (the pod's) `memory.events` and its counters when the watch began:
    /// they include this cgroup's and outlive it. Read only when this cgroup was gone before
    /// its kill was read (under load, systemd can remove an OOM-killed scope before the
    /// monitor is scheduled); a sibling's kill in that window would count as this one's.
    parent: Option<(File, OomCounts)>,
    /// Whether the last read of the container's own file failed (its cgroup is gone).
    own_gone: bool,
    pub last: OomCounts,
}

/// The counters of an open `memory.events`; `None` once its cgroup is removed.
fn read_counts(f: &File) -> Option<OomCounts> {
    let mut buf = [0u8; 512];
    let n = f.read_at(&mut buf, 0).ok()?;
    Some(parse(&String::from_utf8_lossy(&buf[..n])))
}

fn open_events(path: &Path) -> Option<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .ok()
}

impl OomWatch {
    /// Watches the v2 cgroup `pid` is in. `Err(Later)` while `pid` is still in the monitor's
    /// own cgroup: with the systemd driver a runtime may return before systemd has moved the
    /// process into its scope (runc waits one second for the job, then goes on). `Err(Never)`
    /// without the unified hierarchy, its memory controller there, or with `pid` gone.
    pub fn open(pid: i32) -> Result<OomWatch, NotYet> {
        let mount = UNIFIED_MOUNTS
            .into_iter()
            .find(|m| Path::new(m).join("cgroup.controllers").exists())
            .ok_or(NotYet::Never)?;
        let controllers = std::fs::read_to_string(Path::new(mount).join("cgroup.controllers"))
            .unwrap_or_default();
        if !controllers.split_whitespace().any(|c| c == "memory") {
            return Err(NotYet::Never);
        }
        let rel = v2_cgroup(&format!("/proc/{pid}/cgroup")).ok_or(NotYet::Never)?;
        if v2_cgroup("/proc/self/cgroup").as_deref() == Some(rel.as_str()) {
            return Err(NotYet::Later);
        }
        let dir = Path::new(mount).join(rel.trim_start_matches('/'));
        let file = open_events(&dir.join("memory.events")).ok_or(NotYet::Never)?;
        // (The root cgroup has no memory.events: no parent to fall back on.)
        let parent = dir
            .parent()
            .and_then(|p| open_events(&p.join("memory.events")))
            .and_then(|f| read_counts(&f).map(|base| (f, base)));
        let mut w = OomWatch {
            file,
            parent,
            own_gone: false,
            last: OomCounts::default(),
        };
        w.refresh();
        Ok(w)
    }

    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Reads the counters again (reading also re-arms the change notification); a cgroup
    /// already removed keeps the last values read.
    pub fn refresh(&mut self) {
        match read_counts(&self.file) {
            Some(now) => {
                self.own_gone = false;
                self.last.at_limit = self.last.at_limit.max(now.at_limit);
                self.last.kills = self.last.kills.max(now.kills);
            }
            None => self.own_gone = true,
        }
    }

    /// The counters for the exit: the container's own, or — its cgroup gone before any kill
    /// was read — what the parent's grew by since the watch began.
    pub fn at_exit(&mut self) -> OomCounts {
        self.refresh();
        if !self.own_gone || self.last.kills > 0 {
            return self.last;
        }
        match &self.parent {
            Some((f, base)) => read_counts(f).map_or(self.last, |now| OomCounts {
                at_limit: now.at_limit.saturating_sub(base.at_limit),
                kills: now.kills.saturating_sub(base.kills),
            }),
            None => self.last,
        }
    }
}

/// Where the unified (v2) hierarchy is mounted, by the places systemd and every distribution
/// mount it — `/sys/fs/cgroup` (pure v2) or `/sys/fs/cgroup/unified` (hybrid, where it holds
/// no memory controller and nothing is watched). Its root alone has `cgroup.controllers`.
/// (Not from mountinfo: a monitor starts with every container, and on a node of a thousand
/// pods that table is thousands of lines.)
const UNIFIED_MOUNTS: [&str; 2] = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"];

/// Why there is no watch (yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotYet {
    /// The container is not in a cgroup of its own yet: try again.
    Later,
    /// Nothing to watch on this node, or the container is gone.
    Never,
}

/// The v2 (`0::`) line of a `/proc/<pid>/cgroup` file; `None` without one, or with `..` in it.
fn v2_cgroup(proc_file: &str) -> Option<String> {
    let mut cgroups = String::new();
    File::open(proc_file)
        .ok()?
        .take(64 << 10)
        .read_to_string(&mut cgroups)
        .ok()?;
    let rel = cgroups.lines().find_map(|l| l.strip_prefix("0::"))?;
    if rel.split('/').any(|c| c == "..") {
        return None;
    }
    Some(rel.to_string())
}

fn parse(text: &str) -> OomCounts {
    let mut c = OomCounts::default();
    for l in text.lines() {
        let mut kv = l.split_whitespace();
        let (Some(k), Some(v)) = (kv.next(), kv.next().and_then(|v| v.parse().ok())) else {
            continue;
        };
        match k {
            "oom" => c.at_limit = v,
            "oom_kill" => c.kills = v,
            _ => {}
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_of_memory_events() {
        let t = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(
            parse(t),
            OomCounts {
                at_limit: 2,
                kills: 1
            }
        );
        assert_eq!(parse("garbage\noom x\n"), OomCounts::default());
    }
}
