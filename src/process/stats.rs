//! Benchmark counters: the wall time spent waiting for helper processes (summed over
//! threads) and their number, for the lifecycle benchmark's "own code vs children" split
//! (`benches/lifecycle.rs` reads them through [`child_time`]). Production code only adds to
//! them, here and nowhere else.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

static CHILD_NANOS: AtomicU64 = AtomicU64::new(0);
static CHILD_CALLS: AtomicU64 = AtomicU64::new(0);

/// Total wall time spent waiting for helper processes (summed over threads) and their count.
pub fn child_time() -> (Duration, u64) {
    (
        Duration::from_nanos(CHILD_NANOS.load(Ordering::Relaxed)),
        CHILD_CALLS.load(Ordering::Relaxed),
    )
}

/// Counts `d` as time spent waiting for a helper process that is not our child call (the
/// monitor writing a container's exit), so benchmarks separate it from our own code.
pub fn account_wait(d: Duration) {
    CHILD_NANOS.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
}

/// Counts one helper process call that took `d`.
pub(super) fn account_call(d: Duration) {
    CHILD_NANOS.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    CHILD_CALLS.fetch_add(1, Ordering::Relaxed);
}
