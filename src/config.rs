//! Runtime configuration with defaults that work on a fresh host: the embedded default CNI
//! network, runc as the default handler, the built-in pause process.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// When a pod gets an infra (pause) process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum InfraPolicy {
    /// Only when needed: a pod-level PID namespace, or a handler that needs a sandbox process.
    #[default]
    Auto,
    /// Every pod gets one.
    Always,
}

/// Who manages the pods' cgroups (CRI `RuntimeConfig.linux.cgroup_driver`, what kubelet
/// follows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CgroupDriver {
    /// systemd where it is the init system (`/run/systemd/system` exists), else cgroupfs.
    #[default]
    Auto,
    /// Scopes and slices through systemd's D-Bus API (`cgroups::systemd`).
    Systemd,
    /// Directories written directly under the cgroup mounts.
    Cgroupfs,
}

/// One OCI runtime handler (CRI `runtime_handler`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct RuntimeHandler {
    /// The runtime binary (runc, crun, a Kata-style shim-less runtime…); a bare name is looked
    /// up in PATH when the runtime starts.
    pub path: PathBuf,
    /// The runtime family (`handlers::FAMILIES`: runc, crun, runsc, vm); default: the family
    /// claiming the binary's name, else runc-like.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub family: Option<String>,
    /// The runtime's state dir (`--root`); default `<state root>/runtime/<handler name>`.
    #[serde(default)]
    pub root: Option<PathBuf>,
    /// The older way to say `family = "vm"` (a sandbox process in every pod).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub needs_sandbox_process: bool,
    /// Flags given before every subcommand (e.g. runsc's `--platform=ptrace`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runtime_args: Vec<String>,
}

/// The embedded network used when the CNI conf dir holds no config file (one holding only
/// invalid ones is an error, not a fallback).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DefaultNetwork {
    /// The CNI network's name (the `name` each plugin's config carries).
    pub name: String,
    /// The Linux bridge pods attach to (the bridge plugin makes it; it is their gateway).
    pub bridge: String,
    /// The subnet pod addresses come from (CIDR; host-local IPAM under `<root>/cni/networks`).
    pub subnet: String,
    /// Masquerade traffic leaving the pod subnet (what a node needs to reach services).
    pub ip_masq: bool,
}

impl Default for DefaultNetwork {
    fn default() -> Self {
        DefaultNetwork {
            name: "sandboxd-default".into(),
            bridge: "sandboxd0".into(),
            subnet: "10.89.0.0/16".into(),
            ip_masq: true,
        }
    }
}

/// Everything the core library needs to know about the host.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct Config {
    /// State root: sandbox and container records, bundles, CNI cache, IPAM of the default network.
    pub root: PathBuf,
    /// Where network namespaces are pinned (shared with `ip netns`).
    pub netns_dir: PathBuf,
    /// Where IPC namespaces of pods without an infra process are pinned.
    pub ipcns_dir: PathBuf,
    /// Where UTS namespaces of pods without an infra process are pinned.
    pub utsns_dir: PathBuf,
    /// Where the user namespaces of pods that have their own are pinned.
    pub userns_dir: PathBuf,
    /// CNI config dir: the first valid `.conf`, `.conflist` or `.json` file by name is the
    /// pod network; no such file at all: `default_network`.
    pub cni_conf_dir: PathBuf,
    /// Dirs searched in order for CNI plugin binaries (also the plugins' `CNI_PATH`).
    pub cni_bin_dirs: Vec<PathBuf>,
    /// Limit for one CNI plugin call (ADD or DEL), which is killed past it; seconds in the
    /// config file.
    #[serde(with = "secs")]
    pub cni_plugin_timeout: Duration,
    /// The embedded bridge network used when `cni_conf_dir` holds no config file.
    pub default_network: DefaultNetwork,
    /// A failed CNI DEL is retried by later StopPodSandbox calls; after this many failed
    /// attempts the network is recorded as stopped with a warning (0 = never give up).
    pub cni_del_max_attempts: u32,
    /// The handler of pods whose `runtime_handler` is empty; must be a key of `runtimes`.
    pub default_runtime: String,
    /// Runtime handlers by name (CRI `runtime_handler`, a RuntimeClass's `handler`); by
    /// default runc, crun and runsc. `Status` offers those whose binary exists and whose trial
    /// container the start-up probe could create (`probe`).
    pub runtimes: BTreeMap<String, RuntimeHandler>,
    /// Limit for one OCI runtime call (create, start, kill, delete…), which is killed past
    /// it; seconds in the config file.
    #[serde(with = "secs")]
    pub runtime_timeout: Duration,
    /// Bytes of ExecSync output all calls running at once may keep (each call up to 16 MiB):
    /// concurrent calls cannot add up to more. What is over is read and dropped.
    pub exec_sync_output_budget: u64,
    /// ExecSync calls running at once in one container; more are refused (ResourceExhausted)
    /// rather than queued, so that one pod's execs cannot take the node's CRI threads.
    pub exec_sync_max_per_container: usize,
    /// ExecSync calls running at once on the node.
    pub exec_sync_max: usize,
    /// GetContainerEvents: events a subscriber may fall behind before it is disconnected.
    pub events_backlog: usize,
    /// GetContainerEvents: bytes of events a subscriber may fall behind (each event carries
    /// every container of its pod) before it is disconnected.
    pub events_backlog_bytes: usize,
    /// GetContainerEvents: subscribers connected at once (more are refused).
    pub events_max_subscribers: usize,
    /// The monitor binary (`sandboxd-monitor`); default: `$SANDBOXD_MONITOR`, else next to the
    /// running executable, else in PATH.
    pub monitor_path: Option<PathBuf>,
    /// The static pause binary (`sandboxd-pause`); default: `$SANDBOXD_PAUSE`, else next to the
    /// running executable, else in PATH.
    pub pause_path: Option<PathBuf>,
    /// When a pod gets an infra (pause) process.
    pub infra: InfraPolicy,
    /// Size of each pod's /dev/shm tmpfs in bytes.
    pub shm_size: u64,
    /// cgroup parent of the pod cgroups the daemon makes when a pod config names none. Empty
    /// (the default): `/sandboxd` with the default state root, `/sandboxd-<tag of the root>`
    /// with any other, so that daemons with their own roots never share one.
    pub cgroup_parent: String,
    /// `auto` (the default), `systemd` or `cgroupfs`. With systemd, a pod's parent is a slice
    /// (kubelet's `…/kubepods-burstable-pod<uid>.slice`), each container a scope the OCI
    /// runtime makes (`--systemd-cgroup`), and a pod that names none gets
    /// `<cgroup_parent's name>-pod<id>.slice` (default `sandboxd-pod<id>.slice`).
    pub cgroup_driver: CgroupDriver,
    /// Grace after the stop signal before SIGKILL for containers StopPodSandbox finds still
    /// running; 0 (the default): SIGKILL at once, as `api.proto` asks ("forcibly terminated")
    /// and containerd does — kubelet has stopped them gracefully before.
    #[serde(with = "secs")]
    pub stop_grace: Duration,
    /// How old a container's measured writable-layer use may get before it is measured again
    /// in the background (containerd's `stats_collect_period`); stats report the value with
    /// the time it was measured. Seconds in the config file.
    #[serde(with = "secs")]
    pub stats_collect_period: Duration,
    /// Run the OCI runtime (runc, crun; not a handler with a sandbox process of its own) in a
    /// mount namespace of its own that lacks the other pods' mounts, so its calls cost the
    /// same at 1000 pods as at 10 (`oci::RuntimeMountNs`). Off: the host's namespace.
    pub runtime_mount_ns: bool,
    /// Per-registry pull settings (mirrors, plain HTTP), keyed by registry host[:port].
    /// A registry named here takes only these settings; one not named here takes them from
    /// `registry_files` (containerd's hosts.toml dirs, then containers-registries.conf).
    pub registries: BTreeMap<String, RegistryConfig>,
    /// The registry configuration files operators keep for containerd and CRI-O, read at
    /// each pull (`image::hosts_toml`, `image::registries_conf`, `image::auth_file`).
    pub registry_files: RegistryFilesConfig,
    /// The image store: limits per layer, the free-space reserve, whether compressed layer
    /// blobs are kept, concurrent downloads per pull.
    pub images: StoreConfig,
    /// The streaming server (exec, port-forward URLs) the daemon runs.
    pub streaming: StreamingConfig,
    /// Where containers' writable layers live, when not in their dir under `root` — e.g. a
    /// filesystem of their own, apart from the images (KEP-4191's split image filesystem:
    /// `ImageFsInfo` then reports it in `container_filesystems`). Pods with their own user
    /// namespace keep theirs under `root` (the layer is idmapped with the rootfs).
    pub container_storage_root: Option<PathBuf>,
    /// Where CDI spec files are read from, in priority order (a device defined in a later dir
    /// wins); containerd's and CRI-O's default.
    pub cdi_spec_dirs: Vec<PathBuf>,
    /// A pull that makes no progress (no byte, no layer moving on) for this many seconds is
    /// cancelled, and everyone waiting for it told why; 0: never (containerd's default: 5 min).
    pub image_pull_progress_timeout: u64,
    /// NRI: node plugins that see and adjust pods and containers (`[nri]`).
    pub nri: NriConfig,
    /// The self-audit (`[audit]`): how often, and whether it removes what it finds.
    pub audit: AuditConfig,
}

/// `[audit]`: the daemon compares the host with its records every `interval` seconds (0:
/// only when asked, by `sandboxctl doctor`) and publishes the orphans as metrics; with `fix`
/// it also removes those at least `grace` seconds old.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuditConfig {
    /// Seconds between audits; 0 turns the periodic audit off.
    pub interval: u64,
    /// Remove the orphans each periodic audit finds (off: only `sandboxctl doctor --fix` does).
    pub fix: bool,
    /// How old (seconds since the object last changed) an orphan must be to be removed.
    pub grace: u64,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            interval: 600,
            fix: false,
            grace: 600,
        }
    }
}

/// NRI settings (`[nri]` in the config file; the peers' names and defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NriConfig {
    /// Whether plugins are served at all (on by default, as in containerd 2 and CRI-O).
    pub enable: bool,
    /// The socket external plugins connect to.
    pub socket_path: PathBuf,
    /// Pre-installed plugins (`NN-name` executables), started by the daemon.
    pub plugin_path: PathBuf,
    /// Their configuration files (`NN-name.conf` or `name.conf`).
    pub plugin_config_path: PathBuf,
    /// A plugin must register within this many seconds of connecting or being started, and
    /// answer each part of its Synchronize within as many.
    #[serde(with = "secs")]
    pub plugin_registration_timeout: Duration,
    /// Each request to a plugin must be answered within this many seconds; past it the
    /// plugin is disconnected and the operation goes on without it.
    #[serde(with = "secs")]
    pub plugin_request_timeout: Duration,
    /// Serve no socket: only pre-installed plugins.
    pub disable_connections: bool,
    /// The most plugins connected at once; more are refused.
    pub max_plugins: usize,
}

impl Default for NriConfig {
    fn default() -> Self {
        NriConfig {
            enable: true,
            socket_path: PathBuf::from("/var/run/nri/nri.sock"),
            plugin_path: PathBuf::from("/opt/nri/plugins"),
            plugin_config_path: PathBuf::from("/etc/nri/conf.d"),
            plugin_registration_timeout: Duration::from_secs(5),
            plugin_request_timeout: Duration::from_secs(2),
            disable_connections: false,
            max_plugins: 32,
        }
    }
}

mod secs {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let v = f64::deserialize(d)?;
        Duration::try_from_secs_f64(v).map_err(serde::de::Error::custom)
    }
}

impl Default for Config {
    /// Data only: nothing is looked up or run here (binaries are found, and the host probed,
    /// when the runtime starts).
    fn default() -> Self {
        let handler = |name: &str| RuntimeHandler {
            path: PathBuf::from(name),
            ..Default::default()
        };
        let runtimes = BTreeMap::from([
            ("runc".to_string(), handler("runc")),
            ("crun".to_string(), handler("crun")),
            (
                "runsc".to_string(),
                RuntimeHandler {
                    // ptrace: KVM needs nested virtualisation, which many hosts lack.
                    runtime_args: vec!["--platform=ptrace".into()],
                    ..handler("runsc")
                },
            ),
        ]);
        Config {
            root: PathBuf::from("/var/lib/sandboxd"),
            netns_dir: PathBuf::from("/var/run/netns"),
            ipcns_dir: PathBuf::from("/var/run/ipcns"),
            utsns_dir: PathBuf::from("/var/run/utsns"),
            userns_dir: PathBuf::from("/var/run/userns"),
            cni_conf_dir: PathBuf::from("/etc/cni/net.d"),
            cni_bin_dirs: vec![PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")],
            cni_plugin_timeout: Duration::from_secs(60),
            default_network: DefaultNetwork::default(),
            cni_del_max_attempts: 10,
            default_runtime: "runc".into(),
            runtimes,
            runtime_timeout: Duration::from_secs(60),
            exec_sync_output_budget: 24 << 20,
            exec_sync_max_per_container: 16,
            exec_sync_max: 128,
            events_backlog: 1024,
            events_backlog_bytes: 64 << 20,
            events_max_subscribers: 32,
            monitor_path: std::env::var_os("SANDBOXD_MONITOR").map(PathBuf::from),
            pause_path: std::env::var_os("SANDBOXD_PAUSE").map(PathBuf::from),
            infra: InfraPolicy::Auto,
            shm_size: 64 * 1024 * 1024,
            cgroup_parent: String::new(),
            cgroup_driver: CgroupDriver::Auto,
            stop_grace: Duration::ZERO,
            stats_collect_period: DEFAULT_STATS_PERIOD,
            runtime_mount_ns: true,
            registries: BTreeMap::new(),
            registry_files: RegistryFilesConfig::default(),
            images: Default::default(),
            streaming: Default::default(),
            container_storage_root: None,
            cdi_spec_dirs: vec![PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")],
            image_pull_progress_timeout: 300,
            nri: NriConfig::default(),
            audit: AuditConfig::default(),
        }
    }
}

impl Config {
    /// The parent of the pod cgroups the daemon makes: `cgroup_parent`, or when that is empty
    /// `/sandboxd` for the default state root and `/sandboxd-<8 hex of the root's path>` for
    /// any other.
    pub fn effective_cgroup_parent(&self) -> String {
        if !self.cgroup_parent.is_empty() {
            return self.cgroup_parent.clone();
        }
        if self.root == Config::default().root {
            return "/sandboxd".into();
        }
        format!(
            "/sandboxd-{}",
            crate::state::short_hash(&self.root.to_string_lossy())
        )
    }

    /// Every dir namespaces are pinned in.
    pub fn namespace_dirs(&self) -> [&PathBuf; 4] {
        [
            &self.netns_dir,
            &self.ipcns_dir,
            &self.utsns_dir,
            &self.userns_dir,
        ]
    }

    /// A config whose every host path lives under `base` (state root, namespace dirs,
    /// default-network IPAM), for tests and for several daemons on one host.
    pub fn rooted_at(base: &Path) -> Self {
        Config {
            root: base.join("root"),
            netns_dir: base.join("netns"),
            ipcns_dir: base.join("ipcns"),
            utsns_dir: base.join("utsns"),
            userns_dir: base.join("userns"),
            cni_conf_dir: base.join("cni-conf"),
            cdi_spec_dirs: vec![base.join("cdi")],
            registry_files: RegistryFilesConfig {
                hosts_dirs: vec![base.join("certs.d")],
                registries_conf: Some(base.join("registries.conf")),
                registries_conf_d: Some(base.join("registries.conf.d")),
                global_auth_file: None,
                signature_policy: Some(base.join("policy.json")),
            },
            nri: NriConfig {
                socket_path: base.join("nri/nri.sock"),
                plugin_path: base.join("nri/plugins"),
                plugin_config_path: base.join("nri/conf.d"),
                ..NriConfig::default()
            },
            ..Config::default()
        }
    }

    /// Finds a helper binary: the configured path, else next to the running executable (and
    /// its parent dir, for test binaries under `target/*/deps`), else in PATH.
    pub fn helper_path(configured: &Option<PathBuf>, name: &str) -> Option<PathBuf> {
        if let Some(p) = configured {
            return Some(p.clone());
        }
        if let Ok(exe) = std::env::current_exe() {
            let mut dir = exe.parent().map(Path::to_path_buf);
            for _ in 0..2 {
                if let Some(d) = &dir {
                    let c = d.join(name);
                    if c.is_file() {
                        return Some(c);
                    }
                    dir = d.parent().map(Path::to_path_buf);
                }
            }
        }
        find_in_path(name)
    }
}

/// Looks a program up in `$PATH` (plus the sbin dirs root's PATH may lack).
pub fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// How often a container's writable-layer use is measured at most, by default.
pub const DEFAULT_STATS_PERIOD: Duration = Duration::from_secs(10);

/// Store settings (`[images]` in the config file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StoreConfig {
    /// Most bytes of one uncompressed layer.
    pub max_layer_bytes: u64,
    /// Most entries (files, dirs, links) in one layer.
    pub max_layer_entries: u64,
    /// Pulls and imports stop once the store's filesystem has less than this many bytes free.
    pub min_free_bytes: u64,
    /// Keep each layer's compressed blob while its image exists (only the unpacked layer is
    /// needed to run containers; the blob costs the image's compressed size again).
    pub keep_layer_blobs: bool,
    /// Layers downloaded at once per pull (6, as CRI-O's containers/image; containerd's is 3):
    /// an image of many small layers is bound by each layer's round trips more than by bytes.
    pub max_concurrent_downloads: usize,
    /// Pulls of distinct images at once; more wait their turn (a waiting pull whose callers
    /// all leave is dropped from the queue). Each running pull costs a registry client,
    /// connections and unpack threads.
    pub max_concurrent_pulls: usize,
    /// Range requests at once per large layer, where the registry answers them (the part
    /// being read and those fetched ahead of it, as containerd 2.1's multipart fetch); 1 (the
    /// default, as containerd's): one GET per layer. Worth it where one stream cannot fill the
    /// link (a far registry, object storage); from a near registry it only costs (each part
    /// is a request the registry serves; `bench/RESULTS.md`, multi-GB pulls).
    pub range_parts: usize,
    /// Bytes per range request (64 KiB at least); a layer under two parts is fetched with one GET.
    pub range_part_bytes: u64,
    /// Most bytes of parts fetched ahead and held in memory, over all pulls together (a part
    /// that does not fit is fetched when it is read).
    pub range_buffer_bytes: u64,
    /// An unpacked layer's files are on disk (`syncfs`) before the store names the layer, so
    /// a power cut right after PullImage answers cannot leave the image with empty files
    /// (containerd's `image_pull_with_sync_fs`, off there by default). On by default: it
    /// costs a pull the time the disk takes to write the unpacked bytes (`bench/RESULTS.md`,
    /// image pulls); off only where nodes are rebuilt rather than rebooted after a crash.
    pub sync_layers: bool,
    /// eStargz layers (those whose manifest entry names their TOC digest) are mounted from a
    /// FUSE filesystem of their own instead of downloaded first: PullImage answers once each
    /// TOC is read and verified, files are fetched by range request as they are read (each
    /// chunk checked against the TOC's digest), and the rest of the layer is fetched in the
    /// background, then unpacked as any other layer for the containers created after
    /// (`image/lazy/`). Layers that are not eStargz, and registries that ignore range
    /// requests, take the full pull. Off by default.
    pub lazy_pull: bool,
    /// The binary that serves a lazy layer (`sandboxd lazyfs`); default: `$SANDBOXD_LAZYFS`,
    /// else the `sandboxd` next to the running executable, else in PATH.
    pub lazy_helper: Option<PathBuf>,
    /// A lazy layer's read waits at most this long for one range request (then retries,
    /// twice; then the read fails with EIO and a log line names the layer).
    pub lazy_fetch_timeout_seconds: u64,
    /// A lazy layer's background fetch of the rest starts this long after it is mounted
    /// (the container's own first reads have the link to themselves meanwhile).
    pub lazy_background_delay_seconds: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            max_layer_bytes: 20 << 30,
            max_layer_entries: 1_000_000,
            min_free_bytes: 256 << 20,
            keep_layer_blobs: false,
            max_concurrent_downloads: 6,
            max_concurrent_pulls: 16,
            range_parts: 1,
            range_part_bytes: 4 << 20,
            range_buffer_bytes: 32 << 20,
            sync_layers: true,
            lazy_pull: false,
            lazy_helper: std::env::var_os("SANDBOXD_LAZYFS").map(PathBuf::from),
            lazy_fetch_timeout_seconds: 30,
            lazy_background_delay_seconds: 0,
        }
    }
}

/// Per-registry settings (`[registries."host:port"]` in the config file).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RegistryConfig {
    /// Endpoints tried before the registry itself, e.g. `http://127.0.0.1:5001` or
    /// `https://mirror.example`; the repository path is kept.
    pub mirrors: Vec<String>,
    /// Plain HTTP allowed: HTTPS is tried first, then HTTP (as Docker does for insecure
    /// registries; loopback registries are treated as insecure).
    pub insecure: bool,
    /// A PEM file of CA certificates trusted for this registry and its mirrors (besides the
    /// system's roots).
    pub ca_file: Option<PathBuf>,
}

/// Registry settings read from the files containerd and CRI-O read (`[registry_files]`).
/// For an image on registry `R` not named in `[registries]`, the first of these that speaks
/// for `R` decides its endpoints: a `R/hosts.toml` in one of `hosts_dirs` (then
/// `_default/hosts.toml`), else the longest matching `[[registry]]` prefix of
/// `registries_conf` and the `.conf` files of `registries_conf_d`. A file or dir that does
/// not exist is skipped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RegistryFilesConfig {
    /// containerd's registry host dirs (its `config_path`), in order: `<dir>/<host[:port]>/
    /// hosts.toml` with `server`, `[host."URL"]` `capabilities`, `ca`, `skip_verify`,
    /// `override_path`. Empty: none are read.
    pub hosts_dirs: Vec<PathBuf>,
    /// A containers-registries.conf v2 file (CRI-O, podman): `[[registry]]` `prefix`,
    /// `location`, `insecure`, `blocked`, `[[registry.mirror]]` `location`, `insecure`,
    /// `pull-from-mirror`. None: not read.
    pub registries_conf: Option<PathBuf>,
    /// Its drop-in dir: `*.conf` read after the file, in name order; a `[[registry]]` with a
    /// prefix seen before replaces the earlier one.
    pub registries_conf_d: Option<PathBuf>,
    /// A docker `config.json` of credentials (`auths`: `auth`, or `username` and `password`)
    /// for pulls whose request carries none (CRI-O's `global_auth_file`); each goes only to
    /// the registry or mirror host it is keyed by. None: not read.
    pub global_auth_file: Option<PathBuf>,
    /// A containers-policy.json (CRI-O's `signature_policy`): which images a pull accepts,
    /// refuses, or accepts only with a sigstore signature by a key it names. None, or no
    /// such file: every image is accepted.
    pub signature_policy: Option<PathBuf>,
}

impl Default for RegistryFilesConfig {
    fn default() -> Self {
        RegistryFilesConfig {
            hosts_dirs: vec![
                PathBuf::from("/etc/containerd/certs.d"),
                PathBuf::from("/etc/docker/certs.d"),
            ],
            registries_conf: Some(PathBuf::from("/etc/containers/registries.conf")),
            registries_conf_d: Some(PathBuf::from("/etc/containers/registries.conf.d")),
            global_auth_file: None,
            signature_policy: Some(PathBuf::from("/etc/containers/policy.json")),
        }
    }
}

/// How long an issued URL stays valid by default (kubelet's streaming cache uses one minute too).
pub const TOKEN_TTL: std::time::Duration = std::time::Duration::from_secs(60);

/// Streaming server settings (`[streaming]` in the config file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StreamingConfig {
    /// Address to listen on; port 0 picks a free one.
    pub address: String,
    /// A session with no traffic in either direction for this long is closed.
    pub idle_timeout_secs: u64,
    /// A client that stops reading our output for this long (everything it has not read
    /// yet is held in a fixed per-session buffer meanwhile) has its session closed.
    pub write_timeout_secs: u64,
    /// Sessions running at once; more are refused with 503.
    pub max_sessions: usize,
    /// Connections open at once (before and during their sessions); more are closed at
    /// once. Never more than a quarter of the daemon's file descriptor limit, so the CRI
    /// socket always has descriptors left.
    pub max_connections: usize,
    /// Connections open at once from one client address.
    pub max_connections_per_ip: usize,
    /// A client must send its whole request header within this many seconds.
    pub header_timeout_secs: u64,
    /// How long an issued URL stays valid (it is also valid only once).
    pub token_ttl_secs: u64,
    /// Serve HTTPS with this PEM certificate chain and key (both or neither).
    pub tls_cert_file: Option<PathBuf>,
    /// The PEM private key of `tls_cert_file`.
    pub tls_key_file: Option<PathBuf>,
}

impl Default for StreamingConfig {
    fn default() -> Self {
        StreamingConfig {
            address: "127.0.0.1:0".into(),
            idle_timeout_secs: 4 * 3600,
            write_timeout_secs: 300,
            max_sessions: 256,
            max_connections: 1024,
            max_connections_per_ip: 256,
            header_timeout_secs: 10,
            token_ttl_secs: TOKEN_TTL.as_secs(),
            tls_cert_file: None,
            tls_key_file: None,
        }
    }
}
