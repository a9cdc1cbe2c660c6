//! sandboxd: a Kubernetes pod sandbox runtime. This crate is the library the daemon, the
//! tests and embedders call: [`Runtime`] runs, stops, removes and lists pod sandboxes with
//! persistent network namespaces, CNI, a pod shm and (only when needed) an infra process
//! run by an OCI runtime under a per-container monitor.
#![deny(unsafe_code)]
#![warn(missing_docs)]

// The embedder's API: the runtime, its configuration and errors, the request and record
// types, the image store, lifecycle events, the streaming server, and the CRI layer with the
// daemon's socket server (what `sandboxd` itself is built from).
pub mod api;
pub mod audit;
pub mod config;
pub mod cri;
pub mod error;
pub mod events;
pub mod health;
pub mod image;
pub mod model;
pub mod nri;
pub mod server;
pub mod signals;
pub mod streaming;
pub mod telemetry;

// Internals: public only for this crate's integration tests, benchmarks and fuzz targets —
// not an API, hidden from the docs, free to change.
#[doc(hidden)]
pub mod cdi;
#[doc(hidden)]
pub mod cgroups;
#[doc(hidden)]
pub mod cni;
#[doc(hidden)]
pub mod container;
#[doc(hidden)]
pub mod counters;
#[doc(hidden)]
pub mod failpoint;
#[doc(hidden)]
pub mod handlers;
mod host;
#[doc(hidden)]
pub mod lsm;
#[doc(hidden)]
pub mod metrics;
#[doc(hidden)]
pub mod mounts;
#[doc(hidden)]
pub mod netdev;
#[doc(hidden)]
pub mod netns;
#[doc(hidden)]
pub mod oci;
mod open;
#[doc(hidden)]
pub mod probe;
#[doc(hidden)]
pub mod process;
mod runtime;
#[doc(hidden)]
pub mod sandbox;
#[doc(hidden)]
pub mod state;
#[doc(hidden)]
pub mod sysctl;
#[doc(hidden)]
pub mod untrusted_fs;
mod usage;
mod userns;
#[doc(hidden)]
pub mod validate;

use std::sync::Arc;

pub use config::{Config, InfraPolicy, RuntimeHandler};
pub use container::{
    BindMount, ContainerConfig, ContainerFilter, ContainerMetadata, ContainerRecord,
    ContainerState, ExecResult,
};
pub use error::{Error, Result};
pub use health::{HandlerStatus, RuntimeHealth};
pub use sandbox::{
    DnsConfig, InfraMode, NamespaceMode, NamespaceOptions, PodSandboxConfig, PodSandboxMetadata,
    SandboxFilter, SandboxRecord, SandboxState, SandboxStatus,
};

pub use runtime::Runtime;

impl Runtime {
    /// Starts learning container exits as the monitors record them (one thread, which ends
    /// with the runtime), so STOPPED events go out at once. Without it, exits are folded in
    /// by the next query.
    pub fn watch_exits(self: &Arc<Self>) -> Result<()> {
        self.exit_watch
            .spawn(Arc::downgrade(self), |rt: &Runtime, id| {
                if sandbox::infra::on_watch_event(rt, id) {
                    return;
                }
                if let Ok(Some(e)) = rt.find_container(id) {
                    container::status::refresh(rt, &e);
                }
            })
            .map_err(|e| Error::Config(format!("cannot start the exit watcher: {e}")))
    }

    /// Starts NRI (`[nri]`): the pre-installed plugins and the socket external ones connect
    /// to. The daemon calls it at start; a library user that wants plugins calls it once.
    pub fn start_nri(self: &Arc<Self>) -> Result<()> {
        self.nri
            .start(Arc::new(container::nri::Domain::new(Arc::downgrade(self))))
    }

    /// At shutdown: removes the NRI socket (if it is still the one we bound) and the dirs
    /// made for it; a daemon that is gone leaves no socket plugins would connect to in vain.
    pub fn stop_nri(&self) {
        self.nri.stop_listening();
    }

    /// At a clean shutdown: the cgroup parent the daemon named itself (the per-root default,
    /// cgroupfs driver) is removed from each hierarchy where it is empty, so a short-lived
    /// daemon (critest's, a test's) leaves no dir behind; with pods left it stays.
    pub fn release_cgroup_parent(&self) {
        if self.own_cgroup_parent && self.cgroup_driver == cgroups::Driver::Cgroupfs {
            let _ = cgroups::remove(&self.cfg.cgroup_parent);
        }
    }

    /// RunPodSandbox: returns the new (or, for a retried request, the existing) sandbox id.
    pub fn run_pod_sandbox(&self, config: &PodSandboxConfig) -> Result<String> {
        sandbox::run::run(self, config)
    }

    /// StopPodSandbox: idempotent; an unknown id is success.
    pub fn stop_pod_sandbox(&self, id: &str) -> Result<()> {
        sandbox::stop::stop(self, id)
    }

    /// RemovePodSandbox: stops if needed, then removes everything; an unknown id is success.
    pub fn remove_pod_sandbox(&self, id: &str) -> Result<()> {
        sandbox::remove::remove(self, id)
    }

    /// PodSandboxStatus; an unknown id is `NotFound`.
    pub fn pod_sandbox_status(&self, id: &str) -> Result<SandboxStatus> {
        sandbox::status::status(self, id)
    }

    /// ListPodSandbox, oldest first.
    pub fn list_pod_sandboxes(&self, filter: &SandboxFilter) -> Vec<SandboxStatus> {
        sandbox::status::list(self, filter)
    }

    /// CreateContainer in a ready sandbox; returns the container id.
    pub fn create_container(&self, sandbox_id: &str, config: &ContainerConfig) -> Result<String> {
        container::create::create(self, sandbox_id, config)
    }

    /// StartContainer: only a created container can be started.
    pub fn start_container(&self, id: &str) -> Result<()> {
        container::start::start(self, id)
    }

    /// StopContainer: stop signal, `timeout`, SIGKILL; idempotent, an unknown id is success.
    pub fn stop_container(&self, id: &str, timeout: std::time::Duration) -> Result<()> {
        container::stop::stop(self, id, timeout)
    }

    /// RemoveContainer: force-stops and removes everything; an unknown id is success.
    pub fn remove_container(&self, id: &str) -> Result<()> {
        container::remove::remove(self, id)
    }

    /// ContainerStatus (with the exit folded in if the container has exited); an unknown id
    /// is `NotFound`.
    pub fn container_status(&self, id: &str) -> Result<ContainerRecord> {
        container::status::status(self, id)
    }

    /// The OCI spec a container was created with (its bundle's `config.json`), for verbose
    /// status; `None` when it cannot be read.
    pub fn container_runtime_spec(&self, r: &ContainerRecord) -> Option<serde_json::Value> {
        oci::spec::read_bundle(&r.dir).ok()
    }

    /// ListContainers, oldest first.
    pub fn list_containers(&self, filter: &ContainerFilter) -> Vec<ContainerRecord> {
        container::status::list(self, filter)
    }

    /// ExecSync: runs `cmd` in a running container; past `timeout` (zero = none) the
    /// command is killed and `DeadlineExceeded` returned.
    pub fn exec_sync(
        &self,
        id: &str,
        cmd: &[String],
        timeout: std::time::Duration,
    ) -> Result<ExecResult> {
        container::exec::exec_sync(self, id, cmd, timeout, None)
    }

    /// [`Runtime::exec_sync`] that ends (the command killed) as soon as `cancel` is raised —
    /// the gRPC layer raises it when the caller goes away.
    pub fn exec_sync_cancellable(
        &self,
        id: &str,
        cmd: &[String],
        timeout: std::time::Duration,
        cancel: std::sync::Arc<process::Cancel>,
    ) -> Result<ExecResult> {
        container::exec::exec_sync(self, id, cmd, timeout, Some(cancel))
    }

    /// CheckpointContainer: CRIU dumps running container `id` (which keeps running) into the
    /// archive `location`; `Unimplemented` where CRIU does not work on this host.
    pub fn checkpoint_container(&self, id: &str, location: &std::path::Path) -> Result<()> {
        container::checkpoint::checkpoint(self, id, location)
    }

    /// ReopenContainerLog: the monitor reopens the log file after a rotation.
    pub fn reopen_container_log(&self, id: &str) -> Result<()> {
        container::update::reopen_log(self, id)
    }

    /// UpdatePodSandboxResources (in-place pod resize): the pod's new resources and overhead,
    /// recorded; a pod cgroup the daemon made is resized (see `sandbox::update`).
    pub fn update_pod_sandbox_resources(
        &self,
        id: &str,
        overhead: Option<container::Resources>,
        resources: Option<container::Resources>,
    ) -> Result<()> {
        sandbox::update::update_resources(self, id, overhead, resources)
    }

    /// UpdateContainerResources: new CPU and memory limits for a created or running container.
    pub fn update_container_resources(
        &self,
        id: &str,
        resources: &container::Resources,
    ) -> Result<()> {
        container::update::update_resources(self, id, resources)
    }
}
