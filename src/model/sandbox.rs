//! Pod sandbox requests and records: what RunPodSandbox is asked, what is recorded of a
//! sandbox (every resource it owns, named before it exists) and what status reports.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::network::PortMapping;

/// CRI `NamespaceMode`. The default (`Pod`) is the proto's zero value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum NamespaceMode {
    /// The pod's own (CRI `POD`); for PID, one shared by the pod's containers (in a pod
    /// without a shared one, a container's `Pod` means its own).
    #[default]
    Pod,
    /// The container's own (CRI `CONTAINER`; PID only).
    Container,
    /// The node's (CRI `NODE`).
    Node,
    /// Another container's, named by `target_id` (CRI `TARGET`; a container's PID only).
    Target,
}

/// CRI `NamespaceOption`: which namespaces the pod shares with the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct NamespaceOptions {
    /// `Pod`: a network namespace of its own, set up by CNI; `Node`: host network.
    pub network: NamespaceMode,
    /// `Pod`: one PID namespace shared by its containers (needs an infra process);
    /// `Container`: each container its own; `Node`: the host's.
    pub pid: NamespaceMode,
    /// `Pod`: an IPC namespace and /dev/shm of its own; `Node`: the host's.
    pub ipc: NamespaceMode,
}

/// One range of a user namespace's id map (CRI `IDMapping`): `length` ids from
/// `container_id` inside map to ids from `host_id` outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdMapping {
    /// First id of the range inside the namespace (must be 0).
    pub container_id: u32,
    /// The host id `container_id` maps to (never 0: the node's root is refused).
    pub host_id: u32,
    /// Number of ids in the range (at least 1).
    pub length: u32,
}

/// The uid and gid maps of a user namespace: the pod's own (CRI `UserNamespace` in POD mode)
/// or an idmapped mount's (CRI `Mount.uid_mappings`/`gid_mappings`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct IdMap {
    /// The uid ranges (`/proc/PID/uid_map`); exactly one is supported.
    pub uids: Vec<IdMapping>,
    /// The gid ranges (`/proc/PID/gid_map`); exactly one is supported.
    pub gids: Vec<IdMapping>,
}

impl IdMap {
    /// The host uid and gid the namespace's root maps to.
    pub fn host_root(&self) -> Option<(u32, u32)> {
        let root = |m: &[IdMapping]| {
            m.iter()
                .find(|r| r.container_id == 0 && r.length > 0)
                .map(|r| r.host_id)
        };
        Some((root(&self.uids)?, root(&self.gids)?))
    }

    /// Checks the maps of a pod's user namespace (or an idmapped mount's), as kubelet sends
    /// them: exactly one uid and one gid range, each mapping container id 0, not empty, not
    /// wrapping around, and not mapping the host's root into the pod (which would make root in
    /// the pod root on the node).
    pub fn check(&self, field: &str) -> crate::error::Result<()> {
        let m = self;
        for (kind, ranges) in [("uids", &m.uids), ("gids", &m.gids)] {
            let [r] = ranges.as_slice() else {
                return Err(crate::error::Error::InvalidArgument(format!(
                    "{field}.{kind}: exactly one mapping is supported, got {}",
                    ranges.len()
                )));
            };
            if r.container_id != 0 || r.length == 0 {
                return Err(crate::error::Error::InvalidArgument(format!(
                    "{field}.{kind}: the mapping {}:{}:{} leaves container id 0 unmapped",
                    r.container_id, r.host_id, r.length
                )));
            }
            if r.host_id.checked_add(r.length - 1).is_none() {
                return Err(crate::error::Error::InvalidArgument(format!(
                    "{field}.{kind}: host ids {}+{} run past the last id",
                    r.host_id, r.length
                )));
            }
            if r.host_id == 0 {
                return Err(crate::error::Error::InvalidArgument(format!(
                    "{field}.{kind}: the mapping starts at host id 0, which would make root in the pod the node's root"
                )));
            }
        }
        Ok(())
    }

    /// `/proc/PID/uid_map` (or `gid_map`) text for `ranges`.
    pub fn proc_map(ranges: &[IdMapping]) -> String {
        ranges
            .iter()
            .map(|r| format!("{} {} {}\n", r.container_id, r.host_id, r.length))
            .collect()
    }
}

/// CRI `PodSandboxMetadata`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PodSandboxMetadata {
    /// The pod's name (CRI `metadata.name`).
    pub name: String,
    /// The pod's Kubernetes namespace (CRI `metadata.namespace`).
    pub namespace: String,
    /// The pod's UID (CRI `metadata.uid`).
    pub uid: String,
    /// Creation attempt: kubelet increments it each time it re-creates the pod's sandbox.
    #[serde(default)]
    pub attempt: u32,
}

/// CRI `DNSConfig`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct DnsConfig {
    /// Name server IP addresses (`nameserver` lines).
    pub servers: Vec<String>,
    /// Search domains (the `search` line; at most 32).
    pub searches: Vec<String>,
    /// Resolver options such as `ndots:5` (the `options` line).
    pub options: Vec<String>,
}

/// What RunPodSandbox asks for (the subset of CRI `PodSandboxConfig` the core uses).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct PodSandboxConfig {
    /// CRI `metadata`: name, namespace, UID and attempt, which make the reserved name.
    pub metadata: PodSandboxMetadata,
    /// CRI `hostname` (the UTS hostname and /etc/hostname); empty: the pod name, cut to 63
    /// characters.
    pub hostname: String,
    /// CRI `log_directory`: the absolute dir containers' `log_path` is relative to; empty:
    /// no container gets a log file.
    pub log_directory: String,
    /// CRI `dns_config`, written as the pod's resolv.conf; `None` or all empty: a copy of
    /// the node's /etc/resolv.conf.
    pub dns: Option<DnsConfig>,
    /// CRI `port_mappings`, given to CNI as the `portMappings` capability.
    pub port_mappings: Vec<PortMapping>,
    /// CRI `labels`, which ListPodSandbox's label selector matches.
    pub labels: BTreeMap<String, String>,
    /// CRI `annotations`: kept and reported, not interpreted.
    pub annotations: BTreeMap<String, String>,
    /// CRI `linux.security_context.namespace_options`.
    pub namespace_options: NamespaceOptions,
    /// CRI runtime handler; empty = the default handler.
    pub runtime_handler: String,
    /// Pod cgroup parent; empty = the configured default.
    pub cgroup_parent: String,
    /// Namespaced sysctls for the pod (CRI `linux.sysctls`).
    pub sysctls: BTreeMap<String, String>,
    /// The pod's SELinux label fields (user, role, type, level; all empty = none).
    pub selinux: [String; 4],
    /// CRI `security_context.privileged`: only such a pod may hold privileged containers.
    pub privileged: bool,
    /// The pod's own user namespace (CRI `userns_options` in POD mode); `None`: the node's.
    pub user_namespace: Option<IdMap>,
    /// Pod-level resources (CRI `LinuxPodSandboxConfig.resources`, KEP-2837), as sent at
    /// RunPodSandbox and changed by UpdatePodSandboxResources (in-place pod resize).
    pub resources: Option<super::resources::Resources>,
    /// The pod's overhead (RuntimeClass `overhead`), as sent with the resources.
    pub overhead: Option<super::resources::Resources>,
}

impl PodSandboxConfig {
    /// A config with just its metadata set (attempt 0) and the PID namespace shared across the
    /// pod or not (`shared_pid` = CRI `pid: POD`, which needs an infra process).
    pub fn new(name: &str, namespace: &str, uid: &str, shared_pid: bool) -> Self {
        let mut c = PodSandboxConfig {
            metadata: PodSandboxMetadata {
                name: name.into(),
                namespace: namespace.into(),
                uid: uid.into(),
                attempt: 0,
            },
            ..Default::default()
        };
        c.namespace_options.pid = if shared_pid {
            NamespaceMode::Pod
        } else {
            NamespaceMode::Container
        };
        c
    }

    /// The reserved name, as kubelet builds it: `k8s_POD_<name>_<namespace>_<uid>_<attempt>`.
    pub fn reserved_name(&self) -> String {
        let m = &self.metadata;
        format!("k8s_POD_{}_{}_{}_{}", m.name, m.namespace, m.uid, m.attempt)
    }
    /// The pod's hostname, as the peers make it: the configured one; else, in the node's
    /// network namespace, the node's; else the pod name where it is a valid hostname (a
    /// DNS label of at most 63 characters), and otherwise the first 12 characters of the
    /// pod's id (as CRI-O does) — never an invalid one.
    pub fn effective_hostname(&self, id: &str) -> String {
        if !self.hostname.is_empty() {
            return self.hostname.clone();
        }
        if self.host_network() {
            if let Ok(h) = nix::unistd::gethostname() {
                return h.to_string_lossy().into_owned();
            }
        }
        let name = &self.metadata.name;
        let label = !name.is_empty()
            && name.len() <= 63
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !name.starts_with('-')
            && !name.ends_with('-');
        if label {
            name.clone()
        } else {
            id.chars().take(12).collect()
        }
    }
    /// Whether the pod uses the node's network namespace (`network: NODE`).
    pub fn host_network(&self) -> bool {
        self.namespace_options.network == NamespaceMode::Node
    }
    /// Whether the pod uses the node's IPC namespace and /dev/shm (`ipc: NODE`).
    pub fn host_ipc(&self) -> bool {
        self.namespace_options.ipc == NamespaceMode::Node
    }
    /// Whether the pod uses the node's PID namespace (`pid: NODE`).
    pub fn host_pid(&self) -> bool {
        self.namespace_options.pid == NamespaceMode::Node
    }
}

/// Lifecycle state. `Creating` is never returned as ready; it is what a crash leaves behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    /// RunPodSandbox is under way, or a crash cut it short (restore rolls it back); CRI
    /// `SANDBOX_NOTREADY`.
    Creating,
    /// Everything is set up (CRI `SANDBOX_READY`).
    Ready,
    /// Stopped, lost its infra process or netns, or a rollback that did not finish (CRI
    /// `SANDBOX_NOTREADY`).
    NotReady,
}

/// How the pod's namespaces are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InfraMode {
    /// An infra (pause) container holds them.
    Process,
    /// Bind mounts pin them; no process runs.
    Pinned,
}

/// Progress of the network: what CNI did and whether it was torn down.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NetworkRecord {
    /// ADD was (about to be) called: teardown must call DEL.
    pub setup_started: bool,
    /// The pod's IPs from CNI ADD's result, without prefix length (the first is CRI's `ip`,
    /// the others `additional_ips`); empty with host network.
    pub ips: Vec<String>,
    /// DEL succeeded (or was given up on).
    pub stopped: bool,
    /// Failed DEL attempts so far (given up at `cni_del_max_attempts`).
    pub del_failures: u32,
    /// The last failed DEL's error; cleared when a DEL succeeds.
    pub last_del_error: Option<String>,
    /// DEL was given up on after too many failures; start-up cleanup retries it.
    pub gave_up: bool,
    /// The exact network list and pod attachment used for ADD (recorded before ADD) and, once
    /// ADD succeeded, its result: DEL uses them even if the conf dir changed since.
    pub cache: Option<super::network::CacheEntry>,
}

/// The infra container, when the pod has one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct InfraRecord {
    /// Its id in the OCI runtime (the sandbox's own id).
    pub id: String,
    /// Host pid of the infra (pause) process; 0 until the runtime's `create` returned.
    pub pid: i32,
    /// Its start time in clock ticks since boot, read when `pid` was recorded (see
    /// `ContainerRecord::pid_start`).
    pub pid_start: u64,
    /// The boot `pid` was recorded in.
    pub boot_id: String,
    /// The runtime's `create` succeeded.
    pub created: bool,
    /// The runtime's `start` succeeded.
    pub started: bool,
    /// StopPodSandbox saw it exit (killing it if needed); the runtime deletes it on remove.
    pub stopped: bool,
}

/// Steps of StopPodSandbox that completed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StopRecord {
    /// Every container of the pod is stopped.
    pub containers_stopped: bool,
    /// Every pinned namespace file (network, IPC, UTS, user) is removed.
    pub netns_closed: bool,
    /// The pod's /dev/shm tmpfs is unmounted (or it had none).
    pub shm_unmounted: bool,
}

/// Everything persisted about one sandbox (`<root>/sandboxes/<id>/state.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxRecord {
    /// The record's format ([`super::RECORD_FORMAT`] when written by this build).
    #[serde(default)]
    pub format: u32,
    /// The sandbox's 64-hex id (random, 256 bits).
    pub id: String,
    /// The name it reserves: `k8s_POD_<name>_<namespace>_<uid>_<attempt>`.
    pub name: String,
    /// The RunPodSandbox request as given (a retry with an equal config gets this id).
    pub config: PodSandboxConfig,
    /// Its lifecycle state; a `Creating` record found at start-up is rolled back.
    pub state: SandboxState,
    /// Unix time in nanoseconds.
    pub created_at: i64,
    /// The handler the pod runs under, resolved (the default handler's name if the request
    /// named none).
    pub runtime_handler: String,
    /// Whether an infra process or pinned files hold the pod's namespaces.
    pub infra_mode: InfraMode,
    /// The sandbox's dir, `<root>/sandboxes/<id>`: the record, hosts, resolv.conf and
    /// hostname files, the shm mount point and the infra bundle.
    pub dir: PathBuf,
    /// Resource paths are recorded before the resource is created.
    pub netns: Option<PathBuf>,
    /// The pinned IPC namespace; only without an infra process and without host IPC.
    pub ipcns: Option<PathBuf>,
    /// The pinned UTS namespace; only without an infra process and without host network.
    pub utsns: Option<PathBuf>,
    /// The pod's user namespace, which owns its network, IPC and UTS namespaces.
    #[serde(default)]
    pub userns: Option<PathBuf>,
    /// The pod's /dev/shm tmpfs (`<dir>/shm`, `shm_size` bytes); `None` with host IPC.
    pub shm: Option<PathBuf>,
    /// What CNI did for the pod.
    pub network: NetworkRecord,
    /// The infra container; `None` when the pod has none ([`InfraMode::Pinned`]).
    pub infra: Option<InfraRecord>,
    /// Which StopPodSandbox steps have completed.
    pub stop: StopRecord,
    /// The pod's cgroup, parent of the infra's and every container's cgroup: the config's
    /// `cgroup_parent`, or one made for the pod under the configured parent (`own_pod_cgroup`,
    /// removed with the sandbox).
    #[serde(default)]
    pub pod_cgroup: String,
    /// `pod_cgroup` was made for this pod (and is removed with it), not given as the
    /// config's `cgroup_parent`.
    #[serde(default)]
    pub own_pod_cgroup: bool,
}

/// What PodSandboxStatus reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SandboxStatus {
    /// The sandbox's 64-hex id.
    pub id: String,
    /// CRI `metadata` as RunPodSandbox gave it.
    pub metadata: PodSandboxMetadata,
    /// The lifecycle state (`Creating` reads as not ready in CRI).
    pub state: SandboxState,
    /// When RunPodSandbox recorded it, in nanoseconds since the Unix epoch.
    pub created_at: i64,
    /// The pod's IPs, primary first (CRI `network.ip` and `additional_ips`); empty with
    /// host network.
    pub ips: Vec<String>,
    /// The pinned network namespace file; `None` with host network.
    pub netns_path: Option<PathBuf>,
    /// CRI `namespace_options` as RunPodSandbox gave them.
    pub namespace_options: NamespaceOptions,
    /// CRI `labels` as RunPodSandbox gave them.
    pub labels: BTreeMap<String, String>,
    /// CRI `annotations` as RunPodSandbox gave them.
    pub annotations: BTreeMap<String, String>,
    /// The handler RunPodSandbox named (`""`: the default handler), echoed as asked.
    pub runtime_handler: String,
    /// Whether an infra process or pinned files hold the pod's namespaces.
    pub infra_mode: InfraMode,
    /// Host pid of the infra process while it runs; `None` without one, before it started
    /// and once stopped.
    pub infra_pid: Option<i32>,
    /// The last failed CNI DEL's error; `None` once a DEL succeeded, or if none failed.
    pub network_error: Option<String>,
    /// The pod's own user namespace maps; `None`: the node's user namespace.
    pub user_namespace: Option<IdMap>,
}

impl SandboxRecord {
    /// What PodSandboxStatus reports of this record.
    pub fn status(&self) -> SandboxStatus {
        SandboxStatus {
            id: self.id.clone(),
            metadata: self.config.metadata.clone(),
            state: self.state,
            created_at: self.created_at,
            ips: self.network.ips.clone(),
            netns_path: self.netns.clone(),
            namespace_options: self.config.namespace_options,
            labels: self.config.labels.clone(),
            annotations: self.config.annotations.clone(),
            // What RunPodSandbox asked (`""` for the default), as the peers echo it.
            runtime_handler: self.config.runtime_handler.clone(),
            infra_mode: self.infra_mode,
            infra_pid: self
                .infra
                .as_ref()
                .filter(|i| i.started && !i.stopped)
                .map(|i| i.pid),
            network_error: self.network.last_del_error.clone(),
            user_namespace: self.config.user_namespace.clone(),
        }
    }

    /// Brings a record an older version wrote to today's shape; true if anything changed.
    /// - Before 0.1.0-2026-11-26 the recorded CNI attachment carried the pod's netns path
    ///   too, a second owner of `netns`: dropped (every CNI call is given `netns`).
    pub fn migrate(&mut self) -> bool {
        // Formats 0 and 1 have the same shape: the number is written with the next update.
        self.format = super::RECORD_FORMAT;
        let att = self.network.cache.as_mut().map(|c| &mut c.attachment);
        match att {
            Some(a) if a.netns.is_some() => {
                if self.netns.is_none() {
                    self.netns = a.netns.take();
                }
                a.netns = None;
                true
            }
            _ => false,
        }
    }

    /// Every pinned namespace file the record names, the user namespace (their owner) last.
    pub fn namespace_files(&self) -> impl Iterator<Item = &PathBuf> {
        [&self.netns, &self.ipcns, &self.utsns, &self.userns]
            .into_iter()
            .flatten()
    }

    /// Where the record is persisted: `<dir>/state.json`.
    pub fn state_file(&self) -> PathBuf {
        self.dir.join(super::STATE_FILE)
    }

    /// The infra container's bundle and monitor files: `<dir>/infra`.
    pub fn infra_dir(&self) -> PathBuf {
        self.dir.join("infra")
    }

    /// The pod's cgroup (records from before `pod_cgroup` existed: the parent in use then).
    pub fn pod_cgroup(&self, cfg: &crate::config::Config) -> String {
        let c = if !self.pod_cgroup.is_empty() {
            &self.pod_cgroup
        } else if !self.config.cgroup_parent.is_empty() {
            &self.config.cgroup_parent
        } else {
            &cfg.cgroup_parent
        };
        c.trim_end_matches('/').to_string()
    }
}

/// ListPodSandbox filter; empty fields match everything.
#[derive(Debug, Clone, Default)]
pub struct SandboxFilter {
    /// Sandboxes whose id starts with this lowercase hex prefix.
    pub id_prefix: Option<String>,
    /// Sandboxes in this state.
    pub state: Option<SandboxState>,
    /// Sandboxes carrying every one of these labels (key and value).
    pub labels: BTreeMap<String, String>,
}

impl SandboxFilter {
    /// Whether `r` passes every set field.
    pub fn matches(&self, r: &SandboxRecord) -> bool {
        self.id_prefix
            .as_ref()
            .is_none_or(|p| r.id.starts_with(p.as_str()))
            && self.state.is_none_or(|s| s == r.state)
            && self
                .labels
                .iter()
                .all(|(k, v)| r.config.labels.get(k) == Some(v))
    }
}

impl SandboxRecord {
    /// The pod's infra process as recorded (as `ContainerRecord::init_proc`).
    pub fn infra_proc(&self, infra: &InfraRecord) -> crate::process::ProcId {
        crate::process::ProcId {
            pid: infra.pid,
            start_ticks: infra.pid_start,
            boot_id: infra.boot_id.clone(),
            recorded_at: self.created_at,
        }
    }
}
