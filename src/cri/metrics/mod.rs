//! CRI metrics (`ListMetricDescriptors`, `ListPodSandboxMetrics`) under cAdvisor's names, so
//! kubelet's `/metrics/cadvisor` keeps its meaning when it reads them from the runtime.
//! Container metrics carry the labels `id`, `name`, `image`; network ones add `interface`
//! and filesystem ones `device`. Pod-level metrics (the pod cgroup, the pod's network
//! namespace) are labelled with the pod's id and name and an empty image. CRI values are
//! integers: seconds are whole seconds (as CRI-O sends them).

use crate::api::v1 as cri;

use crate::cgroups::Detail;
use crate::metrics::{ContainerUsage, PodUsage};

mod defs;

use defs::DEFS;

/// Every metric `ListPodSandboxMetrics` may send.
pub fn descriptors() -> Vec<cri::MetricDescriptor> {
    DEFS.iter()
        .map(|d| cri::MetricDescriptor {
            name: d.name.into(),
            help: d.help.into(),
            label_keys: d.labels.keys(),
        })
        .collect()
}

struct Out<'a> {
    metrics: Vec<cri::Metric>,
    timestamp: i64,
    base: [&'a str; 3],
}

impl Out<'_> {
    fn push(&mut self, name: &'static str, extra: Option<&str>, value: Option<u64>) {
        self.push_labelled(name, extra.as_slice(), value);
    }

    fn push_labelled(&mut self, name: &'static str, extra: &[&str], value: Option<u64>) {
        let Some(value) = value else { return };
        let def = DEFS
            .iter()
            .find(|d| d.name == name)
            .expect("a defined metric");
        let mut labels: Vec<String> = self.base.iter().map(|s| s.to_string()).collect();
        labels.extend(extra.iter().map(|s| s.to_string()));
        debug_assert_eq!(labels.len(), def.labels.keys().len(), "{name}");
        self.metrics.push(cri::Metric {
            name: name.into(),
            timestamp: self.timestamp,
            metric_type: if def.counter {
                cri::MetricType::Counter
            } else {
                cri::MetricType::Gauge
            } as i32,
            label_values: labels,
            value: Some(cri::UInt64Value { value }),
        });
    }

    fn cgroup(&mut self, c: &Detail) {
        let secs = |n: Option<u64>| n.map(|n| n / 1_000_000_000);
        self.push("container_cpu_usage_seconds_total", None, secs(c.cpu_nanos));
        self.push(
            "container_cpu_user_seconds_total",
            None,
            secs(c.cpu_user_nanos),
        );
        self.push(
            "container_cpu_system_seconds_total",
            None,
            secs(c.cpu_system_nanos),
        );
        self.push("container_cpu_cfs_periods_total", None, c.cfs_periods);
        self.push(
            "container_cpu_cfs_throttled_periods_total",
            None,
            c.cfs_throttled_periods,
        );
        self.push(
            "container_cpu_cfs_throttled_seconds_total",
            None,
            secs(c.cfs_throttled_nanos),
        );
        self.push("container_memory_usage_bytes", None, c.memory_bytes);
        self.push(
            "container_memory_working_set_bytes",
            None,
            c.working_set_bytes,
        );
        self.push("container_memory_rss", None, c.rss_bytes);
        self.push("container_memory_cache", None, c.cache_bytes);
        self.push("container_memory_mapped_file", None, c.mapped_file_bytes);
        self.push("container_memory_swap", None, c.swap_bytes);
        self.push("container_memory_max_usage_bytes", None, c.max_usage_bytes);
        self.push("container_memory_failcnt", None, c.failcnt);
        self.push("container_oom_events_total", None, c.oom_kills);
        self.push(
            "container_spec_memory_limit_bytes",
            None,
            c.memory_limit_bytes,
        );
        self.push("container_processes", None, c.processes);
        self.push("container_threads", None, c.tasks);
        self.push("container_threads_max", None, c.tasks_max);
        self.push("container_memory_kernel_usage", None, c.kernel_bytes);
        for (scope, faults) in [("container", c.pgfault), ("hierarchy", c.hierarchy_pgfault)] {
            let Some((minor, major)) = faults else {
                continue;
            };
            for (kind, v) in [("pgfault", minor), ("pgmajfault", major)] {
                self.push_labelled("container_memory_failures_total", &[kind, scope], Some(v));
            }
        }
        self.push("container_spec_cpu_period", None, c.cpu_period);
        self.push("container_spec_cpu_quota", None, c.cpu_quota);
        self.push("container_spec_cpu_shares", None, c.cpu_shares);
        self.push(
            "container_spec_memory_reservation_limit_bytes",
            None,
            c.memory_reservation_bytes,
        );
        self.push(
            "container_spec_memory_swap_limit_bytes",
            None,
            c.memory_swap_limit_bytes,
        );
        for b in &c.blkio {
            let (major, minor) = (b.major.to_string(), b.minor.to_string());
            let dev = format!("{major}:{minor}");
            for (op, v) in [("Read", b.read_bytes), ("Write", b.write_bytes)] {
                self.push_labelled(
                    "container_blkio_device_usage_total",
                    &[&dev, &major, &minor, op],
                    Some(v),
                );
            }
            let d = Some(dev.as_str());
            self.push("container_fs_reads_bytes_total", d, Some(b.read_bytes));
            self.push("container_fs_reads_total", d, Some(b.reads));
            self.push("container_fs_writes_bytes_total", d, Some(b.write_bytes));
            self.push("container_fs_writes_total", d, Some(b.writes));
        }
        for h in &c.hugetlb {
            let p = Some(h.pagesize.as_str());
            self.push("container_hugetlb_usage_bytes", p, Some(h.usage_bytes));
            self.push("container_hugetlb_max_usage_bytes", p, h.max_usage_bytes);
        }
        // PSI totals are µs; CRI values are integers: whole seconds.
        let s = |us: u64| us / 1_000_000;
        for (res, p) in [
            ("cpu", c.psi.cpu),
            ("memory", c.psi.memory),
            ("io", c.psi.io),
        ] {
            let Some(p) = p else { continue };
            let (waiting, stalled) = match res {
                "cpu" => (
                    "container_pressure_cpu_waiting_seconds_total",
                    "container_pressure_cpu_stalled_seconds_total",
                ),
                "memory" => (
                    "container_pressure_memory_waiting_seconds_total",
                    "container_pressure_memory_stalled_seconds_total",
                ),
                _ => (
                    "container_pressure_io_waiting_seconds_total",
                    "container_pressure_io_stalled_seconds_total",
                ),
            };
            self.push(waiting, None, Some(s(p.some_total_us)));
            self.push(stalled, None, p.full_total_us.map(s));
        }
        if let Some(p) = c.procs {
            self.push("container_file_descriptors", None, Some(p.file_descriptors));
            self.push("container_sockets", None, Some(p.sockets));
            self.push_labelled("container_ulimits_soft", &["max_open_files"], p.nofile_soft);
        }
    }
}

fn container(c: &ContainerUsage, timestamp: i64) -> cri::ContainerMetrics {
    let r = &c.record;
    let name = r.config.metadata.name.as_str();
    let mut out = Out {
        metrics: Vec::new(),
        timestamp,
        base: [&r.id, name, &r.image_ref],
    };
    out.cgroup(&c.cgroup);
    let secs = |ns: i64| u64::try_from(ns / 1_000_000_000).ok();
    out.push("container_start_time_seconds", None, secs(r.started_at));
    out.push("container_last_seen", None, secs(timestamp));
    let upper = r.upper_dir();
    let device = upper.to_string_lossy();
    out.push(
        "container_fs_usage_bytes",
        Some(&device),
        c.writable.map(|m| m.bytes),
    );
    out.push(
        "container_fs_inodes_total",
        Some(&device),
        c.writable.map(|m| m.inodes),
    );
    // The filesystem the writable layer lives on.
    if let Ok(fs) = nix::sys::statvfs::statvfs(&upper) {
        let frsize = fs.fragment_size();
        out.push(
            "container_fs_limit_bytes",
            Some(&device),
            Some(fs.blocks().saturating_mul(frsize)),
        );
        out.push(
            "container_fs_inodes_free",
            Some(&device),
            Some(fs.files_available()),
        );
    }
    cri::ContainerMetrics {
        container_id: r.id.clone(),
        metrics: out.metrics,
    }
}

/// One pod's metrics: the pod cgroup and its network namespace at pod level, and each
/// running container's.
pub fn pod(p: &PodUsage) -> cri::PodSandboxMetrics {
    let sb = &p.sandbox;
    let mut out = Out {
        metrics: Vec::new(),
        timestamp: p.timestamp,
        base: [&sb.id, &sb.config.metadata.name, ""],
    };
    out.cgroup(&p.cgroup);
    for i in &p.interfaces {
        let n = Some(i.name.as_str());
        out.push("container_network_receive_bytes_total", n, Some(i.rx_bytes));
        out.push(
            "container_network_receive_packets_total",
            n,
            Some(i.rx_packets),
        );
        out.push(
            "container_network_receive_errors_total",
            n,
            Some(i.rx_errors),
        );
        out.push(
            "container_network_receive_packets_dropped_total",
            n,
            Some(i.rx_dropped),
        );
        out.push(
            "container_network_transmit_bytes_total",
            n,
            Some(i.tx_bytes),
        );
        out.push(
            "container_network_transmit_packets_total",
            n,
            Some(i.tx_packets),
        );
        out.push(
            "container_network_transmit_errors_total",
            n,
            Some(i.tx_errors),
        );
        out.push(
            "container_network_transmit_packets_dropped_total",
            n,
            Some(i.tx_dropped),
        );
    }
    cri::PodSandboxMetrics {
        pod_sandbox_id: sb.id.clone(),
        metrics: out.metrics,
        container_metrics: p
            .containers
            .iter()
            .map(|c| container(c, p.timestamp))
            .collect(),
    }
}

/// The pod's network stats for `PodSandboxStats` (the default interface is `eth0`, else the
/// first).
pub fn network_stats(p: &PodUsage) -> Option<cri::NetworkUsage> {
    let v = |value| Some(cri::UInt64Value { value });
    let iface = |i: &crate::netdev::Interface| cri::NetworkInterfaceUsage {
        name: i.name.clone(),
        rx_bytes: v(i.rx_bytes),
        rx_errors: v(i.rx_errors),
        tx_bytes: v(i.tx_bytes),
        tx_errors: v(i.tx_errors),
    };
    let default = p
        .interfaces
        .iter()
        .find(|i| i.name == "eth0")
        .or_else(|| p.interfaces.first())?;
    Some(cri::NetworkUsage {
        timestamp: p.timestamp,
        default_interface: Some(iface(default)),
        interfaces: p
            .interfaces
            .iter()
            .filter(|i| i.name != default.name)
            .map(iface)
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_label_set_matches_its_descriptor() {
        let names: std::collections::HashSet<_> = DEFS.iter().map(|d| d.name).collect();
        assert_eq!(names.len(), DEFS.len(), "a metric is defined twice");
        for d in descriptors() {
            let def = DEFS.iter().find(|x| x.name == d.name).unwrap();
            assert_eq!(d.label_keys, def.labels.keys());
        }
    }
}
