//! What `Status` reports of the runtime: whether the network is usable (a valid CNI config
//! whose plugins exist), what each runtime handler can do on this host, and the records
//! quarantined at start-up.

use crate::runtime::Runtime;

/// One runtime handler and the features it has here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerStatus {
    /// The handler's name, a key of [`Config::runtimes`](crate::config::Config::runtimes); the
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
    /// The handlers offered: binary found, and no failed trial (`probe`).
    pub handlers: Vec<HandlerStatus>,
    /// The handlers not offered, each with why (the runtime's own message).
    pub not_offered: Vec<(String, String)>,
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
        self.probe_handlers();
        let mut handlers = Vec::new();
        let mut not_offered = Vec::new();
        for name in self.cfg.runtimes.keys() {
            // A handler whose binary is missing, or whose trial container failed, cannot run
            // pods: not offered (kubelet's RuntimeClass would send pods to it).
            match self.handler_unusable(name) {
                Some(why) => not_offered.push((name.clone(), why)),
                None => handlers.push(HandlerStatus {
                    name: name.clone(),
                    recursive_read_only_mounts: rro,
                    user_namespaces: self.user_namespaces(name).is_ok(),
                }),
            }
        }
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
            not_offered,
            quarantined: self.quarantined(),
        }
    }

    /// Why pods of `handler` cannot run here, if the host probe knows: its binary is missing
    /// or its trial container failed. `None` while it is being tried.
    pub(crate) fn handler_unusable(&self, handler: &str) -> Option<String> {
        let rt = self.handler(handler).ok()?;
        if let Some(why) = crate::probe::missing_binary(&rt.path) {
            return Some(why);
        }
        match self.handler_readiness(handler) {
            crate::probe::Readiness::NotReady(why) => Some(why),
            _ => None,
        }
    }

    /// Whether pods of `handler` can have their own user namespace here, or why not. The
    /// node's support is probed once.
    pub fn user_namespaces(&self, handler: &str) -> Result<(), String> {
        if !self.cfg.runtimes.contains_key(handler) {
            return Err(format!("no runtime handler {handler:?}"));
        }
        if !self.handler(handler).is_ok_and(|r| r.family.node_kernel()) {
            return Err(format!(
                "runtime handler {handler:?} runs pods in a sandbox of its own, which brings its own user namespace handling"
            ));
        }
        self.probe
            .userns
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
