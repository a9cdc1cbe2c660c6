//! The CRI lifecycle benchmark: N pods, concurrency C, per-RPC percentiles, pods/s, and a
//! leak audit of what the host shows afterwards.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sandboxd::api::v1 as cri;
use tonic::transport::Channel;

use crate::cli::Output;
use crate::{grpc_err, runtime_client, Runtime};

#[derive(Default)]
struct Lat {
    run: Vec<f64>,
    status: Vec<f64>,
    stop: Vec<f64>,
    remove: Vec<f64>,
    create_c: Vec<f64>,
    start_c: Vec<f64>,
    stop_c: Vec<f64>,
    remove_c: Vec<f64>,
}

/// What one benchmark run does.
#[derive(Clone)]
pub struct Params {
    pub pods: usize,
    pub conc: usize,
    pub share_pid: bool,
    pub runtime: String,
    /// Containers per pod (0 = pods only).
    pub containers: usize,
    pub image: String,
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((p / 100.0) * (v.len() - 1) as f64).round() as usize]
}

fn netns_count(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

fn shm_mounts() -> usize {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            let mp = l.split(' ').nth(4).unwrap_or("");
            mp.ends_with("/shm") && l.contains(" - tmpfs ") && !mp.starts_with("/dev/")
        })
        .count()
}

pub async fn run(
    ch: Channel,
    p: Params,
    netns_dir: &Path,
    label: &str,
    output: Output,
) -> Result<(), String> {
    let (pods, conc, share_pid, k) = (p.pods, p.conc, p.share_pid, p.containers);
    let run_id = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
            & 0xffff_ffff
    );
    let (ns_before, shm_before) = (netns_count(netns_dir), shm_mounts());
    let lat = Arc::new(Mutex::new(Lat::default()));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..conc {
        let (ch, lat, errors, next, run_id, p) = (
            ch.clone(),
            lat.clone(),
            errors.clone(),
            next.clone(),
            run_id.clone(),
            p.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut c = runtime_client(&ch);
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= pods {
                    return;
                }
                if let Err(e) = one(&mut c, &run_id, i, &p, &lat).await {
                    errors.lock().unwrap().push(e);
                }
            }
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())?;
    }
    let wall = t0.elapsed().as_secs_f64();
    let mut c = runtime_client(&ch);
    let mut sel = HashMap::new();
    sel.insert("sandboxctl-bench".to_string(), run_id.clone());
    let left_pods = c
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter {
                label_selector: sel.clone(),
                ..Default::default()
            }),
        })
        .await
        .map_err(|s| grpc_err("ListPodSandbox", s))?
        .into_inner()
        .items
        .len();
    let left_containers = c
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                label_selector: sel,
                ..Default::default()
            }),
        })
        .await
        .map_err(|s| grpc_err("ListContainers", s))?
        .into_inner()
        .containers
        .len();
    let left = left_pods + left_containers;
    // Give asynchronous teardown (another runtime's netns cleanup) a moment before the audit.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (ns_after, shm_after) = (netns_count(netns_dir), shm_mounts());
    let errors = errors.lock().unwrap().clone();
    let l = std::mem::take(&mut *lat.lock().unwrap());
    let mut rows = Vec::new();
    let mut phases = vec![
        ("RunPodSandbox", l.run),
        ("PodSandboxStatus", l.status),
        ("StopPodSandbox", l.stop),
        ("RemovePodSandbox", l.remove),
    ];
    if k > 0 {
        phases.extend([
            ("CreateContainer", l.create_c),
            ("StartContainer", l.start_c),
            ("StopContainer", l.stop_c),
            ("RemoveContainer", l.remove_c),
        ]);
    }
    for (name, mut v) in phases {
        let v = &mut v;
        rows.push(serde_json::json!({
            "rpc": name, "count": v.len(),
            "p50_ms": pct(v, 50.0), "p90_ms": pct(v, 90.0), "p99_ms": pct(v, 99.0), "max_ms": pct(v, 100.0),
        }));
    }
    let ok = pods - errors.len();
    let report = serde_json::json!({
        "label": label, "pods": pods, "completed": ok, "concurrency": conc, "share_pid": share_pid,
        "runtime_handler": p.runtime, "containers_per_pod": k, "image": p.image, "wall_s": wall, "pods_per_s": ok as f64 / wall,
        "rpcs": rows, "errors": errors.iter().take(5).collect::<Vec<_>>(), "error_count": errors.len(),
        "leaks": { "sandboxes_listed": left_pods, "containers_listed": left_containers, "netns_files": ns_after as i64 - ns_before as i64, "shm_mounts": shm_after as i64 - shm_before as i64 },
    });
    if output == Output::Json {
        println!("{}", serde_json::to_string(&report).unwrap());
    } else if output == Output::Markdown {
        let cell = |r: &serde_json::Value| {
            format!(
                "{:.1}/{:.1}/{:.1}/{:.1}",
                r["p50_ms"].as_f64().unwrap(),
                r["p90_ms"].as_f64().unwrap(),
                r["p99_ms"].as_f64().unwrap(),
                r["max_ms"].as_f64().unwrap()
            )
        };
        if k > 0 {
            // Containers row: Run, the four container RPCs, Stop, Remove.
            println!(
                "| {label} | {} | {conc} | {pods} | {k} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {left}/{:+}/{:+} |",
                if share_pid { "shared PID (infra)" } else { "default" },
                ok as f64 / wall,
                cell(&rows[0]),
                cell(&rows[4]),
                cell(&rows[5]),
                cell(&rows[6]),
                cell(&rows[7]),
                cell(&rows[2]),
                cell(&rows[3]),
                ns_after as i64 - ns_before as i64,
                shm_after as i64 - shm_before as i64,
            );
        } else {
            println!(
                "| {label} | {} | {conc} | {pods} | {:.1} | {} | {} | {} | {} | {left}/{:+}/{:+} |",
                if share_pid {
                    "shared PID (infra)"
                } else {
                    "default"
                },
                ok as f64 / wall,
                cell(&rows[0]),
                cell(&rows[1]),
                cell(&rows[2]),
                cell(&rows[3]),
                ns_after as i64 - ns_before as i64,
                shm_after as i64 - shm_before as i64,
            );
        }
    } else {
        println!("{label} pods={pods} concurrency={conc} share_pid={share_pid}: {:.1} pods/s ({ok} completed, {} errors) in {wall:.2}s", ok as f64 / wall, errors.len());
        println!(
            "{:<18} {:>8} {:>8} {:>8} {:>8}",
            "RPC", "p50 ms", "p90 ms", "p99 ms", "max ms"
        );
        for r in &rows {
            println!(
                "{:<18} {:>8.1} {:>8.1} {:>8.1} {:>8.1}",
                r["rpc"].as_str().unwrap(),
                r["p50_ms"].as_f64().unwrap(),
                r["p90_ms"].as_f64().unwrap(),
                r["p99_ms"].as_f64().unwrap(),
                r["max_ms"].as_f64().unwrap()
            );
        }
        println!(
            "leaks: {left_pods} sandboxes and {left_containers} containers listed, {:+} netns files, {:+} shm mounts",
            ns_after as i64 - ns_before as i64,
            shm_after as i64 - shm_before as i64
        );
        for e in errors.iter().take(5) {
            println!("error: {e}");
        }
    }
    if left > 0 || !errors.is_empty() {
        return Err(format!(
            "{} errors, {left_pods} sandboxes and {left_containers} containers left",
            errors.len()
        ));
    }
    Ok(())
}

async fn one(
    c: &mut Runtime,
    run_id: &str,
    i: usize,
    p: &Params,
    lat: &Mutex<Lat>,
) -> Result<(), String> {
    let (share_pid, runtime) = (p.share_pid, p.runtime.as_str());
    let mut labels = HashMap::new();
    labels.insert("sandboxctl-bench".to_string(), run_id.to_string());
    let mode = if share_pid {
        cri::NamespaceMode::Pod
    } else {
        cri::NamespaceMode::Container
    } as i32;
    let config = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: format!("bench-{run_id}-{i}"),
            namespace: "bench".into(),
            uid: format!("{run_id}-{i}"),
            attempt: 0,
        }),
        hostname: format!("bench-{i}"),
        log_directory: String::new(),
        labels,
        linux: Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    network: cri::NamespaceMode::Pod as i32,
                    pid: mode,
                    ipc: cri::NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let t = Instant::now();
    let id = c
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: runtime.into(),
        })
        .await
        .map_err(|s| grpc_err("RunPodSandbox", s))?
        .into_inner()
        .pod_sandbox_id;
    let run = t.elapsed().as_secs_f64() * 1000.0;
    let t = Instant::now();
    c.pod_sandbox_status(cri::PodSandboxStatusRequest {
        pod_sandbox_id: id.clone(),
        verbose: false,
    })
    .await
    .map_err(|s| grpc_err("PodSandboxStatus", s))?;
    let status = t.elapsed().as_secs_f64() * 1000.0;
    let mut ctr_lat = Lat::default();
    let mut ids = Vec::new();
    for j in 0..p.containers {
        let mut labels = HashMap::new();
        labels.insert("sandboxctl-bench".to_string(), run_id.to_string());
        let cc = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: format!("c{j}"),
                attempt: 0,
            }),
            image: Some(cri::ImageSpec {
                image: p.image.clone(),
                ..Default::default()
            }),
            command: vec!["sleep".into(), "3600".into()],
            labels,
            ..Default::default()
        };
        let t = Instant::now();
        let cid = c
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: id.clone(),
                config: Some(cc),
                sandbox_config: Some(config.clone()),
            })
            .await
            .map_err(|s| grpc_err("CreateContainer", s))?
            .into_inner()
            .container_id;
        ctr_lat.create_c.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        c.start_container(cri::StartContainerRequest {
            container_id: cid.clone(),
        })
        .await
        .map_err(|s| grpc_err("StartContainer", s))?;
        ctr_lat.start_c.push(t.elapsed().as_secs_f64() * 1000.0);
        ids.push(cid);
    }
    for cid in ids {
        let t = Instant::now();
        c.stop_container(cri::StopContainerRequest {
            container_id: cid.clone(),
            timeout: 0,
        })
        .await
        .map_err(|s| grpc_err("StopContainer", s))?;
        ctr_lat.stop_c.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        c.remove_container(cri::RemoveContainerRequest { container_id: cid })
            .await
            .map_err(|s| grpc_err("RemoveContainer", s))?;
        ctr_lat.remove_c.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let t = Instant::now();
    c.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: id.clone(),
    })
    .await
    .map_err(|s| grpc_err("StopPodSandbox", s))?;
    let stop = t.elapsed().as_secs_f64() * 1000.0;
    let t = Instant::now();
    c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id })
        .await
        .map_err(|s| grpc_err("RemovePodSandbox", s))?;
    let remove = t.elapsed().as_secs_f64() * 1000.0;
    let mut l = lat.lock().unwrap();
    l.run.push(run);
    l.status.push(status);
    l.stop.push(stop);
    l.remove.push(remove);
    l.create_c.extend(ctr_lat.create_c);
    l.start_c.extend(ctr_lat.start_c);
    l.stop_c.extend(ctr_lat.stop_c);
    l.remove_c.extend(ctr_lat.remove_c);
    Ok(())
}
