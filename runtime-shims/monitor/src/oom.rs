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
    pub last: OomCounts,
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
        let path = Path::new(mount)
            .join(rel.trim_start_matches('/'))
            .join("memory.events");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(|_| NotYet::Never)?;
        let mut w = OomWatch {
            file,
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
        let mut buf = [0u8; 512];
        if let Ok(n) = self.file.read_at(&mut buf, 0) {
            let now = parse(&String::from_utf8_lossy(&buf[..n]));
            self.last.at_limit = self.last.at_limit.max(now.at_limit);
            self.last.kills = self.last.kills.max(now.kills);
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
