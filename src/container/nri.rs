//! The runtime as NRI plugins reach it: every pod and container for a joining plugin, and
//! the updates and evictions plugins ask for. It holds the runtime weakly, so plugins never
//! keep it alive.

use std::sync::Weak;

use sandboxd_nri_api::api;

use crate::nri::{convert, Updates};
use crate::runtime::Runtime;
use crate::state::lock;

/// The runtime, for the plugins' side.
pub struct Domain(pub(crate) Weak<Runtime>);

impl Updates for Domain {
    fn apply(
        &self,
        plugin: &str,
        update: &[api::ContainerUpdate],
        evict: &[api::ContainerEviction],
    ) -> Vec<api::ContainerUpdate> {
        let Some(rt) = self.0.upgrade() else {
            return update.to_vec();
        };
        let mut failed = Vec::new();
        for u in update {
            let r = rt.container_record(&u.container_id).and_then(|rec| {
                let Some(res) = u.linux.as_ref().and_then(|l| l.resources.as_ref()) else {
                    return Ok(());
                };
                let want = convert::update_resources(&rec.config.resources, res)
                    .map_err(crate::error::Error::InvalidArgument)?;
                super::update::apply_resources(&rt, &rec.id, &want)
            });
            if let Err(e) = r {
                tracing::warn!(plugin, container_id = %u.container_id, error = %e, "NRI plugin's update not applied");
                if !u.ignore_failure {
                    failed.push(u.clone());
                }
            }
        }
        for e in evict {
            tracing::warn!(plugin, container_id = %e.container_id, reason = %e.reason, "NRI plugin evicts a container: stopping it");
            if let Err(err) = super::stop::stop(&rt, &e.container_id, std::time::Duration::ZERO) {
                tracing::warn!(plugin, container_id = %e.container_id, error = %err, "eviction failed");
            }
        }
        failed
    }

    fn snapshot(&self) -> (Vec<api::PodSandbox>, Vec<api::Container>) {
        let Some(rt) = self.0.upgrade() else {
            return Default::default();
        };
        let (sandboxes, containers): (Vec<_>, Vec<_>) = {
            let reg = lock(&rt.registry);
            (
                reg.sandboxes.values().cloned().collect(),
                reg.containers.values().cloned().collect(),
            )
        };
        let pods = sandboxes
            .iter()
            .map(|e| convert::pod(&lock(&e.record), &rt.cfg))
            .collect();
        let ctrs = containers
            .iter()
            .map(|e| convert::created(&lock(&e.record).clone()))
            .collect();
        (pods, ctrs)
    }
}
