//! Lowering the calling thread's CPU and I/O priority for background work (nice and I/O
//! priority are per thread on Linux; the threads and processes it starts inherit them).

// The scheduling calls are libc's: nothing else here is unsafe.
#![allow(unsafe_code)]

/// Background CPU and I/O: nice 19, and the idle I/O class (`idle_io`: served only when no
/// one else uses the disk) or the lowest best-effort level.
pub fn lower_this_thread(idle_io: bool) {
    // IOPRIO_CLASS_IDLE = 3, IOPRIO_CLASS_BE = 2 with level 7; the class is shifted by 13.
    let ioprio: libc::c_long = if idle_io { 3 << 13 } else { (2 << 13) | 7 };
    // SAFETY: gettid, setpriority and ioprio_set on this thread, with constant arguments.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 19);
        // IOPRIO_WHO_PROCESS = 1.
        libc::syscall(libc::SYS_ioprio_set, 1, tid, ioprio);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn lowers_only_the_calling_thread() {
        let nice = || {
            // SAFETY: getpriority of this thread.
            unsafe {
                libc::getpriority(
                    libc::PRIO_PROCESS,
                    libc::syscall(libc::SYS_gettid) as libc::id_t,
                )
            }
        };
        let before = nice();
        let inside = std::thread::spawn(move || {
            super::lower_this_thread(false);
            nice()
        })
        .join()
        .unwrap();
        assert_eq!(inside, 19);
        assert_eq!(nice(), before);
    }
}
