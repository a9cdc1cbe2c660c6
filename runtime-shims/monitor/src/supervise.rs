//! The detached monitor: it creates the container, reports to its launcher, then serves the
//! container until it has exited and its output is drained (one `poll(2)` loop over the
//! output pipes, the signalfd, the attach socket and its clients), and records the exit.

use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use sandboxd_shim_common::attach::{STDERR, STDOUT};
use sandboxd_shim_common::cli::MonitorArgs;
use sandboxd_shim_common::fd::set_nonblocking;
use sandboxd_shim_common::files::{write_atomic, Durability};

use crate::attach::Attach;
use crate::create::{create, Created};
use crate::cri_log::{LogFile, Stream};
use crate::detach::{detach, Report};
use crate::oom::{NotYet, OomWatch};
use crate::reaper::{read_signals, reap_all, signal_fd, Reaper};

/// How long to keep reading output after the container exited (a daemonised grandchild may
/// hold the pipes open forever).
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);

/// How long a container that is not in a cgroup of its own yet is looked for (every 50 ms).
const WATCH_LATER_FOR: Duration = Duration::from_secs(10);

/// The detached monitor. Returns the process exit code.
pub fn run(args: &MonitorArgs, mut report: Report) -> i32 {
    // Our pid is on record (our parent wrote it before letting us go): a daemon whose
    // `runtime create` times out kills us (we lead our own session and process group, the
    // runtime's too) by it.
    if let Err(e) = detach() {
        return report.fail(format!("detach: {e}"));
    }
    let sigfd = match signal_fd() {
        Ok(fd) => fd,
        Err(e) => return report.fail(format!("signalfd: {e}")),
    };
    let log = LogFile::open(args.log_path.clone());
    let created = match create(args) {
        Ok(c) => c,
        Err(msg) => return report.fail(msg),
    };
    // Watched before the launcher hears of the container: once it has, the container may be
    // started, hit its limit and be gone (its systemd scope with it) in a few milliseconds.
    let oom = OomWatch::open(created.pid);
    oom_watch_settled(args, &oom);
    report.ok(created.pid);
    serve(args, &sigfd, log, created, oom);
    reap_all();
    0
}

/// Tells StartContainer (by the `oom-watch` file beside the exit file) that OOM kills are
/// watched now, or never will be; nothing while the container is not in its cgroup yet.
fn oom_watch_settled(args: &MonitorArgs, oom: &Result<OomWatch, NotYet>) {
    if oom.as_ref().err() == Some(&NotYet::Later) {
        return;
    }
    if let Some(dir) = args.exit_file.parent() {
        // Root's alone, like every file under the state root.
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(dir.join(sandboxd_shim_common::files::OOM_WATCH));
    }
}

/// ReopenContainerLog: reopens the log and answers the daemon's request (the token it left in
/// the bundle) with the result, so the RPC returns only once the new file exists.
fn reopen_log(args: &MonitorArgs, log: &mut LogFile) {
    use sandboxd_shim_common::files::{format_log_reopen, LOG_REOPEN_DONE, LOG_REOPEN_REQUEST};
    let result = log.reopen();
    let Some(dir) = args.exit_file.parent() else {
        return;
    };
    // Root's file in root's dir; a token is short: read at most 64 bytes, never through a link.
    let token = {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let mut buf = [0u8; 64];
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(dir.join(LOG_REOPEN_REQUEST))
            .and_then(|mut f| f.read(&mut buf))
            .map(|n| String::from_utf8_lossy(&buf[..n]).trim().to_string())
            .unwrap_or_default()
    };
    if token.is_empty() {
        return; // a bare SIGUSR1 (an older daemon): reopened, nobody waits for an answer
    }
    let _ = write_atomic(
        &dir.join(LOG_REOPEN_DONE),
        format_log_reopen(&token, &result).as_bytes(),
        Durability::Rename,
    );
}

/// Serves the container until it has exited and its output is drained, then records the
/// exit and closes the attach clients.
fn serve(
    args: &MonitorArgs,
    sigfd: &OwnedFd,
    mut log: LogFile,
    c: Created,
    mut oom: Result<OomWatch, NotYet>,
) {
    let Created {
        pid,
        stdout,
        stderr,
        mut stdin,
        master,
        attach,
        waiter,
        mut kept_stdio,
    } = c;
    // A terminal is the container's output and, for attach clients, its input.
    if let Some(m) = &master {
        set_nonblocking(m);
        stdin = m.try_clone().ok();
    }
    if let Some(w) = &stdin {
        set_nonblocking(w);
    }
    let stdout = match master.as_ref().map(|m| m.try_clone()) {
        Some(Ok(m)) => m,
        _ => stdout,
    };
    let mut streams = [Stream::new("stdout", stdout), Stream::new("stderr", stderr)];
    const KINDS: [u8; 2] = [STDOUT, STDERR];
    let mut attach = Attach::new(attach, stdin, args.stdin);
    let mut reaper = Reaper::new(pid, waiter);
    // Until when a container not yet in its own cgroup is looked for again.
    let watch_until = std::time::Instant::now() + WATCH_LATER_FOR;
    let mut read_at_exit = false;
    loop {
        if let Some(e) = reaper.exit() {
            if streams.iter().all(Stream::is_closed) || e.at.elapsed() >= DRAIN_AFTER_EXIT {
                break;
            }
        }
        // 0, 1: output, 2: signals, 3: the cgroup's memory.events (-1: none), 4: attach
        // listener, 5: container stdin (when input is pending), 6..: attach clients.
        let mut pfds: Vec<libc::pollfd> = streams
            .iter()
            .map(|s| libc::pollfd {
                fd: s.poll_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        pfds.push(libc::pollfd {
            fd: sigfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        pfds.push(libc::pollfd {
            fd: oom.as_ref().map_or(-1, OomWatch::fd),
            // A cgroup file signals a change of its values as priority data.
            events: libc::POLLPRI,
            revents: 0,
        });
        attach.poll_fds(&mut pfds);
        let mut timeout = reaper.poll_timeout();
        let watch_pending = oom.as_ref().err() == Some(&NotYet::Later);
        if watch_pending && reaper.exit().is_none() {
            timeout = if timeout < 0 { 50 } else { timeout.min(50) };
        }
        // SAFETY: pfds is a valid array of pollfd for the duration of the call.
        let r = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout) };
        if r < 0 {
            continue; // EINTR
        }
        for (i, s) in streams.iter_mut().enumerate() {
            if pfds[i].revents != 0 {
                s.read_into(&mut log, attach.has_clients());
                attach.serve(KINDS[i], &s.take_fresh());
            }
        }
        if pfds[3].revents != 0 {
            if let Ok(w) = &mut oom {
                w.refresh();
            }
        }
        if watch_pending && reaper.exit().is_none() {
            oom = match OomWatch::open(pid) {
                Err(NotYet::Later) if std::time::Instant::now() >= watch_until => {
                    Err(NotYet::Never)
                }
                o => o,
            };
            oom_watch_settled(args, &oom);
        }
        attach.handle(&pfds[4..], master.as_ref());
        if pfds[2].revents != 0 {
            for sig in read_signals(sigfd) {
                match sig {
                    libc::SIGCHLD => reaper.reap(args),
                    libc::SIGUSR1 => reopen_log(args, &mut log),
                    _ => {} // SIGTERM/SIGINT/SIGHUP: the monitor outlives them.
                }
            }
        }
        // A SIGCHLD can coalesce with one consumed earlier; reap opportunistically.
        if reaper.exit().is_none() {
            reaper.reap(args);
        }
        if reaper.exit().is_some() && !read_at_exit {
            // Its last process is gone, and with the systemd driver so is its scope soon:
            // read the counters now, not only when the output is drained.
            read_at_exit = true;
            if let Ok(w) = &mut oom {
                w.refresh();
            }
            // Let its pipes reach EOF once the runtime closes its copies.
            drop(kept_stdio.take());
        }
        reaper.rewait_if_due(args);
    }
    for (i, s) in streams.iter_mut().enumerate() {
        s.finish(&mut log, attach.has_clients());
        attach.serve(KINDS[i], &s.take_fresh());
    }
    // The log is complete: record the exit now, so a stop waiting for it does not also wait
    // for slow attach clients below.
    let mut exit = reaper.into_exit().expect("loop ends only after the exit");
    if let Ok(w) = &mut oom {
        let c = w.at_exit();
        exit.info.oom_kills = c.kills;
        exit.info.oom_at_limit = c.at_limit;
    }
    let _ = write_atomic(&args.exit_file, &exit.info.to_line(), Durability::Rename);
    attach.close(args.attach_socket.as_deref());
}
