//! The floor: the same pod lifecycle done with only the process calls no runtime can avoid,
//! and no sandboxd code on the path: `ip netns add`; each CNI plugin executed directly (ADD in
//! order with `prevResult` chained, DEL in reverse with the ADD result); for pods with an infra
//! process `runc create` + `runc start` of the pause bundle and `runc kill` + `runc delete`;
//! `ip netns del`. It uses the network list and the infra bundle sandboxd itself uses, on the
//! same host, right before sandboxd's own rows, so the two can be compared.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sandboxd::cni::{Attachment, NetworkList};
use serde_json::Value;

/// The columns of the per-step breakdown, for the floor and sandboxd alike: what each
/// lifecycle phase spent where.
pub const COLUMNS: [&str; 10] = [
    "netns",
    "CNI ADD",
    "CNI DEL",
    "runtime create",
    "runtime start",
    "runtime kill+wait",
    "runtime delete",
    "other host steps",
    "record fsyncs",
    "rest",
];
pub const NETNS: usize = 0;
pub const CNI_ADD: usize = 1;
pub const CNI_DEL: usize = 2;
pub const CREATE: usize = 3;
pub const START: usize = 4;
pub const KILL: usize = 5;
pub const DELETE: usize = 6;
pub const OTHER: usize = 7;
pub const FSYNC: usize = 8;
pub const REST: usize = 9;

/// One phase of one lifecycle, by column.
pub type Steps = [Duration; 10];

/// Per-phase samples of the floor (wall time and its steps), and its total time.
pub struct Floor {
    pub run: Vec<Duration>,
    pub stop: Vec<Duration>,
    pub remove: Vec<Duration>,
    pub steps: [Vec<Steps>; 3],
    pub wall: Duration,
}

/// Adds the time `f` takes to column `col` of `steps`.
fn step<T>(steps: &mut Steps, col: usize, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = f();
    steps[col] += t.elapsed();
    r
}

/// What the floor needs from the benchmark's runtime.
pub struct Setup<'a> {
    pub list: &'a NetworkList,
    pub bin_dirs: &'a [PathBuf],
    /// The infra container's config.json of a live sandbox (its mounts stay valid while that
    /// sandbox lives); `None` measures pods without an infra process.
    pub infra_spec: Option<&'a Value>,
    /// Scratch dir for bundles and the runtime root.
    pub work: &'a Path,
    /// A cgroupfs path, or with `systemd` a slice the runtime puts a scope per pod in.
    pub cgroup_parent: &'a str,
    /// runc drives cgroups through systemd (`--systemd-cgroup`), as sandboxd's handlers do
    /// under the systemd driver.
    pub systemd: bool,
}

/// Runs `cmd` with no stdio at all (the container `runc create` starts inherits it, so a pipe
/// would never see EOF); a failure shows the log file the command was told to write.
fn must(cmd: &mut Command, what: &str, log: &Path) {
    let status = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        status.success(),
        "{what}: {status}: {}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

fn plugin(s: &Setup, command: &str, netns: &Path, att: &Attachment, conf: &Value) -> Option<Value> {
    let typ = conf["type"].as_str().unwrap_or_default();
    let bin = s
        .bin_dirs
        .iter()
        .map(|d| d.join(typ))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("no CNI plugin {typ}"));
    let paths = s
        .bin_dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    let mut child = Command::new(&bin)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", &att.container_id)
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", &att.ifname)
        .env("CNI_PATH", paths)
        .env("CNI_ARGS", att.cni_args())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{typ}: {e}"));
    let stdin = serde_json::to_vec(conf).unwrap();
    child.stdin.take().unwrap().write_all(&stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{typ} {command}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).ok()
}

/// Waits until process `pid` (not our child: whoever reaps it may take its time) has exited,
/// i.e. is gone or a zombie, which is what `runc delete` checks.
fn wait_gone(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let running = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            let state = s.rsplit_once(") ").and_then(|(_, r)| r.chars().next());
            !matches!(state, Some('Z' | 'X'))
        })
    };
    while running() {
        assert!(Instant::now() < deadline, "pause {pid} did not exit");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// `pods` floor lifecycles, `conc` at a time. At concurrency 1 the wall is the sum of the
/// timed process calls alone; above, the elapsed time of all of them (writing the bundles,
/// well under a millisecond each, included).
pub fn measure(s: &Setup, pods: usize, conc: usize) -> Floor {
    std::fs::create_dir_all(s.work).unwrap();
    if conc <= 1 {
        let mut f = lifecycles(s, 0..pods);
        // Only the timed process calls count (not writing the bundles).
        f.wall = f.run.iter().chain(&f.stop).chain(&f.remove).sum();
        return f;
    }
    let t = Instant::now();
    let parts: Vec<Floor> = std::thread::scope(|sc| {
        let workers: Vec<_> = (0..conc)
            .map(|w| sc.spawn(move || lifecycles(s, (w..pods).step_by(conc))))
            .collect();
        workers.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut f = empty();
    for p in parts {
        f.run.extend(p.run);
        f.stop.extend(p.stop);
        f.remove.extend(p.remove);
        for (a, b) in f.steps.iter_mut().zip(p.steps) {
            a.extend(b);
        }
    }
    f.wall = t.elapsed();
    f
}

fn empty() -> Floor {
    Floor {
        run: Vec::new(),
        stop: Vec::new(),
        remove: Vec::new(),
        steps: Default::default(),
        wall: Duration::ZERO,
    }
}

/// The floor lifecycles of pods `indices`, one after the other.
fn lifecycles(s: &Setup, indices: impl Iterator<Item = usize>) -> Floor {
    let runc_root = s.work.join("runc");
    let mut f = empty();
    for i in indices {
        let name = format!("sbfloor-{}-{i}", std::process::id());
        let netns = PathBuf::from("/var/run/netns").join(&name);
        let att = Attachment {
            container_id: name.clone(),
            netns: Some(netns.clone()),
            ifname: "eth0".into(),
            pod_name: name.clone(),
            pod_namespace: "floor".into(),
            pod_uid: name.clone(),
            port_mappings: Vec::new(),
        };
        // The bundle is written before the clock starts: only process calls are timed.
        let bundle = s.work.join(&name);
        if let Some(spec) = s.infra_spec {
            let mut spec = spec.clone();
            for ns in spec["linux"]["namespaces"].as_array_mut().unwrap() {
                if ns["type"] == "network" {
                    ns["path"] = Value::String(netns.display().to_string());
                }
            }
            spec["linux"]["cgroupsPath"] = Value::String(if s.systemd {
                format!("{}:sbfloor:{name}", s.cgroup_parent)
            } else {
                format!("{}/{name}", s.cgroup_parent)
            });
            std::fs::create_dir_all(&bundle).unwrap();
            std::fs::write(
                bundle.join("config.json"),
                serde_json::to_vec(&spec).unwrap(),
            )
            .unwrap();
        }
        let log = s.work.join(format!("{name}.log"));
        let runc = |args: &[&str]| {
            let mut c = Command::new("runc");
            if s.systemd {
                c.arg("--systemd-cgroup");
            }
            c.arg("--root")
                .arg(&runc_root)
                .arg("--log")
                .arg(&log)
                .args(args);
            must(&mut c, &format!("runc {}", args[0]), &log);
        };
        let ip = |args: &[&str]| must(Command::new("ip").args(args), "ip netns", &log);

        let mut st = Steps::default();
        let t = Instant::now();
        step(&mut st, NETNS, || ip(&["netns", "add", &name]));
        let mut prev: Option<Value> = None;
        step(&mut st, CNI_ADD, || {
            for p in &s.list.plugins {
                let conf = s.list.plugin_stdin(p, prev.as_ref(), &att);
                prev = plugin(s, "ADD", &netns, &att, &conf);
            }
        });
        if s.infra_spec.is_some() {
            let pid_file = bundle.join("pid");
            step(&mut st, CREATE, || {
                runc(&[
                    "create",
                    "--bundle",
                    bundle.to_str().unwrap(),
                    "--pid-file",
                    pid_file.to_str().unwrap(),
                    &name,
                ])
            });
            step(&mut st, START, || runc(&["start", &name]));
        }
        f.run.push(t.elapsed());
        f.steps[0].push(st);

        let pid: Option<i32> = std::fs::read_to_string(bundle.join("pid"))
            .ok()
            .and_then(|p| p.trim().parse().ok());
        let mut st = Steps::default();
        let t = Instant::now();
        if let Some(pid) = pid {
            step(&mut st, KILL, || {
                runc(&["kill", &name, "KILL"]);
                wait_gone(pid);
            });
            step(&mut st, DELETE, || runc(&["delete", &name]));
        }
        step(&mut st, CNI_DEL, || {
            for p in s.list.plugins.iter().rev() {
                let conf = s.list.plugin_stdin(p, prev.as_ref(), &att);
                plugin(s, "DEL", &netns, &att, &conf);
            }
        });
        f.stop.push(t.elapsed());
        f.steps[1].push(st);

        let mut st = Steps::default();
        let t = Instant::now();
        step(&mut st, NETNS, || ip(&["netns", "del", &name]));
        f.remove.push(t.elapsed());
        f.steps[2].push(st);
        let _ = std::fs::remove_dir_all(&bundle);
        let _ = std::fs::remove_file(&log);
    }
    f
}
