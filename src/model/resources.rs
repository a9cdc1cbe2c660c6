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
    /// Memory plus swap in bytes (CRI `memory_swap_limit_in_bytes`, OCI `memory.swap`); 0:
    /// not set.
    pub memory_swap_limit_in_bytes: i64,
    /// Huge page limits: page size (`2MB`, `1GB`) → bytes (CRI `hugepage_limits`).
    pub hugepage_limits: Vec<(String, u64)>,
    /// cgroup v2 files to write as they are (CRI `unified`, OCI `unified`), e.g.
    /// `memory.oom.group`, `memory.high`, `io.weight`; checked by [`Resources::check`].
    pub unified: std::collections::BTreeMap<String, String>,
}

/// The most entries of `unified` one container may ask for.
pub const MAX_UNIFIED: usize = 64;
/// The most huge page sizes one container may limit (x86 has 2, arm64 4).
pub const MAX_HUGEPAGE_LIMITS: usize = 8;
/// The kernel's range of cgroup v1 `cpu.shares` (a value outside it is clamped, and the
/// runtime, reading back another value, fails after the write).
pub const CPU_SHARES: std::ops::RangeInclusive<i64> = 2..=262_144;
/// The kernel's range of a CFS period in µs.
pub const CPU_PERIOD: std::ops::RangeInclusive<i64> = 1_000..=1_000_000;
/// The largest CFS quota in µs the kernel takes (`(1 << 44) - 1`).
pub const MAX_CPU_QUOTA: i64 = (1 << 44) - 1;

/// `what` in cpuset list syntax (`0-3,6`): ascending ranges of CPU or node numbers, at most
/// 4096 bytes.
fn check_cpuset(what: &str, v: &str) -> Result<(), String> {
    if v.is_empty() {
        return Ok(());
    }
    let ok = v.len() <= 4096
        && v.split(',').all(|r| {
            let (a, b) = r.split_once('-').unwrap_or((r, r));
            let num = |x: &str| (1..=5).contains(&x.len()) && x.bytes().all(|c| c.is_ascii_digit());
            num(a) && num(b) && a.parse::<u32>().ok() <= b.parse::<u32>().ok()
        });
    match ok {
        true => Ok(()),
        false => Err(format!(
            "{what} {v:?} is not a cpuset list such as \"0-3,6\""
        )),
    }
}

impl Resources {
    /// Refuses what no cgroup write should carry out: a `unified` key that is not a plain
    /// `<controller>.<file>` name (no path, no `cgroup.*` core file: membership and
    /// delegation stay the runtime's), a value with a newline or NUL, more than
    /// [`MAX_UNIFIED`] entries, or `unified` at all on a host without the pure cgroup v2
    /// hierarchy (`v2` false), where the runtime cannot write it. Huge page limits: at most
    /// [`MAX_HUGEPAGE_LIMITS`], each size once, named as kubelet names them (`2MB`, `1GB`:
    /// the runtime makes a cgroup file name of it).
    pub fn check(&self, v2: bool) -> Result<(), String> {
        if self.cpu_shares != 0 && !CPU_SHARES.contains(&self.cpu_shares) {
            return Err(format!(
                "cpu_shares {} is outside the kernel's {}..={}",
                self.cpu_shares,
                CPU_SHARES.start(),
                CPU_SHARES.end()
            ));
        }
        if self.cpu_period != 0 && !CPU_PERIOD.contains(&self.cpu_period) {
            return Err(format!(
                "cpu_period {} is outside the kernel's {}..={} µs",
                self.cpu_period,
                CPU_PERIOD.start(),
                CPU_PERIOD.end()
            ));
        }
        if self.cpu_quota > MAX_CPU_QUOTA {
            return Err(format!(
                "cpu_quota {} is above the kernel's {MAX_CPU_QUOTA} µs",
                self.cpu_quota
            ));
        }
        check_cpuset("cpuset_cpus", &self.cpuset_cpus)?;
        check_cpuset("cpuset_mems", &self.cpuset_mems)?;
        if self.hugepage_limits.len() > MAX_HUGEPAGE_LIMITS {
            return Err(format!(
                "hugepage_limits: {} entries (at most {MAX_HUGEPAGE_LIMITS})",
                self.hugepage_limits.len()
            ));
        }
        for (i, (size, _)) in self.hugepage_limits.iter().enumerate() {
            let digits = size.trim_end_matches(['K', 'M', 'G', 'B']);
            let unit = &size[digits.len()..];
            let named = (1..=6).contains(&digits.len())
                && digits.bytes().all(|b| b.is_ascii_digit())
                && matches!(unit, "KB" | "MB" | "GB");
            if !named || self.hugepage_limits[..i].iter().any(|(s, _)| s == size) {
                return Err(format!(
                    "hugepage_limits: page size {size:?} is not a size like \"2MB\" given once"
                ));
            }
        }
        if self.unified.is_empty() {
            return Ok(());
        }
        if !v2 {
            return Err("unified: cgroup v2 files need a cgroup v2 host".into());
        }
        if self.unified.len() > MAX_UNIFIED {
            return Err(format!(
                "unified: {} entries (at most {MAX_UNIFIED})",
                self.unified.len()
            ));
        }
        for (k, v) in &self.unified {
            let plain = k.len() <= 64
                && k.split_once('.').is_some_and(|(ctl, file)| {
                    !ctl.is_empty()
                        && !file.is_empty()
                        && k.bytes().all(|b| {
                            b.is_ascii_lowercase() || b.is_ascii_digit() || b"._".contains(&b)
                        })
                });
            if !plain || k.starts_with("cgroup.") {
                return Err(format!(
                    "unified: {k:?} is not a controller's file name (<controller>.<file>, not cgroup.*)"
                ));
            }
            if v.len() > 4096 || v.contains(['\n', '\0']) {
                return Err(format!(
                    "unified[{k:?}]: a value of at most 4096 bytes without newline or NUL"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_page_limits_are_sizes_named_once() {
        let with = |sizes: &[&str]| Resources {
            hugepage_limits: sizes.iter().map(|s| (s.to_string(), 1 << 21)).collect(),
            ..Default::default()
        };
        assert!(with(&["2MB", "1GB", "64KB"]).check(false).is_ok());
        for bad in [
            &["2MiB"][..],
            &["../2MB"],
            &["MB"],
            &["1234567MB"],
            &["2MB", "2MB"],
            &["2MB"; 9],
        ] {
            assert!(with(bad).check(true).is_err(), "{bad:?}");
        }
    }
}
