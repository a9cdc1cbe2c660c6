//! Benchmark counters, in one place: wall time spent waiting for helper processes (and their
//! number), in record fsyncs, and for namespaces to be pinned — each summed over threads, for
//! the lifecycle benchmark's split of "our own code" from what it waits for
//! (`benches/lifecycle.rs`). Production code only adds to them (a relaxed atomic add each).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What a wait was for.
#[derive(Debug, Clone, Copy)]
pub enum Wait {
    /// A helper process we ran (counted as a call too).
    Child,
    /// A helper process that is not our call (the monitor writing a container's exit).
    OtherProcess,
    /// fsync of a record.
    Sync,
    /// A namespace being pinned on its thread.
    Namespace,
}

static CHILD_NANOS: AtomicU64 = AtomicU64::new(0);
static CHILD_CALLS: AtomicU64 = AtomicU64::new(0);
static SYNC_NANOS: AtomicU64 = AtomicU64::new(0);
static NS_NANOS: AtomicU64 = AtomicU64::new(0);

/// Counts a wait of `d`.
pub fn add(what: Wait, d: Duration) {
    let n = d.as_nanos() as u64;
    match what {
        Wait::Child => {
            CHILD_NANOS.fetch_add(n, Ordering::Relaxed);
            CHILD_CALLS.fetch_add(1, Ordering::Relaxed);
        }
        Wait::OtherProcess => {
            CHILD_NANOS.fetch_add(n, Ordering::Relaxed);
        }
        Wait::Sync => {
            SYNC_NANOS.fetch_add(n, Ordering::Relaxed);
        }
        Wait::Namespace => {
            NS_NANOS.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// Total wall time spent waiting for helper processes and the number of calls.
pub fn child_time() -> (Duration, u64) {
    (
        Duration::from_nanos(CHILD_NANOS.load(Ordering::Relaxed)),
        CHILD_CALLS.load(Ordering::Relaxed),
    )
}

/// Total time spent in record fsyncs.
pub fn sync_wait() -> Duration {
    Duration::from_nanos(SYNC_NANOS.load(Ordering::Relaxed))
}

/// Total time callers waited for namespaces to be pinned.
pub fn pin_wait() -> Duration {
    Duration::from_nanos(NS_NANOS.load(Ordering::Relaxed))
}
