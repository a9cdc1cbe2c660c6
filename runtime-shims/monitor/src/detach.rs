//! The monitor's side of the launch: detaching from the daemon (new session, subreaper,
//! stdio on /dev/null) and its one report back to the launcher.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;

/// The monitor's one message to its launcher: `ok PID` or `err MESSAGE` (the pipe's EOF
/// ends it).
pub struct Report(File);

impl Report {
    /// The report, written to the launcher's pipe.
    pub fn new(pipe: File) -> Report {
        Report(pipe)
    }

    /// The container is created: its pid.
    pub fn ok(mut self, pid: i32) {
        let _ = write!(self.0, "ok {pid}");
    }

    /// The monitor failed: `msg` goes to the daemon (once the report is dropped, when the
    /// monitor exits); returns the monitor's exit code.
    pub fn fail(&mut self, msg: String) -> i32 {
        let _ = write!(self.0, "err {msg}");
        1
    }
}

/// New session, subreaper, cwd `/`, stdio on /dev/null (holding nothing of the daemon's).
pub fn detach() -> std::io::Result<()> {
    // SAFETY: plain syscalls without pointers (setsid, prctl with integer args).
    unsafe {
        libc::setsid();
        if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    std::env::set_current_dir("/")?;
    let null = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    for fd in 0..3 {
        // SAFETY: dup2 onto the standard fds, which we mean to replace.
        if unsafe { libc::dup2(null.as_raw_fd(), fd) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
