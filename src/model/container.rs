//! Container requests and records: the CRI container config as the core takes it, the
//! record kept per container, filters and ExecSync results.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use super::resources::Resources;
use super::sandbox::NamespaceMode;

/// CRI `ContainerMetadata`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ContainerMetadata {
    /// The container's name within its pod (CRI `metadata.name`); path-safe, at most 253 bytes.
    pub name: String,
    /// Creation attempt: kubelet increments it each time it re-creates the container.
    #[serde(default)]
    pub attempt: u32,
}

/// CRI `MountPropagation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Propagation {
    /// rprivate: no propagation either way (CRI `PROPAGATION_PRIVATE`).
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
    /// Where it appears in the container: an absolute path without `.` or `..`.
    pub container_path: String,
    /// The host file or dir bound there: an absolute path without `.` or `..`.
    pub host_path: String,
    /// Read-only (submounts stay writable unless `recursive_read_only`).
    pub readonly: bool,
    /// Mount propagation; anything but `Private` needs `host_path` on a shared mount
    /// (`Bidirectional`) or a shared or slave one (`HostToContainer`).
    pub propagation: Propagation,
    /// Every submount read-only too (CRI `recursive_read_only`).
    pub recursive_read_only: bool,
    /// An idmapped mount with these maps (CRI `uid_mappings`/`gid_mappings`; those of the
    /// pod's user namespace).
    #[serde(default)]
    pub idmap: Option<crate::model::sandbox::IdMap>,
    /// Extra mount flags (CRI `mount_options`, KEP-5855): `noexec`, `nodev`, `nosuid`.
    pub mount_options: Vec<String>,
    /// An image volume (CRI `Mount.image`, KEP-4639): the image's files, read-only, instead
    /// of `host_path` (empty then).
    #[serde(default)]
    pub image: Option<ImageVolume>,
}

/// An image (or OCI artifact) mounted as a volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct ImageVolume {
    /// The image as kubelet names it (pulled beforehand).
    pub image: String,
    /// Only this subdirectory (or file) of the image (CRI `image_sub_path`); empty: all of it.
    pub sub_path: String,
    /// The image's digest reference, resolved at create (reported in ContainerStatus).
    pub image_ref: String,
    /// Its layers (diff ids, bottom first), resolved at create: kept while the container exists.
    pub layers: Vec<String>,
    /// An OCI artifact's files (in the store's artifact namespace), not an image's layers.
    pub artifact: bool,
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
    /// The process's uid, as the container sees it.
    pub uid: u32,
    /// Its primary gid: `run_as_group`, else the user's group in the image, else 0.
    pub gid: u32,
    /// Its supplementary gids, sorted: the requested ones plus (policy `Merge`) the
    /// user's groups in the image's /etc/group.
    pub supplemental_groups: Vec<u32>,
}

/// CRI `Device`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct Device {
    /// Where the device node is made in the container (absolute).
    pub container_path: String,
    /// The host's device node (absolute; must be a char or block device).
    pub host_path: String,
    /// Any of `r`, `w`, `m`.
    pub permissions: String,
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
    /// CRI `privileged`: every capability and host device, no masked or read-only paths,
    /// no seccomp filter.
    pub privileged: bool,
    /// Capability names with or without the `CAP_` prefix, or `ALL`.
    pub add_capabilities: Vec<String>,
    /// Capabilities removed from the default set (same names; `ALL` empties it before the
    /// named additions apply).
    pub drop_capabilities: Vec<String>,
    /// Mount the rootfs read-only (CRI `readonly_rootfs`); the pod's /etc/hosts,
    /// /etc/resolv.conf and /etc/hostname are then read-only too.
    pub readonly_rootfs: bool,
    /// uid to run as (CRI `run_as_user`, 0..=4294967295); `None`: `run_as_username`, else
    /// the image's `USER`.
    pub run_as_user: Option<i64>,
    /// gid to run as (CRI `run_as_group`; needs `run_as_user` or `run_as_username`);
    /// `None`: the group of the image's `USER`, else the user's in /etc/passwd, else 0.
    pub run_as_group: Option<i64>,
    /// User name to run as, looked up in the image's /etc/passwd (CRI `run_as_username`);
    /// empty: not set. Excludes `run_as_user`.
    pub run_as_username: String,
    /// Extra gids for the process (CRI `supplemental_groups`, each 0..=4294967295).
    pub supplemental_groups: Vec<i64>,
    /// Whether the user's groups in the image's /etc/group are added too (CRI
    /// `supplemental_groups_policy`).
    pub supplemental_groups_policy: GroupsPolicy,
    /// Set `no_new_privs` on the process (CRI `no_new_privs`): setuid binaries and file
    /// capabilities grant nothing.
    pub no_new_privs: bool,
    /// PID namespace: POD (the pod's, needs the pod to have one), CONTAINER (own), NODE
    /// (host) or TARGET (`target_id`'s).
    pub pid: NamespaceMode,
    /// With `pid: TARGET`: the running container of the same pod whose PID namespace is
    /// joined (CRI `namespace_options.target_id`); empty otherwise.
    pub target_id: String,
    /// `None` = the runtime's defaults; kubelet sends its own lists.
    pub masked_paths: Option<Vec<String>>,
    /// Paths made read-only (CRI `readonly_paths`); `None`: the runtime's defaults
    /// (`/proc/sys`, `/proc/bus`…). Ignored when privileged, as `masked_paths` is.
    pub readonly_paths: Option<Vec<String>>,
    /// Seccomp profile (CRI `seccomp`); ignored when privileged.
    pub seccomp: Seccomp,
    /// AppArmor profile (CRI `apparmor`, or the deprecated `apparmor_profile` string).
    pub apparmor: AppArmor,
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
    /// CRI `metadata`: the container's name and attempt.
    pub metadata: ContainerMetadata,
    /// Image reference, id or id prefix.
    pub image: String,
    /// Overrides the image's entrypoint (Kubernetes `command`).
    pub command: Vec<String>,
    /// Overrides the image's cmd (Kubernetes `args`).
    pub args: Vec<String>,
    /// CRI `working_dir` (absolute); empty: the image's WorkingDir, else `/`.
    pub working_dir: String,
    /// CRI `envs` as `(name, value)` pairs, set over the image's ENV (a later pair wins).
    pub envs: Vec<(String, String)>,
    /// CRI `mounts`: host paths bound in after the defaults (one at /etc/hosts,
    /// /etc/resolv.conf or /etc/hostname replaces the pod's file).
    pub mounts: Vec<BindMount>,
    /// CRI `devices`: host device nodes made in the container, with cgroup access.
    pub devices: Vec<Device>,
    /// CRI `CDI_devices`: fully qualified CDI device names (`vendor.com/class=name`), resolved
    /// against the node's CDI spec files (see [`crate::cdi`]).
    pub cdi_devices: Vec<String>,
    /// CRI `labels`, which ListContainers' label selector matches.
    pub labels: BTreeMap<String, String>,
    /// CRI `annotations`; also copied into the OCI spec's annotations.
    pub annotations: BTreeMap<String, String>,
    /// Relative to the pod's log directory; empty = no log file.
    pub log_path: String,
    /// Give the process a stdin pipe that attach clients write to (CRI `stdin`); false:
    /// /dev/null.
    pub stdin: bool,
    /// Close the container's stdin when the first attached client that wrote to it leaves.
    pub stdin_once: bool,
    /// Run the process on a terminal (CRI `tty`): stderr goes to stdout, and attach must
    /// ask for a terminal too.
    pub tty: bool,
    /// CRI `linux.resources`; UpdateContainerResources replaces them.
    pub resources: Resources,
    /// CRI `linux.security_context`.
    pub security: SecurityContext,
    /// The signal StopContainer sends first (CRI `stop_signal`, canonical name without `SIG`);
    /// empty: the image's `StopSignal`, else TERM.
    #[serde(default)]
    pub stop_signal: String,
}

/// CRI `ContainerState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContainerState {
    /// Being created (a crash leaves this; restore rolls it back). Reported as Unknown.
    Creating,
    /// Made by the runtime, not started (CRI `CONTAINER_CREATED`).
    Created,
    /// Started, and no exit seen yet (CRI `CONTAINER_RUNNING`).
    Running,
    /// Exited or failed to start (CRI `CONTAINER_EXITED`); `exit_code`, `reason` and
    /// `finished_at` say how.
    Exited,
    /// An interrupted creation whose rollback did not finish; RemoveContainer completes it
    /// (CRI `CONTAINER_UNKNOWN`).
    Unknown,
}

/// Everything persisted about one container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerRecord {
    /// The record's format ([`super::RECORD_FORMAT`] when written by this build).
    #[serde(default)]
    pub format: u32,
    /// The container's 64-hex id (random, 256 bits).
    pub id: String,
    /// The name it reserves, as kubelet builds it:
    /// `k8s_<container>_<pod>_<namespace>_<pod uid>_<attempt>`.
    pub name: String,
    /// Full id of the pod sandbox it belongs to.
    pub sandbox_id: String,
    /// The CreateContainer request as given (resources as last updated).
    pub config: ContainerConfig,
    /// `sha256:…` of the image config.
    pub image_id: String,
    /// The image's layers (diff ids) this container's rootfs stacks: kept while it exists.
    #[serde(default)]
    pub layers: Vec<String>,
    /// What the user asked for, normalized (a repo tag or digest), and a repo digest if known.
    pub image_ref: String,
    /// The pod's runtime handler, resolved (the default handler's name if the pod named
    /// none).
    pub runtime_handler: String,
    /// The recorded lifecycle state (see [`ContainerRecord::cri_state`] for what CRI sees).
    pub state: ContainerState,
    /// When CreateContainer recorded it, in nanoseconds since the Unix epoch.
    pub created_at: i64,
    /// When its process started, in nanoseconds since the Unix epoch; 0: never started.
    pub started_at: i64,
    /// When it exited (or failed to start), in nanoseconds since the Unix epoch; 0: not
    /// exited.
    pub finished_at: i64,
    /// Exit status once exited (0 before): 128+N when killed by signal N, 128 for
    /// `StartError`, 255 when unknown.
    pub exit_code: i32,
    /// CRI `reason` once exited: `Completed`, `Error`, `OOMKilled`, `StartError` or
    /// `Unknown`; empty before.
    pub reason: String,
    /// CRI `message`: why it failed to start, or why its exit status is unknown; usually
    /// empty.
    pub message: String,
    /// Host pid of the container's init process (from the runtime's `create`); 0 before.
    pub pid: i32,
    /// That process's start time in clock ticks since boot, read when `pid` was recorded:
    /// with `boot_id`, what tells it from a later process given the same pid.
    #[serde(default)]
    pub pid_start: u64,
    /// The boot `pid` was recorded in (`/proc/sys/kernel/random/boot_id`).
    #[serde(default)]
    pub boot_id: String,
    /// The container's dir, `<root>/containers/<id>`: bundle, record, monitor files.
    pub dir: PathBuf,
    /// The CRI log file: the pod's `log_directory` joined with `config.log_path`; `None` if
    /// either is empty.
    pub log_path: Option<PathBuf>,
    /// The container's cgroup (OCI `cgroupsPath`): `<pod cgroup>/sandboxd-<id>`, or with the
    /// systemd driver `<pod slice>:sandboxd:<id>` (`cgroups::child`).
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
    /// The dir holding the writable layer (`upper`, `work`) when the config's
    /// `container_storage_root` puts it apart from `dir`.
    #[serde(default)]
    pub storage_dir: Option<PathBuf>,
}

impl ContainerRecord {
    /// The mount point of its overlay rootfs: `rootfs` in `userns_dir` if set, else in
    /// `dir`.
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
    /// The overlay's work dir (beside [`upper_dir`](Self::upper_dir)).
    pub fn work_dir(&self) -> PathBuf {
        self.overlay_dir().join("work")
    }
    fn overlay_dir(&self) -> PathBuf {
        match (&self.userns_dir, &self.storage_dir) {
            (Some(_), _) => self.dir.join("ovl"),
            (None, Some(s)) => s.clone(),
            (None, None) => self.dir.clone(),
        }
    }
    /// Where the record is persisted: `<dir>/state.json`.
    pub fn state_file(&self) -> PathBuf {
        self.dir.join(super::STATE_FILE)
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
    /// Containers whose id starts with this lowercase hex prefix.
    pub id_prefix: Option<String>,
    /// Containers in this state, as CRI sees it ([`ContainerRecord::cri_state`]).
    pub state: Option<ContainerState>,
    /// Containers whose pod sandbox id starts with this lowercase hex prefix.
    pub sandbox_id: Option<String>,
    /// Containers carrying every one of these labels (key and value).
    pub labels: BTreeMap<String, String>,
}

impl ContainerFilter {
    /// Whether `r` passes every set field.
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
    /// What the command wrote to stdout. Both streams together are capped just under 16 MiB
    /// (one gRPC message); the rest is dropped.
    pub stdout: Vec<u8>,
    /// What it wrote to stderr; when the cap bites, up to its first MiB is kept ahead of
    /// stdout.
    pub stderr: Vec<u8>,
    /// Its exit status; 128+N when killed by signal N.
    pub exit_code: i32,
}

/// CRI AppArmor profile choice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AppArmor {
    /// Nothing asked.
    #[default]
    Unset,
    /// The runtime's default profile.
    RuntimeDefault,
    /// No profile.
    Unconfined,
    /// A profile loaded on the node, by name.
    Localhost(String),
}

impl ContainerRecord {
    /// The container's init process as recorded: believed alive only while its pid still
    /// names that process (`process::ProcId`).
    pub fn init_proc(&self) -> crate::process::ProcId {
        crate::process::ProcId {
            pid: self.pid,
            start_ticks: self.pid_start,
            boot_id: self.boot_id.clone(),
            recorded_at: self.created_at,
        }
    }
}
