//! Sizing a pod's cgroup: its pod-level resources plus its overhead, v1 or v2.

use std::path::Path;

use super::{hierarchies, join};
use crate::error::HostError;

/// A pod's cgroup limits: its pod-level resources plus its overhead (CRI
/// `LinuxPodSandboxConfig.resources` and `overhead`), as kubelet sizes a pod's cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodLimits {
    /// Bytes; 0: no limit.
    pub memory: i64,
    /// CFS quota in µs per `cpu_period`; 0: no limit.
    pub cpu_quota: i64,
    /// CFS period in µs.
    pub cpu_period: i64,
    /// cgroup v1 shares (converted to `cpu.weight` on v2); 0: not set.
    pub cpu_shares: i64,
}

impl PodLimits {
    /// The limits for `resources` with `overhead` added (a resource the pod does not limit
    /// stays unlimited, overhead or not).
    pub fn of(
        resources: Option<&crate::model::container::Resources>,
        overhead: Option<&crate::model::container::Resources>,
    ) -> PodLimits {
        let d = crate::model::container::Resources::default();
        let (r, o) = (resources.unwrap_or(&d), overhead.unwrap_or(&d));
        let period = if r.cpu_period > 0 {
            r.cpu_period
        } else {
            100_000
        };
        let o_period = if o.cpu_period > 0 {
            o.cpu_period
        } else {
            100_000
        };
        let o_quota = o.cpu_quota.max(0).saturating_mul(period) / o_period;
        PodLimits {
            memory: if r.memory_limit_in_bytes > 0 {
                r.memory_limit_in_bytes
                    .saturating_add(o.memory_limit_in_bytes.max(0))
            } else {
                0
            },
            cpu_quota: if r.cpu_quota > 0 {
                r.cpu_quota.saturating_add(o_quota)
            } else {
                0
            },
            cpu_period: period,
            // Past the kernel's largest the weight is the largest anyway.
            cpu_shares: if r.cpu_shares > 0 {
                r.cpu_shares
                    .saturating_add(o.cpu_shares.max(0))
                    .min(*crate::model::resources::CPU_SHARES.end())
            } else {
                0
            },
        }
    }
}

/// Writes `l` to `cgroup` (made where missing): v1 `memory.limit_in_bytes`,
/// `cpu.cfs_period_us`/`cpu.cfs_quota_us`/`cpu.shares`; v2 `memory.max`, `cpu.max`,
/// `cpu.weight` (with the controllers enabled on the way down). A systemd slice is made or
/// resized through its unit properties instead.
pub fn set_limits(cgroup: &str, l: &PodLimits) -> Result<(), HostError> {
    if super::systemd::is_slice(cgroup) {
        // systemd owns the slice: the limits are its unit properties.
        return super::systemd::set_slice(cgroup, l);
    }
    if cgroup.split('/').any(|c| c == "..") || cgroup.trim_matches('/').is_empty() {
        return Err(HostError::Refused {
            op: "set cgroup limits",
            path: cgroup.into(),
            reason: "not a cgroup path of ours".into(),
        });
    }
    let write = |d: &Path, f: &str, v: String| {
        std::fs::write(d.join(f), &v).map_err(|e| HostError::io("write", d.join(f), e))
    };
    let make = |d: &Path| std::fs::create_dir_all(d).map_err(|e| HostError::io("create", d, e));
    let hs = hierarchies();
    let v1 = |ctl: &str| {
        hs.iter().find(|h| {
            h.controllers
                .as_ref()
                .is_some_and(|c| c.iter().any(|c| c == ctl))
        })
    };
    if let (Some(m), Some(c)) = (v1("memory"), v1("cpu")) {
        let md = join(&m.mount_point, cgroup);
        make(&md)?;
        let mem = if l.memory > 0 { l.memory } else { -1 };
        write(&md, "memory.limit_in_bytes", mem.to_string())?;
        let cd = join(&c.mount_point, cgroup);
        make(&cd)?;
        write(&cd, "cpu.cfs_period_us", l.cpu_period.to_string())?;
        let quota = if l.cpu_quota > 0 { l.cpu_quota } else { -1 };
        write(&cd, "cpu.cfs_quota_us", quota.to_string())?;
        if l.cpu_shares > 0 {
            write(&cd, "cpu.shares", l.cpu_shares.max(2).to_string())?;
        }
        return Ok(());
    }
    let Some(h) = hs.iter().find(|h| h.controllers.is_none()) else {
        return Err(HostError::Other(
            "no cgroup hierarchy with the memory and cpu controllers".into(),
        ));
    };
    let mut at = h.mount_point.clone();
    for part in cgroup.trim_matches('/').split('/') {
        // Best effort: a parent that already delegates them answers the same.
        let _ = std::fs::write(at.join("cgroup.subtree_control"), "+cpu +memory");
        at = at.join(part);
        make(&at)?;
    }
    let mem = if l.memory > 0 {
        l.memory.to_string()
    } else {
        "max".into()
    };
    write(&at, "memory.max", mem)?;
    let quota = if l.cpu_quota > 0 {
        l.cpu_quota.to_string()
    } else {
        "max".into()
    };
    write(&at, "cpu.max", format!("{quota} {}", l.cpu_period))?;
    if l.cpu_shares > 0 {
        // runc's and kubelet's conversion of shares (2..262144) to weight (1..10000).
        let shares = l.cpu_shares.clamp(2, 262_144);
        write(
            &at,
            "cpu.weight",
            (1 + ((shares - 2) * 9999) / 262_142).to_string(),
        )?;
    }
    Ok(())
}
