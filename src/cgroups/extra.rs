//! What cAdvisor's metric families read beyond CPU and memory use: block I/O per device,
//! huge pages, pressure stall information, and the processes' open files. Each reader is
//! bounded (lines, devices, processes, file descriptors) and answers `None` or an empty list
//! where the host does not say — never a made-up zero.

use std::path::{Path, PathBuf};

use super::{controller_dir, key_value};

/// Most devices, page sizes or processes one reader looks at.
const MAX_ENTRIES: usize = 256;
/// Most file descriptors counted in one cgroup (a tenant may open millions: each is a
/// readlink on the metrics path).
const MAX_FDS: u64 = 65_536;

/// Block I/O of one device (major:minor).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlkioDevice {
    pub major: u32,
    pub minor: u32,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub reads: u64,
    pub writes: u64,
}

/// Block I/O per device: v1 `blkio.throttle.io_service_bytes_recursive` and
/// `…io_serviced_recursive`, v2 `io.stat`.
pub fn blkio(cgroup: &str) -> Vec<BlkioDevice> {
    let mut out: Vec<BlkioDevice> = Vec::new();
    if let Some(dir) = controller_dir("blkio", cgroup) {
        for (file, bytes) in [
            ("blkio.throttle.io_service_bytes_recursive", true),
            ("blkio.throttle.io_serviced_recursive", false),
        ] {
            let Ok(t) = std::fs::read_to_string(dir.join(file)) else {
                continue;
            };
            for l in t.lines().take(MAX_ENTRIES * 8) {
                let mut f = l.split_whitespace();
                let (Some(dev), Some(op), Some(Ok(v))) =
                    (f.next(), f.next(), f.next().map(str::parse::<u64>))
                else {
                    continue;
                };
                let Some(d) = entry(&mut out, dev) else {
                    continue;
                };
                match (op, bytes) {
                    ("Read", true) => d.read_bytes = v,
                    ("Write", true) => d.write_bytes = v,
                    ("Read", false) => d.reads = v,
                    ("Write", false) => d.writes = v,
                    _ => {}
                }
            }
        }
        return out;
    }
    let Some(t) = controller_dir("io", cgroup)
        .and_then(|dir| std::fs::read_to_string(dir.join("io.stat")).ok())
    else {
        return out;
    };
    for l in t.lines().take(MAX_ENTRIES) {
        let mut f = l.split_whitespace();
        let Some(d) = f.next().and_then(|dev| entry(&mut out, dev)) else {
            continue;
        };
        for (k, v) in f.filter_map(|x| {
            let (k, v) = x.split_once('=')?;
            Some((k, v.parse::<u64>().ok()?))
        }) {
            match k {
                "rbytes" => d.read_bytes = v,
                "wbytes" => d.write_bytes = v,
                "rios" => d.reads = v,
                "wios" => d.writes = v,
                _ => {}
            }
        }
    }
    out
}

/// The entry of device `dev` (`major:minor`), added if new while there is room.
fn entry<'a>(out: &'a mut Vec<BlkioDevice>, dev: &str) -> Option<&'a mut BlkioDevice> {
    let (ma, mi) = dev.split_once(':')?;
    let (major, minor): (u32, u32) = (ma.parse().ok()?, mi.parse().ok()?);
    match out
        .iter()
        .position(|d| d.major == major && d.minor == minor)
    {
        Some(i) => Some(&mut out[i]),
        None if out.len() < MAX_ENTRIES => {
            out.push(BlkioDevice {
                major,
                minor,
                ..Default::default()
            });
            out.last_mut()
        }
        None => None,
    }
}

/// Huge pages of one size.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hugetlb {
    /// As the kernel names it: `2MB`, `1GB`.
    pub pagesize: String,
    pub usage_bytes: u64,
    /// v1 only (v2 keeps no peak).
    pub max_usage_bytes: Option<u64>,
}

/// Huge page use per page size: v1 `hugetlb.<size>.usage_in_bytes`/`max_usage_in_bytes`,
/// v2 `hugetlb.<size>.current`.
pub fn hugetlb(cgroup: &str) -> Vec<Hugetlb> {
    let Some(dir) = controller_dir("hugetlb", cgroup) else {
        return Vec::new();
    };
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let num = |p: PathBuf| {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    let mut out = Vec::new();
    for e in rd.flatten().take(MAX_ENTRIES * 8) {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("hugetlb.") else {
            continue;
        };
        let (size, usage) = if let Some(s) = rest.strip_suffix(".usage_in_bytes") {
            let max = num(dir.join(format!("hugetlb.{s}.max_usage_in_bytes")));
            (s, num(e.path()).map(|u| (u, max)))
        } else if let Some(s) = rest.strip_suffix(".current") {
            (s, num(e.path()).map(|u| (u, None)))
        } else {
            continue;
        };
        if size.contains('.') {
            continue; // .rsvd.* files
        }
        if let Some((usage_bytes, max_usage_bytes)) = usage {
            out.push(Hugetlb {
                pagesize: size.to_string(),
                usage_bytes,
                max_usage_bytes,
            });
        }
    }
    out.sort_by(|a, b| a.pagesize.cmp(&b.pagesize));
    out
}

/// Pressure stall totals of one resource, in microseconds: `some` (at least one task
/// waiting) and `full` (all stalled; the kernel keeps none for CPU at the root), with the
/// kernel's 10, 60 and 300 s averages (percent).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Pressure {
    pub some_total_us: u64,
    pub full_total_us: Option<u64>,
    pub some_avg: [f64; 3],
    pub full_avg: [f64; 3],
}

pub(super) fn parse_pressure(t: &str) -> Option<Pressure> {
    let mut p = Pressure::default();
    let mut some = false;
    for l in t.lines().take(4) {
        let mut f = l.split_whitespace();
        let kind = f.next()?;
        let mut total = None;
        let mut avg = [0f64; 3];
        for kv in f {
            let Some((k, v)) = kv.split_once('=') else {
                continue;
            };
            match k {
                "total" => total = v.parse::<u64>().ok(),
                "avg10" => avg[0] = v.parse().unwrap_or(0.0),
                "avg60" => avg[1] = v.parse().unwrap_or(0.0),
                "avg300" => avg[2] = v.parse().unwrap_or(0.0),
                _ => {}
            }
        }
        match kind {
            "some" => {
                p.some_total_us = total?;
                p.some_avg = avg;
                some = true;
            }
            "full" => {
                p.full_total_us = total;
                p.full_avg = avg;
            }
            _ => {}
        }
    }
    some.then_some(p)
}

/// The open files of a cgroup's processes, and the first one's soft `RLIMIT_NOFILE`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Procs {
    pub file_descriptors: u64,
    pub sockets: u64,
    pub nofile_soft: Option<u64>,
}

/// Counts the open files and sockets of the processes in `cgroup` (its own `cgroup.procs`,
/// at most [`MAX_ENTRIES`] processes and [`MAX_FDS`] files in all).
pub fn procs(cgroup: &str) -> Option<Procs> {
    let dir = controller_dir("pids", cgroup).or_else(|| controller_dir("memory", cgroup))?;
    let list = std::fs::read_to_string(dir.join("cgroup.procs")).ok()?;
    let pids: Vec<i32> = list
        .lines()
        .take(MAX_ENTRIES)
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    let mut p = Procs::default();
    for pid in &pids {
        let fd_dir = Path::new("/proc").join(pid.to_string()).join("fd");
        let Ok(rd) = std::fs::read_dir(&fd_dir) else {
            continue;
        };
        for e in rd.flatten() {
            if p.file_descriptors >= MAX_FDS {
                break;
            }
            p.file_descriptors += 1;
            if std::fs::read_link(e.path())
                .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))
            {
                p.sockets += 1;
            }
        }
    }
    p.nofile_soft = pids.first().and_then(|pid| {
        let t = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
        let l = t.lines().find(|l| l.starts_with("Max open files"))?;
        l.split_whitespace().nth(3)?.parse().ok()
    });
    Some(p)
}

/// v1 `memory.kmem.usage_in_bytes`, v2 `kernel` of `memory.stat`.
pub fn kernel_memory(dir: &Path, stat: &str) -> Option<u64> {
    std::fs::read_to_string(dir.join("memory.kmem.usage_in_bytes"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .or_else(|| key_value(stat, "kernel"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pressure_lines() {
        let p = parse_pressure(
            "some avg10=1.50 avg60=0.20 avg300=0.00 total=1234\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=99\n",
        )
        .unwrap();
        assert_eq!(p.some_total_us, 1234);
        assert_eq!(p.full_total_us, Some(99));
        assert_eq!(p.some_avg[0], 1.5);
        assert!(parse_pressure("").is_none());
        assert!(parse_pressure("some avg10=x").is_none());
    }
}
