//! Benchmark counters, in one place: wall time spent waiting for helper processes (and their
//! number), in record fsyncs, and for namespaces to be pinned — each summed over threads, for
//! the lifecycle benchmark's split of "our own code" from what it waits for — and the wall
//! time of each host step the lifecycles order (`Step`: what the real host's seam methods
//! took), for its per-step breakdown (`benches/lifecycle.rs`). Production code only adds to
//! them (a relaxed atomic add each).

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

/// A host step of the pod and container lifecycles, as the host seam's methods group them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Namespace pins removed, the namespace dirs made shared (the pins themselves are made
    /// on their own thread: [`pin_wait`]).
    Namespaces,
    /// Namespaced sysctls written.
    Sysctls,
    /// CNI ADD of the whole list.
    CniAdd,
    /// CNI DEL of the whole list.
    CniDel,
    /// The CNI cache written.
    CniCache,
    /// Mounts made or unmounted (the pod's shm, rootfs overlays, staged copies).
    Mounts,
    /// `runtime create` under a new monitor.
    RuntimeCreate,
    /// `runtime start`.
    RuntimeStart,
    /// `runtime kill` and the wait for the exit.
    RuntimeStop,
    /// `runtime delete`.
    RuntimeDelete,
    /// `runtime state`.
    RuntimeState,
    /// Cgroups removed or sized.
    Cgroups,
}

impl Step {
    /// Every step, in the order a pod's lifecycle first takes them.
    pub const ALL: [Step; 12] = [
        Step::Namespaces,
        Step::Sysctls,
        Step::CniAdd,
        Step::CniCache,
        Step::Mounts,
        Step::RuntimeCreate,
        Step::RuntimeStart,
        Step::RuntimeState,
        Step::RuntimeStop,
        Step::RuntimeDelete,
        Step::CniDel,
        Step::Cgroups,
    ];

    /// Its name in the benchmark's tables.
    pub fn name(self) -> &'static str {
        match self {
            Step::Namespaces => "namespaces",
            Step::Sysctls => "sysctls",
            Step::CniAdd => "CNI ADD",
            Step::CniDel => "CNI DEL",
            Step::CniCache => "CNI cache",
            Step::Mounts => "mounts",
            Step::RuntimeCreate => "runtime create",
            Step::RuntimeStart => "runtime start",
            Step::RuntimeStop => "runtime kill+wait",
            Step::RuntimeDelete => "runtime delete",
            Step::RuntimeState => "runtime state",
            Step::Cgroups => "cgroups",
        }
    }
}

static STEP_NANOS: [AtomicU64; 12] = [const { AtomicU64::new(0) }; 12];

/// Runs `f`, adding its wall time to `step`.
pub fn timed<T>(step: Step, f: impl FnOnce() -> T) -> T {
    let t = std::time::Instant::now();
    let r = f();
    STEP_NANOS[step as usize].fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    r
}

/// Total wall time of `step` so far, summed over threads.
pub fn step_time(step: Step) -> Duration {
    Duration::from_nanos(STEP_NANOS[step as usize].load(Ordering::Relaxed))
}
