//! Running helper processes (CNI plugins, the OCI runtime, the monitor) with a time limit.
//! A child that outlives its limit is killed and reaped; nothing is left as a zombie.
#![allow(unsafe_code)]

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

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

/// Is process `pid` alive (signal 0)?
pub fn alive(pid: i32) -> bool {
    pid > 0 && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

/// A process's exit as a shell reports it: its code, or 128 + the signal that killed it.
pub fn exit_code(s: &ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    s.code()
        .or_else(|| s.signal().map(|n| 128 + n))
        .unwrap_or(255)
}

/// The pid in a pid file (decimal, surrounding whitespace ignored), if there is one.
pub fn read_pid(pid_file: &std::path::Path) -> Option<i32> {
    std::fs::read_to_string(pid_file).ok()?.trim().parse().ok()
}

/// SIGKILLs the process whose pid a runtime wrote to `pid_file` (an exec'd command: killing
/// only the runtime or its helper would orphan it inside the container).
pub fn kill_pid_file(pid_file: &std::path::Path) {
    if let Some(pid) = read_pid(pid_file).filter(|p| *p > 0) {
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
    #[error("{program} did not finish within {limit:?} and was killed")]
    Timeout { program: String, limit: Duration },
    #[error("waiting for {program}: {source}")]
    Wait {
        program: String,
        #[source]
        source: std::io::Error,
    },
}

/// Runs `cmd` to completion, feeding `stdin` and collecting stdout and stderr, killing it
/// (SIGKILL) if it runs longer than `limit`.
pub fn run(cmd: Command, stdin: &[u8], limit: Duration) -> Result<Output, RunError> {
    let started = Instant::now();
    let r = run_inner(cmd, stdin, limit);
    CHILD_NANOS.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    CHILD_CALLS.fetch_add(1, Ordering::Relaxed);
    r
}

fn run_inner(mut cmd: Command, stdin: &[u8], limit: Duration) -> Result<Output, RunError> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|source| RunError::Spawn {
        program: program.clone(),
        source,
    })?;
    let mut child_stdin = child.stdin.take();
    let input = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        if let Some(mut s) = child_stdin.take() {
            // A child that exits without reading its stdin gives EPIPE here: not our error.
            let _ = s.write_all(&input);
        }
    });
    let mut out_pipe = child.stdout.take();
    let err_pipe = child.stderr.take();
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut p) = err_pipe {
            let _ = p.read_to_end(&mut buf);
        }
        buf
    });
    let deadline = Instant::now() + limit;
    let status = wait_until(&mut child, deadline);
    let status = match status {
        Ok(Some(status)) => status,
        Ok(None) => {
            let _ = child.kill();
            let _ = child.wait();
            let _ = writer.join();
            return Err(RunError::Timeout { program, limit });
        }
        Err(source) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(RunError::Wait { program, source });
        }
    };
    // The child has exited; its pipes close unless a grandchild still holds them, so read
    // what is there without waiting for such a grandchild beyond the deadline.
    let mut stdout = Vec::new();
    if let Some(p) = out_pipe.as_mut() {
        read_until_eof_or(p, &mut stdout, deadline);
    }
    let _ = writer.join();
    let stderr = if err_reader.is_finished() || Instant::now() < deadline {
        err_reader.join().unwrap_or_default()
    } else {
        Vec::new()
    };
    Ok(Output {
        status,
        stdout,
        stderr,
    })
}

/// Waits for `child` until `deadline`; `Ok(None)` means the deadline passed first.
pub fn wait_until(child: &mut Child, deadline: Instant) -> std::io::Result<Option<ExitStatus>> {
    if let Some(fd) = pidfd_open(child.id()) {
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

fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1; no memory is shared.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the syscall returned a fresh fd that nothing else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn read_until_eof_or(pipe: &mut std::process::ChildStdout, buf: &mut Vec<u8>, deadline: Instant) {
    let fd = pipe.as_raw_fd();
    let mut chunk = [0u8; 16384];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `pfd` is a valid pollfd array of length 1 for the duration of the call.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r <= 0 {
            return;
        }
        match pipe.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
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
    fn kills_past_the_limit() {
        let mut c = Command::new("sleep");
        c.arg("10");
        let t = Instant::now();
        let e = run(c, b"", Duration::from_millis(100)).unwrap_err();
        assert!(matches!(e, RunError::Timeout { .. }), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn missing_program() {
        let c = Command::new("/nonexistent/prog");
        let e = run(c, b"", Duration::from_secs(1)).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/prog"), "{e}");
    }
}
