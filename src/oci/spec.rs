//! OCI bundle generation with `oci-spec`: the parts every container's spec shares — the
//! namespaces (typed, one way of naming them), mounts, the pod's id mappings, /dev/shm, the
//! CRI and CRI-O annotations, the standard filesystem — and the infra (pause) container's
//! spec built from them. An application container's spec (`container::spec`) is built from
//! the same parts. The infra rootfs is prepared by the daemon (one static binary,
//! read-only), so no image is needed.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    Capability, LinuxBuilder, LinuxCapabilitiesBuilder, LinuxIdMapping, LinuxIdMappingBuilder,
    LinuxNamespace, LinuxNamespaceBuilder, LinuxNamespaceType, Mount, MountBuilder, ProcessBuilder,
    RootBuilder, Spec, SpecBuilder, UserBuilder,
};

use crate::error::HostError;

/// The capabilities a default container gets (containerd's and CRI-O's default set).
pub const DEFAULT_CAPABILITIES: &[caps::Capability] = &[
    caps::Capability::CAP_CHOWN,
    caps::Capability::CAP_DAC_OVERRIDE,
    caps::Capability::CAP_FSETID,
    caps::Capability::CAP_FOWNER,
    caps::Capability::CAP_MKNOD,
    caps::Capability::CAP_NET_RAW,
    caps::Capability::CAP_SETGID,
    caps::Capability::CAP_SETUID,
    caps::Capability::CAP_SETFCAP,
    caps::Capability::CAP_SETPCAP,
    caps::Capability::CAP_NET_BIND_SERVICE,
    caps::Capability::CAP_SYS_CHROOT,
    caps::Capability::CAP_KILL,
    caps::Capability::CAP_AUDIT_WRITE,
];

/// Converts a capability named by the `caps` crate into the OCI spec's type.
pub fn oci_capability(c: caps::Capability) -> Capability {
    serde_json::from_value(serde_json::Value::String(c.to_string()))
        .expect("every caps::Capability name is an OCI capability name")
}

/// What the infra container needs to know about its pod.
#[derive(Debug, Clone)]
pub struct InfraSpec {
    pub sandbox_id: String,
    /// The pod's name, namespace and uid, as annotations (a VM runtime names its VM by them).
    pub metadata: crate::model::sandbox::PodSandboxMetadata,
    pub rootfs: PathBuf,
    pub hostname: String,
    /// Join this network namespace by path; `None` = the host's (unless `private_netns`).
    pub netns: Option<PathBuf>,
    /// Without `netns`: a new, empty network namespace made by the runtime (the start-up
    /// probe's trial container), not the host's.
    pub private_netns: bool,
    /// Join this user namespace (the pod's, with these maps), which owns `netns`.
    pub userns: Option<(PathBuf, crate::model::sandbox::IdMap)>,
    pub host_ipc: bool,
    pub host_pid: bool,
    /// The pod's shm tmpfs, bound as /dev/shm (None with host IPC).
    pub shm: Option<PathBuf>,
    pub resolv_conf: PathBuf,
    pub hosts: PathBuf,
    pub hostname_file: PathBuf,
    pub cgroups_path: String,
    pub oom_score_adj: i32,
    /// Namespaced sysctls of the pod (normalized names).
    pub sysctls: HashMap<String, String>,
}

/// A namespace the container gets: joined by `path`, or a new one (`None`).
pub(crate) fn namespace(typ: LinuxNamespaceType, path: Option<&Path>) -> LinuxNamespace {
    let b = LinuxNamespaceBuilder::default().typ(typ);
    match path {
        Some(p) => b.path(p.to_path_buf()),
        None => b,
    }
    .build()
    .expect("namespace fields are set")
}

/// One mount of the spec.
pub(crate) fn mount(
    dest: &str,
    typ: &str,
    source: &Path,
    options: &[&str],
) -> Result<Mount, HostError> {
    MountBuilder::default()
        .destination(PathBuf::from(dest))
        .typ(typ.to_string())
        .source(source.to_path_buf())
        .options(options.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .build()
        .map_err(|e| HostError::Other(format!("mount {dest}: {e}")))
}

/// The PATH a process gets when neither the image nor the config sets one.
pub(crate) const DEFAULT_PATH: &str =
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// One mount of the standard container filesystem: destination, type, source, options.
pub(crate) type StdMount = (&'static str, &'static str, &'static str, Vec<&'static str>);

/// The mounts every container gets, as runc's default spec has them: /proc, /dev, /dev/pts,
/// /dev/mqueue, a sysfs of its own (read-only; runc mounts a fresh one in the host's network
/// namespace too, so a host-network container never sees the host's /sys and its cgroup
/// tree read-write) and /sys/fs/cgroup showing only the container's own cgroups, read-only;
/// `writable` (privileged containers) makes the last two read-write. `bind_sys` (a pod with
/// its own user namespace on the node's network, which may not mount a sysfs for a network
/// namespace it does not own) makes /sys a read-only recursive bind of the node's.
pub(crate) fn standard_mounts(writable: bool, bind_sys: bool) -> Vec<StdMount> {
    let mode = if writable { "rw" } else { "ro" };
    let sys = match bind_sys {
        true => (
            "/sys",
            "bind",
            "/sys",
            vec!["rbind", "nosuid", "noexec", "nodev", "ro"],
        ),
        false => (
            "/sys",
            "sysfs",
            "sysfs",
            vec!["nosuid", "noexec", "nodev", mode],
        ),
    };
    vec![
        ("/proc", "proc", "proc", vec!["nosuid", "noexec", "nodev"]),
        (
            "/dev",
            "tmpfs",
            "tmpfs",
            vec!["nosuid", "strictatime", "mode=755", "size=65536k"],
        ),
        (
            "/dev/pts",
            "devpts",
            "devpts",
            vec![
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
                "gid=5",
            ],
        ),
        // Shows the queues of the IPC namespace the container is in: the pod's own, or the
        // host's for host-IPC pods (whose /dev/mqueue may not even be mounted).
        (
            "/dev/mqueue",
            "mqueue",
            "mqueue",
            vec!["nosuid", "noexec", "nodev"],
        ),
        sys,
        (
            "/sys/fs/cgroup",
            "cgroup",
            "cgroup",
            vec!["nosuid", "noexec", "nodev", "relatime", mode],
        ),
    ]
}

/// /dev/shm: the pod's shm tmpfs bound; with host IPC (no pod shm) the host's /dev/shm
/// bound; else (a trial container with neither) a tmpfs of its own.
pub(crate) fn shm_mount(shm: Option<&Path>, host_ipc: bool) -> Result<Mount, HostError> {
    let bind = ["rbind", "nosuid", "nodev", "noexec"];
    match (shm, host_ipc) {
        (Some(shm), _) => mount("/dev/shm", "bind", shm, &bind),
        (None, true) if Path::new("/dev/shm").is_dir() => {
            mount("/dev/shm", "bind", Path::new("/dev/shm"), &bind)
        }
        (None, _) => mount(
            "/dev/shm",
            "tmpfs",
            Path::new("shm"),
            &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        ),
    }
}

/// The uid and gid mappings of a pod's user namespace.
pub(crate) fn id_mappings(
    map: &crate::model::sandbox::IdMap,
) -> (Vec<LinuxIdMapping>, Vec<LinuxIdMapping>) {
    let ranges = |m: &[crate::model::sandbox::IdMapping]| {
        m.iter()
            .map(|r| {
                LinuxIdMappingBuilder::default()
                    .container_id(r.container_id)
                    .host_id(r.host_id)
                    .size(r.length)
                    .build()
                    .expect("id mapping fields are set")
            })
            .collect::<Vec<_>>()
    };
    (ranges(&map.uids), ranges(&map.gids))
}

/// Which container of the pod a spec is for, as the annotations say it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ContainerType {
    /// The infra container (or the runtime's sandbox).
    Sandbox,
    /// An application container.
    Container,
}

/// The annotations by which runtimes tell a pod's containers apart and group them: CRI's
/// and CRI-O's names, both (sandboxed runtimes such as runsc and Kata read either to put
/// the containers of one pod into one sandbox).
pub(crate) fn pod_annotations(kind: ContainerType, sandbox_id: &str) -> HashMap<String, String> {
    let kind = match kind {
        ContainerType::Sandbox => "sandbox",
        ContainerType::Container => "container",
    };
    [
        ("io.kubernetes.cri.container-type", kind),
        ("io.kubernetes.cri.sandbox-id", sandbox_id),
        ("io.kubernetes.cri-o.ContainerType", kind),
        ("io.kubernetes.cri-o.SandboxID", sandbox_id),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Does this host run the unified cgroup v2 hierarchy alone (where a container gets a cgroup
/// namespace of its own, as containerd and CRI-O give it)?
pub fn cgroup_v2_only() -> bool {
    let hs = crate::cgroups::hierarchies();
    !hs.is_empty() && hs.iter().all(|h| h.controllers.is_none())
}

/// Builds the infra container's spec.
pub fn infra(s: &InfraSpec) -> Result<Spec, HostError> {
    let err = |what: &str, e: oci_spec::OciSpecError| HostError::Other(format!("{what}: {e}"));
    static DEFAULT_SET: std::sync::OnceLock<HashSet<Capability>> = std::sync::OnceLock::new();
    let caps = DEFAULT_SET
        .get_or_init(|| {
            DEFAULT_CAPABILITIES
                .iter()
                .map(|c| oci_capability(*c))
                .collect()
        })
        .clone();
    let capabilities = LinuxCapabilitiesBuilder::default()
        .bounding(caps.clone())
        .effective(caps.clone())
        .permitted(caps)
        .build()
        .map_err(|e| err("capabilities", e))?;
    let process = ProcessBuilder::default()
        .terminal(false)
        .user(
            UserBuilder::default()
                .uid(0u32)
                .gid(0u32)
                .umask(0o022u32)
                .build()
                .map_err(|e| err("user", e))?,
        )
        .args(vec!["/pause".to_string()])
        .env(vec![DEFAULT_PATH.to_string()])
        .cwd("/")
        .no_new_privileges(true)
        .capabilities(capabilities)
        .oom_score_adj(s.oom_score_adj)
        .build()
        .map_err(|e| err("process", e))?;

    let mut namespaces = vec![namespace(LinuxNamespaceType::Mount, None)];
    if let Some((userns, _)) = &s.userns {
        namespaces.push(namespace(LinuxNamespaceType::User, Some(userns)));
    }
    if !s.host_pid {
        namespaces.push(namespace(LinuxNamespaceType::Pid, None));
    }
    if !s.host_ipc {
        namespaces.push(namespace(LinuxNamespaceType::Ipc, None));
    }
    let own_network = s.netns.is_some() || s.private_netns;
    if own_network {
        namespaces.push(namespace(LinuxNamespaceType::Network, s.netns.as_deref()));
        namespaces.push(namespace(LinuxNamespaceType::Uts, None));
    }

    let mut mounts = standard_mounts(false, s.userns.is_some() && s.netns.is_none())
        .into_iter()
        .map(|(dest, typ, src, opts)| mount(dest, typ, Path::new(src), &opts))
        .collect::<Result<Vec<_>, _>>()?;
    mounts.push(shm_mount(s.shm.as_deref(), s.host_ipc)?);
    for (dest, src) in [
        ("/etc/resolv.conf", &s.resolv_conf),
        ("/etc/hosts", &s.hosts),
        ("/etc/hostname", &s.hostname_file),
    ] {
        mounts.push(mount(
            dest,
            "bind",
            src,
            &["rbind", "ro", "nosuid", "nodev", "noexec"],
        )?);
    }

    let defaults = oci_spec::runtime::Linux::default();
    let mut linux = LinuxBuilder::default();
    if let Some((_, map)) = &s.userns {
        let (uids, gids) = id_mappings(map);
        linux = linux.uid_mappings(uids).gid_mappings(gids);
    }
    let linux = linux
        .sysctl(s.sysctls.clone())
        .namespaces(namespaces)
        .cgroups_path(PathBuf::from(&s.cgroups_path))
        .masked_paths(defaults.masked_paths().clone().unwrap_or_default())
        .readonly_paths(defaults.readonly_paths().clone().unwrap_or_default())
        .build()
        .map_err(|e| err("linux", e))?;
    let mut annotations = pod_annotations(ContainerType::Sandbox, &s.sandbox_id);
    for (k, v) in [
        ("io.kubernetes.cri.sandbox-name", &s.metadata.name),
        ("io.kubernetes.cri.sandbox-namespace", &s.metadata.namespace),
        ("io.kubernetes.cri.sandbox-uid", &s.metadata.uid),
    ] {
        annotations.insert(k.to_string(), v.clone());
    }
    let mut b = SpecBuilder::default()
        .version("1.0.2")
        .process(process)
        .root(
            RootBuilder::default()
                .path(s.rootfs.clone())
                .readonly(true)
                .build()
                .map_err(|e| err("root", e))?,
        )
        .mounts(mounts)
        .linux(linux)
        .annotations(annotations);
    if own_network {
        b = b.hostname(s.hostname.clone());
    }
    let mut spec = b.build().map_err(|e| err("spec", e))?;
    if !own_network {
        // No private UTS namespace: the builder's default hostname must not be set.
        spec.set_hostname(None);
    }
    Ok(spec)
}

/// Prepares the shared, read-only infra rootfs under `dir`: the static pause binary as
/// `/pause` plus the mount points the spec needs. Refreshing it while infra containers run is
/// safe: the binary is replaced by rename, running processes keep the old inode.
pub fn prepare_infra_rootfs(dir: &Path, pause: &Path) -> Result<(), HostError> {
    for d in ["proc", "dev", "sys", "etc", "dev/shm"] {
        crate::state::files::private_dir_all(&dir.join(d))?;
    }
    for f in ["etc/resolv.conf", "etc/hosts", "etc/hostname"] {
        let p = dir.join(f);
        if !p.exists() {
            crate::state::files::write_private(&p, b"")?;
        }
    }
    if is_dynamic_elf(pause)? {
        return Err(HostError::Other(format!(
            "{} is dynamically linked; the infra rootfs holds only this one file, so it must be \
             static (build it with scripts/build-shims)",
            pause.display()
        )));
    }
    let target = dir.join("pause");
    // The source's identity when it was last installed (or found equal): the same binary
    // is not read again (two reads of ~1 MiB were a fifth of a restart where the page cache
    // no longer held them).
    let stamp = dir.join(".pause.source");
    let source = file_identity(pause);
    let installed = std::fs::metadata(&target).ok();
    if source.is_some() && installed.is_some() && std::fs::read_to_string(&stamp).ok() == source {
        return Ok(());
    }
    // Copied only when it changed: a start on a full disk must not need new blocks.
    let wanted = std::fs::read(pause).map_err(|e| HostError::io("read", pause, e))?;
    if !std::fs::read(&target).is_ok_and(|have| have == wanted) {
        let tmp = dir.join(".pause.tmp");
        let r = crate::state::files::write_file(&tmp, &wanted, 0o700).and_then(|()| {
            std::fs::rename(&tmp, &target).map_err(|e| HostError::io("install", &target, e))
        });
        if r.is_err() {
            let _ = std::fs::remove_file(&tmp); // a partial copy would hold the space it took
            return r;
        }
    }
    // (Best effort: without it the next start compares the contents again.)
    if let Some(s) = source {
        let _ = crate::state::write_atomic(&stamp, s.as_bytes());
    }
    Ok(())
}

/// What identifies a file's contents without reading them: device, inode, size, mtime and
/// ctime (a change in place moves the ctime; a replacement, the inode).
pub(crate) fn file_identity(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some(format!(
        "{}:{} {} {}.{} {}.{}",
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec()
    ))
}

/// Does this ELF file ask for a program interpreter (PT_INTERP), i.e. need a dynamic loader?
pub fn is_dynamic_elf(path: &Path) -> Result<bool, HostError> {
    // The header and the program headers, which follow it in every binary a linker makes:
    // the first 64 KiB, not the whole file (read at every start).
    let mut data = Vec::with_capacity(64 << 10);
    std::io::Read::read_to_end(
        &mut std::io::Read::take(
            std::fs::File::open(path).map_err(|e| HostError::io("open", path, e))?,
            64 << 10,
        ),
        &mut data,
    )
    .map_err(|e| HostError::io("read", path, e))?;
    let bad = || HostError::format(path.display(), "not a 64-bit little-endian ELF file");
    if data.len() < 64 || &data[..4] != b"\x7fELF" || data[4] != 2 || data[5] != 1 {
        return Err(bad());
    }
    let u16_at = |o: usize| u16::from_le_bytes([data[o], data[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(data[32..40].try_into().map_err(|_| bad())?) as usize;
    let (phentsize, phnum) = (u16_at(54), u16_at(56));
    for i in 0..phnum {
        let o = phoff + i * phentsize;
        if o + 4 > data.len() {
            return Err(bad());
        }
        if u32::from_le_bytes(data[o..o + 4].try_into().map_err(|_| bad())?) == 3 {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The OOM score adjustment to ask for: `wanted`, but never below the daemon's own value
/// (a process without CAP_SYS_RESOURCE cannot lower it; containerd's restrict_oom_score_adj).
pub fn clamp_oom_score_adj(wanted: i32) -> i32 {
    // The daemon's own value does not change while it runs.
    static OWN: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    let own = *OWN.get_or_init(|| {
        std::fs::read_to_string("/proc/self/oom_score_adj")
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .unwrap_or(0)
    });
    wanted.max(own)
}

/// Most a bundle's config.json is read up to (ours are a few KiB; NRI adjustments are
/// bounded by the protocol's 4 MiB messages).
const MAX_BUNDLE_SPEC: u64 = 16 << 20;

/// Reads the OCI spec of the bundle `dir` (`config.json`, as [`save`] wrote it): a regular
/// file, at most [`MAX_BUNDLE_SPEC`] bytes, opened without blocking.
pub fn read_bundle(dir: &Path) -> Result<serde_json::Value, String> {
    let f = dir.join("config.json");
    let data = crate::untrusted_fs::read_file(&f, MAX_BUNDLE_SPEC).map_err(|e| e.to_string())?;
    serde_json::from_slice(&data).map_err(|e| format!("{}: {e}", f.display()))
}

/// Writes a bundle's config.json (compact: the runtime is its only reader).
pub fn save(spec: &Spec, path: &Path) -> Result<(), HostError> {
    let data = serde_json::to_vec(spec).map_err(|e| HostError::format("OCI spec", e))?;
    crate::state::files::write_private(path, &data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(netns: Option<&str>) -> Spec {
        infra(&InfraSpec {
            sandbox_id: "abc".into(),
            metadata: crate::model::sandbox::PodSandboxMetadata {
                name: "web".into(),
                namespace: "ns".into(),
                uid: "u1".into(),
                attempt: 0,
            },
            rootfs: "/r".into(),
            hostname: "h".into(),
            netns: netns.map(PathBuf::from),
            private_netns: false,
            userns: None,
            host_ipc: false,
            host_pid: false,
            shm: Some("/s/shm".into()),
            resolv_conf: "/s/resolv.conf".into(),
            hosts: "/s/hosts".into(),
            hostname_file: "/s/hostname".into(),
            cgroups_path: "/sandboxd/abc".into(),
            oom_score_adj: -998,
            sysctls: HashMap::new(),
        })
        .unwrap()
    }

    #[test]
    fn joins_netns_by_path() {
        let s = spec(Some("/run/netns/x"));
        let v = serde_json::to_value(&s).unwrap();
        let nss = v["linux"]["namespaces"].as_array().unwrap();
        assert!(nss
            .iter()
            .any(|n| n["type"] == "network" && n["path"] == "/run/netns/x"));
        assert!(nss.iter().any(|n| n["type"] == "uts"));
        assert_eq!(v["hostname"], "h");
        // containerd's names of the pod, which Kata-style runtimes read.
        assert_eq!(v["annotations"]["io.kubernetes.cri.sandbox-name"], "web");
        assert_eq!(
            v["annotations"]["io.kubernetes.cri.sandbox-namespace"],
            "ns"
        );
        assert_eq!(v["annotations"]["io.kubernetes.cri.sandbox-uid"], "u1");
        assert_eq!(v["root"]["readonly"], true);
        assert_eq!(v["process"]["noNewPrivileges"], true);
        let mounts = v["mounts"].as_array().unwrap();
        assert!(mounts
            .iter()
            .any(|m| m["destination"] == "/dev/shm" && m["source"] == "/s/shm"));
        assert!(v["process"]["capabilities"]["bounding"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c == "CAP_NET_RAW"));
        assert!(!v["linux"]["maskedPaths"].as_array().unwrap().is_empty());
    }

    #[test]
    fn the_pause_binary_is_installed_when_it_changed_and_only_read_then() {
        use std::os::unix::fs::MetadataExt;
        let base = std::env::temp_dir().join(format!("sandboxd-infra-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let (src, dir) = (base.join("pause"), base.join("rootfs"));
        // A static ELF header (no program headers, so no interpreter) and a payload.
        let elf = |payload: &[u8]| {
            let mut h = vec![0u8; 64];
            h[..6].copy_from_slice(b"\x7fELF\x02\x01");
            h[32] = 64; // phoff
            h[54] = 56; // phentsize
            h.extend_from_slice(payload);
            std::fs::write(&src, h).unwrap();
        };
        elf(b"one");
        prepare_infra_rootfs(&dir, &src).unwrap();
        let installed = dir.join("pause");
        assert!(std::fs::read(&installed).unwrap().ends_with(b"one"));
        let ino = std::fs::metadata(&installed).unwrap().ino();
        // The same source: nothing read or written again.
        prepare_infra_rootfs(&dir, &src).unwrap();
        assert_eq!(std::fs::metadata(&installed).unwrap().ino(), ino);
        // Changed in place: installed anew.
        std::thread::sleep(std::time::Duration::from_millis(20));
        elf(b"two");
        prepare_infra_rootfs(&dir, &src).unwrap();
        assert!(std::fs::read(&installed).unwrap().ends_with(b"two"));
        // The installed copy gone: installed again, though the stamp matches.
        std::fs::remove_file(&installed).unwrap();
        prepare_infra_rootfs(&dir, &src).unwrap();
        assert!(std::fs::read(&installed).unwrap().ends_with(b"two"));
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn host_network_has_no_netns() {
        let v = serde_json::to_value(spec(None)).unwrap();
        let nss = v["linux"]["namespaces"].as_array().unwrap();
        assert!(!nss
            .iter()
            .any(|n| n["type"] == "network" || n["type"] == "uts"));
    }

    #[test]
    fn detects_dynamic_elf() {
        assert!(is_dynamic_elf(Path::new("/bin/sh")).unwrap());
        assert!(is_dynamic_elf(Path::new("/etc/hostname")).is_err());
    }

    #[test]
    fn oom_clamp_never_below_own() {
        assert!(clamp_oom_score_adj(-1000) >= -1000);
        assert_eq!(clamp_oom_score_adj(1000), 1000);
    }
}
