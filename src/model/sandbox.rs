//! Pod sandbox requests and records: what RunPodSandbox is asked, what is recorded of a
//! sandbox (every resource it owns, named before it exists) and what status reports.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::cni::PortMapping;

/// CRI `NamespaceMode`. The default (`Pod`) is the proto's zero value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum NamespaceMode {
    #[default]
    Pod,
    Container,
    Node,
    Target,
}

/// CRI `NamespaceOption`: which namespaces the pod shares with the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct NamespaceOptions {
    pub network: NamespaceMode,
    pub pid: NamespaceMode,
    pub ipc: NamespaceMode,
}

/// One range of a user namespace's id map (CRI `IDMapping`): `length` ids from
/// `container_id` inside map to ids from `host_id` outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdMapping {
    pub container_id: u32,
    pub host_id: u32,
    pub length: u32,
}

/// The uid and gid maps of a user namespace: the pod's own (CRI `UserNamespace` in POD mode)
/// or an idmapped mount's (CRI `Mount.uid_mappings`/`gid_mappings`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct IdMap {
    pub uids: Vec<IdMapping>,
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
    pub name: String,
    pub namespace: String,
    pub uid: String,
    #[serde(default)]
    pub attempt: u32,
}

/// CRI `DNSConfig`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct DnsConfig {
    pub servers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

/// What RunPodSandbox asks for (the subset of CRI `PodSandboxConfig` the core uses).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct PodSandboxConfig {
    pub metadata: PodSandboxMetadata,
    pub hostname: String,
    pub log_directory: String,
    pub dns: Option<DnsConfig>,
    pub port_mappings: Vec<PortMapping>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub namespace_options: NamespaceOptions,
    /// CRI runtime handler; empty = the default handler.
    pub runtime_handler: String,
    /// Pod cgroup parent; empty = the configured default.
    pub cgroup_parent: String,
    /// Namespaced sysctls for the pod (CRI `linux.sysctls`).
    pub sysctls: BTreeMap<String, String>,
    /// The pod's SELinux label fields (user, role, type, level; all empty = none).
    pub selinux: [String; 4],
    /// The pod's own user namespace (CRI `userns_options` in POD mode); `None`: the node's.
    pub user_namespace: Option<IdMap>,
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
    /// The pod's hostname: the configured one, else the pod name (at most 63 characters).
    pub fn effective_hostname(&self) -> String {
        if self.hostname.is_empty() {
            self.metadata.name.chars().take(63).collect()
        } else {
            self.hostname.clone()
        }
    }
    pub fn host_network(&self) -> bool {
        self.namespace_options.network == NamespaceMode::Node
    }
    pub fn host_ipc(&self) -> bool {
        self.namespace_options.ipc == NamespaceMode::Node
    }
    pub fn host_pid(&self) -> bool {
        self.namespace_options.pid == NamespaceMode::Node
    }
}

/// Lifecycle state. `Creating` is never returned as ready; it is what a crash leaves behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    Creating,
    Ready,
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
    pub ips: Vec<String>,
    /// DEL succeeded (or was given up on).
    pub stopped: bool,
    pub del_failures: u32,
    pub last_del_error: Option<String>,
    /// DEL was given up on after too many failures; start-up cleanup retries it.
    pub gave_up: bool,
    /// The exact network list and pod attachment used for ADD (recorded before ADD) and, once
    /// ADD succeeded, its result: DEL uses them even if the conf dir changed since.
    pub cache: Option<crate::cni::CacheEntry>,
}

/// The infra container, when the pod has one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct InfraRecord {
    pub id: String,
    pub pid: i32,
    pub created: bool,
    pub started: bool,
    pub stopped: bool,
}

/// Steps of StopPodSandbox that completed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StopRecord {
    pub containers_stopped: bool,
    pub netns_closed: bool,
    pub shm_unmounted: bool,
}

/// Everything persisted about one sandbox (`<root>/sandboxes/<id>/state.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxRecord {
    pub id: String,
    pub name: String,
    pub config: PodSandboxConfig,
    pub state: SandboxState,
    /// Unix time in nanoseconds.
    pub created_at: i64,
    pub runtime_handler: String,
    pub infra_mode: InfraMode,
    pub dir: PathBuf,
    /// Resource paths are recorded before the resource is created.
    pub netns: Option<PathBuf>,
    pub ipcns: Option<PathBuf>,
    pub utsns: Option<PathBuf>,
    /// The pod's user namespace, which owns its network, IPC and UTS namespaces.
    #[serde(default)]
    pub userns: Option<PathBuf>,
    pub shm: Option<PathBuf>,
    pub network: NetworkRecord,
    pub infra: Option<InfraRecord>,
    pub stop: StopRecord,
    /// The pod's cgroup, parent of the infra's and every container's cgroup: the config's
    /// `cgroup_parent`, or one made for the pod under the configured parent (`own_pod_cgroup`,
    /// removed with the sandbox).
    #[serde(default)]
    pub pod_cgroup: String,
    #[serde(default)]
    pub own_pod_cgroup: bool,
}

/// What PodSandboxStatus reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SandboxStatus {
    pub id: String,
    pub metadata: PodSandboxMetadata,
    pub state: SandboxState,
    pub created_at: i64,
    pub ips: Vec<String>,
    pub netns_path: Option<PathBuf>,
    pub namespace_options: NamespaceOptions,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub runtime_handler: String,
    pub infra_mode: InfraMode,
    pub infra_pid: Option<i32>,
    pub network_error: Option<String>,
    pub user_namespace: Option<IdMap>,
}

impl SandboxRecord {
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
            runtime_handler: self.runtime_handler.clone(),
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

    /// Every pinned namespace file the record names, the user namespace (their owner) last.
    pub fn namespace_files(&self) -> impl Iterator<Item = &PathBuf> {
        [&self.netns, &self.ipcns, &self.utsns, &self.userns]
            .into_iter()
            .flatten()
    }

    pub fn state_file(&self) -> PathBuf {
        crate::state::Record::state_file(self)
    }

    pub fn infra_dir(&self) -> PathBuf {
        self.dir.join("infra")
    }

    /// The pod's cgroup (records from before `pod_cgroup` existed: the parent in use then).
    pub fn pod_cgroup(&self, cfg: &crate::Config) -> String {
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
    pub id_prefix: Option<String>,
    pub state: Option<SandboxState>,
    pub labels: BTreeMap<String, String>,
}

impl SandboxFilter {
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

impl crate::state::Record for SandboxRecord {
    const KIND: &'static str = "sandbox";
    fn id(&self) -> &str {
        &self.id
    }
    fn dir(&self) -> &std::path::Path {
        &self.dir
    }
}
