//! What `Status` reports of the runtime: whether the network is usable (a valid CNI config
//! whose plugins exist), what each runtime handler can do on this host, and the records
//! quarantined at start-up.

use crate::Runtime;

/// One runtime handler and the features it has here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerStatus {
    pub name: String,
    /// Recursively read-only mounts are made by the daemon itself (open_tree +
    /// mount_setattr), so every handler has them where the kernel does.
    pub recursive_read_only_mounts: bool,
    /// Pod user namespaces are not implemented: never offered.
    pub user_namespaces: bool,
}

/// The runtime's health, as `Status` shows it.
#[derive(Debug, Clone)]
pub struct RuntimeHealth {
    /// The CNI network new pods would join, or why none is usable.
    pub network: Result<crate::cni::NetworkList, String>,
    /// The handlers whose binary exists.
    pub handlers: Vec<HandlerStatus>,
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
        RuntimeHealth {
            network,
            handlers: self
                .cfg
                .runtimes
                .iter()
                // A handler whose binary is missing cannot run anything: not offered.
                .filter(|(_, h)| h.path.is_file())
                .map(|(name, _)| HandlerStatus {
                    name: name.clone(),
                    recursive_read_only_mounts: rro,
                    user_namespaces: false,
                })
                .collect(),
            quarantined: self.quarantined(),
        }
    }
}
