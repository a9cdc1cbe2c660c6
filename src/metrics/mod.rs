//! What the daemon measures: per-pod resource use for CRI metrics and stats (cgroups, the
//! pod's network namespace, container writable layers), and the daemon's own operation
//! metrics served in the Prometheus text format ([`prom`]) when `--metrics-address` is set.

mod fs_usage;
pub mod prom;

pub use fs_usage::{FsUsageCache, Measured, DEFAULT_PERIOD as DEFAULT_STATS_PERIOD};

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
    /// What the container wrote to its rootfs (its overlay upper dir), with when it was
    /// measured (see [`FsUsageCache`]); `None` until it first is.
    pub writable: Option<Measured>,
}

/// Items per reader thread below which a list is read on the calling thread alone.
const PER_THREAD: usize = 64;

/// `f` over `items`, in order, on up to 4 threads (one per CPU): reading a thousand cgroups'
/// files is kernel time that parallelizes.
fn par_map<T: Send, R: Send>(items: Vec<T>, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = cpus.min(4).min(items.len() / PER_THREAD).max(1);
    if threads == 1 {
        return items.into_iter().map(f).collect();
    }
    let per = items.len().div_ceil(threads);
    let mut items = items.into_iter().peekable();
    let mut slots: Vec<std::sync::Mutex<Option<Vec<T>>>> = Vec::with_capacity(threads);
    while items.peek().is_some() {
        slots.push(std::sync::Mutex::new(Some(
            items.by_ref().take(per).collect(),
        )));
    }
    let take =
        |slot: &std::sync::Mutex<Option<Vec<T>>>| crate::lock(slot).take().unwrap_or_default();
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = slots[1..]
            .iter()
            .map(|slot| {
                std::thread::Builder::new()
                    .name("stats-reader".into())
                    .spawn_scoped(s, move || take(slot).into_iter().map(f).collect::<Vec<R>>())
                    .ok()
            })
            .collect();
        let mut out: Vec<R> = take(&slots[0]).into_iter().map(f).collect();
        for (h, slot) in handles.into_iter().zip(&slots[1..]) {
            match h.and_then(|h| h.join().ok()) {
                Some(v) => out.extend(v),
                // Not spawned: read here.
                None => out.extend(take(slot).into_iter().map(f)),
            }
        }
        out
    })
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
        par_map(self.list_containers(filter), |r| {
            self.usage_of_container(r, Depth::Stats)
        })
    }

    /// One container's use; `NotFound` for an unknown id.
    pub fn container_usage_detail(&self, id: &str) -> crate::Result<ContainerUsage> {
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

#[cfg(test)]
mod tests {
    #[test]
    fn par_map_keeps_order_and_every_item() {
        for n in [0, 1, 63, 64, 129, 1000, 1001] {
            let v: Vec<usize> = (0..n).collect();
            let out = super::par_map(v, |i| i * 2);
            assert_eq!(out, (0..n).map(|i| i * 2).collect::<Vec<_>>(), "n={n}");
        }
    }
}
