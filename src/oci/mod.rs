//! The OCI runtime driven by process calls (runc, crun, or any runtime with their CLI), with
//! every container created under a `sandboxd-monitor` so it outlives the daemon, and its pid
//! and exit status learned from files the monitor writes.

mod files;
mod mount_ns;
mod runtime;
pub mod spec;

pub use files::ContainerFiles;
pub use mount_ns::RuntimeMountNs;
pub use runtime::{OciRuntime, RuntimeError, RuntimeStats};
/// The exit file and `runtime state`, as the monitor and the daemon both read them.
pub use sandboxd_shim_common::{exit::ExitInfo, runtime::RuntimeState};
