//! Running one helper process to completion under [`Limits`]: its own process group, killed
//! as a whole past its time limit, stdin fed and stdout/stderr read concurrently with
//! `poll(2)` on the calling thread, output read only for a short drain after the exit.
#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandboxd_shim_common::fd::{pidfd_open, set_nonblocking};

use super::kill_tree;
use super::output::{OutputBudget, Sink};
use super::spawn::Within;

/// A process's exit as a shell reports it: its code, or 128 + the signal that killed it.
pub fn exit_code(s: &ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    s.code()
        .or_else(|| s.signal().map(|n| 128 + n))
        .unwrap_or(255)
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
    #[error("{program} was killed: its caller went away")]
    Cancelled { program: String },
    #[error("waiting for {program}: {source}")]
    Wait {
        program: String,
        #[source]
        source: std::io::Error,
    },
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
    /// Raised when whoever waits for the result has gone: the child is killed as at its
    /// time limit, and the run ends with [`RunError::Cancelled`].
    pub cancel: Option<Arc<Cancel>>,
    /// Spawned by the spawner thread with this umask and mount namespace (and no signal
    /// blocked); `None`: by the calling thread, as it is.
    pub within: Option<Within>,
}

/// A flag one thread raises to end another's run early (an RPC whose client went away): an
/// eventfd the run polls with its child's pipes.
#[derive(Debug)]
pub struct Cancel {
    fd: OwnedFd,
}

impl Cancel {
    pub fn new() -> std::io::Result<Arc<Cancel>> {
        // SAFETY: eventfd with flags only; the result is checked and owned at once.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        Ok(Arc::new(Cancel { fd }))
    }

    /// Raises the flag (idempotent).
    pub fn cancel(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writing 8 bytes from a local array to our own eventfd.
        unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), 8) };
    }

    /// Whether the flag is up.
    pub fn is_cancelled(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }
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
            cancel: None,
            within: None,
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
    crate::counters::add(crate::counters::Wait::Child, started.elapsed());
    r
}

/// Runs `cmd` with the given stdio (`None`: /dev/null) in its own process group, killing
/// the group past `limit`; spawned `within` as [`Limits::within`] says. For a command whose
/// output is not ours to read (a runtime's `start` that hands the container its stdio).
pub fn run_with_stdio(
    mut cmd: Command,
    [stdin, stdout, stderr]: [Option<OwnedFd>; 3],
    limit: Duration,
    within: Option<&Within>,
) -> Result<ExitStatus, RunError> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let io = |f: Option<OwnedFd>| f.map_or_else(Stdio::null, Stdio::from);
    cmd.stdin(io(stdin))
        .stdout(io(stdout))
        .stderr(io(stderr))
        .process_group(0);
    let mut child = spawn_within(cmd, within).map_err(|source| RunError::Spawn {
        program: program.clone(),
        source,
    })?; // our copies of the stdio are gone with `cmd`
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

fn spawn_within(mut cmd: Command, within: Option<&Within>) -> std::io::Result<Child> {
    match within {
        Some(w) => super::spawn::spawn(cmd, w),
        None => cmd.spawn(),
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
    let mut child =
        spawn_within(cmd, limits.within.as_ref()).map_err(|source| RunError::Spawn {
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
        let cancelled =
            status.is_none() && limits.cancel.as_ref().is_some_and(|c| c.is_cancelled());
        if cancelled {
            on_timeout(pid);
            kill_group(pid);
            let _ = child.wait();
            return Err(RunError::Cancelled { program });
        }
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
        slot(
            limits
                .cancel
                .as_ref()
                .filter(|_| status.is_none())
                .map(|c| c.fd.as_raw_fd()),
            libc::POLLIN,
        );
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
