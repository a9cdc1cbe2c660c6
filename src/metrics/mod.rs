//! What the daemon measures: per-pod resource use for CRI metrics and stats (cgroups, the
//! pod's network namespace, container writable layers), and the daemon's own operation
//! metrics served in the Prometheus text format ([`prom`]) when `--metrics-address` is set.

mod fs_usage;
pub mod prom;

pub use fs_usage::{FsUsageCache, Measured, DEFAULT_PERIOD as DEFAULT_STATS_PERIOD};

use crate::cgroups::Detail;
use crate::model::container::ContainerRecord;
use crate::model::sandbox::SandboxRecord;
use crate::netdev::Interface;

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
pub(crate) fn par_map<T: Send, R: Send>(items: Vec<T>, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    par_map_on(cpus.min(4), items, f)
}

/// [`par_map`] on up to `max_threads` threads, whatever the CPUs: for work that waits on the
/// disk (reading a thousand small files the page cache no longer holds) rather than on a CPU.
pub(crate) fn par_map_on<T: Send, R: Send>(
    max_threads: usize,
    items: Vec<T>,
    f: impl Fn(T) -> R + Sync,
) -> Vec<R> {
    let threads = max_threads.min(items.len() / PER_THREAD).max(1);
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
    let take = |slot: &std::sync::Mutex<Option<Vec<T>>>| {
        crate::state::lock(slot).take().unwrap_or_default()
    };
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
