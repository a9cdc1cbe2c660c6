//! Pod sandbox lifecycle benchmark through the library, on the real host (root): N lifecycles
//! (run → status → stop → remove) with the embedded bridge network, for pods without an infra
//! process (kubelet's default) and with one (shared PID namespace), sequentially and at
//! concurrency 4 and 16. Prints per-phase p50/p90/p99, sandboxes/s, the share of time spent in
//! child processes (runtime, plugins, monitor) and our own time per phase, and the idle RSS
//! of a monitor and a pause process. Run it with `scripts/bench`, which records the result.
//!
//! Usage: cargo bench --bench lifecycle -- [--pods N] [--infra yes|no] [--conc C]
//!        [--driver auto|systemd|cgroupfs]   (the cgroup driver; auto: systemd where it is PID 1)
//!        [--nri off|idle|noop]   (NRI disabled; enabled with its socket served and no plugin
//!        (the default); or with one plugin that subscribes to every event and changes nothing,
//!        `sandboxd-nri-logger`)
//! (`--infra`/`--conc` run one row only; `SANDBOXD_BENCH_LOG=debug` prints the library's
//! tracing, e.g. each CNI plugin call's duration, to stderr.)

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sandboxd::api::v1 as cri;
use sandboxd::api::v1::runtime_service_client::RuntimeServiceClient;
use sandboxd::counters::Step;
use sandboxd::{Config, PodSandboxConfig, Runtime, SandboxFilter};

#[path = "floor/mod.rs"]
mod floor;

const SUBNET: &str = "10.254.0.0/22";
const BRIDGE: &str = "sbbench0";
const CGROUP_PARENT: &str = "/sandboxd-bench";
/// The concurrencies the floor is measured at, beside sandboxd's rows.
const FLOOR_CONC: [usize; 2] = [1, 8];

/// The floor's slice under the systemd driver, and its whole path.
const FLOOR_SLICE: &str = "sandboxd-bench.slice";
const FLOOR_SLICE_PATH: &str = "/sandboxd-bench.slice";

/// The cgroup parent every pod names: the floor's. kubelet always names one, the pod's own
/// cgroup that it made itself (and removes itself); sandboxd makes a pod level of its own
/// only when a client names none. With the floor's parent, sandboxd and the floor each make
/// one level per pod, the container's, as under kubelet.
static POD_CGROUP_PARENT: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

fn pod_cgroup_parent() -> String {
    POD_CGROUP_PARENT
        .get()
        .copied()
        .unwrap_or(CGROUP_PARENT)
        .into()
}

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
        for d in ["netns", "ipcns", "utsns", "userns"] {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.base.join(d))
                .output();
        }
        let _ = std::fs::remove_dir_all(&self.base);
        let _ = sandboxd::cgroups::remove(CGROUP_PARENT);
        if sandboxd::cgroups::systemd::booted() {
            for slice in [FLOOR_SLICE, "sandboxd.slice"] {
                let _ = sandboxd::cgroups::remove(slice);
            }
        }
    }
}

/// Samples of one phase (run, status, stop or remove).
#[derive(Default, Clone)]
struct Phase {
    wall: Vec<Duration>,
    /// Wall time minus time in child processes.
    own: Vec<Duration>,
    /// CPU time of this process.
    cpu: Vec<Duration>,
    /// Of `own`: waits for record fsyncs, and for namespace creation.
    sync: Vec<Duration>,
    ns: Vec<Duration>,
    /// Where the wall time went, by the floor's columns.
    steps: Vec<floor::Steps>,
}

impl Phase {
    fn extend(&mut self, o: &Phase) {
        self.wall.extend(&o.wall);
        self.own.extend(&o.own);
        self.cpu.extend(&o.cpu);
        self.sync.extend(&o.sync);
        self.ns.extend(&o.ns);
        self.steps.extend(&o.steps);
    }
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
    let mut p = PodSandboxConfig::new(
        &format!("bench-{tag}-{i}"),
        "bench",
        &format!("uid-{tag}-{i}"),
        infra,
    );
    p.cgroup_parent = pod_cgroup_parent();
    p
}

/// CPU time (user + system) of this process, all threads; children not included.
fn cpu_time() -> Duration {
    // SAFETY: an all-zero rusage is valid, and getrusage only writes into it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a pointer to our local struct.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Runs `f` and records its wall time, own time, CPU time and waits into `phase` (the
/// process-wide counters are exact only when nothing else runs in this process).
fn timed<T>(phase: &mut Phase, f: impl FnOnce() -> T) -> T {
    let (c0, _) = sandboxd::counters::child_time();
    let (cpu0, s0, n0) = (
        cpu_time(),
        sandboxd::counters::sync_wait(),
        sandboxd::counters::pin_wait(),
    );
    let steps0 = Snapshot::now();
    let t = Instant::now();
    let r = f();
    let wall = t.elapsed();
    let (c1, _) = sandboxd::counters::child_time();
    phase.wall.push(wall);
    phase.own.push(wall.saturating_sub(c1 - c0));
    phase.cpu.push(cpu_time() - cpu0);
    phase.sync.push(sandboxd::counters::sync_wait() - s0);
    phase.ns.push(sandboxd::counters::pin_wait() - n0);
    phase.steps.push(Snapshot::now().since(&steps0, wall));
    r
}

/// The step counters, the fsync and the namespace-wait counters at one moment.
struct Snapshot {
    steps: [Duration; 12],
    sync: Duration,
    ns: Duration,
}

impl Snapshot {
    fn now() -> Snapshot {
        Snapshot {
            steps: Step::ALL.map(sandboxd::counters::step_time),
            sync: sandboxd::counters::sync_wait(),
            ns: sandboxd::counters::pin_wait(),
        }
    }

    /// What was spent since `before`, by the floor's columns; *rest* is `wall` minus all of
    /// it (with several workers, `wall` is theirs summed).
    fn since(&self, before: &Snapshot, wall: Duration) -> floor::Steps {
        let mut st = floor::Steps::default();
        for ((s, now), then) in Step::ALL.iter().zip(self.steps).zip(before.steps) {
            let col = match s {
                Step::Namespaces => floor::NETNS,
                Step::CniAdd => floor::CNI_ADD,
                Step::CniDel => floor::CNI_DEL,
                Step::RuntimeCreate => floor::CREATE,
                Step::RuntimeStart => floor::START,
                Step::RuntimeStop => floor::KILL,
                Step::RuntimeDelete => floor::DELETE,
                _ => floor::OTHER,
            };
            st[col] += now - then;
        }
        // The pins are made on their own thread: what the verb waited for them counts.
        st[floor::NETNS] += self.ns - before.ns;
        st[floor::FSYNC] = self.sync - before.sync;
        st[floor::REST] = wall.saturating_sub(st.iter().sum());
        st
    }
}

/// The per-step table's rows for one phase: the floor's and sandboxd's p50 of each column
/// (each column on its own), then the walls' p50 and their ratio.
fn step_rows(infra: bool, phase: &str, fl: (&[Duration], &[floor::Steps]), us: &Phase) {
    let cols = |steps: &[floor::Steps]| -> Vec<String> {
        (0..floor::COLUMNS.len())
            .map(|c| {
                let v: Vec<Duration> = steps.iter().map(|s| s[c]).collect();
                if v.iter().all(|d| d.is_zero()) {
                    "—".to_string()
                } else {
                    format!("{:.2}", pct(&v, 50.0))
                }
            })
            .collect()
    };
    let (fw, uw) = (pct(fl.0, 50.0), pct(&us.wall, 50.0));
    let infra = if infra { "yes" } else { "no" };
    println!(
        "| {infra} | {phase} | floor | {fw:.2} | {} | |",
        cols(fl.1).join(" | ")
    );
    println!(
        "| {infra} | {phase} | sandboxd | {uw:.2} | {} | {:+.0}% |",
        cols(&us.steps).join(" | "),
        (uw / fw - 1.0) * 100.0
    );
}

/// One configuration's samples per phase, its wall time, the child-process share, and what
/// all its lifecycles spent per step (summed over the workers).
fn run_config(
    rt: &Runtime,
    pods: usize,
    conc: usize,
    infra: bool,
) -> ([Phase; 4], Duration, f64, floor::Steps) {
    let tag = format!(
        "{}-{conc}-{}",
        if infra { "i" } else { "p" },
        std::process::id()
    );
    let all = Mutex::new(<[Phase; 4]>::default());
    let (c0, _) = sandboxd::counters::child_time();
    let before = Snapshot::now();
    let t = Instant::now();
    std::thread::scope(|s| {
        for w in 0..conc {
            let (all, tag) = (&all, &tag);
            s.spawn(move || {
                let mut mine = <[Phase; 4]>::default();
                for i in (w..pods).step_by(conc) {
                    let [run, status, stop, remove] = &mut mine;
                    let id = timed(run, || {
                        rt.run_pod_sandbox(&pod(i, tag, infra)).expect("run")
                    });
                    timed(status, || rt.pod_sandbox_status(&id).expect("status"));
                    timed(stop, || rt.stop_pod_sandbox(&id).expect("stop"));
                    timed(remove, || rt.remove_pod_sandbox(&id).expect("remove"));
                }
                let mut a = all.lock().unwrap();
                for (a, m) in a.iter_mut().zip(&mine) {
                    a.extend(m);
                }
            });
        }
    });
    let wall = t.elapsed();
    let (c1, _) = sandboxd::counters::child_time();
    // Child wall time summed over workers, against the workers' total wall time.
    let child_share = (c1 - c0).as_secs_f64() / (wall.as_secs_f64() * conc as f64);
    let phases = all.into_inner().unwrap();
    let worker_time = phases.iter().flat_map(|p| &p.wall).sum();
    let steps = Snapshot::now().since(&before, worker_time);
    (phases, wall, child_share, steps)
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

/// sandboxd through its CRI socket: the daemon's own server (`server::serve`) on a socket in
/// the state root, in this process on a Tokio runtime of its own, and a tonic client — the
/// gRPC translation and transport on top of the library's path.
struct Grpc {
    tokio: tokio::runtime::Runtime,
    socket: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<sandboxd::Result<()>>>,
}

impl Grpc {
    fn start(rt: &std::sync::Arc<Runtime>, base: &std::path::Path) -> Grpc {
        let socket = base.join("cri.sock");
        let listener = sandboxd::server::bind_socket(&socket).expect("CRI socket");
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio.spawn(sandboxd::server::serve(
            rt.clone(),
            listener,
            socket.clone(),
            None,
            Box::pin(async move {
                let _ = stopped.await;
            }),
        ));
        // The handlers' trial containers it starts are over before anything is measured.
        rt.wait_probed(Duration::from_secs(30));
        Grpc {
            tokio,
            socket,
            stop: Some(stop),
            server: Some(server),
        }
    }

    fn client(&self, socket: &std::path::Path) -> RuntimeServiceClient<tonic::transport::Channel> {
        let path = socket.to_path_buf();
        let ch = self.tokio.block_on(
            tonic::transport::Endpoint::try_from("http://[::]:50051")
                .unwrap()
                .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                            tokio::net::UnixStream::connect(path).await?,
                        ))
                    }
                })),
        );
        RuntimeServiceClient::new(ch.expect("connect to the CRI socket"))
    }

    /// `pods` lifecycles over gRPC, `conc` at a time: each phase's samples and the wall.
    fn run_config(&self, pods: usize, conc: usize, infra: bool) -> ([Vec<Duration>; 4], Duration) {
        self.run_config_on(&self.socket, pods, conc, infra)
    }

    /// [`run_config`](Self::run_config) against the CRI server on `socket` (a peer runtime's).
    fn run_config_on(
        &self,
        socket: &std::path::Path,
        pods: usize,
        conc: usize,
        infra: bool,
    ) -> ([Vec<Duration>; 4], Duration) {
        let tag = format!(
            "g{}-{conc}-{}",
            if infra { "i" } else { "p" },
            std::process::id()
        );
        let all = Mutex::new(<[Vec<Duration>; 4]>::default());
        let clients: Vec<_> = (0..conc).map(|_| self.client(socket)).collect();
        let t = Instant::now();
        self.tokio.block_on(async {
            let mut workers = Vec::new();
            for (w, mut c) in clients.into_iter().enumerate() {
                let (tag, all) = (tag.clone(), &all);
                workers.push(async move {
                    let mut mine = <[Vec<Duration>; 4]>::default();
                    for i in (w..pods).step_by(conc) {
                        let mode = if infra {
                            cri::NamespaceMode::Pod
                        } else {
                            cri::NamespaceMode::Container
                        };
                        let config = cri::PodSandboxConfig {
                            metadata: Some(cri::PodSandboxMetadata {
                                name: format!("bench-{tag}-{i}"),
                                namespace: "bench".into(),
                                uid: format!("uid-{tag}-{i}"),
                                attempt: 0,
                            }),
                            linux: Some(cri::LinuxPodSandboxConfig {
                                security_context: Some(cri::LinuxSandboxSecurityContext {
                                    namespace_options: Some(cri::NamespaceOption {
                                        pid: mode as i32,
                                        ..Default::default()
                                    }),
                                    ..Default::default()
                                }),
                                cgroup_parent: pod_cgroup_parent(),
                                ..Default::default()
                            }),
                            ..Default::default()
                        };
                        let t = Instant::now();
                        let id = c
                            .run_pod_sandbox(cri::RunPodSandboxRequest {
                                config: Some(config),
                                runtime_handler: String::new(),
                            })
                            .await
                            .expect("RunPodSandbox")
                            .into_inner()
                            .pod_sandbox_id;
                        mine[0].push(t.elapsed());
                        let t = Instant::now();
                        c.pod_sandbox_status(cri::PodSandboxStatusRequest {
                            pod_sandbox_id: id.clone(),
                            verbose: false,
                        })
                        .await
                        .expect("PodSandboxStatus");
                        mine[1].push(t.elapsed());
                        let t = Instant::now();
                        c.stop_pod_sandbox(cri::StopPodSandboxRequest {
                            pod_sandbox_id: id.clone(),
                        })
                        .await
                        .expect("StopPodSandbox");
                        mine[2].push(t.elapsed());
                        let t = Instant::now();
                        c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id })
                            .await
                            .expect("RemovePodSandbox");
                        mine[3].push(t.elapsed());
                    }
                    let mut a = all.lock().unwrap();
                    for (a, m) in a.iter_mut().zip(mine) {
                        a.extend(m);
                    }
                });
            }
            futures_util::future::join_all(workers).await;
        });
        (all.into_inner().unwrap(), t.elapsed())
    }
}

impl Drop for Grpc {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(h) = self.server.take() {
            let _ = self.tokio.block_on(h);
        }
    }
}

/// The no-op plugin's process, ended with the benchmark.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Rounds of the alternating comparison.
const ROUNDS: usize = 4;

/// One configuration's alternating rounds: ms per lifecycle of the floor, the library, gRPC
/// and the peer runtime (NaN without one) in each round.
struct Alternated {
    infra: bool,
    conc: usize,
    pods: usize,
    rounds: Vec<[f64; 4]>,
    /// The host's busy CPU ms per lifecycle in the same rounds and order.
    cpu: Vec<[f64; 4]>,
}

/// Busy CPU time of the whole host (all CPUs, every process and kernel thread: user, nice,
/// system, irq, softirq; idle, iowait and steal left out) from /proc/stat. It charges
/// each contestant what its lifecycles cost the machine, runc and the plugins included,
/// whatever the machine's speed meanwhile.
fn host_busy() -> Duration {
    let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
    let line = stat.lines().next().expect("cpu line");
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let ticks = f[0] + f[1] + f[2] + f[5] + f[6];
    Duration::from_millis(ticks * 1000 / hz)
}

/// Runs `f`, returning its result and the host's busy CPU time meanwhile.
fn host_cpu<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let before = host_busy();
    let out = f();
    (out, host_busy().saturating_sub(before))
}

/// A peer runtime's CRI socket (containerd's, from `scripts/bench-peers floor`) and its name.
struct Peer {
    socket: PathBuf,
    name: String,
}

/// The floor, sandboxd through the library and through the CRI socket, one after the other,
/// [`ROUNDS`] times: what the machine does meanwhile (its speed moves by a fifth within
/// minutes here, and the kernel tears down the last round's namespaces in the background)
/// falls on all three alike.
fn alternate(
    rt: &Runtime,
    g: &Grpc,
    peer: Option<&Peer>,
    setup: &floor::Setup,
    pods: usize,
    conc: usize,
    infra: bool,
) -> Alternated {
    let pods = (pods / 2).max(conc * 4);
    let per_pod = |d: Duration| d.as_secs_f64() * 1000.0 / pods as f64;
    let (mut rounds, mut cpu) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let (floor, floor_cpu) = host_cpu(|| floor::measure(setup, pods, conc).wall);
        let ((_, library, _, _), library_cpu) = host_cpu(|| run_config(rt, pods, conc, infra));
        let ((_, grpc), grpc_cpu) = host_cpu(|| g.run_config(pods, conc, infra));
        let (peer, peer_cpu) = match peer {
            Some(p) => {
                let ((_, wall), c) = host_cpu(|| g.run_config_on(&p.socket, pods, conc, infra));
                (per_pod(wall), per_pod(c))
            }
            None => (f64::NAN, f64::NAN),
        };
        rounds.push([per_pod(floor), per_pod(library), per_pod(grpc), peer]);
        cpu.push([
            per_pod(floor_cpu),
            per_pod(library_cpu),
            per_pod(grpc_cpu),
            peer_cpu,
        ]);
    }
    Alternated {
        infra,
        conc,
        pods,
        rounds,
        cpu,
    }
}

fn print_alternated(all: &[Alternated], peer: Option<&Peer>) {
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    };
    let ratios = |r: &[[f64; 4]], who: usize| -> Vec<f64> {
        r.iter().map(|x| (x[who] / x[0] - 1.0) * 100.0).collect()
    };
    let spread = |v: Vec<f64>| {
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
        format!("{:+.0}% ({lo:+.0}…{hi:+.0})", median(v))
    };
    println!();
    let (peer_cols, peer_dashes, peer_says) = match peer {
        Some(p) => (
            format!(" {0} ms/pod | {0} vs floor |", p.name),
            "---|---|",
            format!(", then {} through its CRI socket with the same client (it runs a pause container in every pod, so its fair floor is the infra row's)", p.name),
        ),
        None => (String::new(), "", String::new()),
    };
    println!("Alternating: {ROUNDS} rounds, each the floor, then sandboxd through the library, then through the CRI socket{peer_says}, one right after the other, so that the machine's drift within the run falls on all alike. Each round's ratio is to that round's floor; the table gives the median of the rounds (min…max). These are the figures to hold against the 10 % goal:");
    println!();
    println!("| infra process | concurrency | lifecycles a round | floor ms/pod (median) | library ms/pod | gRPC ms/pod | library vs floor | gRPC vs floor |{peer_cols}");
    println!("|---|---|---|---|---|---|---|---|{peer_dashes}");
    // The peer's cells of a row: its median and its ratio to the floor.
    let peer_cells = |r: &[[f64; 4]]| match peer {
        Some(_) => format!(
            " {:.1} | {} |",
            median(r.iter().map(|x| x[3]).collect()),
            spread(ratios(r, 3))
        ),
        None => String::new(),
    };
    for a in all {
        let col = |who: usize| median(a.rounds.iter().map(|x| x[who]).collect());
        let peer = peer_cells(&a.rounds);
        println!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.1} | {} | {} |{peer}",
            if a.infra { "yes" } else { "no" },
            a.conc,
            a.pods,
            col(0),
            col(1),
            col(2),
            spread(ratios(&a.rounds, 1)),
            spread(ratios(&a.rounds, 2)),
        );
    }
    println!();
    println!("The same rounds in the host's busy CPU time (/proc/stat: user, system, irq and softirq of every CPU, idle, iowait and steal left out), per lifecycle: what each costs the machine, runc, the plugins and the kernel's work included, whatever its speed meanwhile (through a CRI socket, the in-process client's work too). *extra*: ms over the same round's floor (median):");
    println!();
    let peer_cpu_cols = match peer {
        Some(p) => format!(" {0} CPU ms/pod | {0} vs floor |", p.name),
        None => String::new(),
    };
    println!("| infra process | concurrency | floor CPU ms/pod | library CPU ms/pod | gRPC CPU ms/pod | library extra | gRPC extra | library vs floor | gRPC vs floor |{peer_cpu_cols}");
    println!("|---|---|---|---|---|---|---|---|---|{peer_dashes}");
    for a in all {
        let col = |who: usize| median(a.cpu.iter().map(|x| x[who]).collect());
        let extra = |who: usize| median(a.cpu.iter().map(|x| x[who] - x[0]).collect());
        let peer = peer_cells(&a.cpu);
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:+.1} | {:+.1} | {} | {} |{peer}",
            if a.infra { "yes" } else { "no" },
            a.conc,
            col(0),
            col(1),
            col(2),
            extra(1),
            extra(2),
            spread(ratios(&a.cpu, 1)),
            spread(ratios(&a.cpu, 2)),
        );
    }
}

fn main() {
    let mut pods = 60usize;
    let (mut only_infra, mut only_conc) = (None, None);
    let mut driver = sandboxd::config::CgroupDriver::Auto;
    let mut nri = "idle".to_string();
    let (mut peer_socket, mut peer_name, mut alternating_only) = (None, None, false);
    let mut dir: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--pods" => pods = args.next().and_then(|v| v.parse().ok()).expect("--pods N"),
            "--infra" => only_infra = Some(args.next().as_deref() == Some("yes")),
            "--conc" => only_conc = args.next().and_then(|v| v.parse::<usize>().ok()),
            "--driver" => {
                driver = match args.next().as_deref() {
                    Some("systemd") => sandboxd::config::CgroupDriver::Systemd,
                    Some("cgroupfs") => sandboxd::config::CgroupDriver::Cgroupfs,
                    _ => sandboxd::config::CgroupDriver::Auto,
                }
            }
            "--nri" => nri = args.next().expect("--nri off|idle|noop"),
            // A peer runtime's CRI socket, added to the alternating rounds.
            "--peer" => peer_socket = args.next().map(PathBuf::from),
            "--peer-name" => peer_name = args.next(),
            // Only the alternating rounds (scripts/bench-peers floor).
            "--alternating-only" => alternating_only = true,
            // Where the state roots go (default /tmp): to measure on another filesystem.
            "--dir" => dir = args.next().map(PathBuf::from),
            _ => {}
        }
    }
    if let Ok(filter) = std::env::var("SANDBOXD_BENCH_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .init();
    }
    let base = match &dir {
        Some(d) => d.join(format!("sandboxd-bench-{}", std::process::id())),
        None => PathBuf::from(format!("/tmp/sandboxd-bench-{}", std::process::id())),
    };
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
    cfg.cgroup_driver = driver;
    cfg.nri.enable = nri != "off";
    let socket = cfg.nri.socket_path.clone();
    let rt = std::sync::Arc::new(Runtime::new(cfg).expect("runtime"));
    rt.start_nri().expect("NRI");
    let _plugin = (nri == "noop").then(|| {
        let child = Command::new(env!("CARGO_BIN_EXE_sandboxd-nri-logger"))
            .args([
                "--socket",
                &socket.to_string_lossy(),
                "--name",
                "noop",
                "--idx",
                "90",
            ])
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start sandboxd-nri-logger");
        let deadline = Instant::now() + Duration::from_secs(10);
        while rt.nri_plugins().is_empty() {
            assert!(
                Instant::now() < deadline,
                "the no-op plugin did not register"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        KillOnDrop(child)
    });
    eprintln!("NRI: {nri}");
    let systemd = rt.cgroup_driver() == sandboxd::cgroups::Driver::Systemd;
    // Under the systemd driver kubelet names the slice by its whole path.
    let _ = POD_CGROUP_PARENT.set(if systemd {
        FLOOR_SLICE_PATH
    } else {
        CGROUP_PARENT
    });
    eprintln!("cgroup driver: {:?}", rt.cgroup_driver());

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
    let setup = |infra: bool| floor::Setup {
        list: &list,
        bin_dirs: &rt.config().cni_bin_dirs,
        infra_spec: infra.then_some(&infra_spec),
        work: &floor_dir,
        cgroup_parent: if systemd { FLOOR_SLICE } else { CGROUP_PARENT },
        systemd,
    };
    let mut floors = Vec::new();
    let peer = peer_socket.map(|socket| Peer {
        socket,
        name: peer_name.unwrap_or_else(|| "containerd".into()),
    });
    // The configurations of the alternating rounds: the floor's concurrencies.
    let alternated: Vec<(bool, usize)> = [false, true]
        .into_iter()
        .filter(|i| only_infra.is_none_or(|o| o == *i))
        .flat_map(|i| FLOOR_CONC.iter().map(move |c| (i, *c)))
        .filter(|(_, c)| only_conc.is_none_or(|o| o == *c))
        .collect();

    let (mut ours_at_floor_conc, mut breakdowns, mut totals) = (Vec::new(), Vec::new(), Vec::new());
    if !alternating_only {
        println!("| pods | infra process | concurrency | sandboxes/s | run p50/p90/p99 ms | status p50 ms | stop p50/p90/p99 ms | remove p50/p90/p99 ms | lifecycle ms (wall/pod) | child-process share | own code p50 ms (run/status/stop/remove) |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|");
        for infra in [false, true] {
            if only_infra.is_some_and(|o| o != infra) {
                continue;
            }
            for conc in [1usize, 4, 8, 16] {
                if only_conc.is_some_and(|c| c != conc) {
                    continue;
                }
                // The floor at concurrency 1 and 8, each run right before sandboxd's row.
                if FLOOR_CONC.contains(&conc) {
                    floors.push((infra, conc, floor::measure(&setup(infra), pods, conc)));
                }
                let (s, wall, share, steps) = run_config(&rt, pods, conc, infra);
                if FLOOR_CONC.contains(&conc) {
                    ours_at_floor_conc.push(wall);
                    totals.push((infra, conc, steps));
                }
                // Child time is a process-wide counter: per-phase own time is exact only when
                // one lifecycle runs at a time.
                let own = if conc == 1 {
                    breakdowns.push((infra, s.clone()));
                    s.iter()
                        .map(|p| format!("{:.2}", pct(&p.own, 50.0)))
                        .collect::<Vec<_>>()
                        .join("/")
                } else {
                    "—".to_string()
                };
                let [run, status, stop, remove] = &s;
                println!(
                "| {pods} | {} | {conc} | {:.1} | {:.1}/{:.1}/{:.1} | {:.2} | {:.1}/{:.1}/{:.1} | {:.1}/{:.1}/{:.1} | {:.1} | {:.0}% | {} |",
                if infra { "yes" } else { "no" },
                pods as f64 / wall.as_secs_f64(),
                pct(&run.wall, 50.0), pct(&run.wall, 90.0), pct(&run.wall, 99.0),
                pct(&status.wall, 50.0),
                pct(&stop.wall, 50.0), pct(&stop.wall, 90.0), pct(&stop.wall, 99.0),
                pct(&remove.wall, 50.0), pct(&remove.wall, 90.0), pct(&remove.wall, 99.0),
                wall.as_secs_f64() * 1000.0 / pods as f64,
                share * 100.0,
                own,
            );
            }
        }
    }
    if !breakdowns.is_empty() {
        println!();
        println!("Own time at concurrency 1, per phase (p50 of each column on its own, in ms): *own* = wall − child processes; *fsync* = waits for the record fsyncs in it; *namespaces* = waits for the namespace thread (unshare + bind mounts) not hidden behind the first fsync; *rest* = own − fsync − namespaces per sample; *CPU* = this process's CPU time (all threads, children excluded):");
        println!();
        println!("| infra process | phase | own | fsync | namespaces | rest | CPU |");
        println!("|---|---|---|---|---|---|---|");
        for (infra, phases) in &breakdowns {
            for (name, p) in ["run", "status", "stop", "remove"].iter().zip(phases) {
                let rest: Vec<Duration> = p
                    .own
                    .iter()
                    .zip(p.sync.iter().zip(&p.ns))
                    .map(|(o, (s, n))| o.saturating_sub(*s + *n))
                    .collect();
                println!(
                    "| {} | {name} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                    if *infra { "yes" } else { "no" },
                    pct(&p.own, 50.0),
                    pct(&p.sync, 50.0),
                    pct(&p.ns, 50.0),
                    pct(&rest, 50.0),
                    pct(&p.cpu, 50.0),
                );
            }
        }
    }
    // The CRI socket, and the alternating rounds (the floor reuses the warm pod's bundle).
    let grpc = (!alternated.is_empty()).then(|| Grpc::start(&rt, &base));
    let rounds: Vec<Alternated> = match &grpc {
        Some(g) => alternated
            .iter()
            .map(|&(infra, conc)| {
                alternate(&rt, g, peer.as_ref(), &setup(infra), pods, conc, infra)
            })
            .collect(),
        None => Vec::new(),
    };
    rt.remove_pod_sandbox(&id).unwrap();
    if !floors.is_empty() {
        println!();
        println!("Floor: the same lifecycles with only the unavoidable process calls (`ip netns add`, each CNI plugin executed directly, `runc create`+`start` and `kill`+`delete` of the same pause bundle, `ip netns del`), no sandboxd code, at concurrency 1 and 8, each run right before sandboxd's row of the same concurrency:");
        println!();
        println!("| pods | infra process | concurrency | floor run/stop/remove p50 ms | floor lifecycle ms (wall/pod) | sandboxd lifecycle ms (wall/pod) | sandboxd vs floor |");
        println!("|---|---|---|---|---|---|---|");
        for ((infra, conc, f), ours) in floors.iter().zip(&ours_at_floor_conc) {
            let (fl, us) = (
                f.wall.as_secs_f64() * 1000.0 / pods as f64,
                ours.as_secs_f64() * 1000.0 / pods as f64,
            );
            println!(
                "| {pods} | {} | {conc} | {:.1}/{:.1}/{:.1} | {fl:.1} | {us:.1} | {:+.0}% |",
                if *infra { "yes" } else { "no" },
                pct(&f.run, 50.0),
                pct(&f.stop, 50.0),
                pct(&f.remove, 50.0),
                (us / fl - 1.0) * 100.0,
            );
        }
    }
    // The same lifecycles through the CRI socket, at the floor's concurrencies, beside the
    // floor rows measured above.
    if let (Some(g), false) = (&grpc, floors.is_empty()) {
        println!();
        println!("Through the CRI socket (the daemon's gRPC server in this process on its own socket, a tonic client; run after the rows above), against the same floor rows:");
        println!();
        println!("| pods | infra process | concurrency | pods/s | run p50/p90 ms | status p50 ms | stop p50 ms | remove p50 ms | lifecycle ms (wall/pod) | floor lifecycle ms (wall/pod) | gRPC vs floor | gRPC vs library |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
        for ((infra, conc, f), lib) in floors.iter().zip(&ours_at_floor_conc) {
            let ([run, status, stop, remove], wall) = g.run_config(pods, *conc, *infra);
            let (fl, us, li) = (
                f.wall.as_secs_f64() * 1000.0 / pods as f64,
                wall.as_secs_f64() * 1000.0 / pods as f64,
                lib.as_secs_f64() * 1000.0 / pods as f64,
            );
            println!(
                "| {pods} | {} | {conc} | {:.1} | {:.1}/{:.1} | {:.2} | {:.1} | {:.1} | {us:.1} | {fl:.1} | {:+.0}% | {:+.0}% |",
                if *infra { "yes" } else { "no" },
                pods as f64 / wall.as_secs_f64(),
                pct(&run, 50.0),
                pct(&run, 90.0),
                pct(&status, 50.0),
                pct(&stop, 50.0),
                pct(&remove, 50.0),
                (us / fl - 1.0) * 100.0,
                (us / li - 1.0) * 100.0,
            );
        }
    }
    if !floors.is_empty() && !breakdowns.is_empty() {
        println!();
        println!("Per step at concurrency 1 (p50 ms, each column on its own, so the columns need not add up to the wall): the floor's process calls beside the host steps sandboxd ordered in the same phase. *netns*: the floor's `ip netns add`/`del`, sandboxd's wait for its pinning thread plus the pins' removal; *runtime …*: runc with its monitor (sandboxd) or bare (floor); *other host steps*: mounts, sysctls, cgroups, the CNI cache, `runtime state`; *rest*: the wall minus every step and fsync — sandboxd's own code. A phase ends when its last call returns, so sandboxd's stop includes removing the network namespace, which the floor leaves to remove:");
        println!();
        println!(
            "| infra process | phase | who | wall | {} | vs floor |",
            floor::COLUMNS.join(" | ")
        );
        println!("|{}", "---|".repeat(floor::COLUMNS.len() + 5));
        let c1 = floors.iter().filter(|(_, conc, _)| *conc == 1);
        for ((infra, _, f), (_, phases)) in c1.zip(&breakdowns) {
            let [run, _, stop, remove] = phases;
            step_rows(*infra, "run", (&f.run, &f.steps[0]), run);
            step_rows(*infra, "stop", (&f.stop, &f.steps[1]), stop);
            step_rows(*infra, "remove", (&f.remove, &f.steps[2]), remove);
        }
    }
    if !floors.is_empty() && !totals.is_empty() {
        println!();
        println!("Per step, all lifecycles together (mean ms per lifecycle: each step's wall time summed over the workers and divided by the pods, so at concurrency 8 it includes waiting for the CPU; *rest* is the workers' time in the verbs minus every step and fsync):");
        println!();
        println!(
            "| infra process | concurrency | who | {} |",
            floor::COLUMNS.join(" | ")
        );
        println!("|{}", "---|".repeat(floor::COLUMNS.len() + 3));
        for ((infra, conc, f), (_, _, ours)) in floors.iter().zip(&totals) {
            let floor_sum: floor::Steps =
                f.steps
                    .iter()
                    .flatten()
                    .fold(floor::Steps::default(), |mut acc, s| {
                        for (a, b) in acc.iter_mut().zip(s) {
                            *a += *b;
                        }
                        acc
                    });
            let row = |st: &floor::Steps| {
                st.iter()
                    .map(|d| match d.as_secs_f64() * 1000.0 / pods as f64 {
                        0.0 => "—".to_string(),
                        ms => format!("{ms:.2}"),
                    })
                    .collect::<Vec<_>>()
                    .join(" | ")
            };
            let infra = if *infra { "yes" } else { "no" };
            println!("| {infra} | {conc} | floor | {} |", row(&floor_sum));
            println!("| {infra} | {conc} | sandboxd | {} |", row(ours));
        }
    }
    if !rounds.is_empty() {
        print_alternated(&rounds, peer.as_ref());
    }
    if !alternating_only {
        println!();
        println!(
            "Idle RSS: monitor {monitor_rss} KiB, pause {pause_rss} KiB (VmRSS, one infra pod)."
        );
    }
    assert!(
        rt.list_pod_sandboxes(&SandboxFilter::default()).is_empty(),
        "bench leaked sandboxes"
    );
}
