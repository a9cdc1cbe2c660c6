//! The OCI spec of an application container, from the CRI `ContainerConfig`, the image config
//! and the sandbox. Validation ([`validate`]) runs before anything is created; the spec is
//! assembled as JSON and parsed into `oci_spec`'s `Spec`, so what runc reads went through
//! the spec's own types.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;

use serde_json::{json, Value};

use super::{ContainerConfig, Propagation, Seccomp};
use crate::error::{Error, Result};
use crate::image::ExecConfig;
use crate::oci::spec::{DEFAULT_CAPABILITIES, DEFAULT_PATH};

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

/// Syscalls the `RuntimeDefault` seccomp profile refuses with EPERM: the ones Docker's and
/// containerd's default profiles keep from unprivileged containers (kernel modules, kexec,
/// clock setting, mount and namespace manipulation, keyrings, tracing other processes, bpf…).
const DENIED_SYSCALLS: &[&str] = &[
    "acct",
    "add_key",
    "bpf",
    "clock_adjtime",
    "clock_settime",
    "create_module",
    "delete_module",
    "finit_module",
    "fsconfig",
    "fsmount",
    "fsopen",
    "fspick",
    "get_kernel_syms",
    "init_module",
    "ioperm",
    "iopl",
    "kcmp",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "lookup_dcookie",
    "mount",
    "move_mount",
    "name_to_handle_at",
    "nfsservctl",
    "open_by_handle_at",
    "open_tree",
    "perf_event_open",
    "pivot_root",
    "process_vm_readv",
    "process_vm_writev",
    "ptrace",
    "query_module",
    "quotactl",
    "reboot",
    "request_key",
    "setns",
    "settimeofday",
    "stime",
    "swapoff",
    "swapon",
    "_sysctl",
    "sysfs",
    "umount",
    "umount2",
    "unshare",
    "uselib",
    "userfaultfd",
    "ustat",
    "vm86",
    "vm86old",
];

fn invalid(msg: String) -> Error {
    Error::InvalidArgument(msg)
}

fn clean_abs(field: &str, p: &str) -> Result<()> {
    let path = Path::new(p);
    if !path.is_absolute()
        || path
            .components()
            .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
        || p.contains('\0')
    {
        return Err(invalid(format!(
            "{field} {p:?} must be an absolute path without \".\" or \"..\""
        )));
    }
    Ok(())
}

/// Parses a capability name as CRI carries it (`NET_RAW` or `CAP_NET_RAW`, any case).
pub fn parse_capability(field: &str, name: &str) -> Result<caps::Capability> {
    let upper = name.to_ascii_uppercase();
    let full = if upper.starts_with("CAP_") {
        upper
    } else {
        format!("CAP_{upper}")
    };
    caps::Capability::from_str(&full)
        .map_err(|_| invalid(format!("{field}: unknown capability {name:?}")))
}

/// Checks the whole config before anything on the host is touched; every message names the
/// field.
pub fn validate(c: &ContainerConfig) -> Result<()> {
    crate::validate::name("metadata.name", &c.metadata.name)?;
    if c.image.is_empty() {
        return Err(invalid("image.image must not be empty".into()));
    }
    if !c.working_dir.is_empty() {
        clean_abs("working_dir", &c.working_dir)?;
    }
    for (k, _) in &c.envs {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(invalid(format!("envs: bad variable name {k:?}")));
        }
    }
    for m in &c.mounts {
        clean_abs("mounts.container_path", &m.container_path)?;
        clean_abs("mounts.host_path", &m.host_path)?;
    }
    for d in &c.devices {
        clean_abs("devices.container_path", &d.container_path)?;
        clean_abs("devices.host_path", &d.host_path)?;
        if d.permissions.is_empty() || !d.permissions.chars().all(|p| "rwm".contains(p)) {
            return Err(invalid(format!(
                "devices.permissions {:?} must be made of r, w and m",
                d.permissions
            )));
        }
    }
    if !c.log_path.is_empty() {
        let p = Path::new(&c.log_path);
        if p.is_absolute() || p.components().any(|c| !matches!(c, Component::Normal(_))) {
            return Err(invalid(format!(
                "log_path {:?} must be relative to the pod's log directory, without \"..\"",
                c.log_path
            )));
        }
    }
    let s = &c.security;
    for n in &s.add_capabilities {
        if !n.eq_ignore_ascii_case("ALL") {
            parse_capability("security_context.capabilities.add_capabilities", n)?;
        }
    }
    for n in &s.drop_capabilities {
        if !n.eq_ignore_ascii_case("ALL") {
            parse_capability("security_context.capabilities.drop_capabilities", n)?;
        }
    }
    if s.run_as_user
        .is_some_and(|u| !(0..=u32::MAX as i64).contains(&u))
        || s.run_as_group
            .is_some_and(|g| !(0..=u32::MAX as i64).contains(&g))
        || s.supplemental_groups
            .iter()
            .any(|g| !(0..=u32::MAX as i64).contains(g))
    {
        return Err(invalid(
            "security_context: user and group ids must be in 0..=4294967295".into(),
        ));
    }
    if s.run_as_user.is_some() && !s.run_as_username.is_empty() {
        return Err(invalid(
            "security_context: run_as_user and run_as_username are mutually exclusive".into(),
        ));
    }
    if s.run_as_group.is_some() && s.run_as_user.is_none() && s.run_as_username.is_empty() {
        return Err(invalid(
            "security_context.run_as_group needs run_as_user or run_as_username".into(),
        ));
    }
    if s.pid == crate::NamespaceMode::Target && s.target_id.is_empty() {
        return Err(invalid(
            "security_context.namespace_options: pid TARGET needs target_id".into(),
        ));
    }
    if let Seccomp::Localhost(p) = &s.seccomp {
        clean_abs("security_context.seccomp.localhost_ref", p)?;
    }
    validate_resources(&c.resources)
}

/// Checks resource limits (CreateContainer and UpdateContainerResources).
pub fn validate_resources(r: &super::Resources) -> Result<()> {
    if r.cpu_period < 0 || r.cpu_shares < 0 || r.memory_limit_in_bytes < 0 {
        return Err(invalid(
            "resources: cpu_period, cpu_shares and memory_limit_in_bytes must not be negative"
                .into(),
        ));
    }
    if r.cpu_quota > 0 && r.cpu_quota < 1000 {
        return Err(invalid(format!(
            "resources.cpu_quota {} is below the kernel's minimum of 1000",
            r.cpu_quota
        )));
    }
    if !(-1000..=1000).contains(&r.oom_score_adj) {
        return Err(invalid(format!(
            "resources.oom_score_adj {} is outside -1000..=1000",
            r.oom_score_adj
        )));
    }
    Ok(())
}

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

/// The capability set of the process.
pub fn capabilities(c: &ContainerConfig) -> Result<BTreeSet<String>> {
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
    let last = caps::read(None, caps::CapSet::Bounding)
        .unwrap_or_else(|_| caps::runtime::thread_all_supported());
    Ok(set
        .into_iter()
        .filter(|c| last.contains(c))
        .map(|c| c.to_string()) // `CAP_…`, the OCI name
        .collect())
}

/// The resolved user of the process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
    pub additional_gids: Vec<u32>,
}

/// Reads a file of the image's rootfs without following symlinks (an image could point
/// `/etc/passwd` at a host file).
fn rootfs_file(rootfs: &Path, rel: &str) -> Option<String> {
    let mut p = rootfs.to_path_buf();
    for part in rel.split('/') {
        p.push(part);
        let m = std::fs::symlink_metadata(&p).ok()?;
        if m.file_type().is_symlink() {
            return None;
        }
    }
    std::fs::read_to_string(p).ok()
}

struct Passwd {
    name: String,
    uid: u32,
    gid: u32,
}

fn passwd(rootfs: &Path) -> Vec<Passwd> {
    rootfs_file(rootfs, "etc/passwd")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            Some(Passwd {
                name: f.first()?.to_string(),
                uid: f.get(2)?.parse().ok()?,
                gid: f.get(3)?.parse().ok()?,
            })
        })
        .collect()
}

/// `(name, gid, members)` of /etc/group.
fn groups(rootfs: &Path) -> Vec<(String, u32, Vec<String>)> {
    rootfs_file(rootfs, "etc/group")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            Some((
                f.first()?.to_string(),
                f.get(2)?.parse().ok()?,
                f.get(3)
                    .map(|m| {
                        m.split(',')
                            .filter(|s| !s.is_empty())
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default(),
            ))
        })
        .collect()
}

/// Resolves the user: `run_as_username` in the image's /etc/passwd, or `run_as_user`, or the
/// image's `USER` (`name|uid[:group|gid]`); the group from `run_as_group`, the passwd entry
/// or 0; supplementary groups from /etc/group plus `supplemental_groups`.
pub fn resolve_user(c: &ContainerConfig, image: &ExecConfig, rootfs: &Path) -> Result<User> {
    let s = &c.security;
    let users = passwd(rootfs);
    let by_name = |n: &str, field: &str| {
        users
            .iter()
            .find(|p| p.name == n)
            .map(|p| (p.uid, Some(p.gid)))
            .ok_or_else(|| {
                invalid(format!(
                    "{field}: user {n:?} is not in the image's /etc/passwd"
                ))
            })
    };
    let (uid, mut gid, group_spec) = if !s.run_as_username.is_empty() {
        let (u, g) = by_name(&s.run_as_username, "security_context.run_as_username")?;
        (u, g, None)
    } else if let Some(u) = s.run_as_user {
        let u = u as u32;
        (u, users.iter().find(|p| p.uid == u).map(|p| p.gid), None)
    } else {
        let (user, group) = match image.user.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (image.user.as_str(), None),
        };
        let (u, g) = if user.is_empty() {
            (0, Some(0))
        } else if let Ok(u) = user.parse::<u32>() {
            (u, users.iter().find(|p| p.uid == u).map(|p| p.gid))
        } else {
            by_name(user, "image config User")?
        };
        (u, g, group.filter(|g| !g.is_empty()))
    };
    let all_groups = groups(rootfs);
    if let Some(g) = group_spec {
        gid = Some(match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => all_groups
                .iter()
                .find(|(n, _, _)| n == g)
                .map(|(_, id, _)| *id)
                .ok_or_else(|| {
                    invalid(format!(
                        "image config User: group {g:?} is not in /etc/group"
                    ))
                })?,
        });
    }
    if let Some(g) = s.run_as_group {
        gid = Some(g as u32);
    }
    let name = users.iter().find(|p| p.uid == uid).map(|p| p.name.clone());
    let mut additional: Vec<u32> = name
        .map(|n| {
            all_groups
                .iter()
                .filter(|(_, _, m)| m.contains(&n))
                .map(|(_, id, _)| *id)
                .collect()
        })
        .unwrap_or_default();
    additional.extend(s.supplemental_groups.iter().map(|g| *g as u32));
    additional.sort_unstable();
    additional.dedup();
    Ok(User {
        uid,
        gid: gid.unwrap_or(0),
        additional_gids: additional,
    })
}

/// The RuntimeDefault seccomp profile: allow everything but [`DENIED_SYSCALLS`] (EPERM).
pub fn runtime_default_seccomp() -> Value {
    json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "syscalls": [{
            "names": DENIED_SYSCALLS,
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": 1
        }]
    })
}

/// Loads a `Localhost` profile: an OCI seccomp object (Docker's profile format is accepted;
/// fields the OCI spec lacks are ignored).
pub fn localhost_seccomp(path: &str) -> Result<Value> {
    let data = std::fs::read(path).map_err(|e| {
        invalid(format!(
            "security_context.seccomp: cannot read profile {path}: {e}"
        ))
    })?;
    let mut v: Value = serde_json::from_slice(&data).map_err(|e| {
        invalid(format!(
            "security_context.seccomp: profile {path} is not JSON: {e}"
        ))
    })?;
    if let Some(o) = v.as_object_mut() {
        o.remove("archMap");
        o.remove("defaultErrno");
    }
    serde_json::from_value::<oci_spec::runtime::LinuxSeccomp>(v.clone()).map_err(|e| {
        invalid(format!(
            "security_context.seccomp: profile {path} is not a seccomp profile: {e}"
        ))
    })?;
    Ok(v)
}

/// The OCI `LinuxResources` (cpu and memory) of a CRI resources message.
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
    if r.memory_limit_in_bytes > 0 {
        out["memory"] = json!({"limit": r.memory_limit_in_bytes});
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
    /// `(type, path)`: path `None` = a new namespace of that type.
    pub namespaces: Vec<(&'static str, Option<PathBuf>)>,
    /// The sandbox's shm (None = host IPC: the host's /dev/shm).
    pub shm: Option<PathBuf>,
    pub host_network: bool,
    pub sandbox_dir: &'a Path,
    pub oom_score_adj: i32,
    pub seccomp: Option<Value>,
    pub devices: Vec<DeviceNode>,
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

fn mnt(dest: &str, typ: &str, source: &str, options: &[&str]) -> Value {
    json!({"destination": dest, "type": typ, "source": source, "options": options})
}

/// Builds the spec.
pub fn build(i: &Inputs) -> Result<oci_spec::runtime::Spec> {
    let c = i.config;
    let s = &c.security;
    let caps: Vec<String> = capabilities(c)?.into_iter().collect();
    let args = args(c, i.image)?;
    let cwd = if !c.working_dir.is_empty() {
        c.working_dir.clone()
    } else if !i.image.working_dir.is_empty() {
        i.image.working_dir.clone()
    } else {
        "/".to_string()
    };
    let user_mount_at = |d: &str| c.mounts.iter().any(|m| m.container_path == d);
    let mut mounts: Vec<Value> = crate::oci::spec::standard_mounts(!i.host_network, s.privileged)
        .into_iter()
        .map(|(dest, typ, src, opts)| mnt(dest, typ, src, &opts))
        .collect();
    let shm = i
        .shm
        .clone()
        .unwrap_or_else(|| PathBuf::from("/dev/shm"))
        .to_string_lossy()
        .into_owned();
    mounts.push(mnt(
        "/dev/shm",
        "bind",
        &shm,
        &["rbind", "nosuid", "nodev", "noexec"],
    ));
    let etc_mode = if s.readonly_rootfs { "ro" } else { "rw" };
    for (dest, file) in [
        ("/etc/hosts", "hosts"),
        ("/etc/resolv.conf", "resolv.conf"),
        ("/etc/hostname", "hostname"),
    ] {
        if !user_mount_at(dest) {
            let src = i.sandbox_dir.join(file).to_string_lossy().into_owned();
            mounts.push(mnt(
                dest,
                "bind",
                &src,
                &["rbind", "rprivate", "nosuid", "nodev", "noexec", etc_mode],
            ));
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
        mounts.retain(|x| x["destination"] != m.container_path.as_str());
        mounts.push(mnt(
            &m.container_path,
            "bind",
            &m.host_path,
            &["rbind", prop, if m.readonly { "ro" } else { "rw" }],
        ));
    }

    let namespaces: Vec<Value> = i
        .namespaces
        .iter()
        .map(|(t, p)| match p {
            Some(p) => json!({"type": t, "path": p}),
            None => json!({"type": t}),
        })
        .collect();
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
        "namespaces": namespaces,
        "cgroupsPath": i.cgroup,
        "resources": resources,
        "devices": devices,
        "maskedPaths": masked,
        "readonlyPaths": readonly,
    });
    if let Some(sc) = &i.seccomp {
        linux["seccomp"] = sc.clone();
    }
    let mut annotations: serde_json::Map<String, Value> = c
        .annotations
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    for (k, v) in [
        ("io.kubernetes.cri.container-type", "container"),
        ("io.kubernetes.cri.sandbox-id", i.sandbox_id),
        ("io.kubernetes.cri.container-name", c.metadata.name.as_str()),
        ("io.kubernetes.cri.image-name", i.image_name),
    ] {
        annotations.insert(k.into(), json!(v));
    }
    let mut spec = json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": c.tty,
            "user": {"uid": i.user.uid, "gid": i.user.gid,
                     "additionalGids": i.user.additional_gids},
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
        let set = capabilities(&c).unwrap();
        assert!(!set.contains("CAP_NET_RAW") && set.contains("CAP_CHOWN"));
        c.security.drop_capabilities = vec!["ALL".into()];
        c.security.add_capabilities = vec!["cap_net_admin".into()];
        assert_eq!(
            capabilities(&c).unwrap().into_iter().collect::<Vec<_>>(),
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

    #[test]
    fn rejects_bad_paths() {
        let mut c = ContainerConfig {
            image: "x".into(),
            ..Default::default()
        };
        c.metadata.name = "n".into();
        c.log_path = "../x.log".into();
        assert!(validate(&c).unwrap_err().to_string().contains("log_path"));
        c.log_path = "n/0.log".into();
        c.mounts = vec![super::super::BindMount {
            container_path: "/a/../etc".into(),
            host_path: "/tmp".into(),
            ..Default::default()
        }];
        assert!(validate(&c)
            .unwrap_err()
            .to_string()
            .contains("mounts.container_path"));
    }

    #[test]
    fn users_from_passwd() {
        let d = std::env::temp_dir().join(format!("sandboxd-spec-{}", std::process::id()));
        std::fs::create_dir_all(d.join("etc")).unwrap();
        std::fs::write(
            d.join("etc/passwd"),
            "root:x:0:0::/:/bin/sh\napp:x:1234:1235::/:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(d.join("etc/group"), "app:x:1235:\nextra:x:77:app\n").unwrap();
        let mut c = ContainerConfig::default();
        c.security.run_as_username = "app".into();
        let u = resolve_user(&c, &ExecConfig::default(), &d).unwrap();
        assert_eq!(
            (u.uid, u.gid, u.additional_gids.clone()),
            (1234, 1235, vec![77])
        );
        c.security.run_as_username.clear();
        c.security.run_as_user = Some(5);
        c.security.supplemental_groups = vec![9];
        let u = resolve_user(&c, &ExecConfig::default(), &d).unwrap();
        assert_eq!((u.uid, u.gid, u.additional_gids), (5, 0, vec![9]));
        let img = ExecConfig {
            user: "app:extra".into(),
            ..Default::default()
        };
        let u = resolve_user(&ContainerConfig::default(), &img, &d).unwrap();
        assert_eq!((u.uid, u.gid), (1234, 77));
        c.security.run_as_user = None;
        c.security.run_as_username = "nobody".into();
        assert!(resolve_user(&c, &ExecConfig::default(), &d).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
