//! The usage verbs: what pods and containers use now (CRI stats and metrics), counts by
//! state, and the daemon's own metrics. Read from cgroups, the pods' network namespaces and
//! the writable layers' measured use; the types and readers are in `metrics/`.

use crate::metrics::{par_map, prom, ContainerUsage, Depth, Measured, PodUsage};
use crate::model::container::{ContainerRecord, ContainerState};
use crate::model::sandbox::{SandboxRecord, SandboxState};
use crate::runtime::Runtime;

impl Runtime {
    /// The filesystem of containers' writable layers when it is not the images' (the config's
    /// `container_storage_root` on a filesystem of its own): its path and the layers' use
    /// (bytes, inodes) as last measured. `None` when images and layers share a filesystem.
    pub fn container_filesystem(&self) -> Option<(std::path::PathBuf, u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        let root = self.config().container_storage_root.as_ref()?;
        let dev = |p: &std::path::Path| std::fs::metadata(p).ok().map(|m| m.dev());
        let split = dev(root).is_some_and(|d| Some(d) != dev(&self.images.dir));
        split.then(|| {
            let (bytes, inodes) = self.fs_usage.total();
            (root.clone(), bytes, inodes)
        })
    }

    /// The daemon's operation metrics (RPC latencies and errors, pulls).
    pub fn daemon_metrics(&self) -> std::sync::Arc<prom::DaemonMetrics> {
        self.metrics.clone()
    }

    /// Pods and containers by state (CRI state names, lower case), for the metrics.
    pub fn counts_by_state(&self) -> (prom::StateCounts, prom::StateCounts) {
        let pods = self.list_pod_sandboxes(&crate::model::sandbox::SandboxFilter::default());
        let ready = pods
            .iter()
            .filter(|p| p.state == SandboxState::Ready)
            .count() as i64;
        let containers = self.list_containers(&crate::model::container::ContainerFilter::default());
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
    pub fn pods_usage(
        &self,
        filter: &crate::model::sandbox::SandboxFilter,
        depth: Depth,
    ) -> Vec<PodUsage> {
        // Grouped by pod once: O(pods + containers), not pods × containers.
        let mut running: std::collections::HashMap<String, Vec<ContainerRecord>> =
            Default::default();
        for c in self.list_containers(&crate::model::container::ContainerFilter {
            state: Some(ContainerState::Running),
            ..Default::default()
        }) {
            running.entry(c.sandbox_id.clone()).or_default().push(c);
        }
        let pods: Vec<(SandboxRecord, Vec<ContainerRecord>)> = self
            .list_pod_sandboxes(filter)
            .iter()
            .filter_map(|s| self.sandbox_record(&s.id).ok())
            .map(|sb| {
                let mine = running.remove(&sb.id).unwrap_or_default();
                (sb, mine)
            })
            .collect();
        par_map(pods, |(sb, mine)| self.usage_of(sb, mine, depth))
    }

    /// One pod's use; `NotFound` for an unknown id.
    pub fn pod_usage_detail(&self, id: &str) -> crate::error::Result<PodUsage> {
        let sb = self.sandbox_record(id)?;
        let running = self.list_containers(&crate::model::container::ContainerFilter {
            sandbox_id: Some(sb.id.clone()),
            state: Some(ContainerState::Running),
            ..Default::default()
        });
        Ok(self.usage_of(sb, running, Depth::Stats))
    }

    /// The use of the containers `filter` matches.
    pub fn containers_usage(
        &self,
        filter: &crate::model::container::ContainerFilter,
    ) -> Vec<ContainerUsage> {
        par_map(self.list_containers(filter), |r| {
            self.usage_of_container(r, Depth::Stats)
        })
    }

    /// One container's use; `NotFound` for an unknown id.
    pub fn container_usage_detail(&self, id: &str) -> crate::error::Result<ContainerUsage> {
        let mut u = self.usage_of_container(self.container_record(id)?, Depth::Stats);
        // One container: never measured yet is measured now.
        if u.writable.is_none() {
            u.writable = Some(self.fs_usage.get(&u.record.id, &u.record.upper_dir()));
        }
        Ok(u)
    }

    /// A container's use: its cgroup, or — when its cgroup holds no process although it
    /// runs (a sandboxed runtime keeps every container in its sandbox's cgroup) — what the
    /// runtime measures (`events --stats`).
    fn usage_of_container(&self, record: ContainerRecord, depth: Depth) -> ContainerUsage {
        // Stats take the last measurement (refreshed in the background); metrics, scraped
        // less often and read as cAdvisor's, walk the layer now.
        let writable = match depth {
            Depth::Stats => self.fs_usage.cached(&record.id, &record.upper_dir()),
            Depth::Metrics => {
                let (bytes, inodes) = crate::state::disk_usage(&record.upper_dir());
                Some(Measured {
                    bytes,
                    inodes,
                    at: crate::state::now_nanos(),
                })
            }
        };
        let mut cgroup = match depth {
            Depth::Metrics => crate::cgroups::detail(&record.cgroup),
            Depth::Stats => self.cgroup_files.usage(&record.cgroup).into(),
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
            writable,
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
