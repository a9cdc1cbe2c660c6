//! Writable-layer use per container, kept as containerd's CRI keeps snapshot usage (a syncer
//! every `stats_collect_period`) and cAdvisor keeps filesystem use: measured when the container
//! starts, then refreshed in the background once older than the period, while callers get the
//! last measurement with the time it was taken (CRI reports that time). Stats of a thousand
//! containers never walk a tree in the call: a container not measured yet (after a daemon
//! restart) is queued and reported without a writable layer until it is. Only a single
//! container's stats walk in line when nothing is known.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The refresh period unless configured (containerd's `stats_collect_period` default).
pub const DEFAULT_PERIOD: Duration = crate::config::DEFAULT_STATS_PERIOD;

/// Measurements queued for the refresher at most (a full queue drops one; it is asked again).
const QUEUE: usize = 4096;

/// One measurement: bytes and inodes, and when it was taken (Unix nanoseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Measured {
    pub bytes: u64,
    pub inodes: u64,
    pub at: i64,
}

#[derive(Clone, Copy)]
struct Entry {
    /// None: queued, never measured.
    value: Option<(Measured, Instant)>,
    /// A measurement is queued.
    queued: bool,
}

fn measure(upper: &Path) -> (Measured, Instant) {
    let (bytes, inodes) = crate::state::disk_usage(upper);
    (
        Measured {
            bytes,
            inodes,
            at: crate::state::now_nanos(),
        },
        Instant::now(),
    )
}

/// The cache (one per runtime).
pub struct FsUsageCache {
    period: Duration,
    map: Arc<Mutex<HashMap<String, Entry>>>,
    /// Containers whose measurement is due, for the refresher thread (started at first use).
    due: Mutex<Option<SyncSender<(String, PathBuf)>>>,
}

impl Default for FsUsageCache {
    fn default() -> Self {
        Self::new(DEFAULT_PERIOD)
    }
}

impl FsUsageCache {
    /// A cache whose values are refreshed once older than `period`.
    pub fn new(period: Duration) -> Self {
        FsUsageCache {
            period: period.max(Duration::from_millis(100)),
            map: Default::default(),
            due: Mutex::new(None),
        }
    }

    /// Measures container `id`'s writable layer `upper` now (at start).
    pub(crate) fn measure_now(&self, id: &str, upper: &Path) -> Measured {
        let v = measure(upper);
        crate::state::lock(&self.map).insert(
            id.to_string(),
            Entry {
                value: Some(v),
                queued: false,
            },
        );
        v.0
    }

    /// The last measurement of `id`, queueing a new one when it is older than the period;
    /// `None` (queued) when it was never measured.
    pub(crate) fn cached(&self, id: &str, upper: &Path) -> Option<Measured> {
        let (value, queue) = {
            let mut m = crate::state::lock(&self.map);
            let e = m.entry(id.to_string()).or_insert(Entry {
                value: None,
                queued: false,
            });
            let due = e.value.is_none_or(|(_, t)| t.elapsed() >= self.period);
            let queue = due && !e.queued;
            e.queued |= queue;
            (e.value.map(|(v, _)| v), queue)
        };
        if queue {
            self.refresh_later(id, upper);
        }
        value
    }

    /// As [`cached`](Self::cached), but measured in line when never measured (one
    /// container's stats).
    pub(crate) fn get(&self, id: &str, upper: &Path) -> Measured {
        match self.cached(id, upper) {
            Some(v) => v,
            None => self.measure_now(id, upper),
        }
    }

    /// The sum of every container's last measurement: bytes and inodes.
    pub(crate) fn total(&self) -> (u64, u64) {
        crate::state::lock(&self.map)
            .values()
            .filter_map(|e| e.value.map(|(v, _)| v))
            .fold((0, 0), |(b, i), v| (b + v.bytes, i + v.inodes))
    }

    /// Forgets container `id` (removed).
    pub(crate) fn forget(&self, id: &str) {
        crate::state::lock(&self.map).remove(id);
    }

    /// Queues `id` for the refresher.
    fn refresh_later(&self, id: &str, upper: &Path) {
        let mut due = crate::state::lock(&self.due);
        if due.is_none() {
            let (tx, rx) = std::sync::mpsc::sync_channel::<(String, PathBuf)>(QUEUE);
            let map = self.map.clone();
            let spawned = std::thread::Builder::new()
                .name("fs-usage".into())
                .spawn(move || {
                    // Ends when the cache (its sender) goes.
                    for (id, upper) in rx {
                        let v = measure(&upper);
                        let mut m = crate::state::lock(&map);
                        if !upper.exists() {
                            // Removed while a list was being answered: forgotten for good.
                            m.remove(&id);
                        } else if let Some(e) = m.get_mut(&id) {
                            *e = Entry {
                                value: Some(v),
                                queued: false,
                            };
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
            if let Some(e) = crate::state::lock(&self.map).get_mut(id) {
                e.queued = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait_for(cache: &FsUsageCache, dir: &Path, inodes: u64) -> Option<Measured> {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            match cache.cached("c1", dir) {
                Some(v) if v.inodes == inodes => return Some(v),
                _ => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        None
    }

    /// Measured at start; the last measurement while it is fresh; once stale, still the last
    /// one while the refresher measures again in the background.
    #[test]
    fn writable_layer_use_is_refreshed_in_the_background() {
        let dir = std::env::temp_dir().join(format!("sandboxd-fsusage-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a"), vec![1u8; 8192]).unwrap();
        let cache = FsUsageCache::new(Duration::from_millis(200));
        let first = cache.measure_now("c1", &dir);
        assert_eq!(first.inodes, 1);
        std::fs::write(dir.join("b"), vec![1u8; 8192]).unwrap();
        assert_eq!(cache.cached("c1", &dir), Some(first));
        assert_eq!(cache.get("c1", &dir), first);
        std::thread::sleep(Duration::from_millis(250));
        // Stale: the old value now, a fresh one soon after.
        assert_eq!(cache.cached("c1", &dir), Some(first));
        let second = wait_for(&cache, &dir, 2);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(second.expect("never refreshed").at > first.at);
    }

    /// Never measured (a daemon restarted): a list gets nothing and queues it, then the
    /// measurement; one container's stats measure in line.
    #[test]
    fn a_container_never_measured_is_queued_not_walked_in_line() {
        let dir = std::env::temp_dir().join(format!("sandboxd-fsusage2-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a"), b"x").unwrap();
        let cache = FsUsageCache::new(Duration::from_secs(60));
        assert_eq!(cache.cached("c1", &dir), None);
        let v = wait_for(&cache, &dir, 1);
        assert!(v.is_some(), "never measured");
        assert_eq!(cache.get("c2", &dir).inodes, 1);
        // A list that named a container just removed does not keep it in the cache.
        let _ = std::fs::remove_dir_all(&dir);
        cache.forget("c1");
        assert_eq!(cache.cached("c1", &dir), None);
        let deadline = Instant::now() + Duration::from_secs(5);
        while crate::state::lock(&cache.map).contains_key("c1") && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!crate::state::lock(&cache.map).contains_key("c1"));
    }
}
