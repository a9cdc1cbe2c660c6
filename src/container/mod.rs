//! Application containers: CreateContainer (`create.rs`: image rootfs on overlayfs, OCI spec
//! from the CRI config and the image config in `spec.rs`, runtime `create` under a monitor),
//! one file per verb (`start.rs`, `stop.rs`, `remove.rs`, `exec.rs`, `update.rs`,
//! `checkpoint.rs`), status refresh (`status.rs`), restore after a restart (`restore.rs`).
//! Each container's record lives in `<root>/containers/<id>/state.json`, next to its bundle,
//! the monitor's files and the rootfs mount point.

pub mod checkpoint;
pub(crate) mod create;
mod devices;
pub(crate) mod exec;
pub(crate) mod image_volume;
pub(crate) mod nri;
pub(crate) mod remove;
pub(crate) mod restore;
pub mod rootfs_diff;
pub mod spec;
pub(crate) mod start;
pub(crate) mod status;
pub(crate) mod stop;
pub(crate) mod update;

pub use exec::MAX_EXEC_OUTPUT;

pub use crate::model::container::*;

/// The container's init process as recorded: believed alive only while its pid still names
/// that process (`process::ProcId`).
pub(crate) fn init_proc(rec: &ContainerRecord) -> crate::process::ProcId {
    crate::process::ProcId {
        pid: rec.pid,
        start_ticks: rec.pid_start,
        boot_id: rec.boot_id.clone(),
        recorded_at: rec.created_at,
    }
}

/// A pod's infra process as recorded (as [`init_proc`]).
pub(crate) fn infra_proc(
    sb: &crate::model::sandbox::SandboxRecord,
    infra: &crate::model::sandbox::InfraRecord,
) -> crate::process::ProcId {
    crate::process::ProcId {
        pid: infra.pid,
        start_ticks: infra.pid_start,
        boot_id: infra.boot_id.clone(),
        recorded_at: sb.created_at,
    }
}
