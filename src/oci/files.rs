//! The files one container's monitor keeps in the container's dir (pid, exit, the monitor's
//! pid, the runtime's log, sockets), and what the daemon reads of them: the exit, when it
//! happened, whether the monitor is gone without recording one. Their names and formats are
//! `sandboxd_shim_common`'s.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sandboxd_shim_common::cli::StdinMode;
use sandboxd_shim_common::exit::ExitInfo;

use crate::process;

/// The files one container's monitor reads and writes.
#[derive(Debug, Clone)]
pub struct ContainerFiles {
    pub pid_file: PathBuf,
    pub exit_file: PathBuf,
    pub monitor_pid_file: PathBuf,
    pub runtime_log: PathBuf,
    /// CRI log of the container's stdout/stderr, if it has one.
    pub log_path: Option<PathBuf>,
    /// The monitor's attach socket, if the container gets one.
    pub attach_socket: Option<PathBuf>,
    /// The container's stdin.
    pub stdin: StdinMode,
    /// Where the runtime hands over the terminal of a container that has one.
    pub console_socket: Option<PathBuf>,
}

impl crate::model::container::ContainerRecord {
    /// The files its monitor reads and writes (pid, exit, logs, sockets) and its stdin mode.
    pub fn files(&self) -> ContainerFiles {
        let mut f = ContainerFiles::in_dir(&self.dir, self.log_path.clone());
        f.attach_socket = self.attach_socket.clone();
        f.console_socket = self.console_socket.clone();
        f.stdin = match (self.config.stdin, self.config.stdin_once) {
            (false, _) => StdinMode::None,
            (true, false) => StdinMode::Open,
            (true, true) => StdinMode::Once,
        };
        f
    }
}

impl ContainerFiles {
    /// Waits until the monitor wrote the exit file, or (monitor gone) the process is gone.
    /// `proc` is the process as recorded: a pid another process holds now (after a reboot,
    /// say) is gone.
    pub fn wait_exit(&self, proc: &crate::process::ProcId, limit: Duration) -> Result<(), String> {
        let started = Instant::now();
        let r = wait_exit_since(started, self, proc, limit);
        crate::counters::add(crate::counters::Wait::OtherProcess, started.elapsed());
        r
    }

    /// Waits (up to `limit`) until the monitor watches the container's OOM kills or knows it
    /// cannot (`oom-watch`); whether it does. A container made by a monitor of an older
    /// version never says so, and costs the limit once.
    pub fn wait_oom_watch(&self, limit: Duration) -> bool {
        let marker = self
            .exit_file
            .with_file_name(sandboxd_shim_common::files::OOM_WATCH);
        let deadline = Instant::now() + limit;
        loop {
            if marker.exists() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The standard layout inside a container's (or the infra's) own dir.
    pub fn in_dir(dir: &Path, log_path: Option<PathBuf>) -> Self {
        ContainerFiles {
            pid_file: dir.join("pid"),
            exit_file: dir.join(sandboxd_shim_common::exit::EXIT_FILE),
            monitor_pid_file: dir.join("monitor.pid"),
            runtime_log: dir.join("runtime.log"),
            log_path,
            attach_socket: None,
            stdin: StdinMode::None,
            console_socket: None,
        }
    }

    /// The container's exit as the monitor recorded it, if it has exited.
    pub fn exit(&self) -> Option<ExitInfo> {
        ExitInfo::parse(&std::fs::read(&self.exit_file).ok()?)
    }

    /// The monitor's pid, if recorded.
    pub fn monitor_pid(&self) -> Option<i32> {
        process::read_pid(&self.monitor_pid_file)
    }

    /// The monitor's pid while it is alive and still the monitor: a pid another process
    /// holds now (the monitor exited, or the node rebooted since it wrote the file) is none.
    pub fn live_monitor(&self) -> Option<i32> {
        self.monitor_pid()
            .filter(|p| *p > 1 && process::alive_as_written(*p, &self.monitor_pid_file))
    }

    /// The monitor is gone and recorded no exit: nobody ever will. (The one check of a dead
    /// monitor: the status refresh and the start-up restore ask it.)
    pub fn monitor_gone_without_exit(&self) -> bool {
        self.live_monitor().is_none() && self.exit().is_none()
    }

    /// When the container exited, as the monitor recorded it at the reap (before the drain
    /// of its output); for an exit file without a readable `exited_at` (an older monitor),
    /// the file's mtime.
    pub fn exited_at_nanos(&self, exit: &ExitInfo) -> Option<i64> {
        exit.exited_at_nanos().or_else(|| {
            let t = std::fs::metadata(&self.exit_file).ok()?.modified().ok()?;
            Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos() as i64)
        })
    }
}

fn wait_exit_since(
    started: Instant,
    files: &ContainerFiles,
    proc: &crate::process::ProcId,
    limit: Duration,
) -> Result<(), String> {
    let deadline = started + limit;
    let pid = proc.pid;
    // Written before create returned; never changes. Checked once: a monitor that is not
    // ours (the pid taken by another process) is never waited for.
    let monitor = files.live_monitor();
    let mut delay = Duration::from_micros(100);
    // When the process was first seen exited (a zombie its monitor does not reap, or gone
    // with no exit recorded): a monitor that is stopped or dead never records the exit.
    let mut exited_since: Option<Instant> = None;
    loop {
        if files.exit().is_some() {
            return Ok(());
        }
        let process_exited = !proc.alive();
        let monitor_alive = monitor.is_some_and(crate::process::alive);
        if process_exited && !monitor_alive {
            return Ok(());
        }
        if process_exited {
            // A live monitor reaps and records within milliseconds (its output drain takes
            // at most 2 s); one that does not within 3 s is stopped or hung.
            let since = *exited_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= Duration::from_secs(3) {
                tracing::warn!(pid, monitor = ?monitor, "the process exited but its monitor records nothing (stopped?)");
                return Ok(());
            }
        }
        if Instant::now() >= deadline {
            return Err(format!("process {pid} did not exit within {limit:?}"));
        }
        std::thread::sleep(delay);
        // A killed process is usually reaped and recorded within a few ms: check every ms at
        // first, then back off to 20 ms for one that takes its time.
        let cap = if started.elapsed() < Duration::from_millis(100) {
            Duration::from_millis(1)
        } else {
            Duration::from_millis(20)
        };
        delay = (delay * 2).min(cap);
    }
}
