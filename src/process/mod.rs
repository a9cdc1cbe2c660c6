//! Running helper processes (CNI plugins, the OCI runtime, the monitor, exec'd commands) with
//! bounds on everything they can cost us: each runs in a process group of its own, is killed
//! as a whole group past its time limit, and has its stdout and stderr read concurrently into
//! buffers capped at a size (what is beyond the cap is read and dropped, so the child never
//! blocks on a full pipe and our memory stays bounded). A grandchild that keeps a pipe open
//! after the child exited cannot hold the call: output is read only for a short drain period
//! after the exit. Everything runs on the calling thread with `poll(2)`; no reader threads
//! are left behind.
//!
//! - `run`: one helper call under [`Limits`] ([`run()`], [`run_with`], [`run_with_stdio`]);
//! - `output`: capped output buffers and the [`OutputBudget`] shared between calls;
//! - `tree`: liveness (a zombie is not alive), `/proc` stat, killing a process tree;
//! - `pidfile`: pid files and killing the process one names;
//! - `spawn`: spawning with a umask and mount namespace without forking the daemon;
//! - `priority`: background work at the lowest CPU and I/O priority;

mod output;
mod pidfile;
pub mod priority;
mod run;
mod slots;
mod spawn;
mod tree;

pub use output::OutputBudget;
pub use pidfile::{kill_pid_file, read_pid};
pub use run::{
    exit_code, run, run_with, run_with_stdio, wait_until, Cancel, Limits, Output, RunError,
};
/// The pidfds the monitor uses too, from the contract they share.
pub use sandboxd_shim_common::fd::pidfd_open;
pub(crate) use slots::ExecSlots;
pub use spawn::{spawn, Within};
pub use tree::{
    alive, alive_as_written, boot_id, boot_time_nanos, group_members, kill_tree, proc_stat,
    start_time_nanos, wait_gone, wait_reaped, ProcId, ProcStat,
};

#[cfg(test)]
mod tests;
