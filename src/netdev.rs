//! Per-interface traffic counters of a pod's network namespace (`/proc/net/dev` as seen from
//! inside it), for pod stats and metrics. Read from a short-lived thread that enters the
//! namespace: the daemon's own threads never change namespace.

use std::io::Read;
use std::path::Path;

use crate::error::HostError;

/// Counters of one interface.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub rx_bytes: u64,
    pub rx_packets: u64,
    pub rx_errors: u64,
    pub rx_dropped: u64,
    pub tx_bytes: u64,
    pub tx_packets: u64,
    pub tx_errors: u64,
    pub tx_dropped: u64,
}

/// At most this many interfaces are reported (a namespace can hold thousands).
pub const MAX_INTERFACES: usize = 256;
/// At most this much of `/proc/net/dev` is read.
const MAX_BYTES: u64 = 256 << 10;

/// Parses `/proc/net/dev`: two header lines, then `name: 16 counters` per interface.
/// Malformed lines are skipped; `lo` is left out (it is not the pod's traffic).
pub fn parse(text: &str) -> Vec<Interface> {
    let mut out = Vec::new();
    for line in text.lines().skip(2) {
        if out.len() == MAX_INTERFACES {
            break;
        }
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        let name = name.trim();
        if name.is_empty() || name == "lo" || name.len() > 15 {
            continue;
        }
        let v: Vec<u64> = rest
            .split_whitespace()
            .map_while(|x| x.parse().ok())
            .collect();
        if v.len() < 12 {
            continue;
        }
        out.push(Interface {
            name: name.to_string(),
            rx_bytes: v[0],
            rx_packets: v[1],
            rx_errors: v[2],
            rx_dropped: v[3],
            tx_bytes: v[8],
            tx_packets: v[9],
            tx_errors: v[10],
            tx_dropped: v[11],
        });
    }
    out
}

/// The interfaces of the network namespace pinned at `netns`.
pub fn read(netns: &Path) -> Result<Vec<Interface>, HostError> {
    let ns = std::fs::File::open(netns).map_err(|e| HostError::io("open netns", netns, e))?;
    let path = netns.to_path_buf();
    std::thread::Builder::new()
        .name("netdev".into())
        .spawn(move || -> Result<Vec<Interface>, HostError> {
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| HostError::sys("enter netns", &path, e))?;
            // thread-self: this thread's namespace, not the process's.
            let mut text = String::new();
            std::fs::File::open("/proc/thread-self/net/dev")
                .and_then(|f| f.take(MAX_BYTES).read_to_string(&mut text))
                .map_err(|e| HostError::io("read", Path::new("/proc/thread-self/net/dev"), e))?;
            Ok(parse(&text))
        })
        .map_err(|e| HostError::thread_start("netdev", e))?
        .join()
        .map_err(|_| HostError::thread_panicked("netdev"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:     100       2    0    0    0     0          0         0      100       2    0    0    0     0       0          0
  eth0:    5000      40    1    2    0     0          0         0     3000      30    3    4    0     0       0          0
garbage
  eth1: 1 2 3
";

    #[test]
    fn parses_counters_and_skips_lo_and_junk() {
        let v = parse(SAMPLE);
        assert_eq!(v.len(), 1);
        let e = &v[0];
        assert_eq!(e.name, "eth0");
        assert_eq!(
            (e.rx_bytes, e.rx_packets, e.rx_errors, e.rx_dropped),
            (5000, 40, 1, 2)
        );
        assert_eq!(
            (e.tx_bytes, e.tx_packets, e.tx_errors, e.tx_dropped),
            (3000, 30, 3, 4)
        );
    }

    #[test]
    fn bounded() {
        let mut text = String::from("h\nh\n");
        for i in 0..1000 {
            text.push_str(&format!("v{i}: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n"));
        }
        assert_eq!(parse(&text).len(), MAX_INTERFACES);
    }
}
