//! Pid files: the runtime's and the monitor's (read as the monitor writes them, through the
//! contract both share), and killing the process one names.

pub use sandboxd_shim_common::files::read_pid;

/// SIGKILLs the process whose pid a runtime wrote to `pid_file` (an exec'd command: killing
/// only the runtime or its helper would orphan it inside the container).
pub fn kill_pid_file(pid_file: &std::path::Path) {
    if let Some(pid) = read_pid(pid_file).filter(|p| *p > 1) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}
