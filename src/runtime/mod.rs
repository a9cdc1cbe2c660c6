//! The runtime's state and its parts, and the lookups every verb shares. The verbs live in
//! their own modules (`sandbox/`, `container/`, the image and event verbs here, `usage`,
//! `health`, `audit`) and take the runtime from here; the crate root's facade forwards to
//! them.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::cni::{self, Cni};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::host::Host;
use crate::model::container::ContainerRecord;
use crate::model::sandbox::SandboxRecord;
use crate::oci::OciRuntime;
use crate::state::{self, lock, short_hash};
use crate::{cdi, cgroups, events, image, metrics, nri, probe, process};

mod event_verbs;
mod image_verbs;
mod probe_verbs;

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
    /// The cgroup parent is the per-root default the daemon named itself (none configured).
    pub(crate) own_cgroup_parent: bool,
    /// Records found unreadable at start-up (left alone until removed explicitly).
    pub(crate) quarantine: Mutex<state::Quarantine>,
    /// ExecSync calls running, per container and in all (`exec_sync_max*`).
    pub(crate) exec_slots: process::ExecSlots,
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
    /// Containers' cgroup usage files, kept open between stats calls.
    pub(crate) cgroup_files: cgroups::UsageCache,
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
    /// Set once the start-up sweep is done ([`Runtime::sweep_left_over`]); the audit waits
    /// for it, so that it does not report what the sweep is about to remove.
    pub(crate) start_up_swept: state::Latch,
}
/// The outcome of one pull, shared by everyone who asked for it while it ran.
pub(crate) struct PullCell {
    result: std::sync::OnceLock<std::result::Result<image::ImageRecord, Error>>,
    /// Everyone waiting for this pull; when every one has gone, the pull is abandoned.
    callers: Mutex<Vec<image::PullCaller>>,
}

impl Drop for Runtime {
    /// A library user's runtime (a benchmark's, a harness's) going away: the cgroup parent it
    /// named itself goes too where empty (its start-up probe's trial made it), as at a
    /// daemon's clean shutdown.
    fn drop(&mut self) {
        self.release_cgroup_parent();
    }
}

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

    /// The NRI plugins connected now, in the order they are called.
    pub fn nri_plugins(&self) -> Vec<nri::PluginInfo> {
        self.nri.plugins()
    }

    /// A pod's cgroup as the daemon names it: a path (cgroupfs) or a slice (systemd; its
    /// directory is `cgroups::systemd::fs_path` of it).
    pub fn pod_cgroup(&self, sandbox_id: &str) -> Result<String> {
        Ok(self.sandbox_record(sandbox_id)?.pod_cgroup(&self.cfg))
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

    /// The record as it stands (no refresh).
    pub fn container_record(&self, id: &str) -> Result<ContainerRecord> {
        let e = self.container_entry(id)?;
        let r = lock(&e.record).clone();
        Ok(r)
    }

    /// CPU and memory use of a whole pod (its cgroup, which holds every container's).
    pub fn pod_usage(&self, id: &str) -> Result<cgroups::Usage> {
        let r = self.sandbox_record(id)?;
        Ok(cgroups::usage(&r.pod_cgroup(&self.cfg)))
    }

    /// CPU and memory use of a container, from its cgroup.
    pub fn container_usage(&self, id: &str) -> Result<cgroups::Usage> {
        Ok(self.cgroup_files.usage(&self.container_record(id)?.cgroup))
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
