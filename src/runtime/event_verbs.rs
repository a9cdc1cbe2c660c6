//! The event verbs: subscribing to lifecycle events, and publishing a transition with the
//! pod's statuses as they stand.

use super::Runtime;
use crate::events::{Event, EventKind, Subscription};
use crate::model::container::ContainerRecord;
use crate::model::sandbox::SandboxStatus;

impl Runtime {
    /// Subscribes to lifecycle events (GetContainerEvents). `ResourceExhausted` when
    /// `events_max_subscribers` are connected already.
    pub fn subscribe_events(&self) -> crate::error::Result<Subscription> {
        self.events.subscribe().ok_or_else(|| {
            crate::error::Error::ResourceExhausted(format!(
                "{} event subscribers are connected already (events_max_subscribers)",
                self.cfg.events_max_subscribers
            ))
        })
    }

    /// Publishes a container's transition with its pod's statuses as they are now (nothing
    /// is built when nobody listens). Call with no record lock held.
    pub(crate) fn emit(&self, kind: EventKind, id: &str, sandbox_id: &str) {
        if !self.events.wanted() {
            return;
        }
        let sandbox = self
            .lookup(sandbox_id)
            .ok()
            .flatten()
            .map(|e| crate::state::lock(&e.record).status());
        self.publish(kind, id, sandbox_id, sandbox);
    }

    /// Publishes a pod's transition (`container_id` is the pod's id, as CRI-O sends it).
    pub(crate) fn emit_pod(&self, kind: EventKind, status: SandboxStatus) {
        if !self.events.wanted() {
            return;
        }
        let id = status.id.clone();
        self.publish(kind, &id, &id, Some(status));
    }

    fn publish(&self, kind: EventKind, id: &str, sandbox_id: &str, sandbox: Option<SandboxStatus>) {
        let mut containers: Vec<ContainerRecord> = self
            .containers_of(sandbox_id)
            .iter()
            .map(|e| crate::state::lock(&e.record).clone())
            .collect();
        containers.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        self.events.publish(Event {
            kind,
            container_id: id.to_string(),
            created_at: crate::state::now_nanos(),
            sandbox,
            containers,
        });
    }
}
