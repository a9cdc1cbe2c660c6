//! `sandboxd-syscall-probe`: a static test helper the seccomp tests bind-mount into a
//! container. It tries syscalls that a seccomp profile decides on, each in a child process
//! of its own (so that what one does, such as entering a new namespace, cannot change the
//! next), and prints one line per probe: `name=ok` or `name=<ERRNO>`. Run it only inside a
//! container (`--in-container`): as root on a host, the probes that succeed act on the host.

use std::ffi::CString;

/// `Ok(())` or the errno of a raw syscall's result.
fn result(r: libc::c_long) -> Result<(), i32> {
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(())
    }
}

fn errno_name(e: i32) -> String {
    match e {
        libc::EPERM => "EPERM".into(),
        libc::ENOSYS => "ENOSYS".into(),
        libc::EINVAL => "EINVAL".into(),
        libc::EBADF => "EBADF".into(),
        libc::EACCES => "EACCES".into(),
        libc::ENOENT => "ENOENT".into(),
        libc::EFAULT => "EFAULT".into(),
        e => format!("errno{e}"),
    }
}

/// A clone-like call that returns 0 in a child: the child exits at once, the parent reaps it.
fn forked(r: libc::c_long) -> Result<(), i32> {
    if r == 0 {
        // SAFETY: in the child of a fork-like clone: leave without running anything else.
        unsafe { libc::_exit(0) };
    }
    let out = result(r);
    if r > 0 {
        let mut st = 0;
        // SAFETY: waitpid on our own child with a local status word.
        unsafe { libc::waitpid(r as libc::pid_t, &mut st, 0) };
    }
    out
}

/// Runs `f` in a forked child and returns what it returned (a probe that changes the
/// process, such as unshare, cannot affect the next one).
fn isolated(f: fn() -> Result<(), i32>) -> Result<(), i32> {
    // SAFETY: the probe is single-threaded; the child runs `f` and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let code = match f() {
            Ok(()) => 0,
            Err(e) => e.clamp(1, 254),
        };
        // SAFETY: leave the child without unwinding.
        unsafe { libc::_exit(code) };
    }
    let mut st = 0;
    // SAFETY: waitpid on our own child with a local status word.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    match libc::WEXITSTATUS(st) {
        0 => Ok(()),
        e => Err(e),
    }
}

fn clone_flags(flags: libc::c_long) -> Result<(), i32> {
    // SAFETY: a fork-like raw clone (no CLONE_VM, no new stack): the child gets a copy of
    // our address space and leaves at once in `forked`.
    forked(unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags | libc::SIGCHLD as libc::c_long,
            0,
            0,
            0,
            0,
        )
    })
}

#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
}

/// One probe: a syscall attempt, `Err(errno)` when refused.
type Probe = fn() -> Result<(), i32>;

fn main() {
    let probes: Vec<(&str, Probe)> = vec![
        ("getpid", || {
            // SAFETY: getpid has no arguments.
            result(unsafe { libc::syscall(libc::SYS_getpid) })
        }),
        ("clone_plain", || clone_flags(0)),
        ("clone_newuser", || {
            clone_flags(libc::CLONE_NEWUSER as libc::c_long)
        }),
        ("clone_newnet", || {
            clone_flags(libc::CLONE_NEWNET as libc::c_long)
        }),
        ("clone_newns", || {
            clone_flags(libc::CLONE_NEWNS as libc::c_long)
        }),
        ("clone3", || {
            let args = CloneArgs {
                exit_signal: libc::SIGCHLD as u64,
                ..Default::default()
            };
            // SAFETY: clone3 reads `size` bytes of a valid clone_args; fork-like (no stack).
            forked(unsafe {
                libc::syscall(
                    libc::SYS_clone3,
                    &args as *const CloneArgs,
                    std::mem::size_of::<CloneArgs>(),
                )
            })
        }),
        ("unshare_user", || {
            // SAFETY: unshare with integer flags, in an isolated child.
            result(unsafe { libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUSER) })
        }),
        ("unshare_uts", || {
            // SAFETY: unshare with integer flags, in an isolated child.
            result(unsafe { libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUTS) })
        }),
        ("setns", || {
            // SAFETY: setns on an invalid fd: EBADF if the call is let through.
            result(unsafe { libc::syscall(libc::SYS_setns, -1, 0) })
        }),
        ("keyctl", || {
            // SAFETY: KEYCTL_GET_KEYRING_ID (0) of the session keyring (-3), no pointers.
            result(unsafe { libc::syscall(libc::SYS_keyctl, 0, -3, 0) })
        }),
        ("add_key", || {
            let t = CString::new("user").unwrap();
            let d = CString::new("probe").unwrap();
            // SAFETY: valid C strings and a 1-byte payload; -3 is the session keyring.
            result(unsafe {
                libc::syscall(libc::SYS_add_key, t.as_ptr(), d.as_ptr(), d.as_ptr(), 1, -3)
            })
        }),
        ("personality_query", || {
            // SAFETY: 0xffffffff only queries the persona.
            result(unsafe { libc::syscall(libc::SYS_personality, 0xffff_ffffu64) })
        }),
        ("personality_set", || {
            // SAFETY: READ_IMPLIES_EXEC, in an isolated child.
            result(unsafe { libc::syscall(libc::SYS_personality, 0x0400000) })
        }),
        ("chroot", || {
            let root = CString::new("/").unwrap();
            // SAFETY: a valid C string, in an isolated child.
            result(unsafe { libc::syscall(libc::SYS_chroot, root.as_ptr()) })
        }),
    ];
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    // Some probes change the host if they succeed: run only where asked to, in a container.
    if args.first().map(String::as_str) != Some("--in-container") {
        eprintln!("usage: sandboxd-syscall-probe --in-container [PROBE…] (run it inside a container only)");
        std::process::exit(2);
    }
    args.remove(0);
    let only = args;
    for (name, f) in probes {
        if !only.is_empty() && !only.iter().any(|o| o == name) {
            continue;
        }
        let outcome = match isolated(f) {
            Ok(()) => "ok".to_string(),
            Err(e) => errno_name(e),
        };
        println!("{name}={outcome}");
    }
}
