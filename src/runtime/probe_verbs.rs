//! The probe's verbs: its trials started once, and what it found read.

use std::collections::BTreeMap;
use std::time::Duration;

use super::Runtime;
use crate::probe::{Readiness, TrialPlace};

impl Runtime {
    /// Starts the handlers' trial containers in the background, once (the daemon calls it
    /// before serving; [`health`](Self::health) calls it too).
    pub fn probe_handlers(&self) {
        self.probe.start(self.runtimes.values(), || TrialPlace {
            infra_rootfs: self.infra_rootfs.clone(),
            dir: self.cfg.root.join("probe"),
            driver: self.cgroup_driver,
            cgroup_parent: self.cfg.cgroup_parent.clone(),
        });
    }

    /// Ends the probe before the daemon exits: trials not begun are skipped, those in
    /// progress are waited for (up to `limit`) so that none is left half-made.
    pub fn stop_probe(&self, limit: Duration) {
        self.probe.stop(limit);
    }

    /// What the probe found of `handler` (the default one for an empty name).
    pub fn handler_readiness(&self, handler: &str) -> Readiness {
        let name = if handler.is_empty() {
            &self.cfg.default_runtime
        } else {
            handler
        };
        self.probe.readiness(name)
    }

    /// Starts the probe if needed and waits (up to `limit`) until no handler is being tried;
    /// returns what it found of each.
    pub fn wait_probed(&self, limit: Duration) -> BTreeMap<String, Readiness> {
        self.probe_handlers();
        self.probe.wait(limit)
    }
}
