//! The in-memory registries: one [`Entry`] per sandbox and per container, the name
//! reservations and the id indexes. An entry's `op` lock serialises its lifecycle operations
//! (held across process calls); its `record` lock guards the current record (held only for
//! short reads and updates). Lock order: the registry, then records; a sandbox's `op` before
//! any of its containers' `op`; never the registry across a process call.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;

use super::{IdIndex, NameReservations};
use crate::error::{Error, Result};

/// Locks `m`, recovering the data of a panicked holder (records stay usable).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a persisted record tells its entry.
pub trait Record: Serialize {
    /// `sandbox` or `container` (in errors).
    const KIND: &'static str;
    fn id(&self) -> &str;
    /// The record's own dir (its state file lives in it).
    fn dir(&self) -> &Path;
    fn state_file(&self) -> PathBuf {
        self.dir().join(crate::model::STATE_FILE)
    }
}

impl Record for crate::model::container::ContainerRecord {
    const KIND: &'static str = "container";
    fn id(&self) -> &str {
        &self.id
    }
    fn dir(&self) -> &std::path::Path {
        &self.dir
    }
}

impl Record for crate::model::sandbox::SandboxRecord {
    const KIND: &'static str = "sandbox";
    fn id(&self) -> &str {
        &self.id
    }
    fn dir(&self) -> &std::path::Path {
        &self.dir
    }
}

/// One sandbox or container in memory.
pub struct Entry<R> {
    pub op: Mutex<()>,
    pub record: Mutex<R>,
    /// When the record was last checked against the host (ms on the daemon's monotonic
    /// clock, 0 = never): lists re-check a container at most once per interval.
    pub checked_ms: std::sync::atomic::AtomicU64,
}

/// Milliseconds on the daemon's monotonic clock (since its first call).
pub fn monotonic_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
        + 1
}

impl<R: Record + Clone> Entry<R> {
    pub fn new(record: R) -> Arc<Self> {
        Arc::new(Entry {
            op: Mutex::new(()),
            record: Mutex::new(record),
            checked_ms: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// A copy of the record as it stands.
    pub fn snapshot(&self) -> R {
        lock(&self.record).clone()
    }

    /// Applies `f` to the in-memory record only: for progress that is safe to redo after a
    /// crash, persisted with the next durable update.
    pub fn note(&self, f: impl FnOnce(&mut R)) {
        f(&mut lock(&self.record));
    }

    /// Applies `f` to the record and persists it atomically. Before the record's dir exists
    /// (a rollback of a creation that failed that early) the change stays in memory.
    pub fn update(&self, f: impl FnOnce(&mut R)) -> Result<()> {
        let mut r = lock(&self.record);
        f(&mut r);
        if !r.dir().is_dir() {
            return Ok(());
        }
        super::write_json_atomic(&r.state_file(), &*r).map_err(|e| {
            let step = match R::KIND {
                "sandbox" => "persist sandbox state",
                _ => "persist container state",
            };
            Error::step(step, r.id(), e)
        })
    }
}

/// Sandboxes and containers by id, their names and id indexes.
pub struct Registry<S, C> {
    pub sandboxes: HashMap<String, Arc<Entry<S>>>,
    pub containers: HashMap<String, Arc<Entry<C>>>,
    /// Pod and container names share one reservation table (they cannot collide: a
    /// container name never starts with `k8s_POD_`).
    pub names: NameReservations,
    pub ids: IdIndex,
    pub container_ids: IdIndex,
}

impl<S, C> Default for Registry<S, C> {
    fn default() -> Self {
        Registry {
            sandboxes: HashMap::new(),
            containers: HashMap::new(),
            names: NameReservations::default(),
            ids: IdIndex::default(),
            container_ids: IdIndex::default(),
        }
    }
}
