//! The seam between the pod lifecycle and the host: every host operation whose order the
//! lifecycle decides (namespace pins and their removal, sysctls, CNI ADD/DEL and the durable
//! CNI cache, the pod's mounts, the infra container's runtime calls, the pod cgroup) is a
//! method of [`Host`]. `sandbox/` (run, stop, remove, restore) and the runtime's
//! start-up reach the host only through `rt.host`.
//!
//! [`RealHost`] delegates each method to the existing function, unchanged. The unit tests use
//! the recording fake in `fake.rs`, which logs every call in order and fails the calls it is
//! told to, so rollback order, the CNI DEL give-up policy and restore decisions are tested
//! without root in milliseconds (as youki's `Syscall` trait with its test double does).
//! Container lifecycle (`container/`) still calls the host directly: its ordering is tested
//! by the privileged integration tests only.
//!
//! What stays outside: reads and writes under the state root (records, the CNI cache reads
//! and removal, sandbox files), which are plain files the unit tests keep real in a temp dir.

#[cfg(test)]
pub(crate) mod fake;

use std::fs::File;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::cni::{Attachment, CacheEntry, Cni, CniError, NetworkList};
use crate::counters::{timed, Step};
use crate::error::HostError;
use crate::netns::{PinRequest, Pinning};
use crate::oci::{ContainerFiles, OciRuntime, RuntimeError, RuntimeState};
use crate::sysctl::Ns;

/// The host operations the pod lifecycle orders. One method per operation, named by what it
/// does to the host; the arguments are those of the function [`RealHost`] calls.
pub(crate) trait Host: Send + Sync {
    /// Makes each namespace dir a shared mount point (`mounts::make_shared_dirs`).
    fn make_shared_dirs(&self, dirs: &[PathBuf]) -> Result<(), HostError>;

    /// Starts pinning a pod's namespaces, the user-namespace path included
    /// (`netns::pin_in_background`).
    fn pin_namespaces(&self, req: &PinRequest) -> Result<Pinning, HostError>;

    /// Closes a pinned namespace; a missing file is success (`netns::remove`).
    fn remove_namespace(&self, path: &Path) -> Result<(), HostError>;

    /// Is `path` a pinned namespace (`netns::is_nsfs`)? A query: the fake does not log it.
    fn is_namespace(&self, path: &Path) -> bool;

    /// Writes namespaced sysctls inside the pinned namespaces (`netns::apply_sysctls`).
    fn apply_sysctls(
        &self,
        net: Option<&Path>,
        ipc: Option<&Path>,
        uts: Option<&Path>,
        sysctls: &[(String, String, Ns)],
    ) -> Result<(), HostError>;

    /// CNI ADD of every plugin in order; the final result (`Cni::add`).
    fn cni_add(&self, cni: &Cni, list: &NetworkList, att: &Attachment) -> Result<Value, CniError>;

    /// CNI DEL of every plugin in reverse order (`Cni::del`).
    fn cni_del(
        &self,
        cni: &Cni,
        list: &NetworkList,
        att: &Attachment,
        result: Option<&Value>,
    ) -> Result<(), CniError>;

    /// Keeps what DEL needs durably, apart from the record (`Cni::save_cache`).
    fn cni_save_cache(&self, cni: &Cni, id: &str, entry: &CacheEntry) -> Result<(), CniError>;

    /// Mounts the pod's shm tmpfs (`mounts::mount_shm`).
    fn mount_shm(&self, path: &Path, size: u64) -> Result<(), HostError>;

    /// Unmounts everything stacked at `path`; not mounted is success (`mounts::unmount_all`).
    fn unmount_all(&self, path: &Path) -> Result<(), HostError>;

    /// Mounts a private copy of `source` at `target`, idmapped with the user namespace
    /// `userns` if given (`mounts::mount_tree_copy`).
    fn mount_tree_copy(
        &self,
        source: &Path,
        target: &Path,
        readonly: bool,
        userns: Option<BorrowedFd<'_>>,
    ) -> Result<(), HostError>;

    /// Mounts a container's rootfs: `lower` (top first) under an overlay whose writable
    /// layer is `upper` (`mounts::mount_overlay`).
    fn mount_overlay(
        &self,
        lower: &[PathBuf],
        upper: &Path,
        work: &Path,
        target: &Path,
    ) -> Result<(), HostError>;

    /// Mounts a rootfs for a pod with its own user namespace: the layers idmapped to the
    /// pod's root under an overlay in `ovl` (`userns::mount_overlay`).
    fn mount_idmapped_overlay(
        &self,
        userns: &File,
        host_root: (u32, u32),
        lower: &[PathBuf],
        ovl: &Path,
        scratch: &Path,
        target: &Path,
    ) -> Result<(), HostError>;

    /// `runtime create` under a new monitor; the container's pid (`OciRuntime::create`).
    fn runtime_create(
        &self,
        runtime: &OciRuntime,
        id: &str,
        bundle: &Path,
        files: &ContainerFiles,
    ) -> Result<i32, RuntimeError>;

    /// Waits until the container's monitor watches its OOM kills (or knows it cannot);
    /// whether it does (`ContainerFiles::wait_oom_watch`). A wait: the fake does not log it.
    fn wait_oom_watch(&self, files: &ContainerFiles, limit: Duration) -> bool;

    /// `runtime start` (`OciRuntime::start`).
    fn runtime_start(&self, runtime: &OciRuntime, id: &str, log: &Path)
        -> Result<(), RuntimeError>;

    /// `runtime kill`; gone or stopped is success (`OciRuntime::kill`).
    fn runtime_kill(
        &self,
        runtime: &OciRuntime,
        id: &str,
        signal: &str,
        all: bool,
        log: &Path,
    ) -> Result<(), RuntimeError>;

    /// Waits for the monitor to record the exit, or the process to be gone
    /// (`ContainerFiles::wait_exit`).
    fn wait_exit(
        &self,
        files: &ContainerFiles,
        proc: &crate::process::ProcId,
        limit: Duration,
    ) -> Result<(), String>;

    /// `runtime delete --force`; unknown is success (`OciRuntime::delete`).
    fn runtime_delete(
        &self,
        runtime: &OciRuntime,
        id: &str,
        log: &Path,
    ) -> Result<(), RuntimeError>;

    /// `runtime state`; `None` if the runtime does not know the container
    /// (`OciRuntime::state`).
    fn runtime_state(
        &self,
        runtime: &OciRuntime,
        id: &str,
    ) -> Result<Option<RuntimeState>, RuntimeError>;

    /// Removes a cgroup in every hierarchy (`cgroups::remove`).
    fn remove_cgroup(&self, cgroup: &str) -> Result<(), HostError>;

    /// Sizes a pod's cgroup (`cgroups::set_limits`).
    fn set_cgroup_limits(
        &self,
        cgroup: &str,
        limits: &crate::cgroups::PodLimits,
    ) -> Result<(), HostError>;
}

/// The host itself: each method is the function it names, its wall time added to its step's
/// benchmark counter (`counters::Step`).
pub(crate) struct RealHost;

impl Host for RealHost {
    fn make_shared_dirs(&self, dirs: &[PathBuf]) -> Result<(), HostError> {
        timed(Step::Namespaces, || crate::mounts::make_shared_dirs(dirs))
    }

    fn pin_namespaces(&self, req: &PinRequest) -> Result<Pinning, HostError> {
        crate::netns::pin_in_background(req)
    }

    fn remove_namespace(&self, path: &Path) -> Result<(), HostError> {
        timed(Step::Namespaces, || crate::netns::remove(path))
    }

    fn is_namespace(&self, path: &Path) -> bool {
        crate::netns::is_nsfs(path)
    }

    fn apply_sysctls(
        &self,
        net: Option<&Path>,
        ipc: Option<&Path>,
        uts: Option<&Path>,
        sysctls: &[(String, String, Ns)],
    ) -> Result<(), HostError> {
        timed(Step::Sysctls, || {
            crate::netns::apply_sysctls(net, ipc, uts, sysctls)
        })
    }

    fn cni_add(&self, cni: &Cni, list: &NetworkList, att: &Attachment) -> Result<Value, CniError> {
        timed(Step::CniAdd, || cni.add(list, att))
    }

    fn cni_del(
        &self,
        cni: &Cni,
        list: &NetworkList,
        att: &Attachment,
        result: Option<&Value>,
    ) -> Result<(), CniError> {
        timed(Step::CniDel, || cni.del(list, att, result))
    }

    fn cni_save_cache(&self, cni: &Cni, id: &str, entry: &CacheEntry) -> Result<(), CniError> {
        timed(Step::CniCache, || cni.save_cache(id, entry))
    }

    fn mount_shm(&self, path: &Path, size: u64) -> Result<(), HostError> {
        timed(Step::Mounts, || crate::mounts::mount_shm(path, size))
    }

    fn unmount_all(&self, path: &Path) -> Result<(), HostError> {
        timed(Step::Mounts, || crate::mounts::unmount_all(path))
    }

    fn mount_tree_copy(
        &self,
        source: &Path,
        target: &Path,
        readonly: bool,
        userns: Option<BorrowedFd<'_>>,
    ) -> Result<(), HostError> {
        timed(Step::Mounts, || {
            crate::mounts::mount_tree_copy(source, target, readonly, userns)
        })
    }

    fn mount_overlay(
        &self,
        lower: &[PathBuf],
        upper: &Path,
        work: &Path,
        target: &Path,
    ) -> Result<(), HostError> {
        timed(Step::Mounts, || {
            crate::mounts::mount_overlay(lower, upper, work, target)
        })
    }

    fn mount_idmapped_overlay(
        &self,
        userns: &File,
        host_root: (u32, u32),
        lower: &[PathBuf],
        ovl: &Path,
        scratch: &Path,
        target: &Path,
    ) -> Result<(), HostError> {
        timed(Step::Mounts, || {
            crate::userns::mount_overlay(userns, host_root, lower, ovl, scratch, target)
        })
    }

    fn runtime_create(
        &self,
        runtime: &OciRuntime,
        id: &str,
        bundle: &Path,
        files: &ContainerFiles,
    ) -> Result<i32, RuntimeError> {
        timed(Step::RuntimeCreate, || runtime.create(id, bundle, files))
    }

    fn wait_oom_watch(&self, files: &ContainerFiles, limit: Duration) -> bool {
        timed(Step::RuntimeStart, || files.wait_oom_watch(limit))
    }

    fn runtime_start(
        &self,
        runtime: &OciRuntime,
        id: &str,
        log: &Path,
    ) -> Result<(), RuntimeError> {
        timed(Step::RuntimeStart, || runtime.start(id, log))
    }

    fn runtime_kill(
        &self,
        runtime: &OciRuntime,
        id: &str,
        signal: &str,
        all: bool,
        log: &Path,
    ) -> Result<(), RuntimeError> {
        timed(Step::RuntimeStop, || runtime.kill(id, signal, all, log))
    }

    fn wait_exit(
        &self,
        files: &ContainerFiles,
        proc: &crate::process::ProcId,
        limit: Duration,
    ) -> Result<(), String> {
        timed(Step::RuntimeStop, || files.wait_exit(proc, limit))
    }

    fn runtime_delete(
        &self,
        runtime: &OciRuntime,
        id: &str,
        log: &Path,
    ) -> Result<(), RuntimeError> {
        timed(Step::RuntimeDelete, || runtime.delete(id, log))
    }

    fn runtime_state(
        &self,
        runtime: &OciRuntime,
        id: &str,
    ) -> Result<Option<RuntimeState>, RuntimeError> {
        timed(Step::RuntimeState, || runtime.state(id))
    }

    fn remove_cgroup(&self, cgroup: &str) -> Result<(), HostError> {
        timed(Step::Cgroups, || crate::cgroups::remove(cgroup))
    }

    fn set_cgroup_limits(
        &self,
        cgroup: &str,
        limits: &crate::cgroups::PodLimits,
    ) -> Result<(), HostError> {
        timed(Step::Cgroups, || crate::cgroups::set_limits(cgroup, limits))
    }
}
