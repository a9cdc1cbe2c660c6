//! The OCI spec of an application container, from the CRI `ContainerConfig`, the image config
//! and the sandbox: validation (`validate.rs`) runs before anything is created, the user is
//! resolved from the image (`user.rs`), seccomp profiles come from `seccomp.rs`; the spec is
//! assembled here as JSON and parsed into `oci_spec`'s `Spec`, so what runc reads went
//! through the spec's own types.

mod seccomp;
mod user;
mod validate;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::{ContainerConfig, Propagation};
use crate::error::{Error, Result};
use crate::image::ExecConfig;
use crate::oci::spec::{self as ocispec, ContainerType, DEFAULT_CAPABILITIES, DEFAULT_PATH};
use oci_spec::runtime::{LinuxNamespace, Mount};
pub(crate) use validate::clean_abs;
use validate::invalid;

pub use seccomp::{
    convert as convert_seccomp, localhost_seccomp, runtime_default_seccomp, Host as SeccompHost,
};

/// This machine, as seccomp profiles' conditions see it.
pub fn seccomp_host() -> SeccompHost {
    SeccompHost::current()
}
pub use user::{resolve_user, User};
pub use validate::{parse_capability, validate, validate_pod_resources, validate_resources};

/// The masked and read-only paths a container gets unless kubelet sends its own lists
/// (the same defaults as containerd and runc's spec template).
pub const DEFAULT_MASKED: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
pub const DEFAULT_READONLY: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The process arguments as Kubernetes defines them: `command` replaces the entrypoint (and
/// drops the image's cmd), `args` replaces the cmd.
pub fn args(c: &ContainerConfig, image: &ExecConfig) -> Result<Vec<String>> {
    let out: Vec<String> = if !c.command.is_empty() {
        c.command.iter().chain(&c.args).cloned().collect()
    } else if !c.args.is_empty() {
        image.entrypoint.iter().chain(&c.args).cloned().collect()
    } else {
        image.entrypoint.iter().chain(&image.cmd).cloned().collect()
    };
    if out.is_empty() {
        return Err(invalid(
            "command: neither the config nor the image names a command".into(),
        ));
    }
    Ok(out)
}

/// The environment: the image's, then the config's (later names win), PATH defaulted.
pub fn env(c: &ContainerConfig, image: &ExecConfig, hostname: &str) -> Vec<String> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut set = |k: &str, v: &str| match out.iter_mut().find(|(n, _)| n == k) {
        Some(e) => e.1 = v.to_string(),
        None => out.push((k.to_string(), v.to_string())),
    };
    set("PATH", &DEFAULT_PATH[5..]);
    if !hostname.is_empty() {
        set("HOSTNAME", hostname);
    }
    for e in &image.env {
        let (k, v) = e.split_once('=').unwrap_or((e, ""));
        set(k, v);
    }
    for (k, v) in &c.envs {
        set(k, v);
    }
    out.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// The capability set of the process; `last`: the highest capability number its runtime knows
/// (`Family::last_capability`), none above it.
pub fn capabilities(c: &ContainerConfig, last: Option<u8>) -> Result<BTreeSet<String>> {
    let s = &c.security;
    let mut set: std::collections::HashSet<caps::Capability> = if s.privileged {
        caps::all().into_iter().collect()
    } else {
        DEFAULT_CAPABILITIES.iter().copied().collect()
    };
    if !s.privileged {
        let all = |v: &[String]| v.iter().any(|n| n.eq_ignore_ascii_case("ALL"));
        if all(&s.add_capabilities) {
            set = caps::all().into_iter().collect();
        }
        if all(&s.drop_capabilities) {
            set.clear();
        }
        for n in s
            .add_capabilities
            .iter()
            .filter(|n| !n.eq_ignore_ascii_case("ALL"))
        {
            set.insert(parse_capability("add_capabilities", n)?);
        }
        for n in s
            .drop_capabilities
            .iter()
            .filter(|n| !n.eq_ignore_ascii_case("ALL"))
        {
            set.remove(&parse_capability("drop_capabilities", n)?);
        }
    }
    // A capability the daemon itself lacks (a kernel that does not know it, or a host whose
    // root runs with a reduced bounding set) cannot be granted: the runtime would fail.
    let bounding = caps::read(None, caps::CapSet::Bounding)
        .unwrap_or_else(|_| caps::runtime::thread_all_supported());
    Ok(set
        .into_iter()
        .filter(|c| bounding.contains(c) && last.is_none_or(|l| c.index() <= l))
        .map(|c| c.to_string()) // `CAP_…`, the OCI name
        .collect())
}

/// The OCI `LinuxResources` (cpu, memory, swap, huge pages, cgroup v2 files) of a CRI
/// resources message.
pub fn resources_json(r: &super::Resources) -> Value {
    let mut cpu = serde_json::Map::new();
    if r.cpu_shares > 0 {
        cpu.insert("shares".into(), json!(r.cpu_shares));
    }
    if r.cpu_quota > 0 {
        cpu.insert("quota".into(), json!(r.cpu_quota));
    }
    if r.cpu_period > 0 {
        cpu.insert("period".into(), json!(r.cpu_period));
    }
    if !r.cpuset_cpus.is_empty() {
        cpu.insert("cpus".into(), json!(r.cpuset_cpus));
    }
    if !r.cpuset_mems.is_empty() {
        cpu.insert("mems".into(), json!(r.cpuset_mems));
    }
    let mut out = json!({ "cpu": cpu });
    let mut memory = serde_json::Map::new();
    if r.memory_limit_in_bytes > 0 {
        memory.insert("limit".into(), json!(r.memory_limit_in_bytes));
    }
    if r.memory_swap_limit_in_bytes > 0 {
        memory.insert("swap".into(), json!(r.memory_swap_limit_in_bytes));
    }
    if !memory.is_empty() {
        out["memory"] = Value::Object(memory);
    }
    if !r.hugepage_limits.is_empty() {
        out["hugepageLimits"] = r
            .hugepage_limits
            .iter()
            .map(|(size, limit)| json!({"pageSize": size, "limit": limit}))
            .collect();
    }
    if !r.unified.is_empty() {
        out["unified"] = json!(r.unified);
    }
    out
}

/// Everything [`build`] needs besides the config.
pub struct Inputs<'a> {
    pub id: &'a str,
    pub sandbox_id: &'a str,
    pub config: &'a ContainerConfig,
    pub image: &'a ExecConfig,
    pub image_name: &'a str,
    pub rootfs: &'a Path,
    pub user: User,
    pub hostname: String,
    pub cgroup: &'a str,
    /// The namespaces, in the order the runtime makes or joins them.
    pub namespaces: Vec<LinuxNamespace>,
    /// The sandbox's shm (None = host IPC: the host's /dev/shm).
    pub shm: Option<PathBuf>,
    pub host_network: bool,
    pub sandbox_dir: &'a Path,
    pub oom_score_adj: i32,
    pub seccomp: Option<Value>,
    pub devices: Vec<DeviceNode>,
    /// The pod's namespaced sysctls (normalized names).
    pub sysctls: std::collections::BTreeMap<String, String>,
    /// AppArmor profile and SELinux label, when the node applies them.
    pub apparmor: Option<String>,
    pub selinux_label: Option<String>,
    /// The maps of the pod's user namespace (joined through `namespaces`).
    pub id_map: Option<&'a crate::model::sandbox::IdMap>,
    /// The highest capability its runtime knows (`Family::last_capability`).
    pub last_capability: Option<u8>,
}

/// A host device node requested by the config, as looked up on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNode {
    pub container_path: String,
    /// `c` or `b`.
    pub typ: String,
    pub major: i64,
    pub minor: i64,
    pub mode: u32,
    /// cgroup access: any of `r`, `w`, `m`.
    pub permissions: String,
}

fn mnt(dest: &str, typ: &str, source: &Path, options: &[&str]) -> Result<Mount> {
    ocispec::mount(dest, typ, source, options).map_err(Error::Host)
}

/// Builds the spec.
pub fn build(i: &Inputs) -> Result<oci_spec::runtime::Spec> {
    let c = i.config;
    let s = &c.security;
    let caps: Vec<String> = capabilities(c, i.last_capability)?.into_iter().collect();
    let args = args(c, i.image)?;
    let cwd = if !c.working_dir.is_empty() {
        c.working_dir.clone()
    } else if !i.image.working_dir.is_empty() {
        i.image.working_dir.clone()
    } else {
        "/".to_string()
    };
    let user_mount_at = |d: &str| c.mounts.iter().any(|m| m.container_path == d);
    let mut mounts: Vec<Mount> =
        ocispec::standard_mounts(s.privileged, i.id_map.is_some() && i.host_network)
            .into_iter()
            .map(|(dest, typ, src, opts)| mnt(dest, typ, Path::new(src), &opts))
            .collect::<Result<_>>()?;
    // No pod shm: the pod is on the host's IPC namespace.
    mounts.push(ocispec::shm_mount(i.shm.as_deref(), true)?);
    let etc_mode = if s.readonly_rootfs { "ro" } else { "rw" };
    for (dest, file) in [
        ("/etc/hosts", "hosts"),
        ("/etc/resolv.conf", "resolv.conf"),
        ("/etc/hostname", "hostname"),
    ] {
        if !user_mount_at(dest) {
            mounts.push(mnt(
                dest,
                "bind",
                &i.sandbox_dir.join(file),
                &["rbind", "rprivate", "nosuid", "nodev", "noexec", etc_mode],
            )?);
        }
    }
    // User mounts last, so they win over the defaults at the same place.
    let mut user_mounts: Vec<&super::BindMount> = c.mounts.iter().collect();
    user_mounts.sort_by_key(|m| Path::new(&m.container_path).components().count());
    for m in user_mounts {
        let prop = match m.propagation {
            Propagation::Private => "rprivate",
            Propagation::HostToContainer => "rslave",
            Propagation::Bidirectional => "rshared",
        };
        // (A recursively read-only mount's source is a read-only tree made for it.)
        mounts.retain(|x| x.destination() != Path::new(&m.container_path));
        let mut options = vec!["rbind", prop, if m.readonly { "ro" } else { "rw" }];
        options.extend(m.mount_options.iter().map(String::as_str));
        mounts.push(mnt(
            &m.container_path,
            "bind",
            Path::new(&m.host_path),
            &options,
        )?);
    }

    let mut dev_rules = vec![json!({"allow": s.privileged, "access": "rwm"})];
    let mut devices = Vec::new();
    for d in &i.devices {
        devices.push(
            json!({"path": d.container_path, "type": d.typ, "major": d.major,
            "minor": d.minor, "fileMode": d.mode, "uid": 0, "gid": 0}),
        );
        dev_rules.push(json!({"allow": true, "type": d.typ, "major": d.major,
            "minor": d.minor, "access": d.permissions}));
    }
    let mut resources = resources_json(&c.resources);
    resources["devices"] = json!(dev_rules);
    let (masked, readonly): (Vec<String>, Vec<String>) = if s.privileged {
        (Vec::new(), Vec::new())
    } else {
        (
            s.masked_paths
                .clone()
                .unwrap_or_else(|| DEFAULT_MASKED.iter().map(|x| x.to_string()).collect()),
            s.readonly_paths
                .clone()
                .unwrap_or_else(|| DEFAULT_READONLY.iter().map(|x| x.to_string()).collect()),
        )
    };
    let mut linux = json!({
        "sysctl": i.sysctls,
        "namespaces": i.namespaces,
        "cgroupsPath": i.cgroup,
        "resources": resources,
        "devices": devices,
        "maskedPaths": masked,
        "readonlyPaths": readonly,
    });
    if let Some(sc) = &i.seccomp {
        linux["seccomp"] = sc.clone();
    }
    if let Some(m) = i.id_map {
        let (uids, gids) = ocispec::id_mappings(m);
        linux["uidMappings"] = json!(uids);
        linux["gidMappings"] = json!(gids);
    }
    // A mount that propagates needs the container's rootfs to propagate as well (as
    // containerd sets it): shared for bidirectional, slave for host-to-container.
    if c.mounts
        .iter()
        .any(|m| m.propagation == Propagation::Bidirectional)
    {
        linux["rootfsPropagation"] = json!("rshared");
    } else if c
        .mounts
        .iter()
        .any(|m| m.propagation == Propagation::HostToContainer)
    {
        linux["rootfsPropagation"] = json!("rslave");
    }
    let mut annotations: serde_json::Map<String, Value> = c
        .annotations
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    let ours = ocispec::pod_annotations(ContainerType::Container, i.sandbox_id);
    for (k, v) in ours.iter().map(|(k, v)| (k.as_str(), v.as_str())).chain([
        ("io.kubernetes.cri.container-name", c.metadata.name.as_str()),
        ("io.kubernetes.cri.image-name", i.image_name),
    ]) {
        annotations.insert(k.into(), json!(v));
    }
    let mut spec = json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": c.tty,
            "user": {"uid": i.user.uid, "gid": i.user.gid,
                     "additionalGids": i.user.additional_gids, "umask": 0o022},
            "args": args,
            "env": env(c, i.image, &i.hostname),
            "cwd": cwd,
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            "noNewPrivileges": s.no_new_privs,
            "oomScoreAdj": i.oom_score_adj,
        },
        "root": {"path": i.rootfs, "readonly": s.readonly_rootfs},
        "mounts": mounts,
        "linux": linux,
        "annotations": annotations,
    });
    if !i.host_network {
        spec["hostname"] = json!(i.hostname);
    }
    if let Some(p) = &i.apparmor {
        spec["process"]["apparmorProfile"] = json!(p);
    }
    if let Some(l) = &i.selinux_label {
        spec["process"]["selinuxLabel"] = json!(l);
    }
    serde_json::from_value(spec)
        .map_err(|e| Error::Host(crate::error::HostError::Other(format!("OCI spec: {e}"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image() -> ExecConfig {
        ExecConfig {
            entrypoint: vec!["/entry".into()],
            cmd: vec!["a".into(), "b".into()],
            env: vec!["PATH=/img/bin".into(), "A=1".into()],
            ..Default::default()
        }
    }

    #[test]
    fn kubernetes_command_merge() {
        let mut c = ContainerConfig::default();
        assert_eq!(args(&c, &image()).unwrap(), ["/entry", "a", "b"]);
        c.args = vec!["x".into()];
        assert_eq!(args(&c, &image()).unwrap(), ["/entry", "x"]);
        c.command = vec!["/cmd".into()];
        assert_eq!(args(&c, &image()).unwrap(), ["/cmd", "x"]);
        c.args.clear();
        assert_eq!(args(&c, &image()).unwrap(), ["/cmd"]);
        assert!(args(&ContainerConfig::default(), &ExecConfig::default()).is_err());
    }

    #[test]
    fn env_image_then_config() {
        let c = ContainerConfig {
            envs: vec![("A".into(), "2".into()), ("B".into(), "3".into())],
            ..Default::default()
        };
        let e = env(&c, &image(), "h");
        assert_eq!(e, ["PATH=/img/bin", "HOSTNAME=h", "A=2", "B=3"]);
    }

    #[test]
    fn capability_add_drop_all() {
        let mut c = ContainerConfig::default();
        c.security.drop_capabilities = vec!["NET_RAW".into()];
        let set = capabilities(&c, None).unwrap();
        assert!(!set.contains("CAP_NET_RAW") && set.contains("CAP_CHOWN"));
        c.security.drop_capabilities = vec!["ALL".into()];
        c.security.add_capabilities = vec!["cap_net_admin".into()];
        assert_eq!(
            capabilities(&c, None)
                .unwrap()
                .into_iter()
                .collect::<Vec<_>>(),
            ["CAP_NET_ADMIN"]
        );
        c.security.add_capabilities = vec!["NOT_A_CAP".into()];
        let e = validate(&ContainerConfig {
            image: "x".into(),
            metadata: super::super::ContainerMetadata {
                name: "n".into(),
                attempt: 0,
            },
            ..c
        })
        .unwrap_err();
        assert!(e.to_string().contains("NOT_A_CAP"), "{e}");
    }
}
