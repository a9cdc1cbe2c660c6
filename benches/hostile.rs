//! The daemon under hostile load, measured (not a test): its peak RSS over its idle RSS and
//! the latency of a CRI call while (a) 8 exec sessions stream 1 GiB each to clients that stop
//! reading, (b) 8 ExecSync calls each produce 1 GiB, (c) 2000 half-open connections sit on the
//! streaming port, (d) 600 ExecSync calls with hour-long timeouts wait on one container, then
//! their callers go, (e) 150 pulls stall on a registry sending a byte every 5 s, then their
//! callers go. Goals: each under +64 MiB over the idle daemon, p99 < 50 ms (`Version`;
//! for (d) and (e) `ContainerStatus`, which runs on the blocking pool the attacks would
//! fill), and what the callers left stops within seconds. Run it with `scripts/bench-hostile`,
//! which records the table in bench/RESULTS.md.
//!
//! Usage: cargo bench --bench hostile

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::daemon::{client, Daemon};
use common::Env;
use sandboxd::api::v1 as cri;

const IMAGE: &str = "sandboxd.test/busybox:bench-hostile";

/// Samples the daemon's RSS and Version latency until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    rss_peak: Arc<Mutex<u64>>,
    lat_ms: Arc<Mutex<Vec<f64>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// What the sampler calls every 20 ms to see whether the CRI still answers.
#[derive(Clone)]
enum Probe {
    Version,
    /// ContainerStatus of this container: a call that runs on the daemon's blocking pool.
    Status(String),
}

impl Sampler {
    fn start(d: &Daemon) -> Sampler {
        Self::start_with(d, Probe::Version)
    }

    fn start_with(d: &Daemon, probe: Probe) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let rss_peak = Arc::new(Mutex::new(0u64));
        let lat_ms = Arc::new(Mutex::new(Vec::new()));
        let pid = d.pid();
        let (s, p) = (stop.clone(), rss_peak.clone());
        let rss = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let kib = std::fs::read_to_string(format!("/proc/{pid}/status"))
                    .unwrap_or_default()
                    .lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                    .unwrap_or(0);
                let mut m = p.lock().unwrap();
                *m = (*m).max(kib);
                drop(m);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let (s, l, socket) = (stop.clone(), lat_ms.clone(), d.socket.clone());
        let ver = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let mut c = rt.block_on(client(&socket));
            while !s.load(Ordering::Relaxed) {
                let t = Instant::now();
                let ok = rt.block_on(async {
                    let call = async {
                        match &probe {
                            Probe::Version => {
                                c.version(cri::VersionRequest::default()).await.is_ok()
                            }
                            Probe::Status(id) => c
                                .container_status(cri::ContainerStatusRequest {
                                    container_id: id.clone(),
                                    verbose: false,
                                })
                                .await
                                .is_ok(),
                        }
                    };
                    tokio::time::timeout(Duration::from_secs(5), call)
                        .await
                        .unwrap_or(false)
                });
                let ms = if ok {
                    t.elapsed().as_secs_f64() * 1000.0
                } else {
                    5000.0
                };
                l.lock().unwrap().push(ms);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Sampler {
            stop,
            rss_peak,
            lat_ms,
            threads: vec![rss, ver],
        }
    }

    /// (peak RSS KiB, Version p50, p99, max ms, samples)
    fn finish(self) -> (u64, f64, f64, f64, usize) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            if t.join().is_err() {
                eprintln!("a sampler thread panicked");
            }
        }
        let mut l = self.lat_ms.lock().unwrap().clone();
        l.sort_by(|a, b| a.total_cmp(b));
        let q = |p: f64| {
            l.get(((l.len() as f64 - 1.0) * p).round() as usize)
                .copied()
                .unwrap_or(0.0)
        };
        let peak = *self.rss_peak.lock().unwrap();
        (
            peak,
            q(0.5),
            q(0.99),
            l.last().copied().unwrap_or(0.0),
            l.len(),
        )
    }
}

fn main() {
    let env = Env::new("bench-hostile");
    sandboxd::server::raise_fd_limit();
    sandboxd::image::ImageStore::new(env.cfg.root.join("images"))
        .unwrap()
        .import(&common::busybox::oci_layout(&env.base, IMAGE), None)
        .unwrap();
    let d = Daemon::start(&env);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let mut c = rt.block_on(client(&d.socket));
    let pod = sandboxd::cri::crictl_json::pod_config(
        br#"{"metadata": {"name": "bench-hostile", "namespace": "b", "uid": "bench-hostile"}}"#,
    )
    .unwrap();
    let sb = rt
        .block_on(c.run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(pod.clone()),
            runtime_handler: String::new(),
        }))
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    let ctr = sandboxd::cri::crictl_json::container_config(
        format!(r#"{{"metadata": {{"name": "victim"}}, "image": {{"image": "{IMAGE}"}}, "command": ["sleep", "100000"]}}"#).as_bytes(),
    )
    .unwrap();
    let id = rt
        .block_on(c.create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sb.clone(),
            config: Some(ctr),
            sandbox_config: Some(pod),
        }))
        .unwrap()
        .into_inner()
        .container_id;
    rt.block_on(c.start_container(cri::StartContainerRequest {
        container_id: id.clone(),
    }))
    .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let idle = d.status_kib("VmRSS");
    let mut rows = Vec::new();
    let mut row = |what: &str, s: Sampler| {
        let (peak, p50, p99, max, n) = s.finish();
        let growth = peak.saturating_sub(idle) as f64 / 1024.0;
        rows.push(format!(
            "| {what} | {:.1} | {:.1} | **+{growth:.1}** | {} | {p50:.2} / **{p99:.2}** / {max:.1} ({n}) | {} |",
            idle as f64 / 1024.0,
            peak as f64 / 1024.0,
            if growth < 64.0 { "< +64 MiB" } else { "**over +64 MiB**" },
            if p99 < 50.0 { "met" } else { "**not met**" }
        ));
    };

    // (a) 8 exec sessions streaming 1 GiB each to clients that stop reading.
    let s = Sampler::start(&d);
    let mut clients = Vec::new();
    for _ in 0..8 {
        let url = rt
            .block_on(c.exec(cri::ExecRequest {
                container_id: id.clone(),
                cmd: vec![
                    "head".into(),
                    "-c".into(),
                    "1073741824".into(),
                    "/dev/zero".into(),
                ],
                tty: false,
                stdin: false,
                stdout: true,
                stderr: false,
                ..Default::default()
            }))
            .unwrap()
            .into_inner()
            .url;
        let mut cl = common::spdy::Client::connect(&url, &["v4.channel.k8s.io"]).unwrap();
        cl.open(&[("streamtype", "error")]);
        cl.open(&[("streamtype", "stdout")]);
        clients.push(cl);
    }
    std::thread::sleep(Duration::from_secs(10));
    row("8 exec sessions × 1 GiB, clients not reading (10 s)", s);
    drop(clients);
    std::thread::sleep(Duration::from_secs(2));

    // (b) 8 ExecSync calls producing 1 GiB each.
    let s = Sampler::start(&d);
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let mut cc = c.clone();
            let id = id.clone();
            rt.spawn(async move {
                cc.exec_sync(cri::ExecSyncRequest {
                    container_id: id,
                    cmd: vec![
                        "head".into(),
                        "-c".into(),
                        "1073741824".into(),
                        "/dev/zero".into(),
                    ],
                    timeout: 300,
                })
                .await
                .map(|r| r.into_inner().stdout.len())
            })
        })
        .collect();
    let mut kept = 0;
    for call in calls {
        let n = rt.block_on(call).unwrap().unwrap();
        assert!(n <= sandboxd::container::MAX_EXEC_OUTPUT);
        kept += n;
    }
    row(
        &format!(
            "8 ExecSync × 1 GiB output at once (each ≤ 16 MiB; ≤ 24 MiB kept at a time in all; {:.1} MiB returned)",
            kept as f64 / (1 << 20) as f64
        ),
        s,
    );

    // (c) 2000 half-open connections on the streaming port.
    let url = rt
        .block_on(c.exec(cri::ExecRequest {
            container_id: id.clone(),
            cmd: vec!["true".into()],
            tty: false,
            stdin: false,
            stdout: true,
            stderr: false,
            ..Default::default()
        }))
        .unwrap()
        .into_inner()
        .url;
    let addr = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let s = Sampler::start(&d);
    let mut conns = Vec::new();
    for _ in 0..2000 {
        if let Ok(mut t) = std::net::TcpStream::connect(&addr) {
            let _ = std::io::Write::write_all(&mut t, b"GET /exec/x HTTP/1.1\r\n");
            conns.push(t);
        }
    }
    std::thread::sleep(Duration::from_secs(5));
    row("2000 half-open streaming connections (5 s)", s);
    drop(conns);

    // (d) 600 ExecSync calls with hour-long timeouts on one container over one connection
    // (exec probes with long timeouts are ordinary pod specs), then their callers go away.
    let threads = |pid: u32| {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let sleeping = || {
        std::process::Command::new("pgrep")
            .args(["-fc", "^sleep 3601$"])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .trim()
                    .parse::<usize>()
                    .unwrap_or(0)
            })
            .unwrap_or(0)
    };
    // tokio lets idle blocking threads go after 10 s: start from a settled daemon.
    std::thread::sleep(Duration::from_secs(11));
    let threads_idle = threads(d.pid());
    let s = Sampler::start_with(&d, Probe::Status(id.clone()));
    let calls: Vec<_> = (0..600)
        .map(|_| {
            let mut cc = c.clone();
            let id = id.clone();
            rt.spawn(async move {
                cc.exec_sync(cri::ExecSyncRequest {
                    container_id: id,
                    cmd: vec!["sleep".into(), "3601".into()],
                    timeout: 3600,
                })
                .await
                .map_err(|e| e.code())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(10));
    let running = sleeping();
    let threads_peak = threads(d.pid());
    let refused = calls.iter().filter(|t| t.is_finished()).count();
    for t in &calls {
        t.abort();
    }
    let t0 = Instant::now();
    while sleeping() > 0 && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let gone_s = t0.elapsed().as_secs_f64();
    let left = sleeping();
    row(
        &format!(
            "600 ExecSync (sleep, timeout 1 h) on one container (10 s): {running} running, {refused} refused; daemon threads {threads_idle} → {threads_peak}; callers gone → commands gone in {gone_s:.2} s ({left} left); probe: ContainerStatus"
        ),
        s,
    );

    // (e) 150 pulls of distinct images from a loopback registry that sends each layer a byte
    // every 5 s, each with a 10 s client deadline; then the callers are gone.
    // Each image its own layer (distinct from the busybox the daemon holds), so no pull finds
    // its layer stored or shares another's download.
    let images: Vec<common::fake_registry::OneLayer> = (0..150)
        .map(|i| {
            let body = format!("stalled image {i}\n").repeat(64);
            let layer = common::busybox::layer_of(&[common::busybox::Entry::File(
                "stalled",
                body.as_bytes(),
            )]);
            let config = common::busybox::config(&layer, &["sh"]);
            common::fake_registry::OneLayer::new(
                config,
                layer,
                "application/vnd.oci.image.layer.v1.tar",
            )
        })
        .collect();
    let stall = common::fake_registry::FakeRegistry::start(move |path| {
        // /v2/stall/img<i>/...
        let i: usize = path
            .strip_prefix("/v2/stall/img")?
            .split('/')
            .next()?
            .parse()
            .ok()?;
        images
            .get(i)?
            .answer(path, Some((1, Duration::from_secs(5))))
    });
    std::thread::sleep(Duration::from_secs(11));
    let threads_before = threads(d.pid());
    let s = Sampler::start_with(&d, Probe::Status(id.clone()));
    let pulls: Vec<_> = (0..150)
        .map(|i| {
            let image = format!("{}/stall/img{i}:1", stall.addr);
            let socket = d.socket.clone();
            rt.spawn(async move {
                let chan =
                    common::daemon::connect(&socket.to_string_lossy(), Duration::from_secs(5))
                        .await
                        .unwrap();
                let mut images = cri::image_service_client::ImageServiceClient::new(chan);
                let mut req = tonic::Request::new(cri::PullImageRequest {
                    image: Some(cri::ImageSpec {
                        image,
                        ..Default::default()
                    }),
                    ..Default::default()
                });
                req.set_timeout(Duration::from_secs(10));
                images.pull_image(req).await.map_err(|e| e.code())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(8));
    let threads_pulling = threads(d.pid());
    let mut answers = std::collections::BTreeMap::<String, usize>::new();
    for p in pulls {
        let a = match rt.block_on(p).unwrap() {
            Ok(_) => "OK".to_string(),
            Err(code) => format!("{code:?}"),
        };
        *answers.entry(a).or_default() += 1;
    }
    let answers: Vec<String> = answers.iter().map(|(a, n)| format!("{n} {a}")).collect();
    let answers = answers.join(", ");
    // The daemon's connections to the registry: one per pull still downloading.
    let port = stall.addr.rsplit(':').next().unwrap().to_string();
    let downloading = || {
        std::process::Command::new("ss")
            .args([
                "-Htn",
                "state",
                "established",
                "dport",
                "=",
                &format!(":{port}"),
            ])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).lines().count())
            .unwrap_or(0)
    };
    let t0 = Instant::now();
    while downloading() > 0 && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let settle_s = t0.elapsed().as_secs_f64();
    let left = downloading();
    let threads_after = threads(d.pid());
    row(
        &format!(
            "150 pulls from a registry sending a byte every 5 s, 10 s deadline each: {answers} at the deadline; callers gone → downloads gone in {settle_s:.2} s ({left} left); daemon threads {threads_before} → {threads_pulling} while pulling, {threads_after} after (idle: the probe's calls keep tokio's pool warm); probe: ContainerStatus"
        ),
        s,
    );

    rt.block_on(c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: sb }))
        .unwrap();
    println!("| attack | idle RSS MiB | peak RSS MiB | growth MiB | goal | Version p50 / p99 / max ms (samples) | p99 < 50 ms |");
    println!("|---|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    env.assert_no_leaks();
}
