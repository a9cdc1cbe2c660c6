//! `sandboxd-pause`: the infra process. It runs as PID 1 of a pod's PID namespace inside a
//! rootfs that holds only this (static) binary. It sleeps, reaps every zombie handed to it,
//! and exits 0 promptly on SIGTERM or SIGINT. It keeps no state, so SIGKILL is always safe.

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

extern "C" fn on_child(_: libc::c_int) {}

fn install(sig: libc::c_int, handler: extern "C" fn(libc::c_int)) {
    // SAFETY: an all-zero sigaction is valid; we set a plain handler with an empty mask and
    // pass pointers that live for the duration of the call.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        sa.sa_flags = libc::SA_RESTART;
        libc::sigaction(sig, &sa, std::ptr::null_mut());
    }
}

fn reap() {
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a valid pointer to a local status word.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
    }
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--version") {
        println!("sandboxd-pause {}", env!("CARGO_PKG_VERSION"));
        return;
    }
    // Block the signals we wait for, then wait with sigsuspend, so none can slip in between
    // the check of STOP and going to sleep.
    // SAFETY: sigset_t values are initialised by sigemptyset before use; the pointers are
    // to locals that outlive the calls.
    let wait_mask = unsafe {
        let mut block: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGCHLD] {
            libc::sigaddset(&mut block, s);
        }
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigprocmask(libc::SIG_BLOCK, &block, &mut old);
        let mut wait: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut wait);
        wait
    };
    install(libc::SIGTERM, on_stop);
    install(libc::SIGINT, on_stop);
    install(libc::SIGCHLD, on_child);
    while !STOP.load(Ordering::SeqCst) {
        reap();
        // SAFETY: sigsuspend with a valid mask; it returns after a handler ran.
        unsafe { libc::sigsuspend(&wait_mask) };
    }
    reap();
}
