//! Running helper processes (CNI plugins, the OCI runtime, the monitor, exec'd commands) with
//! bounds on everything they can cost us: each runs in a process group of its own, is killed
//! as a whole group past its time limit, and has its stdout and stderr read concurrently into
//! buffers capped at a size (what is beyond the cap is read and dropped, so the child never
//! blocks on a full pipe and our memory stays bounded). A grandchild that keeps a pipe open
//! after the child exited cannot hold the call: output is read only for a short drain period
//! after the exit. Everything runs on the calling thread with `poll(2)`; no reader threads
//! are left behind.
#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandboxd_shim_common::fd::set_nonblocking;
/// The pid files, pidfds and umask the monitor uses too, from the contract they share.
pub use sandboxd_shim_common::{fd::pidfd_open, files::read_pid, runtime::private_umask};

/// Wall time spent in helper processes, for the benchmark's "own code vs children" split.
static CHILD_NANOS: AtomicU64 = AtomicU64::new(0);
static CHILD_CALLS: AtomicU64 = AtomicU64::new(0);

/// Total wall time spent waiting for helper processes (summed over threads) and their count.
pub fn child_time() -> (Duration, u64) {
    (
        Duration::from_nanos(CHILD_NANOS.load(Ordering::Relaxed)),
        CHILD_CALLS.load(Ordering::Relaxed),
    )
}

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
    let btime: i64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: sysconf takes an integer name and reads no memory of ours.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz <= 0 {
        return None;
    }
    let hz = hz as u64;
    Some(
        btime * 1_000_000_000
            + (ticks / hz * 1_000_000_000 + ticks % hz * 1_000_000_000 / hz) as i64,
    )
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

/// A process's exit as a shell reports it: its code, or 128 + the signal that killed it.
pub fn exit_code(s: &ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    s.code()
        .or_else(|| s.signal().map(|n| 128 + n))
        .unwrap_or(255)
}

/// SIGKILLs the process whose pid a runtime wrote to `pid_file` (an exec'd command: killing
/// only the runtime or its helper would orphan it inside the container).
pub fn kill_pid_file(pid_file: &std::path::Path) {
    if let Some(pid) = read_pid(pid_file).filter(|p| *p > 1) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Counts `d` as time spent waiting for a helper process that is not our child call (the
/// monitor writing a container's exit), so benchmarks separate it from our own code.
pub fn account_wait(d: Duration) {
    CHILD_NANOS.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
}

/// What a finished child left behind.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Bytes read past the caps and dropped.
    pub stdout_dropped: u64,
    pub stderr_dropped: u64,
}

/// Why running a child failed before it could report anything itself.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot execute {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} did not finish within {limit:?} and was killed{}", if stderr.is_empty() { String::new() } else { format!(" (its stderr: {stderr})") })]
    Timeout {
        program: String,
        limit: Duration,
        /// What it said on stderr before it was killed.
        stderr: String,
    },
    #[error("waiting for {program}: {source}")]
    Wait {
        program: String,
        #[source]
        source: std::io::Error,
    },
}

/// Output bytes that calls running at once may keep in all (ExecSync: each call may keep up
/// to its cap, but never more than what is left of this budget, so concurrent calls cannot
/// add up to more than it). What a call cannot keep is read and dropped.
#[derive(Debug)]
pub struct OutputBudget {
    left: AtomicUsize,
}

impl OutputBudget {
    pub fn new(total: usize) -> Arc<OutputBudget> {
        Arc::new(OutputBudget {
            left: AtomicUsize::new(total),
        })
    }

    /// Takes up to `want` bytes; returns how many were taken.
    fn take(&self, want: usize) -> usize {
        let mut cur = self.left.load(Ordering::Relaxed);
        loop {
            let n = want.min(cur);
            if n == 0 {
                return 0;
            }
            match self
                .left
                .compare_exchange_weak(cur, cur - n, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return n,
                Err(now) => cur = now,
            }
        }
    }

    fn give(&self, n: usize) {
        self.left.fetch_add(n, Ordering::AcqRel);
    }

    /// Bytes left now.
    pub fn left(&self) -> usize {
        self.left.load(Ordering::Relaxed)
    }
}

/// How to run one child.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Killed (with its whole process group) past this; `None` = no limit.
    pub timeout: Option<Duration>,
    /// Most bytes of stdout and of stderr kept; the rest is read and dropped.
    pub stdout_cap: usize,
    pub stderr_cap: usize,
    /// After the child exited, output is read for at most this long (a grandchild may hold
    /// the pipes open forever).
    pub drain: Duration,
    /// A budget shared with other calls that what is kept also counts against.
    pub budget: Option<Arc<OutputBudget>>,
}

impl Limits {
    /// Defaults for a helper whose output is a small JSON document or an error message.
    pub fn helper(timeout: Duration) -> Self {
        Limits {
            timeout: Some(timeout),
            stdout_cap: 4 << 20,
            stderr_cap: 64 << 10,
            drain: Duration::from_millis(500),
            budget: None,
        }
    }
}

/// Runs `cmd` to completion, feeding `stdin` and collecting stdout and stderr, killing its
/// process group (SIGKILL) if it runs longer than `limit`.
pub fn run(cmd: Command, stdin: &[u8], limit: Duration) -> Result<Output, RunError> {
    run_with(cmd, stdin, &Limits::helper(limit), |_| {})
}

/// [`run`] with explicit limits; `on_timeout` runs (with the child's pid, which leads its
/// process group) right before the group is killed, to kill what the group does not hold.
pub fn run_with(
    cmd: Command,
    stdin: &[u8],
    limits: &Limits,
    on_timeout: impl FnOnce(i32),
) -> Result<Output, RunError> {
    let started = Instant::now();
    let r = run_inner(cmd, stdin, limits, on_timeout);
    CHILD_NANOS.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    CHILD_CALLS.fetch_add(1, Ordering::Relaxed);
    r
}

/// Runs `cmd` with the given stdio (`None`: /dev/null) in its own process group, killing
/// the group past `limit`. For a command whose output is not ours to read (a runtime's
/// `start` that hands the container its stdio).
pub fn run_with_stdio(
    mut cmd: Command,
    [stdin, stdout, stderr]: [Option<OwnedFd>; 3],
    limit: Duration,
) -> Result<ExitStatus, RunError> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let io = |f: Option<OwnedFd>| f.map_or_else(Stdio::null, Stdio::from);
    cmd.stdin(io(stdin))
        .stdout(io(stdout))
        .stderr(io(stderr))
        .process_group(0);
    let mut child = cmd.spawn().map_err(|source| RunError::Spawn {
        program: program.clone(),
        source,
    })?;
    drop(cmd); // our copies of the stdio
    let pid = child.id() as i32;
    match wait_until(&mut child, Instant::now() + limit) {
        Ok(Some(status)) => Ok(status),
        Ok(None) => {
            kill_tree(pid);
            let _ = child.wait();
            Err(RunError::Timeout {
                program,
                limit,
                stderr: String::new(),
            })
        }
        Err(source) => Err(RunError::Wait { program, source }),
    }
}

/// One of the child's output pipes, read into a capped buffer.
struct Sink {
    fd: Option<OwnedFd>,
    buf: Vec<u8>,
    cap: usize,
    dropped: u64,
    budget: Option<Arc<OutputBudget>>,
    /// Bytes taken from the budget (given back on drop).
    held: usize,
}

impl Drop for Sink {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.give(self.held);
        }
    }
}

impl Sink {
    fn new(fd: Option<OwnedFd>, cap: usize, budget: Option<Arc<OutputBudget>>) -> Sink {
        if let Some(f) = &fd {
            set_nonblocking(f);
        }
        Sink {
            fd,
            buf: Vec::new(),
            cap,
            dropped: 0,
            budget,
            held: 0,
        }
    }

    /// Reads what is there; closes at EOF or on error.
    fn read(&mut self) {
        let Some(fd) = &self.fd else { return };
        let mut chunk = [0u8; 16384];
        loop {
            // SAFETY: reading into an owned stack buffer of its length, from an fd we own.
            let n = unsafe { libc::read(fd.as_raw_fd(), chunk.as_mut_ptr().cast(), chunk.len()) };
            if n > 0 {
                let n = n as usize;
                let mut room = self.cap.saturating_sub(self.buf.len()).min(n);
                if let Some(b) = &self.budget {
                    room = b.take(room);
                    self.held += room;
                }
                self.buf.extend_from_slice(&chunk[..room]);
                self.dropped += (n - room) as u64;
                continue;
            }
            if n < 0 {
                let e = std::io::Error::last_os_error();
                match e.kind() {
                    std::io::ErrorKind::WouldBlock => return,
                    std::io::ErrorKind::Interrupted => continue,
                    _ => {}
                }
            }
            self.fd = None; // EOF or error
            return;
        }
    }
}

fn owned<T: Into<OwnedFd>>(p: Option<T>) -> Option<OwnedFd> {
    p.map(Into::into)
}

fn run_inner(
    mut cmd: Command,
    stdin: &[u8],
    limits: &Limits,
    on_timeout: impl FnOnce(i32),
) -> Result<Output, RunError> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    cmd.stdin(if stdin.is_empty() {
        Stdio::null()
    } else {
        Stdio::piped()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .process_group(0);
    let mut child = cmd.spawn().map_err(|source| RunError::Spawn {
        program: program.clone(),
        source,
    })?;
    let pid = child.id() as i32;
    let mut input = owned(child.stdin.take());
    if let Some(f) = &input {
        set_nonblocking(f);
    }
    let mut written = 0usize;
    let mut out = Sink::new(
        owned(child.stdout.take()),
        limits.stdout_cap,
        limits.budget.clone(),
    );
    let mut err = Sink::new(
        owned(child.stderr.take()),
        limits.stderr_cap,
        limits.budget.clone(),
    );
    let deadline = limits.timeout.map(|t| Instant::now() + t);
    let pidfd = pidfd_open(pid);
    let mut status: Option<ExitStatus> = None;
    let mut drain_until: Option<Instant> = None;
    loop {
        if status.is_none() {
            match child.try_wait() {
                Ok(Some(s)) => {
                    status = Some(s);
                    input = None;
                    let d = Instant::now() + limits.drain;
                    drain_until = Some(deadline.map_or(d, |dl| dl.min(d).max(Instant::now())));
                }
                Ok(None) => {}
                Err(source) => {
                    kill_group(pid);
                    let _ = child.wait();
                    return Err(RunError::Wait { program, source });
                }
            }
        }
        if status.is_some() && out.fd.is_none() && err.fd.is_none() {
            break;
        }
        let now = Instant::now();
        let until = match (status.is_some(), drain_until, deadline) {
            (true, Some(d), _) => Some(d),
            (_, _, dl) => dl,
        };
        if until.is_some_and(|u| now >= u) {
            if status.is_some() {
                break; // drained long enough: whatever still holds the pipes is not ours
            }
            on_timeout(pid);
            kill_group(pid);
            let _ = child.wait();
            err.read();
            return Err(RunError::Timeout {
                program,
                limit: limits.timeout.unwrap_or_default(),
                stderr: String::from_utf8_lossy(&err.buf).trim().to_string(),
            });
        }
        let ms = until.map_or(-1, |u| {
            (u.saturating_duration_since(now).as_millis() as i64 + 1).min(i32::MAX as i64) as i32
        });
        let mut pfds: Vec<libc::pollfd> = Vec::with_capacity(4);
        let mut slot = |fd: Option<RawFd>, events: libc::c_short| {
            pfds.push(libc::pollfd {
                fd: fd.unwrap_or(-1),
                events,
                revents: 0,
            });
        };
        slot(out.fd.as_ref().map(|f| f.as_raw_fd()), libc::POLLIN);
        slot(err.fd.as_ref().map(|f| f.as_raw_fd()), libc::POLLIN);
        slot(input.as_ref().map(|f| f.as_raw_fd()), libc::POLLOUT);
        let child_fd = match (&pidfd, status.is_some()) {
            (Some(fd), false) => Some(fd.as_raw_fd()),
            _ => None,
        };
        slot(child_fd, libc::POLLIN);
        // Without a pidfd (old kernel) the exit is noticed by polling every 10 ms.
        let ms = if pidfd.is_none() && status.is_none() {
            if ms < 0 {
                10
            } else {
                ms.min(10)
            }
        } else {
            ms
        };
        // SAFETY: `pfds` is a valid array of pollfd for the duration of the call.
        let r = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
        if r < 0 {
            continue; // EINTR
        }
        if pfds[0].revents != 0 {
            out.read();
        }
        if pfds[1].revents != 0 {
            err.read();
        }
        if pfds[2].revents & libc::POLLOUT != 0 {
            if let Some(f) = &input {
                let rest = &stdin[written..];
                // SAFETY: writing from a slice we own, of its length, to an fd we own.
                let n = unsafe { libc::write(f.as_raw_fd(), rest.as_ptr().cast(), rest.len()) };
                if n > 0 {
                    written += n as usize;
                }
                if written == stdin.len()
                    || (n < 0
                        && std::io::Error::last_os_error().kind() != std::io::ErrorKind::WouldBlock)
                {
                    input = None; // all written (EOF for the child), or it stopped reading
                }
            }
        } else if pfds[2].revents & (libc::POLLERR | libc::POLLHUP) != 0 {
            input = None;
        }
    }
    Ok(Output {
        status: status.expect("the loop ends only after the exit"),
        stdout: std::mem::take(&mut out.buf),
        stderr: std::mem::take(&mut err.buf),
        stdout_dropped: out.dropped,
        stderr_dropped: err.dropped,
    })
}

/// SIGKILLs the process group `pgid` (a child started with its own group).
fn kill_group(pgid: i32) {
    if pgid > 1 {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(-pgid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Waits for `child` until `deadline`; `Ok(None)` means the deadline passed first.
pub fn wait_until(child: &mut Child, deadline: Instant) -> std::io::Result<Option<ExitStatus>> {
    if let Some(fd) = pidfd_open(child.id() as i32) {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = left.as_millis().min(i32::MAX as u128) as i32;
            let mut pfd = libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: `pfd` is a valid pollfd array of length 1 for the duration of the call.
            let r = unsafe { libc::poll(&mut pfd, 1, ms) };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if r == 0 {
                return child.try_wait();
            }
            return child.wait().map(Some);
        }
    }
    // No pidfd (old kernel): poll with a short sleep.
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok(Some(s));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captures_output_and_stdin() {
        let mut c = Command::new("sh");
        c.args(["-c", "cat; echo err >&2; exit 3"]);
        let out = run(c, b"hello", Duration::from_secs(5)).unwrap();
        assert_eq!(out.stdout, b"hello");
        assert_eq!(out.stderr, b"err\n");
        assert_eq!(out.status.code(), Some(3));
    }

    #[test]
    fn big_stdin_and_output_do_not_deadlock() {
        // The child echoes 4 MiB back while we are still writing it: both directions must
        // move at once.
        let input = vec![b'x'; 4 << 20];
        let mut c = Command::new("cat");
        c.arg("-");
        let out = run(c, &input, Duration::from_secs(20)).unwrap();
        assert_eq!(out.stdout.len(), input.len());
    }

    /// A scratch directory removed even when the test fails.
    struct TestDir(std::path::PathBuf);

    impl TestDir {
        fn new(prefix: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            TestDir(dir)
        }
    }

    impl Drop for TestDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn kills_the_whole_group_past_the_limit() {
        let dir = TestDir::new("sandboxd-proc");
        let pidf = dir.0.join("grandchild");
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(format!("sleep 30 & echo $! > {}; wait", pidf.display()));
        let t = Instant::now();
        let e = run(c, b"", Duration::from_millis(300)).unwrap_err();
        assert!(matches!(e, RunError::Timeout { .. }), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5));
        let gc = read_pid(&pidf).expect("grandchild pid");
        assert!(wait_gone(&[gc], Duration::from_secs(2)).is_empty() || !alive(gc));
    }

    #[test]
    fn output_is_capped_and_a_lingering_grandchild_does_not_hold_us() {
        let dir = TestDir::new("sandboxd-proc2");
        let pidf = dir.0.join("lingering");
        let mut c = Command::new("sh");
        // 8 MiB of output, then exit while a background child keeps stdout open for 29 s.
        c.arg("-c").arg(format!(
            "head -c 8388608 /dev/zero; sleep 29 & echo $! > {}; exit 0",
            pidf.display()
        ));
        let limits = Limits {
            timeout: Some(Duration::from_secs(20)),
            stdout_cap: 1 << 20,
            stderr_cap: 1024,
            drain: Duration::from_millis(200),
            budget: None,
        };
        let t = Instant::now();
        let out = run_with(c, b"", &limits, |_| {}).unwrap();
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert_eq!(out.stdout.len(), 1 << 20);
        assert_eq!(out.stdout_dropped, 7 << 20);
        if let Some(p) = read_pid(&pidf) {
            kill_tree(p);
        }
    }

    #[test]
    fn a_shared_budget_bounds_concurrent_calls() {
        let budget = OutputBudget::new(3 << 20);
        let limits = Limits {
            timeout: Some(Duration::from_secs(20)),
            stdout_cap: 2 << 20,
            stderr_cap: 1024,
            drain: Duration::from_millis(200),
            budget: Some(budget.clone()),
        };
        let outs: Vec<Output> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|_| {
                    let l = limits.clone();
                    s.spawn(move || {
                        let mut c = Command::new("sh");
                        c.args(["-c", "head -c 8388608 /dev/zero; sleep 0.5"]);
                        run_with(c, b"", &l, |_| {}).unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let kept: usize = outs.iter().map(|o| o.stdout.len()).sum();
        assert!(kept <= 3 << 20, "{kept} bytes kept over a 3 MiB budget");
        assert!(outs.iter().all(|o| o.stdout.len() <= 2 << 20));
        assert_eq!(budget.left(), 3 << 20, "the budget was not given back");
    }

    #[test]
    fn missing_program() {
        let c = Command::new("/nonexistent/prog");
        let e = run(c, b"", Duration::from_secs(1)).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/prog"), "{e}");
    }

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
