//! What `Status` reports of the runtime: whether the network is usable (a valid CNI config
//! whose plugins exist), what each runtime handler can do on this host, and the records
//! quarantined at start-up.

use crate::Runtime;

/// One runtime handler and the features it has here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerStatus {
    /// The handler's name, a key of [`Config::runtimes`](crate::Config::runtimes); the
    /// default handler is listed once more under the empty name.
    pub name: String,
    /// Recursively read-only mounts are made by the daemon itself (open_tree +
    /// mount_setattr), so every handler has them where the kernel does.
    pub recursive_read_only_mounts: bool,
    /// Pods with their own user namespace: where the node can make them (`userns::probe`)
    /// and the handler runs containers on the node's kernel (not a sandboxed or VM runtime,
    /// which brings its own).
    pub user_namespaces: bool,
}

/// The runtime's health, as `Status` shows it.
#[derive(Debug, Clone)]
pub struct RuntimeHealth {
    /// The CNI network new pods would join, or why none is usable.
    pub network: Result<crate::cni::NetworkList, String>,
    /// The handlers whose binary exists and that can make a container here.
    pub handlers: Vec<HandlerStatus>,
    /// Handlers that cannot make a container on this node, and why (not offered).
    pub unusable_handlers: Vec<(String, String)>,
    /// One line per record quarantined at start-up.
    pub quarantined: Vec<String>,
}

impl Runtime {
    /// The runtime's health (reads the CNI conf dir and looks for the plugins it names).
    pub fn health(&self) -> RuntimeHealth {
        let network = self.network().map_err(|e| e.to_string()).and_then(|l| {
            self.cni.check_plugins(&l).map_err(|e| e.to_string())?;
            Ok(l)
        });
        let rro = crate::mounts::recursive_read_only_supported();
        let mut unusable_handlers = Vec::new();
        let mut handlers: Vec<HandlerStatus> = self
            .cfg
            .runtimes
            .iter()
            // A handler whose binary is missing cannot run anything: not offered; nor one
            // that cannot make a container here.
            .filter(|(_, h)| h.path.is_file())
            .filter(|(name, _)| match self.handler_works(name) {
                Ok(()) => true,
                Err(why) => {
                    unusable_handlers.push((name.to_string(), why));
                    false
                }
            })
            .map(|(name, _)| HandlerStatus {
                name: name.clone(),
                recursive_read_only_mounts: rro,
                user_namespaces: self.user_namespaces(name).is_ok(),
            })
            .collect();
        // The default handler once more under the empty name, as api.proto says (kubelet
        // looks up pods without a RuntimeClass under it).
        if let Some(d) = handlers.iter().find(|h| h.name == self.cfg.default_runtime) {
            handlers.push(HandlerStatus {
                name: String::new(),
                ..d.clone()
            });
        }
        RuntimeHealth {
            network,
            handlers,
            unusable_handlers,
            quarantined: self.quarantined(),
        }
    }

    /// Whether `handler` can make a container on this node, or why not — proved by making
    /// one: the infra's pause process, created and deleted through the monitor as a pod's
    /// would be (once per handler; a failure is tried again after a minute). Handlers that
    /// run pods in a sandbox process of their own (gVisor, VMs) are not probed. Without a
    /// pause binary nothing can be proved, and nothing is refused.
    pub fn handler_works(&self, handler: &str) -> Result<(), String> {
        let h = match self.cfg.runtimes.get(handler) {
            Some(h) if !h.needs_sandbox_process => h,
            _ => return Ok(()),
        };
        let Some(rootfs) = self.infra_rootfs.clone() else {
            return Ok(());
        };
        let mut probes = crate::lock(&self.handler_probes);
        if let Some((at, r)) = probes.get(handler) {
            if r.is_ok() || at.elapsed() < std::time::Duration::from_secs(60) {
                return r.clone();
            }
        }
        let r = self.probe_handler(handler, rootfs);
        match &r {
            Ok(()) => {
                tracing::info!(handler, path = %h.path.display(), "runtime handler can make containers here")
            }
            Err(why) => {
                tracing::warn!(handler, reason = %why, "runtime handler cannot make containers here; not offered")
            }
        }
        probes.insert(handler.to_string(), (std::time::Instant::now(), r.clone()));
        r
    }

    fn probe_handler(&self, handler: &str, rootfs: std::path::PathBuf) -> Result<(), String> {
        let runtime = self.handler(handler).map_err(|e| e.to_string())?;
        let id = format!("probe-{handler}-{}", &crate::validate::new_id()[..12]);
        let dir = self.cfg.root.join("runtime-probe").join(&id);
        let result = (|| -> Result<(), String> {
            crate::state::files::private_dir_all(&dir).map_err(|e| e.to_string())?;
            for f in ["resolv.conf", "hosts", "hostname"] {
                std::fs::write(dir.join(f), "").map_err(|e| e.to_string())?;
            }
            let parent = match self.cgroup_driver {
                crate::cgroups::Driver::Systemd => "system.slice".to_string(),
                crate::cgroups::Driver::Cgroupfs => self.cfg.cgroup_parent.clone(),
            };
            let spec = crate::oci::spec::infra(&crate::oci::spec::InfraSpec {
                sandbox_id: id.clone(),
                metadata: Default::default(),
                rootfs,
                hostname: "probe".into(),
                netns: None,
                userns: None,
                host_ipc: false,
                host_pid: false,
                shm: None,
                resolv_conf: dir.join("resolv.conf"),
                hosts: dir.join("hosts"),
                hostname_file: dir.join("hostname"),
                cgroups_path: crate::cgroups::child(&parent, &id),
                oom_score_adj: 0,
                sysctls: Default::default(),
            })
            .map_err(|e| e.to_string())?;
            crate::oci::spec::save(&spec, &dir.join("config.json")).map_err(|e| e.to_string())?;
            let files = crate::oci::ContainerFiles::in_dir(&dir, None);
            self.host.probe_runtime(runtime, &id, &dir, &files)
        })();
        let _ = std::fs::remove_dir_all(&dir);
        result
    }

    /// Whether pods of `handler` can have their own user namespace here, or why not. The
    /// node's support is probed once.
    pub fn user_namespaces(&self, handler: &str) -> Result<(), String> {
        let h = self
            .cfg
            .runtimes
            .get(handler)
            .ok_or_else(|| format!("no runtime handler {handler:?}"))?;
        if h.needs_sandbox_process {
            return Err(format!(
                "runtime handler {handler:?} runs pods in a sandbox of its own, which brings its own user namespace handling"
            ));
        }
        self.userns_support
            .get_or_init(|| {
                let r = crate::userns::probe(&self.cfg.root.join("userns-probe"));
                match &r {
                    Ok(()) => tracing::info!("pods can have user namespaces on this node"),
                    Err(e) => {
                        tracing::info!(reason = %e, "pods cannot have user namespaces on this node")
                    }
                }
                r
            })
            .clone()
            .map_err(|e| format!("this node cannot run pods in user namespaces: {e}"))
    }
}
