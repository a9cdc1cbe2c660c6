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
    /// What the container wrote to its rootfs (its overlay upper dir): bytes and inodes, as
    /// measured at `writable_at` (Unix nanoseconds; see [`FsUsageCache`]).
    pub writable_bytes: u64,
    pub writable_inodes: u64,
    pub writable_at: i64,
}

/// How long a writable layer's measured use is reused before its tree is walked again.
pub const FS_USAGE_TTL: std::time::Duration = std::time::Duration::from_secs(10);

/// Writable-layer use per container, as cAdvisor keeps filesystem use: measured once
/// synchronously, then refreshed in the background once older than [`FS_USAGE_TTL`] while
/// callers get the last measurement — stats of a thousand containers never walk a thousand
/// trees in the call. Every value carries when it was measured, and CRI reports that time.
pub struct FsUsageCache {
    ttl: std::time::Duration,
    map: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, FsUsage>>>,
    /// Containers whose measurement is due, for the refresher thread (started at first use).
    due: std::sync::Mutex<Option<std::sync::mpsc::SyncSender<(String, std::path::PathBuf)>>>,
}

#[derive(Clone, Copy)]
struct FsUsage {
    measured: std::time::Instant,
    at: i64,
    bytes: u64,
    inodes: u64,
    /// A refresh is queued.
    queued: bool,
}

impl FsUsage {
    fn now(upper: &std::path::Path) -> FsUsage {
        let (bytes, inodes) = crate::state::disk_usage(upper);
        FsUsage {
            measured: std::time::Instant::now(),
            at: crate::state::now_nanos(),
            bytes,
            inodes,
            queued: false,
        }
    }
}

impl Default for FsUsageCache {
    fn default() -> Self {
        FsUsageCache {
            ttl: FS_USAGE_TTL,
            map: Default::default(),
            due: std::sync::Mutex::new(None),
        }
    }
}

impl FsUsageCache {
    /// (bytes, inodes, measured at) of `upper`, the writable layer of container `id`.
    fn get(&self, id: &str, upper: &std::path::Path) -> (u64, u64, i64) {
        let stale = {
            let mut m = crate::lock(&self.map);
            match m.get_mut(id) {
                Some(u) => {
                    let stale = u.measured.elapsed() >= self.ttl && !u.queued;
                    u.queued |= stale;
                    Some((u.bytes, u.inodes, u.at, stale))
                }
                None => None,
            }
        };
        match stale {
            Some((bytes, inodes, at, stale)) => {
                if stale {
                    self.refresh_later(id, upper);
                }
                (bytes, inodes, at)
            }
            None => {
                let u = FsUsage::now(upper);
                crate::lock(&self.map).insert(id.to_string(), u);
                (u.bytes, u.inodes, u.at)
            }
        }
    }

    /// Forgets container `id` (removed).
    pub(crate) fn forget(&self, id: &str) {
        crate::lock(&self.map).remove(id);
    }

    /// Queues `id` for the refresher (bounded: a full queue drops it, the next call asks
    /// again).
    fn refresh_later(&self, id: &str, upper: &std::path::Path) {
        let mut due = crate::lock(&self.due);
        if due.is_none() {
            let (tx, rx) = std::sync::mpsc::sync_channel::<(String, std::path::PathBuf)>(4096);
            let map = self.map.clone();
            let spawned = std::thread::Builder::new()
                .name("fs-usage".into())
                .spawn(move || {
                    // Ends when the cache (its sender) goes.
                    for (id, upper) in rx {
                        let u = FsUsage::now(&upper);
                        if let Some(e) = crate::lock(&map).get_mut(&id) {
                            *e = u;
                        }
                    }
                });
            if spawned.is_ok() {
                *due = Some(tx);
            }
        }
        let sent = due
            .as_ref()
            .is_some_and(|tx| tx.try_send((id.to_string(), upper.to_path_buf())).is_ok());
        if !sent {
            if let Some(e) = crate::lock(&self.map).get_mut(id) {
                e.queued = false;
            }
        }
    }
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
        // Stats take the last measurement (refreshed in the background); metrics, scraped
        // less often and read as cAdvisor's, walk the layer now.
        let (bytes, inodes, at) = match depth {
            Depth::Stats => self.fs_usage.get(&record.id, &record.upper_dir()),
            Depth::Metrics => {
                let (b, i) = crate::state::disk_usage(&record.upper_dir());
                (b, i, crate::state::now_nanos())
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
            writable_bytes: bytes,
            writable_inodes: inodes,
            writable_at: at,
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
    use super::*;

    /// Measured at once the first time; then the last measurement while it is fresh; once
    /// stale, still the last one while the refresher measures again in the background.
    #[test]
    fn writable_layer_use_is_refreshed_in_the_background() {
        let dir = std::env::temp_dir().join(format!("sandboxd-fsusage-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a"), vec![1u8; 8192]).unwrap();
        let cache = FsUsageCache {
            ttl: std::time::Duration::from_millis(200),
            ..Default::default()
        };
        let (_, inodes, at) = cache.get("c1", &dir);
        assert_eq!(inodes, 1);
        std::fs::write(dir.join("b"), vec![1u8; 8192]).unwrap();
        assert_eq!(cache.get("c1", &dir), (cache.get("c1", &dir).0, 1, at));
        std::thread::sleep(std::time::Duration::from_millis(250));
        // Stale: the old value now, a fresh one soon after.
        assert_eq!(cache.get("c1", &dir).1, 1);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let (_, inodes, at2) = loop {
            let r = cache.get("c1", &dir);
            if r.1 == 2 || std::time::Instant::now() > deadline {
                break r;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(inodes, 2, "never refreshed");
        assert!(at2 > at);
    }
}
