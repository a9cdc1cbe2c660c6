//! The metric families `ListMetricDescriptors` lists: cAdvisor's names, help texts and label
//! keys (kubelet's `/metrics/cadvisor` keeps its meaning when it reads them from the runtime).

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Labels {
    Base,
    Interface,
    Device,
    /// Block I/O: `device` (major:minor), `major`, `minor`, `operation`.
    Blkio,
    /// Memory failures: `failure_type` (pgfault, pgmajfault), `scope` (container, hierarchy).
    Failure,
    Pagesize,
    Ulimit,
}

impl Labels {
    pub(super) fn keys(self) -> Vec<String> {
        let mut k = vec!["id".to_string(), "name".into(), "image".into()];
        let more: &[&str] = match self {
            Labels::Base => &[],
            Labels::Interface => &["interface"],
            Labels::Device => &["device"],
            Labels::Blkio => &["device", "major", "minor", "operation"],
            Labels::Failure => &["failure_type", "scope"],
            Labels::Pagesize => &["pagesize"],
            Labels::Ulimit => &["ulimit"],
        };
        k.extend(more.iter().map(|s| s.to_string()));
        k
    }
}

pub(super) struct Def {
    pub name: &'static str,
    pub help: &'static str,
    pub counter: bool,
    pub labels: Labels,
}

const fn d(name: &'static str, help: &'static str, counter: bool, labels: Labels) -> Def {
    Def {
        name,
        help,
        counter,
        labels,
    }
}

use Labels::{Base, Blkio, Device, Failure, Interface, Pagesize, Ulimit};

#[rustfmt::skip]
pub(super) const DEFS: &[Def] = &[
    d("container_cpu_usage_seconds_total", "Cumulative cpu time consumed in seconds.", true, Base),
    d("container_cpu_user_seconds_total", "Cumulative user cpu time consumed in seconds.", true, Base),
    d("container_cpu_system_seconds_total", "Cumulative system cpu time consumed in seconds.", true, Base),
    d("container_cpu_cfs_periods_total", "Number of elapsed enforcement period intervals.", true, Base),
    d("container_cpu_cfs_throttled_periods_total", "Number of throttled period intervals.", true, Base),
    d("container_cpu_cfs_throttled_seconds_total", "Total time duration the container has been throttled.", true, Base),
    d("container_memory_usage_bytes", "Current memory usage in bytes, including all memory regardless of when it was accessed.", false, Base),
    d("container_memory_working_set_bytes", "Current working set in bytes.", false, Base),
    d("container_memory_rss", "Size of RSS in bytes.", false, Base),
    d("container_memory_cache", "Number of bytes of page cache memory.", false, Base),
    d("container_memory_mapped_file", "Size of memory mapped files in bytes.", false, Base),
    d("container_memory_swap", "Container swap usage in bytes.", false, Base),
    d("container_memory_max_usage_bytes", "Maximum memory usage recorded in bytes.", false, Base),
    d("container_memory_failcnt", "Number of memory usage hits limits.", true, Base),
    d("container_oom_events_total", "Count of out of memory events observed for the container.", true, Base),
    d("container_spec_memory_limit_bytes", "Memory limit for the container.", false, Base),
    d("container_processes", "Number of processes running inside the container.", false, Base),
    d("container_threads", "Number of threads running inside the container.", false, Base),
    d("container_threads_max", "Maximum number of threads allowed inside the container.", false, Base),
    d("container_start_time_seconds", "Start time of the container since unix epoch in seconds.", false, Base),
    d("container_last_seen", "Last time a container was seen by the exporter.", false, Base),
    d("container_fs_usage_bytes", "Number of bytes that are consumed by the container on this filesystem.", false, Device),
    d("container_fs_inodes_total", "Number of inodes the container uses on this filesystem.", false, Device),
    d("container_network_receive_bytes_total", "Cumulative count of bytes received.", true, Interface),
    d("container_network_receive_packets_total", "Cumulative count of packets received.", true, Interface),
    d("container_network_receive_errors_total", "Cumulative count of errors encountered while receiving.", true, Interface),
    d("container_network_receive_packets_dropped_total", "Cumulative count of packets dropped while receiving.", true, Interface),
    d("container_network_transmit_bytes_total", "Cumulative count of bytes transmitted.", true, Interface),
    d("container_network_transmit_packets_total", "Cumulative count of packets transmitted.", true, Interface),
    d("container_network_transmit_errors_total", "Cumulative count of errors encountered while transmitting.", true, Interface),
    d("container_network_transmit_packets_dropped_total", "Cumulative count of packets dropped while transmitting.", true, Interface),
    d("container_blkio_device_usage_total", "Blkio device bytes usage.", true, Blkio),
    d("container_fs_reads_bytes_total", "Cumulative count of bytes read.", true, Device),
    d("container_fs_reads_total", "Cumulative count of reads completed.", true, Device),
    d("container_fs_writes_bytes_total", "Cumulative count of bytes written.", true, Device),
    d("container_fs_writes_total", "Cumulative count of writes completed.", true, Device),
    d("container_fs_inodes_free", "Number of available inodes on this filesystem.", false, Device),
    d("container_fs_limit_bytes", "Number of bytes that can be consumed by the container on this filesystem.", false, Device),
    d("container_file_descriptors", "Number of open file descriptors for the container.", false, Base),
    d("container_sockets", "Number of open sockets for the container.", false, Base),
    d("container_ulimits_soft", "Soft ulimit values for the container root process. Unlimited if -1, except priority and nice.", false, Ulimit),
    d("container_memory_failures_total", "Cumulative count of memory allocation failures.", true, Failure),
    d("container_memory_kernel_usage", "Size of kernel memory allocated in bytes.", false, Base),
    d("container_hugetlb_usage_bytes", "Hugepage usage in bytes.", false, Pagesize),
    d("container_hugetlb_max_usage_bytes", "Hugepage maximum usage in bytes.", false, Pagesize),
    d("container_spec_cpu_period", "CPU period of the container.", false, Base),
    d("container_spec_cpu_quota", "CPU quota of the container.", false, Base),
    d("container_spec_cpu_shares", "CPU share of the container.", false, Base),
    d("container_spec_memory_reservation_limit_bytes", "Memory reservation limit for the container.", false, Base),
    d("container_spec_memory_swap_limit_bytes", "Memory swap limit for the container.", false, Base),
    d("container_pressure_cpu_waiting_seconds_total", "Total time duration tasks in the container have waited due to CPU congestion.", true, Base),
    d("container_pressure_cpu_stalled_seconds_total", "Total time duration no tasks in the container could make progress due to CPU congestion.", true, Base),
    d("container_pressure_memory_waiting_seconds_total", "Total time duration tasks in the container have waited due to memory congestion.", true, Base),
    d("container_pressure_memory_stalled_seconds_total", "Total time duration no tasks in the container could make progress due to memory congestion.", true, Base),
    d("container_pressure_io_waiting_seconds_total", "Total time duration tasks in the container have waited due to IO congestion.", true, Base),
    d("container_pressure_io_stalled_seconds_total", "Total time duration no tasks in the container could make progress due to IO congestion.", true, Base),
];
