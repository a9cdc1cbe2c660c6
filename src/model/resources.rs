//! Resource limits as the CRI sends them, for a container and for a pod (its pod-level
//! resources and overhead).

use serde::{Deserialize, Serialize};

/// CRI `LinuxContainerResources` (the fields a cgroup applies). Zero means unset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct Resources {
    /// CFS period in microseconds (CRI `cpu_period`); 0: the kernel's default.
    pub cpu_period: i64,
    /// CFS quota in microseconds per period, at least 1000 (CRI `cpu_quota`); 0 or less: no
    /// limit.
    pub cpu_quota: i64,
    /// Relative CPU weight as cgroup v1 shares (CRI `cpu_shares`; the runtime converts it
    /// for cgroup v2); 0: not set.
    pub cpu_shares: i64,
    /// Memory limit in bytes (CRI `memory_limit_in_bytes`); 0: no limit.
    pub memory_limit_in_bytes: i64,
    /// OOM score adjustment, -1000..=1000 (CRI `oom_score_adj`), raised to the daemon's own
    /// if lower; applied at creation only (UpdateContainerResources keeps it for status).
    pub oom_score_adj: i64,
    /// CPUs the container may run on, in cpuset list syntax such as `0-3,6` (CRI
    /// `cpuset_cpus`); empty: not set.
    pub cpuset_cpus: String,
    /// NUMA memory nodes it may use, in cpuset list syntax (CRI `cpuset_mems`); empty: not
    /// set.
    pub cpuset_mems: String,
}
