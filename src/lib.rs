//! sandboxd: a Kubernetes pod sandbox runtime. This crate is the library the daemon, the
//! tests and embedders call: [`Runtime`] runs, stops, removes and lists pod sandboxes with
//! persistent network namespaces, CNI, a pod shm and (only when needed) an infra process
//! run by an OCI runtime under a per-container monitor.
#![deny(unsafe_code)]

pub mod cgroups;
pub mod cni;
pub mod config;
pub mod container;
pub mod cri;
pub mod error;
pub mod failpoint;
pub mod image;
pub mod mounts;
pub mod netns;
pub mod oci;
pub mod process;
pub mod sandbox;
pub mod server;
pub mod state;
pub mod streaming;
pub mod validate;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

pub use config::{Config, InfraPolicy, RuntimeHandler};
pub use container::{
    BindMount, ContainerConfig, ContainerFilter, ContainerMetadata, ContainerRecord,
    ContainerState, ExecResult,
};
pub use error::{Error, Result};
pub use sandbox::{
    DnsConfig, InfraMode, NamespaceMode, NamespaceOptions, PodSandboxConfig, PodSandboxMetadata,
    SandboxFilter, SandboxRecord, SandboxState, SandboxStatus,
};

use crate::cni::Cni;
use crate::oci::OciRuntime;
use crate::state::{IdIndex, NameReservations};

/// One sandbox in memory: `op` serialises its lifecycle operations (held across process
/// calls), `record` is the current record (held only for short reads and updates).
pub(crate) struct SandboxEntry {
    pub(crate) op: Mutex<()>,
    pub(crate) record: Mutex<SandboxRecord>,
}

/// One container in memory, locked like [`SandboxEntry`]. Lock order: a sandbox's `op`
/// before any of its containers' `op`.
pub(crate) struct ContainerEntry {
    pub(crate) op: Mutex<()>,
    pub(crate) record: Mutex<ContainerRecord>,
}

#[derive(Default)]
pub(crate) struct Registry {
    pub(crate) sandboxes: HashMap<String, Arc<SandboxEntry>>,
    pub(crate) containers: HashMap<String, Arc<ContainerEntry>>,
    /// Pod and container names share one reservation table (they cannot collide: a
    /// container name never starts with `k8s_POD_`).
    pub(crate) names: NameReservations,
    pub(crate) ids: IdIndex,
    pub(crate) container_ids: IdIndex,
}

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
    /// The shared read-only infra rootfs (present when a pause binary was found).
    pub(crate) infra_rootfs: Option<PathBuf>,
    /// Short tag of the state root, part of every namespace file name, so several daemons
    /// sharing a netns dir never collect each other's files.
    pub(crate) root_tag: String,
}

/// The outcome of one pull, shared by everyone who asked for it while it ran.
pub(crate) type PullCell = std::sync::OnceLock<std::result::Result<image::ImageRecord, String>>;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Runtime {
    /// Opens (or creates) the state root, prepares the namespace dirs and the infra rootfs,
    /// then restores every recorded sandbox: half-created ones are rolled back, the rest are
    /// registered again with their names; unreferenced leftovers are collected.
    pub fn new(cfg: Config) -> Result<Self> {
        let rt = Self::open(cfg)?;
        // Containers first: a sandbox rolled back on restore removes its containers, and
        // the collection of unreferenced runtime containers must know every container.
        container::restore::load(&rt)?;
        sandbox::restore::restore(&rt)?;
        container::restore::reconcile(&rt);
        Ok(rt)
    }

    fn open(cfg: Config) -> Result<Self> {
        check_root(&cfg.root)?;
        // Refuse an unusable pause binary before anything is created.
        let pause = Config::helper_path(&cfg.pause_path, "sandboxd-pause").filter(|p| p.is_file());
        if let Some(p) = &pause {
            if oci::spec::is_dynamic_elf(p)? {
                return Err(Error::Config(format!(
                    "{} is dynamically linked; the infra rootfs holds only this one file, so it \
                     must be static (build it with scripts/build-shims)",
                    p.display()
                )));
            }
        }
        for d in [
            "sandboxes",
            "containers",
            "images",
            "cni/cache",
            "cni/networks",
            "runtime",
        ] {
            let p = cfg.root.join(d);
            std::fs::create_dir_all(&p).map_err(|e| error::HostError::io("create", &p, e))?;
        }
        // Attach and console/exec sockets: ours alone.
        for d in ["attach", "exec"] {
            use std::os::unix::fs::DirBuilderExt;
            let p = cfg.root.join(d);
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&p)
                .map_err(|e| error::HostError::io("create", &p, e))?;
        }
        restrict_root(&cfg.root)?;
        for d in [&cfg.netns_dir, &cfg.ipcns_dir, &cfg.utsns_dir] {
            mounts::make_shared_dir(d)?;
        }
        let monitor = Config::helper_path(&cfg.monitor_path, "sandboxd-monitor");
        let mut runtimes = HashMap::new();
        for (name, h) in &cfg.runtimes {
            validate::name("runtime handler", name)?;
            runtimes.insert(
                name.clone(),
                OciRuntime {
                    name: name.clone(),
                    path: h.path.clone(),
                    root: h
                        .root
                        .clone()
                        .unwrap_or_else(|| cfg.root.join("runtime").join(name)),
                    monitor: monitor
                        .clone()
                        .unwrap_or_else(|| PathBuf::from("sandboxd-monitor")),
                    timeout: cfg.runtime_timeout,
                },
            );
        }
        if !runtimes.contains_key(&cfg.default_runtime) {
            return Err(Error::Config(format!(
                "default runtime {:?} is not among the configured handlers {:?}",
                cfg.default_runtime,
                runtimes.keys().collect::<Vec<_>>()
            )));
        }
        let infra_rootfs = match pause {
            Some(pause) => {
                let dir = cfg.root.join("infra-rootfs");
                oci::spec::prepare_infra_rootfs(&dir, &pause)?;
                Some(dir)
            }
            _ => None,
        };
        let cni = Cni {
            bin_dirs: cfg.cni_bin_dirs.clone(),
            timeout: cfg.cni_plugin_timeout,
            cache_dir: cfg.root.join("cni/cache"),
        };
        let root_tag = short_hash(&cfg.root.to_string_lossy());
        let images = image::ImageStore::new(cfg.root.join("images"))?;
        Ok(Runtime {
            cfg,
            registry: Mutex::new(Registry::default()),
            cni,
            runtimes,
            images,
            pulls: Mutex::new(HashMap::new()),
            infra_rootfs,
            root_tag,
        })
    }

    pub fn config(&self) -> &Config {
        &self.cfg
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
        Ok(self.sandbox_record(id)?.status())
    }

    /// ListPodSandbox, oldest first.
    pub fn list_pod_sandboxes(&self, filter: &SandboxFilter) -> Vec<SandboxStatus> {
        let entries: Vec<_> = lock(&self.registry).sandboxes.values().cloned().collect();
        let mut out: Vec<SandboxStatus> = entries
            .iter()
            .map(|e| lock(&e.record).clone())
            .filter(|r| filter.matches(r))
            .map(|r| r.status())
            .collect();
        out.sort_by_key(|s| (s.created_at, s.id.clone()));
        out
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
        container::lifecycle::start(self, id)
    }

    /// StopContainer: stop signal, `timeout`, SIGKILL; idempotent, an unknown id is success.
    pub fn stop_container(&self, id: &str, timeout: std::time::Duration) -> Result<()> {
        container::lifecycle::stop(self, id, timeout)
    }

    /// RemoveContainer: force-stops and removes everything; an unknown id is success.
    pub fn remove_container(&self, id: &str) -> Result<()> {
        container::lifecycle::remove(self, id)
    }

    /// ContainerStatus (with the exit folded in if the container has exited); an unknown id
    /// is `NotFound`.
    pub fn container_status(&self, id: &str) -> Result<ContainerRecord> {
        let e = self.container_entry(id)?;
        Ok(container::lifecycle::refresh(&e))
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
            .map(|e| container::lifecycle::refresh(e))
            .filter(|r| filter.matches(r))
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
        container::lifecycle::exec_sync(self, id, cmd, timeout)
    }

    /// ReopenContainerLog: the monitor reopens the log file after a rotation.
    pub fn reopen_container_log(&self, id: &str) -> Result<()> {
        container::lifecycle::reopen_log(self, id)
    }

    /// UpdateContainerResources: new CPU and memory limits for a created or running container.
    pub fn update_container_resources(
        &self,
        id: &str,
        resources: &container::Resources,
    ) -> Result<()> {
        container::lifecycle::update_resources(self, id, resources)
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

    /// The image store.
    pub fn images(&self) -> &image::ImageStore {
        &self.images
    }

    /// PullImage: fetches `image` from its registry (mirrors first) into the store. Callers
    /// pulling the same reference at the same time share one download.
    pub fn pull_image(&self, image: &str, auth: &image::Auth) -> Result<image::ImageRecord> {
        let key = image::reference::Reference::parse(image)?.full();
        let cell = lock(&self.pulls).entry(key.clone()).or_default().clone();
        let out = cell.get_or_init(|| {
            let fut = image::pull::pull(&self.images, image, auth, &self.cfg.registries);
            let r = match tokio::runtime::Handle::try_current() {
                Ok(h) => h.block_on(fut),
                Err(_) => tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| Error::Host(error::HostError::Other(e.to_string())))
                    .and_then(|rt| rt.block_on(fut)),
            };
            r.map_err(|e| e.to_string())
        });
        {
            let mut pulls = lock(&self.pulls);
            if pulls.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                pulls.remove(&key);
            }
        }
        out.clone()
            .map_err(|msg| Error::step("pull image", image, error::HostError::Other(msg)))
    }

    /// RemoveImage: refused while a container uses the image; an unknown image is success.
    pub fn remove_image(&self, name: &str) -> Result<()> {
        let used: Vec<String> = lock(&self.registry)
            .containers
            .values()
            .map(|e| lock(&e.record).image_id.clone())
            .collect();
        self.images
            .remove(name, |id| used.iter().any(|u| u == id))?;
        Ok(())
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

/// The state root must not be a symlink (an attacker-made link would move our writes).
fn check_root(root: &Path) -> Result<()> {
    if !root.is_absolute() {
        return Err(Error::Config(format!(
            "state root {} must be an absolute path",
            root.display()
        )));
    }
    match std::fs::symlink_metadata(root) {
        Ok(m) if m.file_type().is_symlink() => Err(Error::Config(format!(
            "state root {} is a symlink; refusing to use it",
            root.display()
        ))),
        Ok(m) if !m.is_dir() => Err(Error::Config(format!(
            "state root {} is not a directory",
            root.display()
        ))),
        _ => Ok(()),
    }
}

fn restrict_root(root: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o711))
        .map_err(|e| error::HostError::io("chmod", root, e).into())
}

/// The prefix of every namespace file a runtime on state root `root` creates
/// (`sandboxd-<root tag>-`), for tools and tests that clean up after one instance.
pub fn ns_file_prefix(root: &Path) -> String {
    format!("sandboxd-{}-", short_hash(&root.to_string_lossy()))
}

/// 8 hex chars of FNV-1a: a stable tag, not a security boundary.
fn short_hash(s: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("{h:08x}")
}
