//! `sandboxd-monitor exec …`: the non-detaching mode for exec sessions. It runs `RUNTIME
//! exec --detach` (a terminal handed to the console socket needs a detached exec), stays
//! subreaper so the exec'd process is reparented to it, reaps it and exits with its status
//! (128+signal when killed). The daemon waits for it like for any child.

use sandboxd_shim_common::cli::ExecArgs;
use sandboxd_shim_common::files::read_pid;
use sandboxd_shim_common::runtime::{command_unblocked, private_umask};

use crate::die;
use crate::reaper::decode;

/// Runs the exec of `argv` (the arguments after `exec`); never returns.
pub fn run(argv: Vec<String>) -> ! {
    let args = ExecArgs::parse(argv).unwrap_or_else(|e| die(&e));
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let mut c = command_unblocked(&args.runtime, &args.runtime_args, &args.runtime_root);
    // The files an exec makes (its pid file) are created root's alone (0600); the exec'd
    // process gets the umask its container's spec names.
    private_umask(&mut c);
    c.arg("exec")
        .arg("--detach")
        .arg("--pid-file")
        .arg(&args.pid_file);
    if let Some(sock) = &args.console_socket {
        // With `--process` the terminal is the file's `terminal: true` (runc ignores `--tty`
        // then; runsc's exec has no such flag and refuses it).
        if args.process_file.is_none() {
            c.arg("--tty");
        }
        c.arg("--console-socket").arg(sock);
    }
    if let Some(f) = &args.internal_pid_file {
        c.arg("--internal-pid-file").arg(f);
    }
    // The whole process (the container's user, capabilities, env, cwd) when given: runsc's
    // exec would otherwise run as root, whatever the container's user.
    match &args.process_file {
        Some(p) => c.arg("--process").arg(p).arg(&args.id),
        None => c.arg(&args.id).args(&args.cmd),
    };
    c.env_remove("NOTIFY_SOCKET");
    let status = c.status();
    if let Some(p) = &args.process_file {
        let _ = std::fs::remove_file(p);
    }
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => die(&format!("runtime exec failed: {s}")),
        Err(e) => die(&format!("runtime exec: {e}")),
    }
    let pid = read_pid(&args.pid_file).unwrap_or_else(|| die("runtime exec wrote no pid"));
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a pointer to a local status word.
        let p = unsafe { libc::waitpid(-1, &mut status, 0) };
        if p < 0 {
            // No children left: the process was not reparented to us (already gone).
            std::process::exit(255);
        }
        if p == pid {
            std::process::exit(decode(status).0);
        }
    }
}
