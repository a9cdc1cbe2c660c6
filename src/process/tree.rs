//! The process tree seen from `/proc`: is a process alive (a zombie is not), what its
//! stat says, when it started, who is in its group or session; killing a whole tree and
//! waiting for it to be gone.
#![allow(unsafe_code)]

use std::time::{Duration, Instant};

/// Is process `pid` alive? A zombie (exited, not yet reaped by its parent) is not: its
/// program has ended, only its exit status waits for a parent that may never collect it
/// (a stopped monitor, say).
pub fn alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    proc_stat(pid).is_some_and(|st| !matches!(st.state, 'Z' | 'X' | 'x'))
}

/// The fields of `/proc/PID/stat` we use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStat {
    pub state: char,
    pub ppid: i32,
    pub pgrp: i32,
    pub session: i32,
    /// Start time in clock ticks since boot (tells a reused pid from the original).
    pub start_time: u64,
}

/// Reads `/proc/PID/stat` (the command name may hold spaces and parentheses: the fields
/// after it are found from the last `)`).
pub fn proc_stat(pid: i32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

fn parse_stat(text: &str) -> Option<ProcStat> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // f[0] is field 3 (state); start time is field 22.
    Some(ProcStat {
        state: f.first()?.chars().next()?,
        ppid: f.get(1)?.parse().ok()?,
        pgrp: f.get(2)?.parse().ok()?,
        session: f.get(3)?.parse().ok()?,
        start_time: f.get(19)?.parse().ok()?,
    })
}

/// When process `pid` started, as Unix time in nanoseconds (from its start time in clock
/// ticks since boot and the boot time).
pub fn start_time_nanos(pid: i32) -> Option<i64> {
    let ticks = proc_stat(pid)?.start_time;
    let btime = boot_time_nanos()?;
    // SAFETY: sysconf takes an integer name and reads no memory of ours.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz <= 0 {
        return None;
    }
    let hz = hz as u64;
    Some(btime + (ticks / hz * 1_000_000_000 + ticks % hz * 1_000_000_000 / hz) as i64)
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`), read once; empty if unreadable.
pub fn boot_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    })
}

/// When this boot began, as Unix time in nanoseconds (`btime`, whole seconds: the true
/// moment is at most a second later), read once.
pub fn boot_time_nanos() -> Option<i64> {
    static BTIME: std::sync::OnceLock<Option<i64>> = std::sync::OnceLock::new();
    *BTIME.get_or_init(|| {
        let s: i64 = std::fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse()
            .ok()?;
        Some(s * 1_000_000_000)
    })
}

/// A process as recorded: its pid, and what tells it from a later process given the same
/// number — after it exited, or after a reboot, when numbering starts again and boot-time
/// services take the low pids. A recorded pid is believed, waited on or signalled only
/// while [`ProcId::alive`] says it is still that process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcId {
    pub pid: i32,
    /// Its start time in clock ticks since boot (`/proc/PID/stat` field 22); 0: not
    /// recorded (a record of an older version).
    pub start_ticks: u64,
    /// The boot it ran in; empty: not recorded.
    pub boot_id: String,
    /// When the record was made (Unix ns), for records without the two above: one made
    /// before this boot names another boot's process.
    pub recorded_at: i64,
}

impl ProcId {
    /// `pid` as it is now (its start time, this boot), to be recorded.
    pub fn now(pid: i32) -> ProcId {
        ProcId {
            pid,
            start_ticks: proc_stat(pid).map_or(0, |s| s.start_time),
            boot_id: boot_id().to_string(),
            recorded_at: 0,
        }
    }

    /// Is the recorded process alive (a zombie is not)? A pid from another boot, or held now
    /// by a process that started at another time, is not.
    pub fn alive(&self) -> bool {
        if self.pid <= 0 {
            return false;
        }
        if !self.boot_id.is_empty() && self.boot_id != boot_id() {
            return false;
        }
        if self.boot_id.is_empty()
            && self.recorded_at > 0
            && boot_time_nanos().is_some_and(|b| self.recorded_at < b)
        {
            return false;
        }
        proc_stat(self.pid).is_some_and(|st| {
            !matches!(st.state, 'Z' | 'X' | 'x')
                && (self.start_ticks == 0 || st.start_time == self.start_ticks)
        })
    }
}

/// Is `pid`, as a process wrote it to `file` when it started (a monitor's `monitor.pid`),
/// still that process? Not when the file was written before this boot, nor when the process
/// holding the pid now started after the file was written (start times from `btime` are
/// exact to a second: 2 s of slack).
pub fn alive_as_written(pid: i32, file: &std::path::Path) -> bool {
    let Some(written) = std::fs::metadata(file)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_nanos() as i64)
    else {
        return false;
    };
    if boot_time_nanos().is_some_and(|b| written < b) {
        return false;
    }
    alive(pid) && start_time_nanos(pid).is_some_and(|s| s <= written + 2_000_000_000)
}

/// Every process whose process group or session is `leader` (host pid numbering).
pub fn group_members(leader: i32) -> Vec<i32> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            proc_stat(*pid).is_some_and(|s| {
                (s.pgrp == leader || s.session == leader) && !matches!(s.state, 'Z' | 'X')
            })
        })
        .collect()
}

/// SIGKILLs a process, its process group and its session (what a command and everything it
/// started in the foreground or in the background of a non-interactive shell live in).
pub fn kill_tree(leader: i32) {
    if leader <= 1 {
        return;
    }
    let kill = |p: i32| {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p),
            nix::sys::signal::Signal::SIGKILL,
        );
    };
    kill(-leader);
    kill(leader);
    // Members of the session in other groups (a `setsid`-less job control shell, say).
    for _ in 0..3 {
        let members = group_members(leader);
        if members.is_empty() {
            break;
        }
        members.into_iter().for_each(kill);
    }
}

/// Waits until none of `pids` exists any more (reaped by whoever is their parent), at most
/// `limit`. Returns those still present (running or zombies).
pub fn wait_reaped(pids: &[i32], limit: Duration) -> Vec<i32> {
    let deadline = Instant::now() + limit;
    loop {
        let left: Vec<i32> = pids
            .iter()
            .copied()
            .filter(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
            .collect();
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Waits until none of `pids` runs any more, at most `limit`. Returns those still running.
/// A zombie counts as gone: it holds no memory, files or mounts, and its reaping is up to
/// its parent — for an orphan that is init, which may take seconds (some inits reap lazily).
pub fn wait_gone(pids: &[i32], limit: Duration) -> Vec<i32> {
    let deadline = Instant::now() + limit;
    loop {
        let left: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn stat_fields_and_zombies() {
        let s = parse_stat("42 (a (b) c) Z 1 42 42 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 777 0")
            .unwrap();
        assert_eq!((s.state, s.ppid, s.pgrp, s.session), ('Z', 1, 42, 42));
        assert_eq!(s.start_time, 777);
        // A child that exited but is not reaped yet is not alive.
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        let deadline = Instant::now() + Duration::from_secs(5);
        while proc_stat(pid).is_some_and(|s| s.state != 'Z') && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!alive(pid), "a zombie counts as alive");
        child.wait().unwrap();
        assert!(!alive(pid));
        assert!(alive(std::process::id() as i32));
    }
}
