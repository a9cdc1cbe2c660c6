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
#[doc(hidden)]
pub mod sandbox;
#[doc(hidden)]
pub mod state;
#[doc(hidden)]
pub mod sysctl;
#[doc(hidden)]
pub mod untrusted_fs;
mod userns;
#[doc(hidden)]
pub mod validate;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

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

use crate::cni::Cni;
use crate::host::Host;
use crate::oci::OciRuntime;

/// One sandbox in memory (see [`state::Entry`]).
pub(crate) type SandboxEntry = state::Entry<SandboxRecord>;
/// One container in memory. Lock order: a sandbox's `op` before any of its containers' `op`.
pub(crate) type ContainerEntry = state::Entry<ContainerRecord>;
pub(crate) type Registry = state::Registry<SandboxRecord, ContainerRecord>;

/// The sandbox runtime: all state lives under `config.root` and is restored by [`Runtime::new`].
pub struct Runtime {
    pub(crate) cfg: Config,
    pub(crate) registry: Mutex<Registry>,
    pub(crate) cni: Cni,
    pub(crate) runtimes: HashMap<String, OciRuntime>,
    /// Images for application containers (`<root>/images`).
    pub(crate) images: image::ImageStore,
    /// Pulls in flight, by reference: concurrent pulls of one image share one download.
    pub(crate) pulls: Mutex<HashMap<String, Arc<PullCell>>>,
    /// Pulls that may run at once (`[images] max_concurrent_pulls`).
    pub(crate) pull_slots: tokio::sync::Semaphore,
    /// The shared read-only infra rootfs (present when a pause binary was found).
    pub(crate) infra_rootfs: Option<PathBuf>,
    /// Short tag of the state root, part of every namespace file name, so several daemons
    /// sharing a netns dir never collect each other's files.
    pub(crate) root_tag: String,
    /// Records found unreadable at start-up (left alone until removed explicitly).
    pub(crate) quarantine: Mutex<state::Quarantine>,
    /// ExecSync calls running, per container and in all (`exec_sync_max*`).
    pub(crate) exec_slots: container::exec::ExecSlots,
    /// ExecSync output kept by all calls at once (`exec_sync_output_budget`).
    pub(crate) exec_output: Arc<process::OutputBudget>,
    /// Lifecycle events for GetContainerEvents subscribers.
    pub(crate) events: Arc<events::Hub>,
    /// Learns container exits as the monitors record them (see [`Runtime::watch_exits`]).
    pub(crate) exit_watch: events::watch::ExitWatcher,
    /// The daemon's own operation metrics (served with `--metrics-address`).
    pub(crate) metrics: Arc<metrics::prom::DaemonMetrics>,
    /// Containers' writable-layer use, measured at most every few seconds.
    pub(crate) fs_usage: metrics::FsUsageCache,
    /// What the host probe found (`probe`): the handlers' trials, user namespaces.
    pub(crate) probe: probe::Probe,
    /// The host operations the pod lifecycle orders (`host/`): the real host, or a
    /// recording fake in the unit tests.
    pub(crate) host: Arc<dyn Host>,
    /// Who manages the pods' cgroups (the config's `cgroup_driver`, resolved at start).
    pub(crate) cgroup_driver: cgroups::Driver,
    /// The node's CDI devices.
    pub(crate) cdi: cdi::Registry,
    /// NRI plugins: their socket, their hooks in the verbs (see `nri/`).
    pub(crate) nri: nri::Nri,
}

/// The outcome of one pull, shared by everyone who asked for it while it ran.
pub(crate) struct PullCell {
    result: std::sync::OnceLock<std::result::Result<image::ImageRecord, Error>>,
    /// Everyone waiting for this pull; when every one has gone, the pull is abandoned.
    callers: Mutex<Vec<image::PullCaller>>,
}

pub(crate) use state::lock;

/// A list re-checks a container the exit watcher covers only when the watcher's own sweep
/// (every [`events::watch::SWEEP`]) has not for this long.
const LIST_RECHECK_MS: u64 = 15_000;

impl Runtime {
    /// The configuration the runtime was opened with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The cgroup driver in use (RuntimeConfig reports it to kubelet).
    pub fn cgroup_driver(&self) -> cgroups::Driver {
        self.cgroup_driver
    }

    /// The CDI devices containers can ask for (qualified name → spec file), and the spec
    /// files that could not be used (file → why).
    pub fn cdi_devices(&self) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
        self.cdi.listing()
    }

    /// Starts NRI (`[nri]`): the pre-installed plugins and the socket external ones connect
    /// to. The daemon calls it at start; a library user that wants plugins calls it once.
    pub fn start_nri(self: &Arc<Self>) -> Result<()> {
        self.nri.start(Arc::new(nri::Domain(Arc::downgrade(self))))
    }

    /// The NRI plugins connected now, in the order they are called.
    pub fn nri_plugins(&self) -> Vec<nri::PluginInfo> {
        self.nri.plugins()
    }

    /// A pod's cgroup as the daemon names it: a path (cgroupfs) or a slice (systemd; its
    /// directory is `cgroups::systemd::fs_path` of it).
    pub fn pod_cgroup(&self, sandbox_id: &str) -> Result<String> {
        Ok(self.sandbox_record(sandbox_id)?.pod_cgroup(&self.cfg))
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
        if let Some(entry) = self.lookup(id)? {
            let full = lock(&entry.record).id.clone();
            if self.nri.hides(&full) {
                return Err(Error::NotFound {
                    kind: "sandbox",
                    id: id.to_string(),
                });
            }
            sandbox::infra::check_unwatched(self, &entry);
            return Ok(lock(&entry.record).status());
        }
        let q = lock(&self.quarantine).sandboxes.clone();
        match state::Quarantine::find(&q, id) {
            Some(full) => Ok(self.quarantined_status(&full, &q[&full])),
            None => Err(Error::NotFound {
                kind: "sandbox",
                id: id.to_string(),
            }),
        }
    }

    /// ListPodSandbox, oldest first.
    pub fn list_pod_sandboxes(&self, filter: &SandboxFilter) -> Vec<SandboxStatus> {
        let entries: Vec<_> = lock(&self.registry).sandboxes.values().cloned().collect();
        let mut out: Vec<SandboxStatus> = entries
            .iter()
            .map(|e| lock(&e.record).clone())
            .filter(|r| filter.matches(r) && !self.nri.hides(&r.id))
            .map(|r| r.status())
            .collect();
        // Quarantined pods too, NotReady with what is known, so that kubelet's garbage
        // collector removes them (RemovePodSandbox finishes their teardown).
        let quarantined = lock(&self.quarantine).sandboxes.clone();
        out.extend(
            quarantined
                .iter()
                .filter(|(id, _)| {
                    filter
                        .id_prefix
                        .as_ref()
                        .is_none_or(|p| id.starts_with(p.as_str()))
                        && filter.state.is_none_or(|s| s == SandboxState::NotReady)
                        && filter.labels.is_empty()
                })
                .map(|(id, why)| self.quarantined_status(id, why)),
        );
        out.sort_by_key(|s| (s.created_at, s.id.clone()));
        out
    }

    /// What is known of a quarantined sandbox (its record unreadable): NotReady, the pod's
    /// name, namespace and uid from its CNI attachment (kept apart from the record), created
    /// when its dir was, and why in the annotation `io.sandboxd.quarantined`.
    fn quarantined_status(&self, id: &str, why: &str) -> SandboxStatus {
        let att = self.cni.load_cache(id).map(|c| c.attachment);
        let created_at = std::fs::metadata(self.cfg.root.join("sandboxes").join(id))
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as i64);
        SandboxStatus {
            id: id.to_string(),
            metadata: PodSandboxMetadata {
                name: att.as_ref().map(|a| a.pod_name.clone()).unwrap_or_default(),
                namespace: att
                    .as_ref()
                    .map(|a| a.pod_namespace.clone())
                    .unwrap_or_default(),
                uid: att.as_ref().map(|a| a.pod_uid.clone()).unwrap_or_default(),
                attempt: 0,
            },
            state: SandboxState::NotReady,
            created_at,
            ips: Vec::new(),
            netns_path: None,
            namespace_options: Default::default(),
            labels: Default::default(),
            annotations: [("io.sandboxd.quarantined".to_string(), why.to_string())].into(),
            runtime_handler: String::new(),
            infra_mode: sandbox::InfraMode::Pinned,
            infra_pid: None,
            network_error: None,
            user_namespace: None,
        }
    }

    /// Records found unreadable at start-up, one line each (`sandbox <id>: <why>`): nothing
    /// they may name is collected until RemovePodSandbox / RemoveContainer of that id.
    pub fn quarantined(&self) -> Vec<String> {
        lock(&self.quarantine).describe()
    }

    /// The full record (for verbose status and tests).
    pub fn sandbox_record(&self, id: &str) -> Result<SandboxRecord> {
        let entry = self.lookup(id)?.ok_or_else(|| Error::NotFound {
            kind: "sandbox",
            id: id.to_string(),
        })?;
        let r = lock(&entry.record).clone();
        Ok(r)
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
        let e = self.container_entry(id)?;
        if self.nri.hides(&lock(&e.record).id) {
            return Err(Error::NotFound {
                kind: "container",
                id: id.to_string(),
            });
        }
        Ok(container::status::refresh(self, &e))
    }

    /// The record as it stands (no refresh).
    pub fn container_record(&self, id: &str) -> Result<ContainerRecord> {
        let e = self.container_entry(id)?;
        let r = lock(&e.record).clone();
        Ok(r)
    }

    /// ListContainers, oldest first.
    pub fn list_containers(&self, filter: &ContainerFilter) -> Vec<ContainerRecord> {
        let entries: Vec<_> = lock(&self.registry).containers.values().cloned().collect();
        let mut out: Vec<ContainerRecord> = entries
            .iter()
            .map(|e| container::status::refresh_within(self, e, LIST_RECHECK_MS))
            .filter(|r| filter.matches(r) && !self.nri.hides(&r.id))
            .collect();
        out.sort_by_key(|r| (r.created_at, r.id.clone()));
        out
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

    /// New resources for a container as an NRI plugin asks on its own: applied without
    /// asking the plugins again.
    pub(crate) fn apply_container_resources(
        &self,
        id: &str,
        resources: &container::Resources,
    ) -> Result<()> {
        container::update::apply_resources(self, id, resources)
    }

    /// CPU and memory use of a whole pod (its cgroup, which holds every container's).
    pub fn pod_usage(&self, id: &str) -> Result<cgroups::Usage> {
        let r = self.sandbox_record(id)?;
        Ok(cgroups::usage(&r.pod_cgroup(&self.cfg)))
    }

    /// CPU and memory use of a container, from its cgroup.
    pub fn container_usage(&self, id: &str) -> Result<cgroups::Usage> {
        Ok(cgroups::usage(&self.container_record(id)?.cgroup))
    }

    pub(crate) fn find_container(&self, id: &str) -> Result<Option<Arc<ContainerEntry>>> {
        let reg = lock(&self.registry);
        let Some(full) = reg.container_ids.resolve(id)? else {
            return Ok(None);
        };
        Ok(reg.containers.get(&full).cloned())
    }

    pub(crate) fn container_entry(&self, id: &str) -> Result<Arc<ContainerEntry>> {
        self.find_container(id)?.ok_or_else(|| Error::NotFound {
            kind: "container",
            id: id.to_string(),
        })
    }

    /// The containers of one sandbox.
    pub(crate) fn containers_of(&self, sandbox_id: &str) -> Vec<Arc<ContainerEntry>> {
        lock(&self.registry)
            .containers
            .values()
            .filter(|e| lock(&e.record).sandbox_id == sandbox_id)
            .cloned()
            .collect()
    }

    /// The CNI network a new sandbox would join: the first valid config file; the embedded
    /// default when the conf dir has no config file at all; an error when it has only
    /// invalid ones.
    pub fn network(&self) -> std::result::Result<cni::NetworkList, cni::CniError> {
        Ok(cni::load(&self.cfg.cni_conf_dir)?.unwrap_or_else(|| {
            cni::embedded_default(
                &self.cfg.default_network,
                &self.cfg.root.join("cni/networks"),
            )
        }))
    }

    /// Resolves an id or unique prefix to the registered entry.
    pub(crate) fn lookup(&self, id: &str) -> Result<Option<Arc<SandboxEntry>>> {
        let reg = lock(&self.registry);
        let Some(full) = reg.ids.resolve(id)? else {
            return Ok(None);
        };
        Ok(reg.sandboxes.get(&full).cloned())
    }

    pub(crate) fn handler(&self, name: &str) -> Result<&OciRuntime> {
        let name = if name.is_empty() {
            &self.cfg.default_runtime
        } else {
            name
        };
        self.runtimes.get(name).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "unknown runtime handler {name:?} (configured: {:?})",
                self.runtimes.keys().collect::<Vec<_>>()
            ))
        })
    }

    /// Namespace file name for a sandbox: `sandboxd-<root tag>-<id prefix>`.
    pub(crate) fn ns_name(&self, id: &str) -> String {
        format!("sandboxd-{}-{}", self.root_tag, &id[..16])
    }

    pub(crate) fn ns_prefix(&self) -> String {
        ns_file_prefix(&self.cfg.root)
    }
}

fn ns_file_prefix(root: &Path) -> String {
    format!("sandboxd-{}-", short_hash(&root.to_string_lossy()))
}

/// 8 hex chars of FNV-1a: a stable tag, not a security boundary.
pub(crate) fn short_hash(s: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("{h:08x}")
}
