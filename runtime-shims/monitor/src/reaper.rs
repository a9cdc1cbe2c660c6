//! Reaping and learning the container's exit. The monitor is child subreaper: the container
//! (a child of the runtime's `create`, reparented to us) and its orphans are reaped here from
//! a signalfd's SIGCHLD. A container that is not ours to reap (runsc's containers run inside
//! its sandbox, and the pid file names the sandbox process) has its exit from the runtime's
//! own `wait`, run as our child (asked again while the container is still created).

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sandboxd_shim_common::cli::MonitorArgs;
use sandboxd_shim_common::exit::ExitInfo;
use sandboxd_shim_common::runtime::{self, parse_wait, RuntimeState};

use sandboxd_shim_common::time::timestamp;

/// The container's exit, and when the monitor learned it.
pub struct Exit {
    pub info: ExitInfo,
    pub at: Instant,
}

impl Exit {
    fn now(exit_code: i32, signal: Option<i32>) -> Exit {
        let exited_at = timestamp();
        Exit {
            info: ExitInfo {
                exit_code,
                signal,
                exited_at,
                ..Default::default()
            },
            at: Instant::now(),
        }
    }

    /// Status unknown (the runtime's `wait` could not tell).
    fn unknown() -> Exit {
        Exit::now(255, None)
    }
}

/// Follows the container `pid` until its exit is known.
pub struct Reaper {
    pid: i32,
    /// The runtime's `wait` for a container that is not our child.
    waiter: Option<Child>,
    /// When to ask the runtime's `wait` again, and the delay after that.
    rewait_at: Option<Instant>,
    rewait: Duration,
    exit: Option<Exit>,
}

impl Reaper {
    pub fn new(pid: i32, waiter: Option<Child>) -> Reaper {
        Reaper {
            pid,
            waiter,
            rewait_at: None,
            rewait: Duration::from_millis(5),
            exit: None,
        }
    }

    pub fn exit(&self) -> Option<&Exit> {
        self.exit.as_ref()
    }

    pub fn into_exit(self) -> Option<Exit> {
        self.exit
    }

    /// How long poll may sleep (ms, -1: until something happens): with the exit known, the
    /// output drain is checked every 100 ms; a runtime `wait` to ask again bounds it.
    pub fn poll_timeout(&self) -> i32 {
        match (&self.exit, self.rewait_at) {
            (Some(_), _) => 100,
            (None, Some(t)) => t.saturating_duration_since(Instant::now()).as_millis() as i32 + 1,
            (None, None) => -1,
        }
    }

    /// Reaps every exited child, noting the container's exit.
    pub fn reap(&mut self, args: &MonitorArgs) {
        for (p, st) in reap_all() {
            if self.exit.is_some() {
                continue;
            }
            match self.exit_of(p, st, args) {
                Reaped::Exit(e) => self.exit = Some(e),
                Reaped::WaitAgain => self.rewait_at = Some(Instant::now() + self.rewait),
                Reaped::Other => {}
            }
        }
    }

    /// Asks the runtime to wait again once the container may have started (backing off from
    /// 5 ms to 500 ms while it stays created).
    pub fn rewait_if_due(&mut self, args: &MonitorArgs) {
        let due = self.rewait_at.is_some_and(|t| Instant::now() >= t);
        if self.exit.is_some() || !due {
            return;
        }
        self.rewait_at = None;
        self.rewait = (self.rewait * 2).min(Duration::from_millis(500));
        match spawn_runtime_wait(args) {
            Ok(w) => self.waiter = Some(w),
            Err(_) => self.exit = Some(Exit::unknown()),
        }
    }

    fn exit_of(&mut self, p: i32, st: i32, args: &MonitorArgs) -> Reaped {
        match &mut self.waiter {
            None if p == self.pid => {
                let (code, signal) = decode(st);
                Reaped::Exit(Exit::now(code, signal))
            }
            Some(w) if p == w.id() as i32 => {
                let mut out = Vec::new();
                if let Some(o) = w.stdout.as_mut() {
                    let _ = o.take(4096).read_to_end(&mut out);
                }
                match parse_wait(&out) {
                    Some(code) => {
                        let signal = (code > 128 && code < 160).then_some(code - 128);
                        Reaped::Exit(Exit::now(code, signal))
                    }
                    // Not started yet, or being started while `wait` asked: ask again.
                    None if matches!(
                        runtime_status(args).as_deref(),
                        Some("created" | "creating" | "running")
                    ) =>
                    {
                        Reaped::WaitAgain
                    }
                    // Gone or stopped without an answer: the status is unknown.
                    None => Reaped::Exit(Exit::unknown()),
                }
            }
            _ => Reaped::Other,
        }
    }
}

/// What reaping a child means for the container.
enum Reaped {
    /// The container exited (its process, or the runtime's `wait` answered).
    Exit(Exit),
    /// The runtime's `wait` gave up although the container is not stopped (runsc's `wait`
    /// refuses a created container, and one being started): ask again later.
    WaitAgain,
    Other,
}

/// A wait status as a shell reports it: (128 + the signal that killed it, or its exit code;
/// that signal).
pub fn decode(status: i32) -> (i32, Option<i32>) {
    if libc::WIFSIGNALED(status) {
        let s = libc::WTERMSIG(status);
        (128 + s, Some(s))
    } else {
        (libc::WEXITSTATUS(status), None)
    }
}

/// Is `pid` a child of ours (so its exit reaches our waitpid)?
pub fn is_our_child(pid: i32) -> bool {
    // SAFETY: waitid with a zeroed siginfo owned by this frame; WNOWAIT leaves the child
    // unreaped.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        ) == 0
    }
}

/// `RUNTIME [runtime args] --root DIR <op> ID`, stdin and stderr on /dev/null.
fn runtime_op(args: &MonitorArgs, op: &str) -> Command {
    let mut c = runtime::command_unblocked(&args.runtime, &args.runtime_args, &args.runtime_root);
    c.arg(op)
        .arg(&args.id)
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    c
}

/// `RUNTIME wait ID` as a child, its JSON answer on a pipe.
pub fn spawn_runtime_wait(args: &MonitorArgs) -> std::io::Result<Child> {
    runtime_op(args, "wait").stdout(Stdio::piped()).spawn()
}

/// `RUNTIME state ID`'s `status`, if it answers.
fn runtime_status(args: &MonitorArgs) -> Option<String> {
    let out = runtime_op(args, "state").output().ok()?;
    let state: RuntimeState = serde_json::from_slice(&out.stdout).ok()?;
    Some(state.status)
}

/// Blocks the signals the monitor handles and returns a signalfd delivering them. Children
/// start with an empty mask (std resets it), so the container sees default dispositions.
pub fn signal_fd() -> std::io::Result<OwnedFd> {
    // SAFETY: the sigset is initialised by sigemptyset before use; pointers are to locals.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [
            libc::SIGCHLD,
            libc::SIGUSR1,
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGHUP,
        ] {
            libc::sigaddset(&mut set, s);
        }
        if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// The signals pending on the signalfd.
pub fn read_signals(fd: &OwnedFd) -> Vec<i32> {
    let mut out = Vec::new();
    loop {
        // SAFETY: an all-zero signalfd_siginfo is valid; read fills at most its size.
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: reading into a properly sized, owned buffer.
        let n = unsafe {
            libc::read(
                fd.as_raw_fd(),
                (&mut info as *mut libc::signalfd_siginfo).cast(),
                size,
            )
        };
        if n as usize != size {
            return out;
        }
        out.push(info.ssi_signo as i32);
    }
}

/// Reaps every exited child (the monitor is subreaper: orphans of the container land here).
pub fn reap_all() -> Vec<(i32, i32)> {
    let mut out = Vec::new();
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a pointer to a local status word.
        let p = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if p <= 0 {
            return out;
        }
        out.push((p, status));
    }
}
