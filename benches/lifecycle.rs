//! Pod sandbox lifecycle benchmark through the library, on the real host (root): N lifecycles
//! (run → status → stop → remove) with the embedded bridge network, for pods without an infra
//! process (kubelet's default) and with one (shared PID namespace), sequentially and at
//! concurrency 4 and 16. Prints per-phase p50/p90/p99, sandboxes/s, the share of time spent in
//! child processes (runtime, plugins, monitor) and our own time per phase, and the idle RSS
//! of a monitor and a pause process. Run it with `scripts/bench`, which records the result.
//!
//! Usage: cargo bench --bench lifecycle -- [--pods N] [--infra yes|no] [--conc C]
//! (`--infra`/`--conc` run one row only; `SANDBOXD_BENCH_LOG=debug` prints the library's
//! tracing, e.g. each CNI plugin call's duration, to stderr.)

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sandboxd::{Config, PodSandboxConfig, Runtime, SandboxFilter};

#[path = "floor/mod.rs"]
mod floor;

const SUBNET: &str = "10.254.0.0/22";
const BRIDGE: &str = "sbbench0";
const CGROUP_PARENT: &str = "/sandboxd-bench";

struct Guard {
    base: PathBuf,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = Command::new("iptables")
            .args([
                "-w", "-D", "FORWARD", "-s", SUBNET, "!", "-d", SUBNET, "-j", "DROP",
            ])
            .output();
        // A floor run that failed half-way: its runtime containers and netns files.
        let runc_root = self.base.join("floor/runc");
        for e in std::fs::read_dir(&runc_root)
            .into_iter()
            .flatten()
            .flatten()
        {
            let _ = Command::new("runc")
                .arg("--root")
                .arg(&runc_root)
                .args(["delete", "--force"])
                .arg(e.file_name())
                .output();
        }
        let prefix = format!("sbfloor-{}-", std::process::id());
        for e in std::fs::read_dir("/var/run/netns")
            .into_iter()
            .flatten()
            .flatten()
        {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = Command::new("ip")
                    .args(["netns", "del"])
                    .arg(e.file_name())
                    .output();
            }
        }
        let _ = Command::new("ip").args(["link", "del", BRIDGE]).output();
        for d in ["netns", "ipcns", "utsns"] {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.base.join(d))
                .output();
        }
        let _ = std::fs::remove_dir_all(&self.base);
        for h in sandboxd::cgroups::hierarchies() {
            let _ = std::fs::remove_dir(h.mount_point.join(CGROUP_PARENT.trim_start_matches('/')));
        }
    }
}

#[derive(Default, Clone)]
struct Samples {
    run: Vec<Duration>,
    status: Vec<Duration>,
    stop: Vec<Duration>,
    remove: Vec<Duration>,
    own: [Vec<Duration>; 4],
}

fn pct(v: &[Duration], p: f64) -> f64 {
    let mut v: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if v.is_empty() {
        return 0.0;
    }
    let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    v[i]
}

fn pod(i: usize, tag: &str, infra: bool) -> PodSandboxConfig {
    PodSandboxConfig::new(
        &format!("bench-{tag}-{i}"),
        "bench",
        &format!("uid-{tag}-{i}"),
        infra,
    )
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration, Duration) {
    let (c0, _) = sandboxd::process::child_time();
    let t = Instant::now();
    let r = f();
    let wall = t.elapsed();
    let (c1, _) = sandboxd::process::child_time();
    (r, wall, wall.saturating_sub(c1 - c0))
}

fn run_config(rt: &Runtime, pods: usize, conc: usize, infra: bool) -> (Samples, Duration, f64) {
    let tag = format!(
        "{}-{conc}-{}",
        if infra { "i" } else { "p" },
        std::process::id()
    );
    let all = Mutex::new(Samples::default());
    let (c0, _) = sandboxd::process::child_time();
    let t = Instant::now();
    std::thread::scope(|s| {
        for w in 0..conc {
            let (all, tag) = (&all, &tag);
            s.spawn(move || {
                let mut mine = Samples::default();
                for i in (w..pods).step_by(conc) {
                    let (id, d, own) =
                        timed(|| rt.run_pod_sandbox(&pod(i, tag, infra)).expect("run"));
                    mine.run.push(d);
                    mine.own[0].push(own);
                    let (_, d, own) = timed(|| rt.pod_sandbox_status(&id).expect("status"));
                    mine.status.push(d);
                    mine.own[1].push(own);
                    let (_, d, own) = timed(|| rt.stop_pod_sandbox(&id).expect("stop"));
                    mine.stop.push(d);
                    mine.own[2].push(own);
                    let (_, d, own) = timed(|| rt.remove_pod_sandbox(&id).expect("remove"));
                    mine.remove.push(d);
                    mine.own[3].push(own);
                }
                let mut a = all.lock().unwrap();
                a.run.extend(mine.run);
                a.status.extend(mine.status);
                a.stop.extend(mine.stop);
                a.remove.extend(mine.remove);
                for k in 0..4 {
                    a.own[k].extend(mine.own[k].iter().copied());
                }
            });
        }
    });
    let wall = t.elapsed();
    let (c1, _) = sandboxd::process::child_time();
    // Child wall time summed over workers, against the workers' total wall time.
    let child_share = (c1 - c0).as_secs_f64() / (wall.as_secs_f64() * conc as f64);
    (all.into_inner().unwrap(), wall, child_share)
}

fn rss_kib(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{}/status", pid.trim()))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn main() {
    let mut pods = 60usize;
    let (mut only_infra, mut only_conc) = (None, None);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--pods" => pods = args.next().and_then(|v| v.parse().ok()).expect("--pods N"),
            "--infra" => only_infra = Some(args.next().as_deref() == Some("yes")),
            "--conc" => only_conc = args.next().and_then(|v| v.parse::<usize>().ok()),
            _ => {}
        }
    }
    if let Ok(filter) = std::env::var("SANDBOXD_BENCH_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .init();
    }
    let base = PathBuf::from(format!("/tmp/sandboxd-bench-{}", std::process::id()));
    std::fs::create_dir_all(&base).unwrap();
    let _guard = Guard { base: base.clone() };
    let ok = Command::new("iptables")
        .args([
            "-w", "-I", "FORWARD", "-s", SUBNET, "!", "-d", SUBNET, "-j", "DROP",
        ])
        .status()
        .unwrap();
    assert!(ok.success(), "cannot install the iptables guard");
    let mut cfg = Config::rooted_at(&base);
    cfg.default_network.bridge = BRIDGE.into();
    cfg.default_network.subnet = SUBNET.into();
    cfg.default_network.name = "sandboxd-bench".into();
    cfg.default_network.ip_masq = false;
    cfg.cgroup_parent = CGROUP_PARENT.into();
    let rt = Runtime::new(cfg).expect("runtime");

    // Warm up (bridge creation, page cache) and measure the idle shims.
    let id = rt.run_pod_sandbox(&pod(0, "warm", true)).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let dir = base.join("root/sandboxes").join(&id).join("infra");
    let monitor_pid = std::fs::read_to_string(dir.join("monitor.pid")).unwrap_or_default();
    let pause_pid = rt
        .pod_sandbox_status(&id)
        .unwrap()
        .infra_pid
        .unwrap_or(0)
        .to_string();
    let (monitor_rss, pause_rss) = (rss_kib(&monitor_pid), rss_kib(&pause_pid));
    // The floor reuses this pod's infra bundle (its mounts stay valid while the pod lives).
    let infra_spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let list = rt.network().expect("network");
    let floor_dir = base.join("floor");
    let mut floors = Vec::new();

    println!("| pods | infra process | concurrency | sandboxes/s | run p50/p90/p99 ms | status p50 ms | stop p50/p90/p99 ms | remove p50/p90/p99 ms | lifecycle ms (wall/pod) | child-process share | own code p50 ms (run/status/stop/remove) |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut ours_c1 = Vec::new();
    for infra in [false, true] {
        if only_infra.is_some_and(|o| o != infra) {
            continue;
        }
        for conc in [1usize, 4, 16] {
            if only_conc.is_some_and(|c| c != conc) {
                continue;
            }
            if conc == 1 {
                let setup = floor::Setup {
                    list: &list,
                    bin_dirs: &rt.config().cni_bin_dirs,
                    infra_spec: infra.then_some(&infra_spec),
                    work: &floor_dir,
                    cgroup_parent: CGROUP_PARENT,
                };
                floors.push((infra, floor::measure(&setup, pods)));
            }
            let (s, wall, share) = run_config(&rt, pods, conc, infra);
            if conc == 1 {
                ours_c1.push(wall);
            }
            // Child time is a process-wide counter: per-phase own time is exact only when
            // one lifecycle runs at a time.
            let own = if conc == 1 {
                s.own
                    .iter()
                    .map(|v| format!("{:.2}", pct(v, 50.0)))
                    .collect::<Vec<_>>()
                    .join("/")
            } else {
                "—".to_string()
            };
            println!(
                "| {pods} | {} | {conc} | {:.1} | {:.1}/{:.1}/{:.1} | {:.2} | {:.1}/{:.1}/{:.1} | {:.1}/{:.1}/{:.1} | {:.1} | {:.0}% | {} |",
                if infra { "yes" } else { "no" },
                pods as f64 / wall.as_secs_f64(),
                pct(&s.run, 50.0), pct(&s.run, 90.0), pct(&s.run, 99.0),
                pct(&s.status, 50.0),
                pct(&s.stop, 50.0), pct(&s.stop, 90.0), pct(&s.stop, 99.0),
                pct(&s.remove, 50.0), pct(&s.remove, 90.0), pct(&s.remove, 99.0),
                wall.as_secs_f64() * 1000.0 / pods as f64,
                share * 100.0,
                own,
            );
        }
    }
    rt.remove_pod_sandbox(&id).unwrap();
    if !floors.is_empty() {
        println!();
        println!("Floor: the same lifecycles with only the unavoidable process calls (`ip netns add`, each CNI plugin executed directly, `runc create`+`start` and `kill`+`delete` of the same pause bundle, `ip netns del`), no sandboxd code, concurrency 1, run right before sandboxd's concurrency-1 row:");
        println!();
        println!("| pods | infra process | floor run/stop/remove p50 ms | floor lifecycle ms (wall/pod) | sandboxd lifecycle ms (wall/pod) | sandboxd vs floor |");
        println!("|---|---|---|---|---|---|");
        for ((infra, f), ours) in floors.iter().zip(&ours_c1) {
            let (fl, us) = (
                f.wall.as_secs_f64() * 1000.0 / pods as f64,
                ours.as_secs_f64() * 1000.0 / pods as f64,
            );
            println!(
                "| {pods} | {} | {:.1}/{:.1}/{:.1} | {fl:.1} | {us:.1} | {:+.0}% |",
                if *infra { "yes" } else { "no" },
                pct(&f.run, 50.0),
                pct(&f.stop, 50.0),
                pct(&f.remove, 50.0),
                (us / fl - 1.0) * 100.0,
            );
        }
    }
    println!();
    println!("Idle RSS: monitor {monitor_rss} KiB, pause {pause_rss} KiB (VmRSS, one infra pod).");
    assert!(
        rt.list_pod_sandboxes(&SandboxFilter::default()).is_empty(),
        "bench leaked sandboxes"
    );
}
