//! Pod stats (PodSandboxStats, ListPodSandboxStats): the pod's cgroup, its network
//! namespace's interfaces, its process count and its running containers' stats.

use crate::api::v1 as cri;

use super::{container, metrics, pod};

/// One pod's stats: its cgroup (which holds every container's), its network namespace's
/// interfaces, its process count and its running containers.
pub(crate) fn pod_stats(p: &crate::metrics::PodUsage) -> cri::PodSandboxStats {
    let r = &p.sandbox;
    let now = p.timestamp;
    let (cpu, memory) = container::usage_to_cri(&p.cgroup.usage(), now);
    let containers = p
        .containers
        .iter()
        .map(|c| container::stats_of(c, now))
        .collect();
    cri::PodSandboxStats {
        attributes: Some(cri::PodSandboxAttributes {
            id: r.id.clone(),
            metadata: Some(pod::metadata_to_cri(&r.config.metadata)),
            labels: pod::unsorted(&r.config.labels),
            annotations: pod::unsorted(&r.config.annotations),
        }),
        linux: Some(cri::LinuxPodSandboxStats {
            cpu: Some(cpu),
            memory: Some(memory),
            network: metrics::network_stats(p),
            process: p.cgroup.processes.map(|n| cri::ProcessUsage {
                timestamp: now,
                process_count: Some(cri::UInt64Value { value: n }),
            }),
            containers,
            io: container::io_to_cri(&p.cgroup.usage(), now),
        }),
        windows: None,
    }
}
