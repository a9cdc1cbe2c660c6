//! Container requests and records: the CRI container config as the core takes it, the
//! record kept per container, filters and ExecSync results.

use std::collections::BTreeMap;
use std::path::PathBuf;

use sandboxd_shim_common::cli::StdinMode;
use serde::{Deserialize, Serialize};

use super::sandbox::NamespaceMode;

/// CRI `ContainerMetadata`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ContainerMetadata {
    pub name: String,
    #[serde(default)]
    pub attempt: u32,
}

/// CRI `MountPropagation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Propagation {
    #[default]
    Private,
    /// rslave
    HostToContainer,
    /// rshared
    Bidirectional,
}

/// CRI `Mount`: a bind mount from the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct BindMount {
    pub container_path: String,
    pub host_path: String,
    pub readonly: bool,
    pub propagation: Propagation,
    /// Every submount read-only too (CRI `recursive_read_only`).
    pub recursive_read_only: bool,
    /// An idmapped mount with these maps (CRI `uid_mappings`/`gid_mappings`; those of the
    /// pod's user namespace).
    #[serde(default)]
    pub idmap: Option<crate::model::sandbox::IdMap>,
}

/// CRI `SupplementalGroupsPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum GroupsPolicy {
    /// The groups of the user in the image's /etc/group, plus the requested ones.
    #[default]
    Merge,
    /// Only the requested ones.
    Strict,
}

/// The user a container's process runs as, as resolved at creation (CRI `ContainerUser`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct EffectiveUser {
    pub uid: u32,
    pub gid: u32,
    pub supplemental_groups: Vec<u32>,
}

/// CRI `Device`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct Device {
    pub container_path: String,
    pub host_path: String,
    /// Any of `r`, `w`, `m`.
    pub permissions: String,
}

/// CRI `LinuxContainerResources` (the fields a cgroup applies). Zero means unset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct Resources {
    pub cpu_period: i64,
    pub cpu_quota: i64,
    pub cpu_shares: i64,
    pub memory_limit_in_bytes: i64,
    pub oom_score_adj: i64,
    pub cpuset_cpus: String,
    pub cpuset_mems: String,
}

/// CRI `SecurityProfile` for seccomp.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Seccomp {
    /// No filter (the CRI default when the field is absent).
    #[default]
    Unconfined,
    /// The runtime's default profile.
    RuntimeDefault,
    /// A profile file on the host (absolute path).
    Localhost(String),
}

/// CRI `LinuxContainerSecurityContext`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct SecurityContext {
    pub privileged: bool,
    /// Capability names with or without the `CAP_` prefix, or `ALL`.
    pub add_capabilities: Vec<String>,
    pub drop_capabilities: Vec<String>,
    pub readonly_rootfs: bool,
    pub run_as_user: Option<i64>,
    pub run_as_group: Option<i64>,
    pub run_as_username: String,
    pub supplemental_groups: Vec<i64>,
    pub supplemental_groups_policy: GroupsPolicy,
    pub no_new_privs: bool,
    /// PID namespace: POD (the pod's, needs the pod to have one), CONTAINER (own), NODE
    /// (host) or TARGET (`target_id`'s).
    pub pid: NamespaceMode,
    pub target_id: String,
    /// `None` = the runtime's defaults; kubelet sends its own lists.
    pub masked_paths: Option<Vec<String>>,
    pub readonly_paths: Option<Vec<String>>,
    pub seccomp: Seccomp,
    pub apparmor: crate::lsm::AppArmor,
    /// `user:role:type:level`, as CRI's `selinux_options` give it.
    pub selinux: [String; 4],
    /// The user namespace kubelet says the container is in (CRI `userns_options` in POD
    /// mode): if given, it must be the pod's.
    pub user_namespace: Option<crate::model::sandbox::IdMap>,
}

/// What CreateContainer asks for (the CRI `ContainerConfig` fields the core uses).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct ContainerConfig {
    pub metadata: ContainerMetadata,
    /// Image reference, id or id prefix.
    pub image: String,
    /// Overrides the image's entrypoint (Kubernetes `command`).
    pub command: Vec<String>,
    /// Overrides the image's cmd (Kubernetes `args`).
    pub args: Vec<String>,
    pub working_dir: String,
    pub envs: Vec<(String, String)>,
    pub mounts: Vec<BindMount>,
    pub devices: Vec<Device>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// Relative to the pod's log directory; empty = no log file.
    pub log_path: String,
    pub stdin: bool,
    /// Close the container's stdin when the first attached client that wrote to it leaves.
    pub stdin_once: bool,
    pub tty: bool,
    pub resources: Resources,
    pub security: SecurityContext,
}

/// CRI `ContainerState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContainerState {
    /// Being created (a crash leaves this; restore rolls it back). Reported as Unknown.
    Creating,
    Created,
    Running,
    Exited,
    Unknown,
}

/// Everything persisted about one container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerRecord {
    pub id: String,
    pub name: String,
    pub sandbox_id: String,
    pub config: ContainerConfig,
    /// `sha256:…` of the image config.
    pub image_id: String,
    /// The image's layers (diff ids) this container's rootfs stacks: kept while it exists.
    #[serde(default)]
    pub layers: Vec<String>,
    /// What the user asked for, normalized (a repo tag or digest), and a repo digest if known.
    pub image_ref: String,
    pub runtime_handler: String,
    pub state: ContainerState,
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    pub reason: String,
    pub message: String,
    pub pid: i32,
    pub dir: PathBuf,
    pub log_path: Option<PathBuf>,
    pub cgroup: String,
    /// Signal that asks it to stop (the image's STOPSIGNAL, default TERM).
    pub stop_signal: String,
    /// The container shares a PID namespace with others: signals go to all its processes.
    pub shared_pid: bool,
    /// The user the process runs as (resolved at creation).
    #[serde(default)]
    pub user: Option<EffectiveUser>,
    /// The monitor's attach socket (CRI Attach).
    #[serde(default)]
    pub attach_socket: Option<PathBuf>,
    /// For a container with a terminal: where the runtime hands the pty to the monitor.
    #[serde(default)]
    pub console_socket: Option<PathBuf>,
    /// In a pod with its own user namespace: the dir (owned by the pod's root, outside the
    /// root-only container dir) whose `rootfs` the runtime pivots into as that user.
    #[serde(default)]
    pub userns_dir: Option<PathBuf>,
}

impl ContainerRecord {
    pub fn rootfs(&self) -> PathBuf {
        match &self.userns_dir {
            Some(d) => d.join("rootfs"),
            None => self.dir.join("rootfs"),
        }
    }
    /// The overlay's writable layer (in the dir that is idmapped for a pod with its own user
    /// namespace, where upper and work must share one mount).
    pub fn upper_dir(&self) -> PathBuf {
        self.overlay_dir().join("upper")
    }
    pub fn work_dir(&self) -> PathBuf {
        self.overlay_dir().join("work")
    }
    fn overlay_dir(&self) -> PathBuf {
        match &self.userns_dir {
            Some(_) => self.dir.join("ovl"),
            None => self.dir.clone(),
        }
    }
    pub fn state_file(&self) -> PathBuf {
        crate::state::Record::state_file(self)
    }
    pub fn files(&self) -> crate::oci::ContainerFiles {
        let mut f = crate::oci::ContainerFiles::in_dir(&self.dir, self.log_path.clone());
        f.attach_socket = self.attach_socket.clone();
        f.console_socket = self.console_socket.clone();
        f.stdin = match (self.config.stdin, self.config.stdin_once) {
            (false, _) => StdinMode::None,
            (true, false) => StdinMode::Open,
            (true, true) => StdinMode::Once,
        };
        f
    }
    /// The state CRI reports (`Creating` is not a CRI state).
    pub fn cri_state(&self) -> ContainerState {
        match self.state {
            ContainerState::Creating => ContainerState::Unknown,
            s => s,
        }
    }
}

/// ListContainers filter; empty fields match everything.
#[derive(Debug, Clone, Default)]
pub struct ContainerFilter {
    pub id_prefix: Option<String>,
    pub state: Option<ContainerState>,
    pub sandbox_id: Option<String>,
    pub labels: BTreeMap<String, String>,
}

impl ContainerFilter {
    pub fn matches(&self, r: &ContainerRecord) -> bool {
        self.id_prefix
            .as_ref()
            .is_none_or(|p| r.id.starts_with(p.as_str()))
            && self.state.is_none_or(|s| s == r.cri_state())
            && self
                .sandbox_id
                .as_ref()
                .is_none_or(|p| r.sandbox_id.starts_with(p.as_str()))
            && self
                .labels
                .iter()
                .all(|(k, v)| r.config.labels.get(k) == Some(v))
    }
}

/// ExecSync's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecResult {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit_code: i32,
}

impl crate::state::Record for ContainerRecord {
    const KIND: &'static str = "container";
    fn id(&self) -> &str {
        &self.id
    }
    fn dir(&self) -> &std::path::Path {
        &self.dir
    }
}
