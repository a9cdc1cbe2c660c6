//! What the daemon measures: per-pod resource use for CRI metrics and stats (cgroups, the
//! pod's network namespace, container writable layers), and the daemon's own operation
//! metrics served in the Prometheus text format ([`prom`]) when `--metrics-address` is set.

pub mod prom;

use crate::cgroups::Detail;
use crate::netdev::Interface;
use crate::{ContainerRecord, ContainerState, Runtime, SandboxRecord, SandboxState};

/// One ready pod's use, read now.
#[derive(Debug, Clone)]
pub struct PodUsage {
    pub sandbox: SandboxRecord,
    /// The pod cgroup (which holds every container's).
    pub cgroup: Detail,
    /// The pod's network namespace's interfaces (none for a host-network pod).
    pub interfaces: Vec<Interface>,
    pub containers: Vec<ContainerUsage>,
    /// When it was read (Unix nanoseconds).
    pub timestamp: i64,
}

/// One running container's use.
#[derive(Debug, Clone)]
pub struct ContainerUsage {
    pub record: ContainerRecord,
    pub cgroup: Detail,
    /// What the container wrote to its rootfs (its overlay upper dir).
    pub writable_bytes: u64,
    pub writable_inodes: u64,
}

/// How much of a container's cgroup to read: what CRI stats report (CPU and memory use: a
/// few small files — ListContainerStats at a thousand containers stays cheap), or everything
/// cAdvisor's metrics report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    Stats,
    Metrics,
}

impl Runtime {
    /// The daemon's operation metrics (RPC latencies and errors, pulls).
    pub fn daemon_metrics(&self) -> std::sync::Arc<prom::DaemonMetrics> {
        self.metrics.clone()
    }

    /// Pods and containers by state (CRI state names, lower case), for the metrics.
    pub fn counts_by_state(&self) -> (prom::StateCounts, prom::StateCounts) {
        let pods = self.list_pod_sandboxes(&crate::SandboxFilter::default());
        let ready = pods
            .iter()
            .filter(|p| p.state == SandboxState::Ready)
            .count() as i64;
        let containers = self.list_containers(&crate::ContainerFilter::default());
        let n = |s: ContainerState| containers.iter().filter(|c| c.cri_state() == s).count() as i64;
        (
            vec![("ready", ready), ("notready", pods.len() as i64 - ready)],
            vec![
                ("created", n(ContainerState::Created)),
                ("running", n(ContainerState::Running)),
                ("exited", n(ContainerState::Exited)),
                ("unknown", n(ContainerState::Unknown)),
            ],
        )
    }

    /// The use of the pods `filter` matches and of their running containers.
    pub fn pods_usage(&self, filter: &crate::SandboxFilter, depth: Depth) -> Vec<PodUsage> {
        // Grouped by pod once: O(pods + containers), not pods × containers.
        let mut running: std::collections::HashMap<String, Vec<ContainerRecord>> =
            Default::default();
        for c in self.list_containers(&crate::ContainerFilter {
            state: Some(ContainerState::Running),
            ..Default::default()
        }) {
            running.entry(c.sandbox_id.clone()).or_default().push(c);
        }
        self.list_pod_sandboxes(filter)
            .iter()
            .filter_map(|s| self.sandbox_record(&s.id).ok())
            .map(|sb| {
                let mine = running.remove(&sb.id).unwrap_or_default();
                self.usage_of(sb, mine, depth)
            })
            .collect()
    }

    /// One pod's use; `NotFound` for an unknown id.
    pub fn pod_usage_detail(&self, id: &str) -> crate::Result<PodUsage> {
        let sb = self.sandbox_record(id)?;
        let running = self.list_containers(&crate::ContainerFilter {
            sandbox_id: Some(sb.id.clone()),
            state: Some(ContainerState::Running),
            ..Default::default()
        });
        Ok(self.usage_of(sb, running, Depth::Stats))
    }

    /// The use of the containers `filter` matches.
    pub fn containers_usage(&self, filter: &crate::ContainerFilter) -> Vec<ContainerUsage> {
        self.list_containers(filter)
            .into_iter()
            .map(|r| self.usage_of_container(r, Depth::Stats))
            .collect()
    }

    /// One container's use; `NotFound` for an unknown id.
    pub fn container_usage_detail(&self, id: &str) -> crate::Result<ContainerUsage> {
        Ok(self.usage_of_container(self.container_record(id)?, Depth::Stats))
    }

    /// A container's use: its cgroup, or — when its cgroup holds no process although it
    /// runs (a sandboxed runtime keeps every container in its sandbox's cgroup) — what the
    /// runtime measures (`events --stats`).
    fn usage_of_container(&self, record: ContainerRecord, depth: Depth) -> ContainerUsage {
        let (bytes, inodes) = crate::state::disk_usage(&record.upper_dir());
        let mut cgroup = match depth {
            Depth::Metrics => crate::cgroups::detail(&record.cgroup),
            Depth::Stats => crate::cgroups::usage(&record.cgroup).into(),
        };
        let empty = match depth {
            Depth::Metrics => matches!(cgroup.processes, None | Some(0)),
            // A running container's own cgroup always holds some memory.
            Depth::Stats => matches!(cgroup.memory_bytes, None | Some(0)),
        };
        if empty && record.state == ContainerState::Running {
            let stats = self
                .handler(&record.runtime_handler)
                .ok()
                .and_then(|h| h.stats(&record.id).ok());
            if let Some(s) = stats {
                cgroup.cpu_nanos = s.cpu_nanos.or(cgroup.cpu_nanos);
                cgroup.memory_bytes = s.memory_bytes.or(cgroup.memory_bytes);
                cgroup.working_set_bytes = s.memory_bytes.or(cgroup.working_set_bytes);
                cgroup.tasks = s.tasks.or(cgroup.tasks);
                cgroup.processes = s.tasks.or(cgroup.processes);
            }
        }
        ContainerUsage {
            cgroup,
            writable_bytes: bytes,
            writable_inodes: inodes,
            record,
        }
    }

    /// `sb`'s use, with its running containers'.
    fn usage_of(&self, sb: SandboxRecord, running: Vec<ContainerRecord>, depth: Depth) -> PodUsage {
        let interfaces = match (&sb.netns, sb.state) {
            (Some(ns), SandboxState::Ready) => crate::netdev::read(ns).unwrap_or_else(|e| {
                tracing::debug!(sandbox_id = %sb.id, error = %e, "cannot read the pod's interface counters");
                Vec::new()
            }),
            _ => Vec::new(),
        };
        let containers = running
            .into_iter()
            .map(|c| self.usage_of_container(c, depth))
            .collect();
        PodUsage {
            cgroup: crate::cgroups::detail(&sb.pod_cgroup(self.config())),
            interfaces,
            containers,
            timestamp: crate::state::now_nanos(),
            sandbox: sb,
        }
    }
}
