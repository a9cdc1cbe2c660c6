//! The daemon under hostile load, measured (not a test): its peak RSS over its idle RSS and
//! the latency of `Version` while (a) 8 exec sessions stream 1 GiB each to clients that stop
//! reading, (b) 8 ExecSync calls each produce 1 GiB, (c) 2000 half-open connections sit on the
//! streaming port. Goals: each under +64 MiB over the idle daemon, Version p99 < 50 ms. Run it
//! with `scripts/bench-hostile`, which records the table in bench/RESULTS.md.
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

impl Sampler {
    fn start(d: &Daemon) -> Sampler {
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
                let ok = rt
                    .block_on(async {
                        tokio::time::timeout(
                            Duration::from_secs(5),
                            c.version(cri::VersionRequest::default()),
                        )
                        .await
                    })
                    .is_ok_and(|r| r.is_ok());
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

    rt.block_on(c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: sb }))
        .unwrap();
    println!("| attack | idle RSS MiB | peak RSS MiB | growth MiB | goal | Version p50 / p99 / max ms (samples) | p99 < 50 ms |");
    println!("|---|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    env.assert_no_leaks();
}
