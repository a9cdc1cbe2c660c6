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
