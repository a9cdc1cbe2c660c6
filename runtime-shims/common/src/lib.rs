//! The contract between sandboxd and `sandboxd-monitor`, defined once for both sides.
//!
//! The daemon and the monitor are separate binaries (the monitor is built statically and
//! outlives the daemon), and they talk only through the monitor's command line and the files
//! and sockets it keeps in the container's dir. Everything both sides must agree on lives
//! here:
//!
//! - [`cli`]: the monitor's options ([`cli::MonitorArgs`], [`cli::ExecArgs`]): the daemon
//!   renders them with `to_args`, the monitor reads them with `parse`.
//! - [`exit`]: the exit file ([`exit::ExitInfo`]), written by the monitor, read by the daemon.
//! - [`files`]: atomic writes, pid files, the `stdio-fds` file.
//! - [`attach`]: the frames on the monitor's attach socket.
//! - [`fd`]: the small syscalls both use (pidfd, fd passing, terminal size, pipes).
//! - [`runtime`]: what both read from the OCI runtime (its JSON log, `state`, `wait`) and how
//!   both run it.
//! - [`time`]: the RFC 3339 timestamps of the CRI log and the exit file, written and read.
//!
//! Light on purpose: libc and serde only, so the monitor still builds as a small static
//! binary (`scripts/build-shims`).

pub mod attach;
pub mod cli;
pub mod exit;
pub mod fd;
pub mod files;
pub mod runtime;
pub mod time;
