//! `runtime create` under the monitor: the container's stdio pipes (ours to read), the attach
//! and console sockets, the runtime run as our child with a JSON log, its terminal received
//! while it runs, its failure explained from its log, the container's pid.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Child, Stdio};

use sandboxd_shim_common::cli::{MonitorArgs, StdinMode};
use sandboxd_shim_common::fd::{pidfd_open, pipe, set_nonblocking};
use sandboxd_shim_common::files::{
    format_stdio_fds, read_pid, write_atomic, Durability, STDIO_FDS,
};
use sandboxd_shim_common::runtime::{self, last_log_message};

use crate::reaper::{is_our_child, spawn_runtime_wait};
use crate::terminal::Console;

/// A created container, as the monitor holds it.
pub struct Created {
    pub pid: i32,
    /// The read ends of the container's stdout and stderr (non-blocking).
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// The write end of the container's stdin.
    pub stdin: Option<OwnedFd>,
    /// The container's terminal.
    pub master: Option<OwnedFd>,
    pub attach: Option<UnixListener>,
    /// The runtime's `wait`, for a container that is not our child.
    pub waiter: Option<Child>,
    /// Our own copies of the container's stdio, published in `stdio-fds` for a runtime that
    /// takes them at `start`: held until the container has exited.
    pub kept_stdio: Option<[Option<OwnedFd>; 3]>,
}

/// Runs `runtime create`; `Err` is the message for the daemon.
pub fn create(args: &MonitorArgs) -> Result<Created, String> {
    let (out_r, out_w) = pipe().map_err(|e| format!("stdout pipe: {e}"))?;
    let (err_r, err_w) = pipe().map_err(|e| format!("stderr pipe: {e}"))?;
    let (stdin_r, stdin_w) = if args.stdin == StdinMode::None {
        (None, None)
    } else {
        let (r, w) = pipe().map_err(|e| format!("stdin pipe: {e}"))?;
        (Some(r), Some(w))
    };
    // The attach socket is ours alone (0600); the console socket is the runtime's to connect.
    let attach = bind_listener(args.attach_socket.as_deref(), Some(0o600))
        .map_err(|e| format!("attach socket {e}"))?;
    let console = bind_listener(args.console_socket.as_deref(), None)
        .map_err(|e| format!("console socket {e}"))?;
    let mut console = Console::new(console, args.console_socket.clone());
    // The runtime's log is ours alone; it appends to it. (Its umask is left alone for
    // create: the container's cgroup directories it makes must stay readable inside.)
    let _ = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&args.runtime_log);
    let mut cmd = runtime::command_unblocked(&args.runtime, &args.runtime_args, &args.runtime_root);
    cmd.arg("--log")
        .arg(&args.runtime_log)
        .arg("--log-format")
        .arg("json")
        .arg("create");
    if let Some(p) = &args.console_socket {
        cmd.arg("--console-socket").arg(p);
    }
    // Our own copies of the container's stdio ends, for a runtime that takes a container's
    // stdio at `start` rather than at `create` (runsc's containers inside a sandbox): kept
    // only in that case, see `stdio-fds` below. CLOEXEC: no child inherits them.
    let kept_stdio = [
        stdin_r.as_ref().and_then(|r| r.try_clone().ok()),
        out_w.try_clone().ok(),
        err_w.try_clone().ok(),
    ];
    cmd.arg("--bundle")
        .arg(&args.bundle)
        .arg("--pid-file")
        .arg(&args.pid_file)
        .arg(&args.id)
        .stdin(match stdin_r {
            Some(r) => Stdio::from(r),
            None => Stdio::null(),
        })
        .stdout(Stdio::from(out_w))
        .stderr(Stdio::from(err_w));
    // The daemon's small mount namespace for this create, held open by us until the runtime
    // has entered it. Where it cannot be opened or entered, the runtime runs in ours: slower
    // on a node with many mounts, never different.
    let mount_ns = args
        .runtime_mount_ns
        .as_ref()
        .and_then(|p| File::open(p).ok());
    if let Some(fd) = mount_ns.as_ref().map(AsRawFd::as_raw_fd) {
        use std::os::unix::process::CommandExt;
        // SAFETY: setns is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(move || {
                libc::setns(fd, libc::CLONE_NEWNS);
                Ok(())
            });
        }
    }
    let spawned = cmd.spawn();
    // Closes our copies of the write ends.
    drop(cmd);
    // The namespace lives on in the runtime (and goes with it); the container's own is a copy
    // the runtime makes.
    drop(mount_ns);
    let mut child =
        spawned.map_err(|e| format!("cannot execute {}: {e}", args.runtime.display()))?;
    // With a terminal, the runtime connects to the console socket during create and sends
    // the pty master; accept it while create runs. Sleep until create exits or the console
    // connects (a pidfd says when the child exits; without one, poll every 2 ms).
    let pidfd = pidfd_open(child.id() as i32);
    let status = loop {
        console.try_accept().map_err(|e| format!("console: {e}"))?;
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) => match &pidfd {
                Some(fd) => wait_readable(fd.as_raw_fd(), console.waiting_fd()),
                None => std::thread::sleep(std::time::Duration::from_millis(2)),
            },
            Err(e) => {
                return Err(format!(
                    "waiting for {} create: {e}",
                    args.runtime.display()
                ))
            }
        }
    };
    let master = match console.finish() {
        Ok(m) => m,
        Err(()) if status.success() => return Err("the runtime sent no terminal".into()),
        Err(()) => None,
    };
    set_nonblocking(&out_r);
    set_nonblocking(&err_r);
    if !status.success() {
        let mut msg = last_log_message(&args.runtime_log).unwrap_or_default();
        if msg.is_empty() {
            let mut buf = [0u8; 4096];
            let n = (&File::from(err_r)).read(&mut buf).unwrap_or(0);
            msg = String::from_utf8_lossy(&buf[..n]).trim().to_string();
        }
        let code = status
            .code()
            .map_or_else(|| format!("{status}"), |c| format!("exit {c}"));
        return Err(format!(
            "{} create failed ({code}): {msg}",
            args.runtime.display()
        ));
    }
    let Some(pid) = read_pid(&args.pid_file) else {
        return Err(format!("no pid in {}", args.pid_file.display()));
    };
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&args.pid_file, std::fs::Permissions::from_mode(0o600));
    }
    // A container whose process is not ours to reap (runsc's containers run inside its
    // sandbox, and the pid file names the sandbox process): its exit comes from the
    // runtime's own `wait`, run as our child.
    let waiter = match is_our_child(pid) {
        true => None,
        false => Some(spawn_runtime_wait(args).map_err(|e| format!("runtime wait: {e}"))?),
    };
    // Such a container gets its stdio when it is started: publish our ends of its pipes so
    // the daemon's `runtime start` can be given them (through /proc/<our pid>/fd/N).
    let kept_stdio = match waiter {
        Some(_) => {
            let fd = |f: &Option<OwnedFd>| f.as_ref().map_or(-1, |f| f.as_raw_fd());
            let line =
                format_stdio_fds([fd(&kept_stdio[0]), fd(&kept_stdio[1]), fd(&kept_stdio[2])]);
            write_atomic(
                &args.bundle.join(STDIO_FDS),
                line.as_bytes(),
                Durability::Rename,
            )
            .map_err(|e| format!("stdio-fds: {}", e.source))?;
            Some(kept_stdio)
        }
        None => None,
    };
    Ok(Created {
        pid,
        stdout: out_r,
        stderr: err_r,
        stdin: stdin_w,
        master,
        attach,
        waiter,
        kept_stdio,
    })
}

/// Binds a non-blocking listener at `path` (replacing a stale socket), optionally setting its
/// mode; `None` path means no socket. The error names the path.
fn bind_listener(path: Option<&Path>, mode: Option<u32>) -> Result<Option<UnixListener>, String> {
    let Some(p) = path else {
        return Ok(None);
    };
    let _ = std::fs::remove_file(p);
    let l = UnixListener::bind(p).map_err(|e| format!("{}: {e}", p.display()))?;
    if let Some(mode) = mode {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode));
    }
    let _ = l.set_nonblocking(true);
    Ok(Some(l))
}

/// Sleeps until `a` or `b` is readable (EINTR and errors just return: callers re-check).
fn wait_readable(a: RawFd, b: Option<RawFd>) {
    let mut pfds = [
        libc::pollfd {
            fd: a,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: b.unwrap_or(-1),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: `pfds` is a valid array of two pollfds (a negative fd is ignored by poll).
    unsafe { libc::poll(pfds.as_mut_ptr(), 2, -1) };
}
