//! Lifecycle events as GetContainerEvents sends them.

use crate::api::v1 as cri;

/// A lifecycle event as GetContainerEvents sends it.
pub fn event_to_cri(e: &crate::events::Event) -> cri::ContainerEventResponse {
    use crate::events::EventKind;
    let kind = match e.kind {
        EventKind::Created => cri::ContainerEventType::ContainerCreatedEvent,
        EventKind::Started => cri::ContainerEventType::ContainerStartedEvent,
        EventKind::Stopped => cri::ContainerEventType::ContainerStoppedEvent,
        EventKind::Deleted => cri::ContainerEventType::ContainerDeletedEvent,
    };
    cri::ContainerEventResponse {
        container_id: e.container_id.clone(),
        container_event_type: kind as i32,
        created_at: e.created_at,
        pod_sandbox_status: e.sandbox.as_ref().map(super::pod::status_to_cri),
        containers_statuses: e
            .containers
            .iter()
            .map(super::container::status_to_cri)
            .collect(),
    }
}
