//! `sandboxd-monitor`: the per-container monitor (conmon's role). The daemon starts one per
//! container; it detaches (new session, the daemon's child exits once `runtime create` is
//! done), becomes child subreaper, runs `RUNTIME create`, owns the container's stdout and
//! stderr and writes them to the CRI log format, reaps the container and writes its exit
//! status atomically to the exit file. The daemon learns everything from files, so
//! containers and their monitors outlive a daemon restart.
//!
//! Usage: sandboxd-monitor --runtime PATH --runtime-root DIR --id ID --bundle DIR
//!   --pid-file FILE --exit-file FILE --runtime-log FILE --monitor-pid-file FILE
//!   [--log-path FILE] [--attach-socket SOCK] [--stdin none|open|once]
//!   [--console-socket SOCK] [--runtime-arg FLAG]...   (flags before the subcommand)
//! On success the invoked process prints the container pid and exits 0; on failure it prints
//! the runtime's own error message on stderr and exits 1.
//!
//! `sandboxd-monitor exec …` is a second, non-detaching mode for exec sessions with a
//! terminal: see [`exec_mode`].
//!
//! Exit file: one JSON line `{"exit_code":N,"signal":S|null,"exited_at":"RFC3339Nano"}`, where
//! a container killed by signal S has exit_code 128+S. SIGUSR1 reopens the log file (log
//! rotation); SIGTERM, SIGINT and SIGHUP to the monitor are ignored: it lives as long as its
//! container.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longest log entry; longer lines are split into partial (`P`) entries.
const MAX_LINE: usize = 16 * 1024;
/// How long to keep reading output after the container exited (a daemonised grandchild may
/// hold the pipes open forever).
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);

struct Args {
    runtime: PathBuf,
    /// Flags for the runtime before its subcommand (`--runtime-arg`, repeatable).
    runtime_args: Vec<String>,
    runtime_root: PathBuf,
    id: String,
    bundle: PathBuf,
    pid_file: PathBuf,
    exit_file: PathBuf,
    runtime_log: PathBuf,
    monitor_pid_file: PathBuf,
    log_path: Option<PathBuf>,
    /// Unix socket where attach clients get the output and may write stdin.
    attach_socket: Option<PathBuf>,
    /// `none` (stdin is /dev/null), `open` (a pipe kept open), `once` (closed when the first
    /// attach client that wrote to it goes away or closes it).
    stdin_mode: String,
    /// The container has a terminal: the runtime hands its master to this socket, and the
    /// monitor reads output from it and writes attach clients' input to it.
    console_socket: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut v: std::collections::HashMap<String, String> = Default::default();
    let mut runtime_args = Vec::new();
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        if k == "--version" {
            println!("sandboxd-monitor {}", env!("CARGO_PKG_VERSION"));
            std::process::exit(0);
        }
        if k == "--runtime-arg" {
            runtime_args.push(
                it.next()
                    .ok_or_else(|| "--runtime-arg needs a value".to_string())?,
            );
            continue;
        }
        let known = [
            "--runtime",
            "--runtime-root",
            "--id",
            "--bundle",
            "--pid-file",
            "--exit-file",
            "--runtime-log",
            "--monitor-pid-file",
            "--log-path",
            "--attach-socket",
            "--stdin",
            "--console-socket",
        ];
        if !known.contains(&k.as_str()) {
            return Err(format!("unknown option {k}"));
        }
        let val = it.next().ok_or_else(|| format!("{k} needs a value"))?;
        v.insert(k, val);
    }
    let mut req = |k: &str| v.remove(k).ok_or_else(|| format!("{k} is required"));
    Ok(Args {
        runtime: req("--runtime")?.into(),
        runtime_args,
        runtime_root: req("--runtime-root")?.into(),
        id: req("--id")?,
        bundle: req("--bundle")?.into(),
        pid_file: req("--pid-file")?.into(),
        exit_file: req("--exit-file")?.into(),
        runtime_log: req("--runtime-log")?.into(),
        monitor_pid_file: req("--monitor-pid-file")?.into(),
        log_path: v.remove("--log-path").map(PathBuf::from),
        attach_socket: v.remove("--attach-socket").map(PathBuf::from),
        console_socket: v.remove("--console-socket").map(PathBuf::from),
        stdin_mode: match v.remove("--stdin").as_deref() {
            None | Some("none") => "none".into(),
            Some(m @ ("open" | "once")) => m.into(),
            Some(m) => return Err(format!("--stdin {m}: expected none, open or once")),
        },
    })
}

/// `sandboxd-monitor exec --runtime R --runtime-root DIR --id ID --pid-file F
/// [--console-socket S] -- CMD...`: runs `R exec --detach` (a terminal handed to the console
/// socket needs a detached exec), stays subreaper so the exec'd process is reparented to it,
/// reaps it and exits with its status (128+signal when killed). Not detached: the daemon waits
/// for it like for any child.
fn exec_mode(argv: Vec<String>) -> ! {
    let mut opts: std::collections::HashMap<String, String> = Default::default();
    let mut runtime_args = Vec::new();
    let mut it = argv.into_iter();
    let mut cmd = Vec::new();
    while let Some(k) = it.next() {
        if k == "--" {
            cmd = it.collect();
            break;
        }
        match k.as_str() {
            "--runtime-arg" => runtime_args.push(
                it.next()
                    .unwrap_or_else(|| die("--runtime-arg needs a value")),
            ),
            "--runtime" | "--runtime-root" | "--id" | "--pid-file" | "--console-socket" => {
                let v = it
                    .next()
                    .unwrap_or_else(|| die(&format!("{k} needs a value")));
                opts.insert(k, v);
            }
            _ => die(&format!("exec: unknown option {k}")),
        }
    }
    let req = |k: &str| {
        opts.get(k)
            .cloned()
            .unwrap_or_else(|| die(&format!("exec: {k} is required")))
    };
    if cmd.is_empty() {
        die("exec: no command after --");
    }
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let pid_file = PathBuf::from(req("--pid-file"));
    let mut c = Command::new(req("--runtime"));
    private_umask(&mut c);
    c.args(&runtime_args)
        .arg("--root")
        .arg(req("--runtime-root"))
        .arg("exec")
        .arg("--detach")
        .arg("--pid-file")
        .arg(&pid_file);
    if let Some(sock) = opts.get("--console-socket") {
        c.arg("--tty").arg("--console-socket").arg(sock);
    }
    c.arg(req("--id")).args(&cmd);
    c.env_remove("NOTIFY_SOCKET");
    match c.status() {
        Ok(s) if s.success() => {}
        Ok(s) => die(&format!("runtime exec failed: {s}")),
        Err(e) => die(&format!("runtime exec: {e}")),
    }
    let pid = read_pid(&pid_file).unwrap_or_else(|| die("runtime exec wrote no pid"));
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a pointer to a local status word.
        let p = unsafe { libc::waitpid(-1, &mut status, 0) };
        if p < 0 {
            // No children left: the process was not reparented to us (already gone).
            std::process::exit(255);
        }
        if p == pid {
            let (code, _, _, _) = decode(status);
            std::process::exit(code);
        }
    }
}

fn main() {
    let mut argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.first().map(String::as_str) == Some("exec") {
        argv.remove(0);
        exec_mode(argv);
    }
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("sandboxd-monitor: {e}");
            std::process::exit(2);
        }
    };
    let (report_r, report_w) = pipe().unwrap_or_else(|e| die(&format!("sync pipe: {e}")));
    let (go_r, go_w) = pipe().unwrap_or_else(|e| die(&format!("sync pipe: {e}")));
    // SAFETY: the monitor is single-threaded here, so the child may run any code after fork.
    match unsafe { libc::fork() } {
        -1 => die(&format!("fork: {}", std::io::Error::last_os_error())),
        0 => {
            drop((report_r, go_w));
            // Leave our parent's process group (which the daemon kills past its time limit)
            // only once our pid is on record: at every moment one of the two finds us.
            let mut b = [0u8; 1];
            if !matches!(File::from(go_r).read(&mut b), Ok(1)) {
                std::process::exit(1);
            }
            let code = monitor(&args, File::from(report_w));
            std::process::exit(code);
        }
        child => {
            drop((report_w, go_r));
            if let Err(e) = write_atomic(&args.monitor_pid_file, format!("{child}\n").as_bytes()) {
                die(&format!("write {}: {e}", args.monitor_pid_file.display()));
            }
            let _ = File::from(go_w).write_all(b"1");
            let mut msg = String::new();
            let _ = File::from(report_r).read_to_string(&mut msg);
            if let Some(pid) = msg.strip_prefix("ok ") {
                println!("{}", pid.trim());
                std::process::exit(0);
            }
            let msg = msg
                .strip_prefix("err ")
                .unwrap_or("monitor died before reporting");
            eprintln!("{}", msg.trim());
            std::process::exit(1);
        }
    }
}

/// A pidfd for `pid` (Linux ≥ 5.3), readable once the process has exited.
fn pidfd_open(pid: libc::pid_t) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: a non-negative return is a fresh fd that nothing else owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
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

/// Binds a non-blocking listener at `path` (replacing a stale socket), optionally setting its
/// mode; `None` path means no socket. The error names the path.
fn bind_listener(
    path: Option<&Path>,
    mode: Option<u32>,
) -> Result<Option<std::os::unix::net::UnixListener>, String> {
    let Some(p) = path else {
        return Ok(None);
    };
    let _ = std::fs::remove_file(p);
    let l =
        std::os::unix::net::UnixListener::bind(p).map_err(|e| format!("{}: {e}", p.display()))?;
    if let Some(mode) = mode {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode));
    }
    let _ = l.set_nonblocking(true);
    Ok(Some(l))
}

/// The pid a runtime wrote to `path`.
fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The files an exec makes (its pid file) are created root's alone (0600); the exec'd
/// process gets the umask its container's spec names.
fn private_umask(c: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: umask is async-signal-safe and touches no memory.
    unsafe {
        c.pre_exec(|| {
            libc::umask(0o077);
            Ok(())
        });
    }
}

fn die(msg: &str) -> ! {
    eprintln!("sandboxd-monitor: {msg}");
    std::process::exit(1)
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two fds into the array we own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both fds are fresh and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The detached monitor. Returns the process exit code.
fn monitor(args: &Args, mut report: File) -> i32 {
    let fail = |report: &mut File, msg: String| {
        let _ = write!(report, "err {msg}");
        1
    };
    // Our pid is on record (our parent wrote it before letting us go): a daemon whose
    // `runtime create` times out kills us (we lead our own session and process group, the
    // runtime's too) by it.
    if let Err(e) = detach() {
        return fail(&mut report, format!("detach: {e}"));
    }
    let sigfd = match signal_fd() {
        Ok(fd) => fd,
        Err(e) => return fail(&mut report, format!("signalfd: {e}")),
    };
    let mut log = LogFile::open(args.log_path.clone());
    let (out_r, out_w) = match pipe() {
        Ok(p) => p,
        Err(e) => return fail(&mut report, format!("stdout pipe: {e}")),
    };
    let (err_r, err_w) = match pipe() {
        Ok(p) => p,
        Err(e) => return fail(&mut report, format!("stderr pipe: {e}")),
    };
    let (stdin_r, mut stdin_w) = if args.stdin_mode == "none" {
        (None, None)
    } else {
        match pipe() {
            Ok((r, w)) => (Some(r), Some(w)),
            Err(e) => return fail(&mut report, format!("stdin pipe: {e}")),
        }
    };
    // The attach socket is ours alone (0600); the console socket is the runtime's to connect.
    let listener = match bind_listener(args.attach_socket.as_deref(), Some(0o600)) {
        Ok(l) => l,
        Err(e) => return fail(&mut report, format!("attach socket {e}")),
    };
    let console = match bind_listener(args.console_socket.as_deref(), None) {
        Ok(l) => l,
        Err(e) => return fail(&mut report, format!("console socket {e}")),
    };
    // The runtime's log is ours alone; it appends to it. (Its umask is left alone for
    // create: the container's cgroup directories it makes must stay readable inside.)
    let _ = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&args.runtime_log);
    let mut cmd = Command::new(&args.runtime);
    cmd.args(&args.runtime_args)
        .arg("--root")
        .arg(&args.runtime_root)
        .arg("--log")
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
    let mut kept_stdio = (
        stdin_r.as_ref().and_then(|r| r.try_clone().ok()),
        out_w.try_clone().ok(),
        err_w.try_clone().ok(),
    );
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
    let spawned = cmd.spawn();
    drop(cmd); // closes our copies of the write ends
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            return fail(
                &mut report,
                format!("cannot execute {}: {e}", args.runtime.display()),
            )
        }
    };
    // With a terminal, the runtime connects to the console socket during create and sends
    // the pty master; accept it while create runs. Sleep until create exits or the console
    // connects (a pidfd says when the child exits; without one, poll every 2 ms).
    let pidfd = pidfd_open(child.id() as libc::pid_t);
    let mut master: Option<OwnedFd> = None;
    let status = loop {
        if let (Some(l), None) = (&console, &master) {
            if let Ok((s, _)) = l.accept() {
                match recv_fd(&s) {
                    Ok(fd) => master = Some(fd),
                    Err(e) => return fail(&mut report, format!("console: {e}")),
                }
            }
        }
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) => match &pidfd {
                Some(fd) => {
                    let listener = console.as_ref().filter(|_| master.is_none());
                    wait_readable(fd.as_raw_fd(), listener.map(|l| l.as_raw_fd()));
                }
                None => std::thread::sleep(std::time::Duration::from_millis(2)),
            },
            Err(e) => {
                return fail(
                    &mut report,
                    format!("waiting for {} create: {e}", args.runtime.display()),
                )
            }
        }
    };
    if let (Some(l), None) = (&console, &master) {
        if let Ok((s, _)) = l.accept() {
            if let Ok(fd) = recv_fd(&s) {
                master = Some(fd);
            }
        }
    }
    if let Some(p) = &args.console_socket {
        let _ = std::fs::remove_file(p);
    }
    if console.is_some() && master.is_none() && status.success() {
        return fail(&mut report, "the runtime sent no terminal".into());
    }
    set_nonblocking(&out_r);
    set_nonblocking(&err_r);
    if !status.success() {
        let mut msg = last_log_error(&args.runtime_log).unwrap_or_default();
        if msg.is_empty() {
            let mut buf = [0u8; 4096];
            let n = (&File::from(err_r)).read(&mut buf).unwrap_or(0);
            msg = String::from_utf8_lossy(&buf[..n]).trim().to_string();
        }
        let code = status
            .code()
            .map_or_else(|| format!("{status}"), |c| format!("exit {c}"));
        return fail(
            &mut report,
            format!("{} create failed ({code}): {msg}", args.runtime.display()),
        );
    }
    let pid = match read_pid(&args.pid_file) {
        Some(p) => {
            use std::os::unix::fs::PermissionsExt;
            let _ =
                std::fs::set_permissions(&args.pid_file, std::fs::Permissions::from_mode(0o600));
            p
        }
        None => {
            return fail(
                &mut report,
                format!("no pid in {}", args.pid_file.display()),
            )
        }
    };
    // A container whose process is not ours to reap (runsc's containers run inside its
    // sandbox, and the pid file names the sandbox process): its exit comes from the
    // runtime's own `wait`, run as our child.
    let mut waiter = match is_our_child(pid) {
        true => None,
        false => match spawn_runtime_wait(args) {
            Ok(w) => Some(w),
            Err(e) => return fail(&mut report, format!("runtime wait: {e}")),
        },
    };
    // Such a container gets its stdio when it is started: publish our ends of its pipes so
    // the daemon's `runtime start` can be given them (through /proc/<our pid>/fd/N).
    if waiter.is_some() {
        let fd = |f: &Option<OwnedFd>| f.as_ref().map_or(-1, |f| f.as_raw_fd());
        let line = format!(
            "{} {} {}\n",
            fd(&kept_stdio.0),
            fd(&kept_stdio.1),
            fd(&kept_stdio.2)
        );
        if let Err(e) = write_atomic(&args.bundle.join("stdio-fds"), line.as_bytes()) {
            return fail(&mut report, format!("stdio-fds: {e}"));
        }
    } else {
        kept_stdio = (None, None, None);
    }
    let _ = write!(report, "ok {pid}");
    drop(report);

    // A terminal is the container's output and, for attach clients, its input.
    if let Some(m) = &master {
        set_nonblocking(m);
        stdin_w = m.try_clone().ok();
    }
    if let Some(w) = &stdin_w {
        set_nonblocking(w);
    }
    let out_r = match master.as_ref().map(|m| m.try_clone()) {
        Some(Ok(m)) => m,
        _ => out_r,
    };
    let mut streams = [Stream::new("stdout", out_r), Stream::new("stderr", err_r)];
    let mut exit: Option<(i32, Option<i32>, Instant, String)> = None;
    let mut clients: Vec<Attached> = Vec::new();
    let mut stdin_pending: Vec<u8> = Vec::new();
    let mut rewait_at: Option<Instant> = None;
    let mut rewait = Duration::from_millis(5);
    loop {
        if let Some((_, _, at, _)) = &exit {
            if streams.iter().all(|s| s.closed) || at.elapsed() >= DRAIN_AFTER_EXIT {
                break;
            }
        }
        let mut pfds: Vec<libc::pollfd> = streams
            .iter()
            .map(|s| libc::pollfd {
                fd: if s.closed { -1 } else { s.fd.as_raw_fd() },
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        pfds.push(libc::pollfd {
            fd: sigfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        // 3: attach listener, 4: container stdin (when input is pending), 5..: clients.
        pfds.push(libc::pollfd {
            fd: listener.as_ref().map_or(-1, |l| l.as_raw_fd()),
            events: libc::POLLIN,
            revents: 0,
        });
        pfds.push(libc::pollfd {
            fd: match &stdin_w {
                Some(w) if !stdin_pending.is_empty() => w.as_raw_fd(),
                _ => -1,
            },
            events: libc::POLLOUT,
            revents: 0,
        });
        for c in &clients {
            pfds.push(libc::pollfd {
                fd: c.sock.as_raw_fd(),
                events: libc::POLLIN | if c.out.is_empty() { 0 } else { libc::POLLOUT },
                revents: 0,
            });
        }
        let timeout = match (&exit, rewait_at) {
            (Some(_), _) => 100,
            (None, Some(t)) => t.saturating_duration_since(Instant::now()).as_millis() as i32 + 1,
            (None, None) => -1,
        };
        // SAFETY: pfds is a valid array of pollfd for the duration of the call.
        let r = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout) };
        if r < 0 {
            continue; // EINTR
        }
        for (i, s) in streams.iter_mut().enumerate() {
            if pfds[i].revents != 0 {
                s.read_into(&mut log, !clients.is_empty());
                serve(&mut clients, i, s);
            }
        }
        if pfds[3].revents != 0 {
            if let Some(l) = &listener {
                while let Ok((sock, _)) = l.accept() {
                    let _ = sock.set_nonblocking(true);
                    clients.push(Attached {
                        sock,
                        inbuf: Vec::new(),
                        out: Vec::new(),
                        owns_stdin: false,
                        gone: false,
                    });
                }
            }
        }
        let mut owner_present = clients.iter().any(|c| c.owns_stdin && !c.gone);
        for (k, c) in clients.iter_mut().enumerate() {
            let re = pfds.get(5 + k).map_or(0, |p| p.revents);
            if re & libc::POLLOUT != 0 {
                c.flush();
            }
            if re & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                for (kind, payload) in c.read_frames() {
                    match kind {
                        0 if stdin_w.is_some() && (c.owns_stdin || !owner_present) => {
                            c.owns_stdin = true;
                            owner_present = true;
                            if stdin_pending.len() + payload.len() <= MAX_STDIN_PENDING {
                                stdin_pending.extend_from_slice(&payload);
                            }
                        }
                        3 if args.stdin_mode == "once" && master.is_none() && c.owns_stdin => {
                            stdin_w = None
                        }
                        4 if payload.len() == 4 => {
                            if let Some(m) = &master {
                                set_winsize(
                                    m,
                                    u16::from_be_bytes([payload[0], payload[1]]),
                                    u16::from_be_bytes([payload[2], payload[3]]),
                                );
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        // stdin_once: the first client that wrote stdin going away closes it.
        if args.stdin_mode == "once" && clients.iter().any(|c| c.gone && c.owns_stdin) {
            stdin_w = None;
        }
        clients.retain(|c| !c.gone);
        match &stdin_w {
            Some(w) if !stdin_pending.is_empty() => {
                // SAFETY: writing from a buffer we own, of the given length.
                let n = unsafe {
                    libc::write(
                        w.as_raw_fd(),
                        stdin_pending.as_ptr().cast(),
                        stdin_pending.len(),
                    )
                };
                if n > 0 {
                    stdin_pending.drain(..n as usize);
                } else if n < 0
                    && std::io::Error::last_os_error().kind() != std::io::ErrorKind::WouldBlock
                {
                    stdin_w = None; // the container closed its stdin
                }
            }
            Some(_) => {}
            None => stdin_pending.clear(),
        }
        if pfds[2].revents != 0 {
            for sig in read_signals(&sigfd) {
                match sig {
                    libc::SIGCHLD => {
                        for (p, st) in reap_all() {
                            if exit.is_none() {
                                match exit_of(p, st, pid, &mut waiter, args) {
                                    Reaped::Exit(e) => exit = Some(e),
                                    Reaped::WaitAgain => rewait_at = Some(Instant::now() + rewait),
                                    Reaped::Other => {}
                                }
                            }
                        }
                    }
                    libc::SIGUSR1 => log.reopen(),
                    _ => {} // SIGTERM/SIGINT/SIGHUP: the monitor outlives them.
                }
            }
        }
        // A SIGCHLD can coalesce with one consumed earlier; reap opportunistically.
        if exit.is_none() {
            for (p, st) in reap_all() {
                if exit.is_none() {
                    match exit_of(p, st, pid, &mut waiter, args) {
                        Reaped::Exit(e) => exit = Some(e),
                        Reaped::WaitAgain => rewait_at = Some(Instant::now() + rewait),
                        Reaped::Other => {}
                    }
                }
            }
        }
        // The container is gone: let its pipes reach EOF once the runtime closes its copies.
        if exit.is_some() && kept_stdio.1.is_some() {
            kept_stdio = (None, None, None);
        }
        // Ask the runtime to wait again once the container may have started (backing off
        // from 5 ms to 500 ms while it stays created).
        if exit.is_none() && rewait_at.is_some_and(|t| Instant::now() >= t) {
            rewait_at = None;
            rewait = (rewait * 2).min(Duration::from_millis(500));
            match spawn_runtime_wait(args) {
                Ok(w) => waiter = Some(w),
                Err(_) => exit = Some((255, None, Instant::now(), timestamp())),
            }
        }
    }
    for (i, s) in streams.iter_mut().enumerate() {
        s.finish(&mut log, !clients.is_empty());
        serve(&mut clients, i, s);
    }
    // The log is complete: record the exit now, so a stop waiting for it does not also wait
    // for slow attach clients below.
    let (code, signal, _, at) = exit.expect("loop ends only after the exit");
    let sig = signal.map_or_else(|| "null".to_string(), |s| s.to_string());
    let line = format!("{{\"exit_code\":{code},\"signal\":{sig},\"exited_at\":\"{at}\"}}\n");
    let _ = write_atomic(&args.exit_file, line.as_bytes());
    // Give attached clients their last output, then close them (EOF = the container exited).
    for c in clients.iter_mut() {
        let _ = c.sock.set_nonblocking(false);
        let _ = c
            .sock
            .set_write_timeout(Some(std::time::Duration::from_secs(1)));
        c.flush();
    }
    drop(clients);
    if let Some(p) = &args.attach_socket {
        let _ = std::fs::remove_file(p);
    }
    reap_all();
    0
}

/// Is `pid` a child of ours (so its exit reaches our waitpid)?
fn is_our_child(pid: i32) -> bool {
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

/// `RUNTIME wait ID` as a child, its JSON answer on a pipe.
struct Waiter {
    child: std::process::Child,
}

/// `RUNTIME [runtime args] --root DIR <op> ID`, stdin and stderr on /dev/null.
fn runtime_op(args: &Args, op: &str) -> Command {
    let mut c = Command::new(&args.runtime);
    c.args(&args.runtime_args)
        .arg("--root")
        .arg(&args.runtime_root)
        .arg(op)
        .arg(&args.id)
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    c
}

fn spawn_runtime_wait(args: &Args) -> std::io::Result<Waiter> {
    let child = runtime_op(args, "wait").stdout(Stdio::piped()).spawn()?;
    Ok(Waiter { child })
}

/// What reaping `p` (with status `st`) means for the container.
enum Reaped {
    /// The container exited (its process, or the runtime's `wait` answered).
    Exit((i32, Option<i32>, Instant, String)),
    /// The runtime's `wait` gave up although the container is not stopped (runsc's `wait`
    /// refuses a created container, and one being started): ask again later.
    WaitAgain,
    Other,
}

fn exit_of(p: i32, st: i32, pid: i32, waiter: &mut Option<Waiter>, args: &Args) -> Reaped {
    match waiter {
        None if p == pid => Reaped::Exit(decode(st)),
        Some(w) if p == w.child.id() as i32 => {
            // `{"id":…,"exitStatus":N}`; N is 128+signal for a killed process.
            let mut out = String::new();
            if let Some(o) = w.child.stdout.as_mut() {
                let _ = o.take(4096).read_to_string(&mut out);
            }
            let code = out
                .split("\"exitStatus\":")
                .nth(1)
                .and_then(|r| {
                    r.trim_start()
                        .split(|c: char| !c.is_ascii_digit() && c != '-')
                        .next()
                })
                .and_then(|n| n.parse::<i32>().ok());
            match code {
                Some(code) => {
                    let signal = (code > 128 && code < 160).then_some(code - 128);
                    Reaped::Exit((code, signal, Instant::now(), timestamp()))
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
                None => Reaped::Exit((255, None, Instant::now(), timestamp())),
            }
        }
        _ => Reaped::Other,
    }
}

/// `RUNTIME state ID`'s `status`, if it answers.
fn runtime_status(args: &Args) -> Option<String> {
    let out = runtime_op(args, "state").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let rest = text.split("\"status\"").nth(1)?;
    let v = rest.split('"').nth(1)?;
    Some(v.to_string())
}

fn decode(status: i32) -> (i32, Option<i32>, Instant, String) {
    let now = timestamp();
    if libc::WIFSIGNALED(status) {
        let s = libc::WTERMSIG(status);
        (128 + s, Some(s), Instant::now(), now)
    } else {
        (libc::WEXITSTATUS(status), None, Instant::now(), now)
    }
}

/// New session, subreaper, cwd `/`, stdio on /dev/null (holding nothing of the daemon's).
fn detach() -> std::io::Result<()> {
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

/// Blocks the signals the monitor handles and returns a signalfd delivering them. Children
/// start with an empty mask (std resets it), so the container sees default dispositions.
fn signal_fd() -> std::io::Result<OwnedFd> {
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

fn read_signals(fd: &OwnedFd) -> Vec<i32> {
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
fn reap_all() -> Vec<(i32, i32)> {
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

fn set_nonblocking(fd: &OwnedFd) {
    // SAFETY: fcntl on an fd we own, with integer arguments.
    unsafe {
        let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
}

/// tmp + rename: a daemon that restarts sees the old content or the new, never a torn file.
/// Not fsynced: the monitor's pid and the container's exit mean nothing after a reboot (the
/// container is gone either way), and a fsync here would sit on every stop's path.
fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(data)?;
    }
    std::fs::rename(&tmp, path)
}

/// The CRI log file; write errors are dropped so a full disk never blocks the container.
struct LogFile {
    path: Option<PathBuf>,
    file: Option<File>,
}

impl LogFile {
    fn open(path: Option<PathBuf>) -> LogFile {
        let mut l = LogFile { path, file: None };
        l.reopen();
        l
    }

    fn reopen(&mut self) {
        self.file = self.path.as_ref().and_then(|p| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o640)
                .custom_flags(libc::O_CLOEXEC)
                .open(p)
                .ok()
        });
    }

    fn entry(&mut self, stream: &str, tag: char, content: &[u8]) {
        if let Some(f) = self.file.as_mut() {
            let mut line = Vec::with_capacity(content.len() + 48);
            line.extend_from_slice(timestamp().as_bytes());
            line.push(b' ');
            line.extend_from_slice(stream.as_bytes());
            line.push(b' ');
            line.push(tag as u8);
            line.push(b' ');
            line.extend_from_slice(content);
            line.push(b'\n');
            let _ = f.write_all(&line);
        }
    }
}

/// One output stream of the container with its pending partial line.
struct Stream {
    name: &'static str,
    fd: OwnedFd,
    buf: Vec<u8>,
    /// Bytes read since the attach clients were last served.
    fresh: Vec<u8>,
    closed: bool,
}

impl Stream {
    fn new(name: &'static str, fd: OwnedFd) -> Stream {
        Stream {
            name,
            fd,
            buf: Vec::new(),
            fresh: Vec::new(),
            closed: false,
        }
    }

    /// Reads what is there into the log; `tee`: also keep it for the attach clients.
    fn read_into(&mut self, log: &mut LogFile, tee: bool) {
        let mut chunk = [0u8; 8192];
        loop {
            // SAFETY: reading into an owned stack buffer of the given length.
            let n =
                unsafe { libc::read(self.fd.as_raw_fd(), chunk.as_mut_ptr().cast(), chunk.len()) };
            if n == 0 {
                self.closed = true;
                return;
            }
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::WouldBlock
                    && e.kind() != std::io::ErrorKind::Interrupted
                {
                    self.closed = true;
                }
                return;
            }
            self.buf.extend_from_slice(&chunk[..n as usize]);
            if tee {
                self.fresh.extend_from_slice(&chunk[..n as usize]);
            }
            for (tag, content) in split_entries(&mut self.buf) {
                log.entry(self.name, tag, &content);
            }
        }
    }

    fn finish(&mut self, log: &mut LogFile, tee: bool) {
        if !self.closed {
            self.read_into(log, tee);
        }
        if !self.buf.is_empty() {
            let rest = std::mem::take(&mut self.buf);
            log.entry(self.name, 'F', &rest);
        }
    }
}

/// Queues what stream `i` read since the last call for every attach client.
fn serve(clients: &mut [Attached], i: usize, s: &mut Stream) {
    let fresh = std::mem::take(&mut s.fresh);
    if fresh.is_empty() {
        return;
    }
    for c in clients.iter_mut() {
        c.queue(i as u8 + 1, &fresh);
    }
}

/// Receives one fd sent with SCM_RIGHTS (the runtime's console socket protocol).
fn recv_fd(s: &std::os::unix::net::UnixStream) -> std::io::Result<OwnedFd> {
    let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(10)));
    let mut data = [0u8; 4096];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    let mut cbuf = [0u64; 8];
    // SAFETY: msghdr is plain data; zeroed is a valid initial value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    // SAFETY: msg points at buffers we own for the duration of the call.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: CMSG_* walk the control buffer the kernel filled, within msg_controllen.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let fd = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>());
                return Ok(OwnedFd::from_raw_fd(fd));
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Err(std::io::Error::other("no fd in the console message"))
}

fn set_winsize(fd: &OwnedFd, width: u16, height: u16) {
    let ws = libc::winsize {
        ws_row: height,
        ws_col: width,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from the pointer, valid for the call.
    unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
}

/// Most stdin bytes held for a container that does not read them.
const MAX_STDIN_PENDING: usize = 1 << 20;
/// Most output bytes queued for a slow attach client before it is dropped.
const MAX_CLIENT_QUEUE: usize = 4 << 20;

/// An attach client. Frames both ways are `kind (1 byte) | length (u32 BE) | payload`:
/// to the client 1 = stdout, 2 = stderr; from it 0 = stdin, 3 = close stdin, 4 = terminal
/// size (width, height as u16 BE).
struct Attached {
    sock: std::os::unix::net::UnixStream,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    /// This client writes the container's stdin: the first one to send input holds it until
    /// it goes away; input from the others is dropped.
    owns_stdin: bool,
    gone: bool,
}

impl Attached {
    fn queue(&mut self, kind: u8, data: &[u8]) {
        if self.gone || data.is_empty() {
            return;
        }
        if self.out.len() + data.len() > MAX_CLIENT_QUEUE {
            self.gone = true; // too slow: it would hold the container's output hostage
            return;
        }
        self.out.push(kind);
        self.out
            .extend_from_slice(&(data.len() as u32).to_be_bytes());
        self.out.extend_from_slice(data);
        self.flush();
    }

    fn flush(&mut self) {
        while !self.out.is_empty() {
            match (&self.sock).write(&self.out) {
                Ok(0) => {
                    self.gone = true;
                    return;
                }
                Ok(n) => {
                    self.out.drain(..n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.gone = true;
                    return;
                }
            }
        }
    }

    fn read_frames(&mut self) -> Vec<(u8, Vec<u8>)> {
        let mut chunk = [0u8; 8192];
        loop {
            match (&self.sock).read(&mut chunk) {
                Ok(0) => {
                    self.gone = true;
                    break;
                }
                Ok(n) => self.inbuf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    self.gone = true;
                    break;
                }
            }
        }
        let mut out = Vec::new();
        while self.inbuf.len() >= 5 {
            let len =
                u32::from_be_bytes([self.inbuf[1], self.inbuf[2], self.inbuf[3], self.inbuf[4]])
                    as usize;
            if len > 1 << 20 {
                self.gone = true;
                break;
            }
            if self.inbuf.len() < 5 + len {
                break;
            }
            out.push((self.inbuf[0], self.inbuf[5..5 + len].to_vec()));
            self.inbuf.drain(..5 + len);
        }
        out
    }
}

/// Takes the complete entries out of `buf`: full lines (`F`, without the newline) and, for a
/// line longer than [`MAX_LINE`], partial chunks (`P`). What remains is an unfinished line.
fn split_entries(buf: &mut Vec<u8>) -> Vec<(char, Vec<u8>)> {
    let mut out = Vec::new();
    let mut start = 0;
    loop {
        let rest = &buf[start..];
        match rest.iter().position(|&b| b == b'\n') {
            Some(nl) if nl <= MAX_LINE => {
                out.push(('F', rest[..nl].to_vec()));
                start += nl + 1;
            }
            _ if rest.len() >= MAX_LINE => {
                out.push(('P', rest[..MAX_LINE].to_vec()));
                start += MAX_LINE;
            }
            _ => break,
        }
    }
    buf.drain(..start);
    out
}

/// The `msg` of the last error-level line of the runtime's json log.
fn last_log_error(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut last_line = None;
    for line in text.lines().rev() {
        if line.trim().is_empty() {
            continue;
        }
        last_line.get_or_insert(line);
        if line.contains("\"level\":\"error\"") || line.contains("\"level\":\"fatal\"") {
            return json_string_field(line, "msg");
        }
    }
    last_line.map(|l| json_string_field(l, "msg").unwrap_or_else(|| l.to_string()))
}

/// Extracts and unescapes a string field from a one-line JSON object (no serde here).
fn json_string_field(line: &str, key: &str) -> Option<String> {
    let pat = format!("\"{key}\":\"");
    let start = line.find(&pat)? + pat.len();
    let mut out = String::new();
    let mut chars = line[start..].chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(out),
            '\\' => match chars.next()? {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'r' => out.push('\r'),
                'u' => {
                    let hex: String = chars.by_ref().take(4).collect();
                    out.push(
                        u32::from_str_radix(&hex, 16)
                            .ok()
                            .and_then(char::from_u32)
                            .unwrap_or('?'),
                    );
                }
                other => out.push(other),
            },
            c => out.push(c),
        }
    }
    None
}

/// Now as RFC 3339 with nanoseconds in UTC, e.g. `2026-11-23T04:05:06.123456789Z`.
fn timestamp() -> String {
    // SAFETY: clock_gettime fills the timespec we own.
    let ts = unsafe {
        let mut ts: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts);
        ts
    };
    format_rfc3339_nano(ts.tv_sec, ts.tv_nsec as u32)
}

fn format_rfc3339_nano(secs: i64, nanos: u32) -> String {
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{nanos:09}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(format_rfc3339_nano(0, 0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(
            format_rfc3339_nano(951_782_400, 5),
            "2000-02-29T00:00:00.000000005Z"
        );
        assert_eq!(
            format_rfc3339_nano(1_709_251_199, 999_999_999),
            "2024-02-29T23:59:59.999999999Z"
        );
        assert_eq!(
            format_rfc3339_nano(4_102_444_800, 0),
            "2100-01-01T00:00:00.000000000Z"
        );
    }

    #[test]
    fn splits_lines_and_partials() {
        let mut b = b"one\ntwo\nthr".to_vec();
        let e = split_entries(&mut b);
        assert_eq!(e, vec![('F', b"one".to_vec()), ('F', b"two".to_vec())]);
        assert_eq!(b, b"thr");
        let mut long = vec![b'x'; MAX_LINE + 10];
        long.push(b'\n');
        let e = split_entries(&mut long);
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].0, 'P');
        assert_eq!(e[0].1.len(), MAX_LINE);
        assert_eq!(e[1], ('F', vec![b'x'; 10]));
        assert!(long.is_empty());
    }

    #[test]
    fn json_msg() {
        let l = r#"{"level":"error","msg":"a \"quoted\" thing\nline2 \u00e9","time":"t"}"#;
        assert_eq!(
            json_string_field(l, "msg").unwrap(),
            "a \"quoted\" thing\nline2 é"
        );
        assert_eq!(json_string_field("{}", "msg"), None);
    }
}
