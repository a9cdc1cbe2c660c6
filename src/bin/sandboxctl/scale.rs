//! The node-scale benchmark (`sandboxctl scale up|down`): pods with one container each
//! brought up C at a time, and at each of several pod counts the latency of what kubelet asks
//! all the time (ListPodSandbox, ListContainers, PodSandboxStatus, ListContainerStats) and
//! what every pod costs in memory (the daemon's growth plus the per-pod processes: RSS, PSS,
//! USS from `/proc/PID/smaps_rollup`); then the teardown rate. Markdown rows for
//! `scripts/bench-peers scale`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use sandboxd::api::v1 as cri;
use tonic::transport::Channel;

use crate::{grpc_err, runtime_client, Runtime};

/// The label every pod of a run carries (its value: the run's name).
const LABEL: &str = "sandboxctl-scale";

/// What `scale up` does: bring up N pods with one container each, C at a time; at each
/// point print a markdown row: bring-up rate, RPC latencies, memory per pod.
#[derive(clap::Args, Debug)]
pub struct Up {
    #[arg(long, short = 'n', default_value_t = 100)]
    pub pods: usize,
    #[arg(long, short = 'c', default_value_t = 8)]
    pub concurrency: usize,
    /// Pod counts at which to measure (comma-separated; N is always one).
    #[arg(long, value_delimiter = ',', default_value = "10,100,250,500")]
    pub points: Vec<usize>,
    /// Calls timed per RPC at each point (half for ListContainerStats).
    #[arg(long, default_value_t = 50)]
    pub samples: usize,
    #[arg(long, default_value = "localhost/sandboxd-bench/busybox:latest")]
    pub image: String,
    /// Runtime handler.
    #[arg(long, default_value = "")]
    pub runtime: String,
    /// The run's name: its pods carry it as a label (scale down removes them by it).
    #[arg(long)]
    pub run: String,
    /// A label for the rows (e.g. the runtime's name).
    #[arg(long, default_value = "")]
    pub label: String,
    /// The daemon's pid, for its memory.
    #[arg(long)]
    pub daemon_pid: Option<u32>,
    /// Command names of the per-pod processes to count (e.g. sandboxd-monitor).
    #[arg(long, value_delimiter = ',')]
    pub procs: Vec<String>,
}

/// Memory of a set of processes, KiB.
#[derive(Clone, Copy, Default)]
struct Mem {
    rss: u64,
    pss: u64,
    uss: u64,
}

impl std::ops::AddAssign for Mem {
    fn add_assign(&mut self, o: Mem) {
        self.rss += o.rss;
        self.pss += o.pss;
        self.uss += o.uss;
    }
}

fn smaps(pid: u32) -> Mem {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Mem {
        rss: field("Rss:"),
        pss: field("Pss:"),
        uss: field("Private_Clean:") + field("Private_Dirty:"),
    }
}

/// (the daemon's memory, the per-pod processes' memory, the USS of one per-pod process in
/// KiB: the median of each command name's processes, averaged over the names).
fn memory(daemon: Option<u32>, procs: &[String]) -> (Mem, Mem, f64) {
    let d = daemon.map(smaps).unwrap_or_default();
    let mut p = Mem::default();
    let mut uss: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        // The kernel keeps 15 bytes of a command name.
        if procs.iter().any(|n| comm.trim() == &n[..n.len().min(15)]) {
            let m = smaps(pid);
            if m.rss == 0 {
                continue; // exited, not yet reaped: no memory to speak of
            }
            uss.entry(comm.trim().to_string())
                .or_default()
                .push(m.uss as f64);
            p += m;
        }
    }
    let medians: Vec<f64> = uss.values_mut().map(|v| pct(v, 50.0)).collect();
    let one = medians.iter().sum::<f64>() / medians.len().max(1) as f64;
    (d, p, one)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((p / 100.0) * (v.len() - 1) as f64).round() as usize]
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

fn labels(run: &str) -> HashMap<String, String> {
    HashMap::from([(LABEL.to_string(), run.to_string())])
}

/// The ids of the pods of `run`.
async fn pods_of(ch: &Channel, run: &str) -> Result<Vec<String>, String> {
    Ok(runtime_client(ch)
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter {
                label_selector: labels(run),
                ..Default::default()
            }),
        })
        .await
        .map_err(|s| grpc_err("ListPodSandbox", s))?
        .into_inner()
        .items
        .into_iter()
        .map(|p| p.id)
        .collect())
}

/// One pod with one `sleep` container, started; its (run, create, start) latencies.
async fn one(c: &mut Runtime, u: &Up, i: usize) -> Result<(f64, f64, f64), String> {
    let config = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: format!("scale-{}-{i}", u.run),
            namespace: "scale".into(),
            uid: format!("{}-{i}", u.run),
            attempt: 0,
        }),
        labels: labels(&u.run),
        linux: Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    pid: cri::NamespaceMode::Container as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let t = Instant::now();
    let pod = c
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: u.runtime.clone(),
        })
        .await
        .map_err(|s| grpc_err("RunPodSandbox", s))?
        .into_inner()
        .pod_sandbox_id;
    let run = ms(t);
    let t = Instant::now();
    let id = c
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: pod,
            config: Some(cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: "c".into(),
                    attempt: 0,
                }),
                image: Some(cri::ImageSpec {
                    image: u.image.clone(),
                    ..Default::default()
                }),
                command: vec!["sleep".into(), "36000".into()],
                labels: labels(&u.run),
                ..Default::default()
            }),
            sandbox_config: Some(config),
        })
        .await
        .map_err(|s| grpc_err("CreateContainer", s))?
        .into_inner()
        .container_id;
    let create = ms(t);
    let t = Instant::now();
    c.start_container(cri::StartContainerRequest { container_id: id })
        .await
        .map_err(|s| grpc_err("StartContainer", s))?;
    Ok((run, create, ms(t)))
}

/// Runs `f(i)` for `from..to` with `conc` workers; every error is kept.
async fn parallel<F, Fut, T>(
    ch: &Channel,
    from: usize,
    to: usize,
    conc: usize,
    f: F,
) -> (Vec<T>, Vec<String>)
where
    F: Fn(Runtime, usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<T, String>> + Send,
    T: Send + 'static,
{
    let next = Arc::new(AtomicUsize::new(from));
    let out = Arc::new(Mutex::new((Vec::new(), Vec::new())));
    let f = Arc::new(f);
    let mut tasks = Vec::new();
    for _ in 0..conc.max(1) {
        let (ch, next, out, f) = (ch.clone(), next.clone(), out.clone(), f.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= to {
                    return;
                }
                let r = f(runtime_client(&ch), i).await;
                let mut o = out.lock().unwrap();
                match r {
                    Ok(v) => o.0.push(v),
                    Err(e) => o.1.push(e),
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let mut o = out.lock().unwrap();
    (std::mem::take(&mut o.0), std::mem::take(&mut o.1))
}

/// `samples` timings of the RPC `rpc` that `f` makes (with a client of its own and the sample's
/// number), as `p50/p99` ms.
async fn timed<F, Fut, T>(
    samples: usize,
    c: &Runtime,
    rpc: &str,
    mut f: F,
) -> Result<String, String>
where
    F: FnMut(Runtime, usize) -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let mut v = Vec::with_capacity(samples);
    for i in 0..samples {
        let t = Instant::now();
        f(c.clone(), i).await.map_err(|s| grpc_err(rpc, s))?;
        v.push(ms(t));
    }
    Ok(format!("{:.1}/{:.1}", pct(&mut v, 50.0), pct(&mut v, 99.0)))
}

/// p50/p99 ms of ListPodSandbox, ListContainers, PodSandboxStatus (of `run`'s pods) and
/// ListContainerStats, `samples` calls each (half for ListContainerStats).
async fn lists(
    ch: &Channel,
    run: &str,
    samples: usize,
) -> Result<(String, String, String, String), String> {
    let c = runtime_client(ch);
    let ids = pods_of(ch, run).await?;
    let pods = timed(samples, &c, "ListPodSandbox", |mut c, _| async move {
        c.list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
            .await
    })
    .await?;
    let ps = timed(samples, &c, "ListContainers", |mut c, _| async move {
        c.list_containers(cri::ListContainersRequest { filter: None })
            .await
    })
    .await?;
    let status = timed(samples, &c, "PodSandboxStatus", |mut c, i| {
        let id = ids[(i * 7919) % ids.len()].clone();
        async move {
            c.pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: id,
                verbose: false,
            })
            .await
        }
    })
    .await?;
    let stats = timed(
        samples.div_ceil(2),
        &c,
        "ListContainerStats",
        |mut c, _| async move {
            c.list_container_stats(cri::ListContainerStatsRequest { filter: None })
                .await
        },
    )
    .await?;
    Ok((pods, ps, status, stats))
}

/// `scale lists`: the list and stats latencies of the node as it is, one line
/// (`ListPodSandbox ListContainers PodSandboxStatus ListContainerStats`, p50/p99 ms each).
pub async fn lists_now(ch: Channel, run: &str, samples: usize) -> Result<(), String> {
    let (pods, ps, status, stats) = lists(&ch, run, samples.max(1)).await?;
    println!("{pods} {ps} {status} {stats}");
    Ok(())
}

/// `scale up`: one markdown row per point.
pub async fn up(ch: Channel, u: Up) -> Result<(), String> {
    let u = Arc::new(u);
    let (d0, p0, _) = memory(u.daemon_pid, &u.procs);
    let mut points = u.points.clone();
    points.retain(|p| *p > 0 && *p < u.pods);
    points.push(u.pods);
    let mut done = 0;
    for point in points {
        let t = Instant::now();
        let uu = u.clone();
        let (lat, errors) = parallel(&ch, done, point, u.concurrency, move |mut c, i| {
            let uu = uu.clone();
            async move { one(&mut c, &uu, i).await }
        })
        .await;
        let rate = (point - done) as f64 / t.elapsed().as_secs_f64();
        if let Some(e) = errors.first() {
            return Err(format!(
                "{} pods failed to come up; first: {e}",
                errors.len()
            ));
        }
        done = point;
        let (mut run, mut create, mut start): (Vec<f64>, Vec<f64>, Vec<f64>) = (
            lat.iter().map(|l| l.0).collect(),
            lat.iter().map(|l| l.1).collect(),
            lat.iter().map(|l| l.2).collect(),
        );
        let (pods, ps, status, stats) = lists(&ch, &u.run, u.samples).await?;
        let (d, p, one_uss) = memory(u.daemon_pid, &u.procs);
        let per_pod = |a: u64, b: u64| (a.saturating_sub(b)) as f64 / 1024.0 / point as f64;
        println!(
            "| {} | {point} | {rate:.1} | {:.0}/{:.0}/{:.0} | {pods} | {ps} | {status} | {stats} | {:.2} ({:.2}) | {:.0} |",
            u.label,
            pct(&mut run, 50.0),
            pct(&mut create, 50.0),
            pct(&mut start, 50.0),
            per_pod(d.rss + p.rss, d0.rss + p0.rss),
            per_pod(d.pss + p.pss, d0.pss + p0.pss),
            one_uss,
        );
    }
    Ok(())
}

/// `scale down`: stops and removes every pod of `run`, `concurrency` at a time; prints the
/// rate.
pub async fn down(ch: Channel, run: &str, concurrency: usize, label: &str) -> Result<(), String> {
    let ids = pods_of(&ch, run).await?;
    let n = ids.len();
    let ids = Arc::new(ids);
    let t = Instant::now();
    let (_, errors) = parallel(&ch, 0, n, concurrency, move |mut c, i| {
        let id = ids[i].clone();
        async move {
            c.stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await
            .map_err(|s| grpc_err("StopPodSandbox", s))?;
            c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id })
                .await
                .map(drop)
                .map_err(|s| grpc_err("RemovePodSandbox", s))
        }
    })
    .await;
    let wall = t.elapsed().as_secs_f64();
    if let Some(e) = errors.first() {
        return Err(format!("{} pods failed to go; first: {e}", errors.len()));
    }
    println!("{label} {n} {:.1} {wall:.1}", n as f64 / wall);
    Ok(())
}
