//! CreateContainer: validate → resolve sandbox (must be ready) and image → reserve name →
//! record `creating` → overlay rootfs → user from the image's /etc/passwd → OCI bundle →
//! runtime `create` under a monitor → record `created`. A failure undoes every earlier step,
//! newest first, and releases the name.

use std::path::{Path, PathBuf};

use oci_spec::runtime::{LinuxNamespace, LinuxNamespaceType};

use super::devices::devices;
use super::image_volume;
use super::spec::{self, Inputs};
use crate::error::{Error, HostError, Result};
use crate::model::container::{
    ContainerConfig, ContainerRecord, ContainerState, EffectiveUser, Propagation, Seccomp,
};
use crate::model::sandbox::{NamespaceMode, SandboxRecord, SandboxState};
use crate::runtime::{ContainerEntry, Runtime};
use crate::state::lock;
use crate::state::now_nanos;
use crate::{failpoint, validate};

/// How long lazy layers' completions give way to a container being made (until it is
/// started, which holds them a second more; a create that never starts lets go by then).
const LAZY_HOLD_CREATE: std::time::Duration = std::time::Duration::from_secs(3);

pub(crate) fn create(rt: &Runtime, sandbox_id: &str, config: &ContainerConfig) -> Result<String> {
    spec::validate(config)?;
    let sb_entry = rt.lookup(sandbox_id)?.ok_or_else(|| Error::NotFound {
        kind: "sandbox",
        id: sandbox_id.to_string(),
    })?;
    // A pod still being made (its RunPodSandbox, NRI hooks included, holds the lock) is not
    // ready: refused now, not made ready by waiting for the lock.
    let creating = lock(&sb_entry.record).state == SandboxState::Creating;
    if creating {
        return Err(Error::FailedPrecondition(format!(
            "sandbox {sandbox_id} is not ready (its RunPodSandbox has not finished); cannot create a container in it"
        )));
    }
    // Holding the sandbox's lock keeps it from being stopped while the container is made.
    let _sb_op = lock(&sb_entry.op);
    let sb = lock(&sb_entry.record).clone();
    if sb.state != SandboxState::Ready {
        return Err(Error::FailedPrecondition(format!(
            "sandbox {} is not ready ({:?}); cannot create a container in it",
            sb.id, sb.state
        )));
    }
    // As both peers: a privileged container only in a privileged pod (kubelet sets the pod's
    // flag when any of its containers is privileged).
    if config.security.privileged && !sb.config.privileged {
        return Err(Error::InvalidArgument(format!(
            "security_context.privileged: sandbox {} is not privileged; a privileged container needs a privileged pod",
            sb.id
        )));
    }
    let image = rt
        .images
        .get(&config.image)
        .ok_or_else(|| Error::NotFound {
            kind: "image",
            id: config.image.clone(),
        })?;
    if image.artifact {
        return Err(Error::InvalidArgument(format!(
            "image {:?} is an OCI artifact, not a runnable image (it can be mounted as an image volume)",
            config.image
        )));
    }
    // The image's WorkingDir (used when the config names none) is held to what the CRI's
    // `working_dir` is: absolute, without `.` or `..`.
    if config.working_dir.is_empty() && !image.config.working_dir.is_empty() {
        spec::clean_abs(
            &format!("image {:?} config WorkingDir", config.image),
            &image.config.working_dir,
        )?;
    }
    // Image volumes: pulled beforehand by kubelet, resolved now, kept while the container is.
    let mut resolved = config.clone();
    let mut layers = image.layers.clone();
    layers.extend(image_volume::resolve(&rt.images, &mut resolved.mounts)?);
    layers.sort_unstable();
    layers.dedup();
    let config = &resolved;
    // Its layers cannot be collected from here on (a RemoveImage meanwhile).
    let _pins = rt.images.pin(layers.iter().map(String::as_str));
    // Lazy layers' background completions give way while it is made (and started).
    rt.images.give_way(&layers, LAZY_HOLD_CREATE, false);
    check_user_namespace(&sb, config)?;
    let namespaces = namespaces(rt, &sb, config)?;
    let family = rt.handler(&sb.runtime_handler)?.family;
    let caps = spec::capabilities(config, family.last_capability())?;
    let seccomp = match &config.security.seccomp {
        _ if config.security.privileged => None,
        Seccomp::Unconfined => None,
        Seccomp::RuntimeDefault => Some(spec::runtime_default_seccomp(&caps)?),
        Seccomp::Localhost(p) => Some(spec::localhost_seccomp(p, &caps)?),
    };
    let devices = devices(config)?;
    // CDI devices: every name must resolve before anything is made (applied in `build`).
    rt.cdi.check(&crate::cdi::requested(config)?)?;
    check_mount_sources(config)?;
    let apparmor =
        crate::lsm::apparmor_profile(&config.security.apparmor, "security_context.apparmor")?;
    let s = &config.security.selinux;
    let selinux_label = crate::lsm::selinux_label(
        [&s[0], &s[1], &s[2], &s[3]],
        "security_context.selinux_options",
    )?;
    let m = &sb.config.metadata;
    let name = format!(
        "k8s_{}_{}_{}_{}_{}",
        config.metadata.name, m.name, m.namespace, m.uid, config.metadata.attempt
    );
    let log_path = (!sb.config.log_directory.is_empty() && !config.log_path.is_empty())
        .then(|| Path::new(&sb.config.log_directory).join(&config.log_path));

    let id = validate::new_id();
    let record = ContainerRecord {
        format: crate::model::RECORD_FORMAT,
        id: id.clone(),
        name: name.clone(),
        sandbox_id: sb.id.clone(),
        config: config.clone(),
        image_id: image.id.clone(),
        layers,
        image_ref: image
            .repo_digests
            .first()
            .cloned()
            .unwrap_or_else(|| image.id.clone()),
        runtime_handler: sb.runtime_handler.clone(),
        state: ContainerState::Creating,
        created_at: now_nanos(),
        started_at: 0,
        finished_at: 0,
        exit_code: 0,
        reason: String::new(),
        message: String::new(),
        pid: 0,
        pid_start: 0,
        boot_id: String::new(),
        dir: rt.cfg.root.join("containers").join(&id),
        log_path,
        cgroup: crate::cgroups::child(&sb.pod_cgroup(&rt.cfg), &id),
        stop_signal: effective_stop_signal(&config.stop_signal, &image.config.stop_signal)?,
        shared_pid: !namespaces
            .iter()
            .any(|n| n.typ() == LinuxNamespaceType::Pid && n.path().is_none()),
        // Short path (sun_path is 108 bytes): under the root, not the container dir.
        attach_socket: Some(
            rt.cfg
                .root
                .join("attach")
                .join(format!("{}.sock", &id[..16])),
        ),
        user: None,
        console_socket: config.tty.then(|| {
            rt.cfg
                .root
                .join("exec")
                .join(format!("{}.console", &id[..16]))
        }),
        userns_dir: sb
            .userns
            .is_some()
            .then(|| rt.cfg.root.join(crate::userns::DIR).join(&id)),
        storage_dir: rt
            .cfg
            .container_storage_root
            .as_ref()
            .filter(|_| sb.userns.is_none())
            .map(|r| r.join(&id)),
    };
    let entry = {
        let mut reg = lock(&rt.registry);
        if let Some(holder) = reg.names.holder(&name) {
            return Err(Error::NameReserved {
                name,
                holder: holder.to_string(),
            });
        }
        reg.names.reserve(&name, &id)?;
        reg.container_ids.insert(&id);
        let entry = ContainerEntry::new(record);
        reg.containers.insert(id.clone(), entry.clone());
        entry
    };
    let _op = lock(&entry.op);
    tracing::info!(container_id = %id, sandbox_id = %sb.id, name = %name, image = %image.id, "creating container");
    let lsm = (apparmor, selinux_label);
    match build(rt, &entry, &sb, &image, namespaces, seccomp, devices, lsm) {
        Ok(()) => {
            let dir = lock(&entry.record).dir.clone();
            rt.exit_watch.add(&id, &dir);
            rt.emit(crate::events::EventKind::Created, &id, &sb.id);
            if rt.nri.active() {
                let rec = lock(&entry.record).clone();
                rt.nri.post_create_container(&sb, &rec, &rt.cfg);
            }
            Ok(id)
        }
        Err(err) => {
            tracing::warn!(container_id = %id, error = %err, "container creation failed; rolling back");
            match super::remove::teardown(rt, &entry) {
                Ok(()) => {
                    super::remove::unregister(rt, &entry);
                    Err(err)
                }
                Err(undo) => Err(Error::with_rollback(err, &id, undo)),
            }
        }
    }
}

#[allow(clippy::too_many_arguments)] // the create's validated parts, each used once
fn build(
    rt: &Runtime,
    entry: &ContainerEntry,
    sb: &SandboxRecord,
    image: &crate::image::ImageRecord,
    namespaces: Vec<LinuxNamespace>,
    seccomp: Option<serde_json::Value>,
    devices: Vec<spec::DeviceNode>,
    (apparmor, selinux_label): (Option<String>, Option<String>),
) -> Result<()> {
    let rec = lock(&entry.record).clone();
    let id = rec.id.as_str();
    crate::state::files::private_dir(&rec.dir)
        .map_err(|e| Error::step("create container dir", id, e))?;
    entry.update(|_| {})?;
    failpoint::hit("create:recorded");

    let lower = image
        .layers
        .iter()
        .rev()
        .map(|l| rt.images.lower_dir(l))
        .collect::<Result<Vec<_>>>()?;
    // In a pod with its own user namespace, its root must own what the node's root owns in
    // the image: the layers are idmapped under the overlay (see `userns`).
    let userns = match (&sb.userns, &sb.config.user_namespace) {
        (Some(path), Some(map)) => Some((
            std::fs::File::open(path).map_err(|e| {
                Error::step(
                    "open the pod's user namespace",
                    id,
                    HostError::io("open", path, e),
                )
            })?,
            map,
        )),
        _ => None,
    };
    match &userns {
        Some((ns, map)) => {
            let owner = map.host_root().unwrap_or_default();
            crate::userns::pod_root_dir(&rt.cfg.root, id, owner)
                .and_then(|_| {
                    rt.host.mount_idmapped_overlay(
                        ns,
                        owner,
                        &lower,
                        &rec.dir.join("ovl"),
                        &rec.dir.join("idmap-layers"),
                        &rec.rootfs(),
                    )
                })
                .map_err(|e| Error::step("mount idmapped rootfs", id, e))?
        }
        None => {
            if let Some(d) = &rec.storage_dir {
                crate::state::files::private_dir_all(d)
                    .map_err(|e| Error::step("create the writable layer's dir", id, e))?;
            }
            rt.host
                .mount_overlay(&lower, &rec.upper_dir(), &rec.work_dir(), &rec.rootfs())
                .map_err(|e| Error::step("mount rootfs", id, e))?
        }
    }
    failpoint::hit("create:rootfs");

    refuse_blocking_account_files(&rec.rootfs())?;
    let user = spec::resolve_user(&rec.config, &image.config, &rec.rootfs())?;
    entry.note(|r| {
        r.user = Some(EffectiveUser {
            uid: user.uid,
            gid: user.gid,
            supplemental_groups: user.additional_gids.clone(),
        })
    });
    // Recursively read-only and idmapped mounts: made here (a detached copy of the host tree,
    // read-only all through and/or idmapped, attached under the container dir) and bound by
    // the runtime from there.
    let mut config = rec.config.clone();
    let mut staged = Vec::new();
    let runtime = rt.handler(&rec.runtime_handler)?;
    let family = runtime.family;
    for (i, m) in config.mounts.iter_mut().enumerate() {
        if m.image.is_some() {
            let at = rec.dir.join("mounts").join(i.to_string());
            let idmap = userns.as_ref().map(|(ns, _)| std::os::fd::AsFd::as_fd(ns));
            image_volume::stage(&rt.images, id, m, &at, idmap)?;
            staged.push(at);
            continue;
        }
        if !m.recursive_read_only && m.idmap.is_none() {
            continue;
        }
        // The runtime binds it read-only all through by itself (gVisor): no staged copy.
        if m.idmap.is_none() && family.ro_binds_recursive() {
            continue;
        }
        let other_ns;
        let ns = match (&m.idmap, &userns) {
            (None, _) => None,
            (Some(want), Some((ns, pod))) if want == *pod => Some(ns),
            (Some(want), _) => {
                other_ns = crate::userns::open(want).map_err(|e| {
                    Error::step("make the user namespace of an idmapped mount", id, e)
                })?;
                Some(&other_ns)
            }
        };
        let at = rec.dir.join("mounts").join(i.to_string());
        rt.host
            .mount_tree_copy(
                Path::new(&m.host_path),
                &at,
                m.recursive_read_only,
                ns.map(std::os::fd::AsFd::as_fd),
            )
            .map_err(|e| Error::step("make a recursively read-only or idmapped mount", id, e))?;
        m.host_path = at.to_string_lossy().into_owned();
        staged.push(at);
    }
    let hostname = sb.config.effective_hostname(&sb.id);
    let oci = spec::build(&Inputs {
        id,
        sandbox_id: &sb.id,
        config: &config,
        image: &image.config,
        image_name: &rec.config.image,
        rootfs: &rec.rootfs(),
        user,
        hostname,
        cgroup: &rec.cgroup,
        namespaces,
        shm: sb.shm.clone(),
        host_network: sb.config.host_network(),
        sandbox_dir: &sb.dir,
        oom_score_adj: crate::oci::spec::clamp_oom_score_adj(
            rec.config.resources.oom_score_adj as i32,
        ),
        seccomp,
        devices,
        apparmor,
        selinux_label,
        id_map: sb.config.user_namespace.as_ref(),
        last_capability: family.last_capability(),
        sysctls: sb
            .config
            .sysctls
            .iter()
            .map(|(k, v)| (crate::sysctl::normalize(k), v.clone()))
            .collect(),
    })?;
    let mut oci = oci;
    rt.cdi
        .inject(&crate::cdi::requested(&rec.config)?, &mut oci)
        .map_err(|e| match e {
            Error::InvalidArgument(m) => Error::InvalidArgument(format!("container {id}: {m}")),
            e => e,
        })?;
    // NRI plugins adjust the spec as built (their CDI devices through the same registry).
    rt.nri
        .create_container(sb, &rec, &rt.cfg, &mut oci, &|names, spec| {
            rt.cdi.inject(names, spec).map_err(|e| match e {
                Error::InvalidArgument(m) => Error::InvalidArgument(format!("container {id}: {m}")),
                e => e,
            })
        })?;
    // A plugin that moved the container's cgroup: the record follows (stats, removal).
    if let Some(moved) = oci
        .linux()
        .as_ref()
        .and_then(|l| l.cgroups_path().as_ref())
        .map(|p| p.to_string_lossy().into_owned())
        .filter(|p| *p != rec.cgroup)
    {
        entry.update(|r| r.cgroup = moved.clone())?;
    }
    crate::oci::spec::save(&oci, &rec.dir.join("config.json"))
        .map_err(|e| Error::step("write bundle", id, e))?;

    if let Some(log) = &rec.log_path {
        if let Some(parent) = log.parent() {
            std::fs::create_dir_all(parent).map_err(|e| {
                Error::step("create log dir", id, HostError::io("create", parent, e))
            })?;
        }
    }
    let files = rec.files();
    let pid = rt
        .host
        .runtime_create(runtime, id, &rec.dir, &files)
        .map_err(|e| Error::step("create container", id, e))?;
    failpoint::hit("create:runtime");
    // The container's mount namespace holds its own copies now. Staged trees left in the
    // node's namespace would pin every submount of a volume there: kubelet's volume teardown
    // (unmount, then rmdir) would fail with EBUSY while the container exists. A handler with
    // a sandbox process of its own (gVisor's gofer, a VM's file server) reads them by path
    // for as long as the container lives: those stay, and go with the container dir.
    let serves_by_path = !family.node_kernel();
    for at in staged.iter().filter(|_| !serves_by_path) {
        if let Err(e) = rt.host.unmount_all(at) {
            tracing::warn!(container_id = %id, path = %at.display(), error = %e,
                "cannot detach a staged mount after create");
        }
    }
    let who = crate::process::ProcId::now(pid);
    entry.update(|r| {
        r.state = ContainerState::Created;
        r.pid = pid;
        r.pid_start = who.start_ticks;
        r.boot_id = who.boot_id;
    })
}

/// The namespaces the container joins: the pod's network, IPC and UTS (by path: pinned
/// files, or the infra process's), the PID namespace per its `NamespaceOption`, a new mount
/// namespace.
fn namespaces(
    rt: &Runtime,
    sb: &SandboxRecord,
    c: &ContainerConfig,
) -> Result<Vec<LinuxNamespace>> {
    use LinuxNamespaceType as T;
    let ns = |t: T, path: Option<PathBuf>| crate::oci::spec::namespace(t, path.as_deref());
    // The infra process's own namespaces, by their /proc name.
    let infra_ns = |proc_name: &str| {
        sb.infra
            .as_ref()
            .filter(|i| i.started && !i.stopped && sb.infra_proc(i).alive())
            .map(|i| PathBuf::from(format!("/proc/{}/ns/{proc_name}", i.pid)))
    };
    let mut out = vec![ns(T::Mount, None)];
    // First: the runtime joins the pod's user namespace before making the others in it.
    if let Some(userns) = &sb.userns {
        out.insert(0, ns(T::User, Some(userns.clone())));
    }
    if let Some(netns) = &sb.netns {
        out.push(ns(T::Network, Some(netns.clone())));
        out.push(ns(T::Uts, infra_ns("uts").or_else(|| sb.utsns.clone())));
    }
    if !sb.config.host_ipc() {
        out.push(ns(T::Ipc, infra_ns("ipc").or_else(|| sb.ipcns.clone())));
    }
    match c.security.pid {
        NamespaceMode::Node => {}
        NamespaceMode::Container => out.push(ns(T::Pid, None)),
        NamespaceMode::Pod if sb.config.host_pid() => {}
        // POD is the proto's zero value: in a pod without a shared PID namespace (kubelet
        // then sends CONTAINER anyway) it means the container's own.
        NamespaceMode::Pod => out.push(ns(T::Pid, infra_ns("pid"))),
        NamespaceMode::Target => {
            let target = rt.container_record(&c.security.target_id)?;
            if target.state != ContainerState::Running
                || target.sandbox_id != sb.id
                || !target.init_proc().alive()
            {
                return Err(Error::InvalidArgument(format!(
                    "security_context.namespace_options.target_id {}: not a running container of this pod",
                    c.security.target_id
                )));
            }
            out.push(ns(
                T::Pid,
                Some(PathBuf::from(format!("/proc/{}/ns/pid", target.pid))),
            ));
        }
    }
    // On a cgroup v2 host a container sees its own cgroup as the root (containerd and CRI-O
    // do the same); v1 and hybrid hosts get the runtime's bind mounts of its own cgroups.
    if crate::oci::spec::cgroup_v2_only() && !c.security.privileged {
        out.push(ns(T::Cgroup, None));
    }
    Ok(out)
}

/// In a pod with its own user namespace, what kubelet says of the container's user namespace
/// (if anything) must be the pod's; idmapped mounts are checked like the pod's maps.
fn check_user_namespace(sb: &SandboxRecord, c: &ContainerConfig) -> Result<()> {
    if let Some(asked) = &c.security.user_namespace {
        if sb.config.user_namespace.as_ref() != Some(asked) {
            return Err(Error::InvalidArgument(
                "security_context.namespace_options.userns_options: a container's user namespace must be its pod's".into(),
            ));
        }
    }
    for m in &c.mounts {
        if let Some(map) = &m.idmap {
            let field = format!("mounts[{}].uid_mappings/gid_mappings", m.container_path);
            map.check(&field)?;
            // kubelet sends the pod's own maps. Others — or any, in a pod without a user
            // namespace — would let a container write the volume as another node uid (its
            // uid 1000 as the node's root, say).
            match &sb.config.user_namespace {
                None => {
                    return Err(Error::InvalidArgument(format!(
                        "{field}: an idmapped mount needs the pod's own user namespace, and this pod has none"
                    )))
                }
                Some(pod) if pod != map => {
                    return Err(Error::InvalidArgument(format!(
                        "{field}: a volume's id-maps must be its pod's user namespace maps"
                    )))
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}

/// Mount propagation can only work from a source the host shares: bidirectional needs a
/// shared mount, host-to-container a shared or slave one (else the setting would silently do
/// nothing). Recursively read-only mounts need the kernel's mount_setattr.
fn check_mount_sources(c: &ContainerConfig) -> Result<()> {
    for m in &c.mounts {
        if m.recursive_read_only && !crate::mounts::recursive_read_only_supported() {
            return Err(Error::InvalidArgument(format!(
                "mounts.recursive_read_only ({}): this node's kernel cannot make recursively read-only mounts",
                m.container_path
            )));
        }
        if m.propagation == Propagation::Private {
            continue;
        }
        let (at, shared, slave) =
            crate::mounts::propagation_of(Path::new(&m.host_path)).map_err(|e| {
                Error::InvalidArgument(format!("mounts.host_path {}: {e}", m.host_path))
            })?;
        let ok = match m.propagation {
            Propagation::Bidirectional => shared,
            _ => shared || slave,
        };
        if !ok {
            return Err(Error::InvalidArgument(format!(
                "mounts.propagation: {} is on the mount {}, which is not a {} mount; {:?} propagation needs one",
                m.host_path,
                at.display(),
                if m.propagation == Propagation::Bidirectional { "shared" } else { "shared or slave" },
                m.propagation
            )));
        }
    }
    Ok(())
}

/// The OCI runtime reads the container's `/etc/passwd` and `/etc/group` itself while it
/// starts the container (runc does, whatever the user): one that is a FIFO or a device would
/// hang it. Such an image is refused before the runtime is called.
fn refuse_blocking_account_files(rootfs: &Path) -> Result<()> {
    for f in ["etc/passwd", "etc/group"] {
        let kind = crate::untrusted_fs::kind_in_root(rootfs, Path::new(f))
            .map_err(|e| Error::InvalidArgument(format!("image's /{f}: {e}")))?;
        if let Some(k) = kind.filter(|k| !k.is_file() && !k.is_dir()) {
            use std::os::unix::fs::FileTypeExt;
            let what = if k.is_fifo() {
                "a FIFO"
            } else if k.is_socket() {
                "a socket"
            } else {
                "a device node"
            };
            return Err(Error::InvalidArgument(format!(
                "the image's /{f} is {what}, not a regular file; the runtime would block reading it"
            )));
        }
    }
    Ok(())
}

/// The signal StopContainer sends first: the request's, else the image's `StopSignal`, else
/// TERM. A name that is no signal is refused here, not found out at stop time.
fn effective_stop_signal(requested: &str, image: &str) -> Result<String> {
    let (given, from) = match (requested, image) {
        ("", "") => return Ok("TERM".into()),
        ("", i) => (i, "the image's StopSignal"),
        (r, _) => (r, "stop_signal"),
    };
    crate::signals::canonical(given)
        .ok_or_else(|| Error::InvalidArgument(format!("{from} {given:?} is not a signal")))
}
