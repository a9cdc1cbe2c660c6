//! RunPodSandbox: validate → reserve name → sandbox dir → record `creating` (while the
//! namespaces are pinned on another thread) → CNI ADD → shm → infra (only when needed) →
//! record `ready`. A failure undoes every earlier step, newest first (the teardown reads the
//! record, which names each resource before it is created), and releases the name.

use std::net::IpAddr;
use std::sync::Arc;

use crate::cni::{CacheEntry, NetworkList};
use crate::config::InfraPolicy;
use crate::error::{Error, HostError, Result};
use crate::model::sandbox::{
    InfraMode, InfraRecord, NamespaceMode, NetworkRecord, PodSandboxConfig, SandboxRecord,
    SandboxState, StopRecord,
};
use crate::oci::{spec, ContainerFiles};
use crate::runtime::{Runtime, SandboxEntry};
use crate::state::lock;
use crate::{failpoint, validate};

/// What validation decided, before anything is touched.
struct Plan {
    handler: String,
    infra: bool,
    network: Option<NetworkList>,
    hostname: String,
    sysctls: Vec<(String, String, crate::sysctl::Ns)>,
}

pub(crate) fn run(rt: &Runtime, config: &PodSandboxConfig) -> Result<String> {
    let mut plan = validate_config(rt, config)?;
    let name = config.reserved_name();

    // Reserve the name, or find who holds it.
    let id = validate::new_id();
    plan.hostname = config.effective_hostname(&id);
    let (entry, holder) = {
        let mut reg = lock(&rt.registry);
        match reg.names.holder(&name).map(str::to_string) {
            Some(holder) => (
                None,
                reg.sandboxes.get(&holder).cloned().map(|e| (holder, e)),
            ),
            None => {
                reg.names.reserve(&name, &id)?;
                reg.ids.insert(&id);
                let record = new_record(rt, &id, &name, config, &plan);
                let entry = SandboxEntry::new(record);
                reg.sandboxes.insert(id.clone(), entry.clone());
                (Some(entry), None)
            }
        }
    };
    let Some(entry) = entry else {
        return retried(&name, config, holder);
    };
    let _op = lock(&entry.op);
    tracing::info!(sandbox_id = %id, name = %name, infra = plan.infra, "running pod sandbox");
    match create(rt, &entry, config, &plan) {
        Ok(()) => {
            let status = lock(&entry.record).status();
            rt.emit_pod(crate::events::EventKind::Created, status.clone());
            rt.emit_pod(crate::events::EventKind::Started, status);
            Ok(id)
        }
        Err(err) => {
            tracing::warn!(sandbox_id = %id, error = %err, "pod sandbox creation failed; rolling back");
            match super::remove::undo(rt, &entry) {
                Ok(()) => {
                    super::remove::unregister(rt, &entry);
                    Err(err)
                }
                Err(undo) => {
                    // Keep the record (NotReady, name reserved) so Stop/Remove finish the job.
                    Err(Error::with_rollback(err, &id, undo))
                }
            }
        }
    }
}

/// A request for a name that is already held: the same request retried gets the same id once
/// that sandbox is ready (waiting for it while it is still being created).
fn retried(
    name: &str,
    config: &PodSandboxConfig,
    holder: Option<(String, Arc<SandboxEntry>)>,
) -> Result<String> {
    let Some((holder_id, entry)) = holder else {
        return Err(Error::NameReserved {
            name: name.to_string(),
            holder: "an unregistered sandbox".into(),
        });
    };
    drop(lock(&entry.op)); // waits while that sandbox is being created
    let r = lock(&entry.record);
    if r.state == SandboxState::Ready && r.config == *config {
        return Ok(holder_id);
    }
    Err(Error::NameReserved {
        name: name.to_string(),
        holder: holder_id,
    })
}

fn new_record(
    rt: &Runtime,
    id: &str,
    name: &str,
    config: &PodSandboxConfig,
    plan: &Plan,
) -> SandboxRecord {
    SandboxRecord {
        format: crate::model::RECORD_FORMAT,
        id: id.to_string(),
        name: name.to_string(),
        config: config.clone(),
        state: SandboxState::Creating,
        created_at: crate::state::now_nanos(),
        runtime_handler: plan.handler.clone(),
        infra_mode: if plan.infra {
            InfraMode::Process
        } else {
            InfraMode::Pinned
        },
        dir: rt.cfg.root.join("sandboxes").join(id),
        netns: None,
        ipcns: None,
        utsns: None,
        userns: None,
        shm: None,
        network: NetworkRecord::default(),
        infra: None,
        stop: StopRecord::default(),
        pod_cgroup: if config.cgroup_parent.is_empty() {
            rt.cgroup_driver.own_pod_cgroup(&rt.cfg.cgroup_parent, id)
        } else {
            // Checked by `validate`.
            rt.cgroup_driver
                .pod_cgroup(&config.cgroup_parent)
                .unwrap_or_default()
        },
        own_pod_cgroup: config.cgroup_parent.is_empty(),
    }
}

/// The resources a sandbox will own, all named in the first record written, before any of
/// them exists: a crash at any later point leaves a record from which teardown finds every
/// one of them (tearing down one that was never made is a no-op).
fn intents(rt: &Runtime, config: &PodSandboxConfig, plan: &Plan, r: &mut SandboxRecord) {
    let ns_name = rt.ns_name(&r.id);
    r.netns = (!config.host_network()).then(|| rt.cfg.netns_dir.join(&ns_name));
    r.ipcns = (!plan.infra && !config.host_ipc()).then(|| rt.cfg.ipcns_dir.join(&ns_name));
    r.utsns = (!plan.infra && !config.host_network()).then(|| rt.cfg.utsns_dir.join(&ns_name));
    r.userns = config
        .user_namespace
        .is_some()
        .then(|| rt.cfg.userns_dir.join(&ns_name));
    r.shm = (!config.host_ipc()).then(|| r.dir.join("shm"));
    if let (Some(list), Some(_)) = (&plan.network, &r.netns) {
        r.network.setup_started = true;
        r.network.cache = Some(CacheEntry {
            list: list.clone(),
            attachment: super::network::attachment(&r.id, Some(config)),
            result: None,
        });
    }
    if plan.infra {
        r.infra = Some(InfraRecord {
            id: r.id.clone(),
            ..InfraRecord::default()
        });
    }
}

fn create(
    rt: &Runtime,
    entry: &SandboxEntry,
    config: &PodSandboxConfig,
    plan: &Plan,
) -> Result<()> {
    let (id, dir) = {
        let r = lock(&entry.record);
        (r.id.clone(), r.dir.clone())
    };
    // Record first: the dir holds the record, and the record names everything to come.
    crate::state::files::private_dir(&dir)
        .map_err(|e| Error::step("create sandbox dir", &id, e))?;
    entry.note(|r| intents(rt, config, plan, r));
    let rec = lock(&entry.record).clone();

    // Namespaces: the network one unless host network; IPC and UTS pinned too when no infra
    // process will hold them. They are pinned on their own thread while the record that names
    // them is made durable: they are kernel objects under our own dirs, gone after a reboot,
    // and after a crash the start-up sweep removes any that no record names (their files
    // carry this root's prefix). Everything that outlives the node's memory (the CNI
    // network's IPAM state, runtime containers) comes after both.
    let pin = crate::netns::PinRequest {
        net: rec.netns.clone(),
        ipc: rec.ipcns.clone(),
        uts: rec.utsns.clone(),
        hostname: Some(plan.hostname.clone()),
        user: rec.userns.clone().zip(config.user_namespace.clone()),
    };
    let pinning = rt
        .host
        .pin_namespaces(&pin)
        .map_err(|e| Error::step("create namespaces", &id, e));
    let recorded = entry.update(|_| {});
    if recorded.is_ok() {
        failpoint::hit("run:recorded");
    }
    let files = recorded.and_then(|()| {
        write_sandbox_files(&dir, config, &plan.hostname)
            .map_err(|e| Error::step("write sandbox files", &id, e))
    });
    if files.is_ok() {
        failpoint::hit("run:dir");
    }
    // Wait for the namespaces even when the record failed: the rollback removes them.
    let pinned = pinning.and_then(|p| {
        p.wait()
            .map_err(|e| Error::step("create namespaces", &id, e))
    });
    files?;
    pinned?;
    failpoint::hit("run:netns");
    // A cgroup made for the pod is written down as ours before anything can make it: the
    // self-audit collects only what is written down (another daemon may share the parent).
    if rec.own_pod_cgroup {
        crate::cgroups::owned::note(&rt.cfg.root, &id, &rec.pod_cgroup)
            .map_err(|e| Error::step("write down the pod cgroup", &id, e))?;
    }
    // Without an infra process nothing else would set them: write them into the pinned
    // namespaces now (an infra's runtime applies them from its spec).
    if !plan.infra && !plan.sysctls.is_empty() {
        rt.host
            .apply_sysctls(
                rec.netns.as_deref(),
                rec.ipcns.as_deref(),
                rec.utsns.as_deref(),
                &plan.sysctls,
            )
            .map_err(|e| Error::InvalidArgument(format!("linux.sysctls: {e}")))?;
    }

    if let (Some(cache), Some(netns)) = (&rec.network.cache, &rec.netns) {
        let result = super::network::add(rt, cache, netns)
            .map_err(|e| Error::step("set up network", &id, e))?;
        // The attachment DEL needs, kept durably on its own at once: even if this record is
        // lost or corrupted later, the addresses can be released.
        let kept = CacheEntry {
            result: Some(result.clone()),
            ..cache.clone()
        };
        rt.host
            .cni_save_cache(&rt.cni, &id, &kept)
            .map_err(|e| Error::step("keep CNI attachment", &id, e))?;
        entry.note(|r| {
            r.network.ips = crate::cni::result_ips(&result);
            if let Some(c) = r.network.cache.as_mut() {
                c.result = Some(result);
            }
        });
        failpoint::hit("run:cni-add");
    }

    if let Some(shm) = &rec.shm {
        rt.host
            .mount_shm(shm, rt.cfg.shm_size)
            .map_err(|e| Error::step("mount shm", &id, e))?;
        failpoint::hit("run:shm");
    }

    // Pod-level resources: where kubelet gave the pod's cgroup it has sized it itself (as
    // with containerd and CRI-O); a cgroup made here for the pod is sized here.
    if rec.own_pod_cgroup && (config.resources.is_some() || config.overhead.is_some()) {
        let limits =
            crate::cgroups::PodLimits::of(config.resources.as_ref(), config.overhead.as_ref());
        rt.host
            .set_cgroup_limits(&rec.pod_cgroup, &limits)
            .map_err(|e| Error::step("size the pod's cgroup", &id, e))?;
    }

    if plan.infra {
        start_infra(rt, entry, config, plan, &rec)?;
    }
    // NRI plugins see the pod before anyone else does (it is hidden meanwhile); one that
    // refuses it fails the creation, which the caller rolls back.
    if rt.nri.active() {
        let snapshot = lock(&entry.record).clone();
        rt.nri.run_pod_sandbox(&snapshot, &rt.cfg)?;
    }
    entry.update(|r| r.state = SandboxState::Ready)
}

fn start_infra(
    rt: &Runtime,
    entry: &SandboxEntry,
    config: &PodSandboxConfig,
    plan: &Plan,
    rec: &SandboxRecord,
) -> Result<()> {
    let (id, dir) = (&rec.id, &rec.dir);
    let runtime = rt.handler(&plan.handler)?;
    let rootfs = rt
        .infra_rootfs
        .clone()
        .ok_or_else(|| Error::Config("no sandboxd-pause binary found (set pause_path)".into()))?;
    let infra_dir = rec.infra_dir();
    crate::state::files::private_dir_all(&infra_dir)
        .map_err(|e| Error::step("create infra dir", id, e))?;
    // In the pod's own user namespace the runtime reaches the rootfs as the pod's root: an
    // idmapped read-only copy of the shared one, in a dir that user can enter.
    let rootfs = match (&rec.userns, &config.user_namespace) {
        (Some(path), Some(map)) => (|| -> Result<std::path::PathBuf, HostError> {
            let owner = map.host_root().unwrap_or_default();
            let at = crate::userns::pod_root_dir(&rt.cfg.root, id, owner)?.join("rootfs");
            let ns = std::fs::File::open(path).map_err(|e| HostError::io("open", path, e))?;
            rt.host
                .mount_tree_copy(&rootfs, &at, true, Some(std::os::fd::AsFd::as_fd(&ns)))?;
            Ok(at)
        })()
        .map_err(|e| Error::step("mount idmapped infra rootfs", id, e))?,
        _ => rootfs,
    };
    let s = spec::infra(&spec::InfraSpec {
        sandbox_id: id.to_string(),
        metadata: config.metadata.clone(),
        rootfs,
        hostname: plan.hostname.clone(),
        netns: rec.netns.clone(),
        private_netns: false,
        userns: rec.userns.clone().zip(config.user_namespace.clone()),
        host_ipc: config.host_ipc(),
        host_pid: config.host_pid(),
        shm: rec.shm.clone(),
        resolv_conf: dir.join("resolv.conf"),
        hosts: dir.join("hosts"),
        hostname_file: dir.join("hostname"),
        cgroups_path: crate::cgroups::child(&rec.pod_cgroup(&rt.cfg), id),
        oom_score_adj: spec::clamp_oom_score_adj(-998),
        sysctls: plan
            .sysctls
            .iter()
            .map(|(k, v, _)| (k.clone(), v.clone()))
            .collect(),
    })
    .map_err(|e| Error::step("generate infra spec", id, e))?;
    spec::save(&s, &infra_dir.join("config.json"))
        .map_err(|e| Error::step("write infra bundle", id, e))?;
    let files = ContainerFiles::in_dir(&infra_dir, None);
    let pid = rt
        .host
        .runtime_create(runtime, id, &infra_dir, &files)
        .map_err(|e| Error::step("create infra container", id, e))?;
    let who = crate::process::ProcId::now(pid);
    entry.note(|r| {
        if let Some(i) = r.infra.as_mut() {
            i.created = true;
            i.pid = pid;
            i.pid_start = who.start_ticks;
            i.boot_id = who.boot_id;
        }
    });
    failpoint::hit("run:infra-created");
    rt.host
        .runtime_start(runtime, id, &files.runtime_log)
        .map_err(|e| Error::step("start infra container", id, e))?;
    entry.note(|r| {
        if let Some(i) = r.infra.as_mut() {
            i.started = true;
        }
    });
    super::infra::watch(rt, entry);
    failpoint::hit("run:infra-started");
    Ok(())
}

fn write_sandbox_files(
    dir: &std::path::Path,
    config: &PodSandboxConfig,
    hostname: &str,
) -> Result<(), HostError> {
    // Bind-mounted into the pod's containers, whose users (any uid) read them; the sandbox
    // dir (0700) keeps them from everyone else.
    let write =
        |name: &str, data: &[u8]| crate::state::files::write_file(&dir.join(name), data, 0o644);
    write("hostname", format!("{hostname}\n").as_bytes())?;
    write(
        "hosts",
        b"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nff00::0\tip6-mcastprefix\n",
    )?;
    let resolv = match &config.dns {
        Some(dns)
            if !(dns.servers.is_empty() && dns.searches.is_empty() && dns.options.is_empty()) =>
        {
            let mut s = String::new();
            if !dns.searches.is_empty() {
                s += &format!("search {}\n", dns.searches.join(" "));
            }
            for srv in &dns.servers {
                s += &format!("nameserver {srv}\n");
            }
            if !dns.options.is_empty() {
                s += &format!("options {}\n", dns.options.join(" "));
            }
            s.into_bytes()
        }
        _ => std::fs::read("/etc/resolv.conf").unwrap_or_default(),
    };
    write("resolv.conf", &resolv)
}

/// Checks the whole request before anything on the host is touched.
fn validate_config(rt: &Runtime, c: &PodSandboxConfig) -> Result<Plan> {
    let m = &c.metadata;
    validate::name("metadata.name", &m.name)?;
    validate::name("metadata.namespace", &m.namespace)?;
    validate::name("metadata.uid", &m.uid)?;
    validate::labels_and_annotations(&c.labels, &c.annotations)?;
    let s = &c.selinux;
    crate::lsm::selinux_label(
        [&s[0], &s[1], &s[2], &s[3]],
        "linux.security_context.selinux_options",
    )?;
    // An empty hostname becomes a valid one (`effective_hostname`, once the id is known).
    if !c.hostname.is_empty() {
        validate::hostname(&c.hostname)?;
    }
    if !c.log_directory.is_empty() && !c.log_directory.starts_with('/') {
        return Err(Error::InvalidArgument(format!(
            "log_directory {:?} must be an absolute path",
            c.log_directory
        )));
    }
    if !c.cgroup_parent.is_empty()
        && (!c.cgroup_parent.starts_with('/')
            || c.cgroup_parent.split('/').any(|s| s == ".." || s == "."))
    {
        return Err(Error::InvalidArgument(format!(
            "linux.cgroup_parent {:?} must be an absolute path without \".\" or \"..\"",
            c.cgroup_parent
        )));
    }
    if !c.cgroup_parent.is_empty() {
        rt.cgroup_driver
            .pod_cgroup(&c.cgroup_parent)
            .map_err(Error::InvalidArgument)?;
    }
    crate::container::spec::validate_pod_resources(c.resources.as_ref(), c.overhead.as_ref())?;
    if let Some(dns) = &c.dns {
        for s in &dns.servers {
            s.parse::<IpAddr>().map_err(|_| {
                Error::InvalidArgument(format!("dns_config.servers: {s:?} is not an IP address"))
            })?;
        }
        if dns.searches.len() > 32 {
            return Err(Error::InvalidArgument(
                "dns_config.searches: more than 32 domains".into(),
            ));
        }
        if dns
            .searches
            .iter()
            .chain(&dns.options)
            .any(|s| s.is_empty() || s.contains(char::is_whitespace))
        {
            return Err(Error::InvalidArgument(
                "dns_config.searches and options must be non-empty words without whitespace".into(),
            ));
        }
    }
    for p in &c.port_mappings {
        if p.container_port == 0 || !matches!(p.protocol.as_str(), "tcp" | "udp" | "sctp") {
            return Err(Error::InvalidArgument(format!(
                "port_mappings: {p:?} needs a non-zero container_port and protocol tcp, udp or sctp"
            )));
        }
    }
    if c.namespace_options.network == NamespaceMode::Target
        || c.namespace_options.network == NamespaceMode::Container
        || c.namespace_options.ipc == NamespaceMode::Target
        || c.namespace_options.ipc == NamespaceMode::Container
    {
        return Err(Error::InvalidArgument(
            "namespace_options: network and ipc must be POD or NODE".into(),
        ));
    }
    if c.namespace_options.pid == NamespaceMode::Target {
        return Err(Error::InvalidArgument(
            "namespace_options.pid TARGET applies to containers, not sandboxes".into(),
        ));
    }
    let handler_name = if c.runtime_handler.is_empty() {
        rt.cfg.default_runtime.clone()
    } else {
        c.runtime_handler.clone()
    };
    let runtime = rt.handler(&handler_name)?;
    if !runtime.path.is_file() {
        return Err(Error::Config(format!(
            "runtime handler {handler_name:?}: binary {} does not exist",
            runtime.path.display()
        )));
    }
    // Refused at once when the start-up probe's trial container failed (a handler still
    // being tried is not waited for).
    if let crate::probe::Readiness::NotReady(why) = rt.handler_readiness(&handler_name) {
        return Err(Error::FailedPrecondition(format!(
            "runtime handler {handler_name:?} cannot create containers on this node (its trial container at start failed): {why}"
        )));
    }
    let needs_process = runtime.family.sandbox_process();
    let infra = c.namespace_options.pid == NamespaceMode::Pod
        || needs_process
        || rt.cfg.infra == InfraPolicy::Always;
    if infra {
        if rt.infra_rootfs.is_none() {
            return Err(Error::Config(
                "this pod needs an infra process but no sandboxd-pause binary was found (set pause_path)".into(),
            ));
        }
        if !runtime.monitor.is_file() {
            return Err(Error::Config(format!(
                "monitor binary {} does not exist (set monitor_path)",
                runtime.monitor.display()
            )));
        }
    }
    let network = if c.host_network() {
        None
    } else {
        let list = rt.network().map_err(|e| Error::Config(e.to_string()))?;
        rt.cni
            .check_plugins(&list)
            .map_err(|e| Error::Config(format!("network {:?}: {e}", list.name)))?;
        Some(list)
    };
    if let Some(map) = &c.user_namespace {
        map.check("namespace_options.userns_options")?;
        // The node's network is allowed (kubelet 1.36's user_namespaces_host_network): the
        // pod's root owns nothing of it, and the container's /sys is the runtime's bind of the
        // node's (read-only), as a sysfs cannot be mounted for a network namespace the user
        // namespace does not own.
        if c.host_pid() || c.host_ipc() {
            return Err(Error::InvalidArgument(
                "namespace_options.userns_options: a pod with its own user namespace cannot share the node's PID or IPC namespace".into(),
            ));
        }
        rt.user_namespaces(&handler_name)
            .map_err(Error::Unimplemented)?;
    }
    let sysctls = crate::sysctl::validate(&c.sysctls, c.host_network(), c.host_ipc())?;
    Ok(Plan {
        handler: handler_name,
        infra,
        network,
        hostname: String::new(),
        sysctls,
    })
}
