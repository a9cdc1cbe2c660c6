//! A storm of pod starts with the daemon SIGKILLed at random moments and restarted on the same
//! root, as a node's bad day would have it; then the truth is checked: no pod a client got an
//! id for is lost, every container's reported state matches the runtime's, every name can be
//! run again (the same id back for a ready pod). Shared by a test (small) and the chaos
//! benchmark (benches/chaos.rs).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sandboxd::api::v1 as cri;
use sandboxd::api::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

use super::daemon::Daemon;
use super::Env;

/// What one round found.
#[derive(Debug, Default)]
pub struct Report {
    pub pods: usize,
    pub kills: usize,
    /// Ids a client was given that are gone.
    pub lost: Vec<String>,
    /// Containers whose reported state differs from the runtime's.
    pub mismatched: Vec<String>,
    /// Names that cannot be run again.
    pub stuck: Vec<String>,
    /// Kill → socket answering and all pods listed, per restart.
    pub restart_ms: Vec<f64>,
    /// Pods and containers left after the teardown through the daemon.
    pub left: usize,
    /// What the daemon's self-audit found after the storm, before the teardown (`kind owner
    /// path`): host objects no record owns.
    pub orphans: Vec<String>,
    /// How long that audit took in the daemon, in ms (with every pod of the round up).
    pub audit_ms: f64,
    pub seconds: f64,
}

fn pod_config(i: usize, round: usize) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: format!("chaos-{round}-{i}"),
            namespace: "chaos".into(),
            uid: format!("chaos-{round}-{i}"),
            attempt: 0,
        }),
        ..Default::default()
    }
}

async fn connect(socket: &std::path::Path) -> Option<RuntimeServiceClient<Channel>> {
    super::daemon::connect(&socket.to_string_lossy(), Duration::from_secs(5))
        .await
        .ok()
        .map(RuntimeServiceClient::new)
}

/// The daemon's self-audit, as `kind owner path` lines.
async fn audit_orphans(socket: &std::path::Path) -> (Vec<String>, f64) {
    let ch = super::daemon::connect(&socket.to_string_lossy(), Duration::from_secs(5))
        .await
        .expect("daemon answers");
    let r = sandboxd::api::admin::admin_client::AdminClient::new(ch)
        .audit(sandboxd::api::admin::AuditRequest {
            fix: false,
            grace_seconds: 0,
        })
        .await
        .expect("Audit answers")
        .into_inner();
    let orphans = r
        .orphans
        .into_iter()
        .map(|o| format!("{} {} {}", o.kind, o.owner, o.path))
        .collect();
    (orphans, r.took_micros as f64 / 1000.0)
}

/// Retries `f` (with a fresh connection after any failure) until it succeeds; `Err` only for
/// answers that retrying cannot change.
async fn retry<T, F, Fut>(socket: &std::path::Path, mut f: F) -> Result<T, tonic::Status>
where
    F: FnMut(RuntimeServiceClient<Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(c) = connect(socket).await {
            match f(c).await {
                Ok(v) => return Ok(v),
                Err(s)
                    if matches!(
                        s.code(),
                        tonic::Code::AlreadyExists | tonic::Code::FailedPrecondition
                    ) =>
                {
                    return Err(s)
                }
                Err(s) if Instant::now() > deadline => return Err(s),
                Err(_) => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One round: `pods` pods (each with a running busybox container of `image`) started by
/// `clients` clients while the daemon is SIGKILLed `kills` times.
pub fn round(
    env: &Env,
    pods: usize,
    clients: usize,
    kills: usize,
    round: usize,
    image: &str,
) -> Report {
    let started = Instant::now();
    let daemon = Arc::new(Mutex::new(Some(Daemon::start(env))));
    let socket = daemon.lock().unwrap().as_ref().unwrap().socket.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let acked: Arc<Mutex<HashMap<String, Vec<String>>>> = Arc::default();
    let done = Arc::new(AtomicUsize::new(0));
    let stop_killing = Arc::new(AtomicBool::new(false));
    // The killer: SIGKILL at pseudo-random moments while the storm runs, restart at once.
    let killer = {
        let (daemon, base, cfg, done, stop) = (
            daemon.clone(),
            env.base.clone(),
            env.cfg.clone(),
            done.clone(),
            stop_killing.clone(),
        );
        std::thread::spawn(move || {
            let mut seed = 0x9e37_79b9u64.wrapping_mul(round as u64 + 1);
            let mut restarts = Vec::new();
            for _ in 0..kills {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let wait = Duration::from_millis(300 + (seed >> 33) % 1500);
                let t = Instant::now();
                while t.elapsed() < wait && !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                if stop.load(Ordering::SeqCst) && done.load(Ordering::SeqCst) >= pods {
                    break;
                }
                if let Some(mut d) = daemon.lock().unwrap().take() {
                    d.kill9();
                }
                let t = Instant::now();
                let d = Daemon::start_at(&base, &cfg);
                restarts.push(t.elapsed().as_secs_f64() * 1000.0);
                *daemon.lock().unwrap() = Some(d);
            }
            restarts
        })
    };
    rt.block_on(async {
        let mut tasks = Vec::new();
        for k in 0..clients {
            let (socket, acked, done) = (socket.clone(), acked.clone(), done.clone());
            let image = image.to_string();
            tasks.push(tokio::spawn(async move {
                for i in (k..pods).step_by(clients) {
                    let cfg = pod_config(i, round);
                    let name = cfg.metadata.as_ref().unwrap().name.clone();
                    let id = retry(&socket, |mut c| {
                        let cfg = cfg.clone();
                        async move {
                            c.run_pod_sandbox(cri::RunPodSandboxRequest {
                                config: Some(cfg),
                                runtime_handler: String::new(),
                            })
                            .await
                            .map(|r| r.into_inner().pod_sandbox_id)
                        }
                    })
                    .await
                    .unwrap_or_else(|s| panic!("run {name}: {s}"));
                    acked.lock().unwrap().entry(name.clone()).or_default().push(id.clone());
                    let ctr = sandboxd::cri::crictl_json::container_config(
                        format!(r#"{{"metadata": {{"name": "c"}}, "image": {{"image": "{image}"}}, "command": ["sleep", "100000"]}}"#).as_bytes(),
                    )
                    .unwrap();
                    // As kubelet does: create (or find the one a lost answer made), start;
                    // a container left in another state is removed and made again.
                    loop {
                        let created = retry(&socket, |mut c| {
                            let (ctr, cfg, id) = (ctr.clone(), cfg.clone(), id.clone());
                            async move {
                                c.create_container(cri::CreateContainerRequest {
                                    pod_sandbox_id: id,
                                    config: Some(ctr),
                                    sandbox_config: Some(cfg),
                                })
                                .await
                                .map(|r| r.into_inner().container_id)
                            }
                        })
                        .await;
                        let (cid, state) = match created {
                            Ok(cid) => (cid, cri::ContainerState::ContainerCreated as i32),
                            Err(_) => retry(&socket, |mut c| {
                                let id = id.clone();
                                async move {
                                    let l = c
                                        .list_containers(cri::ListContainersRequest {
                                            filter: Some(cri::ContainerFilter {
                                                pod_sandbox_id: id,
                                                ..Default::default()
                                            }),
                                        })
                                        .await?
                                        .into_inner()
                                        .containers;
                                    l.into_iter()
                                        .next()
                                        .map(|c| (c.id, c.state))
                                        .ok_or_else(|| tonic::Status::unavailable("not listed yet"))
                                }
                            })
                            .await
                            .unwrap(),
                        };
                        let startable = state == cri::ContainerState::ContainerCreated as i32
                            || state == cri::ContainerState::ContainerRunning as i32;
                        let started = startable
                            && retry(&socket, |mut c| {
                                let cid = cid.clone();
                                async move {
                                    c.start_container(cri::StartContainerRequest {
                                        container_id: cid,
                                    })
                                    .await
                                    .map(drop)
                                }
                            })
                            .await
                            .is_ok();
                        if started {
                            break;
                        }
                        retry(&socket, |mut c| {
                            let cid = cid.clone();
                            async move {
                                c.remove_container(cri::RemoveContainerRequest { container_id: cid })
                                    .await
                                    .map(drop)
                            }
                        })
                        .await
                        .unwrap_or_else(|s| panic!("remove {cid}: {s}"));
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    stop_killing.store(true, Ordering::SeqCst);
    let restart_ms = killer.join().unwrap();
    let mut report = Report {
        pods,
        kills: restart_ms.len(),
        restart_ms,
        ..Default::default()
    };
    // The truth.
    let runc_root = env.cfg.root.join("runtime/runc");
    rt.block_on(async {
        let mut c = connect(&socket).await.unwrap();
        let listed: HashMap<String, i32> = c
            .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
            .await
            .unwrap()
            .into_inner()
            .items
            .into_iter()
            .map(|p| (p.id, p.state))
            .collect();
        for ids in acked.lock().unwrap().values() {
            for id in ids {
                if !listed.contains_key(id) {
                    report.lost.push(id.clone());
                }
            }
        }
        for i in 0..pods {
            let cfg = pod_config(i, round);
            let name = cfg.metadata.as_ref().unwrap().name.clone();
            let last = acked
                .lock()
                .unwrap()
                .get(&name)
                .and_then(|v| v.last().cloned());
            match c
                .run_pod_sandbox(cri::RunPodSandboxRequest {
                    config: Some(cfg),
                    runtime_handler: String::new(),
                })
                .await
            {
                Ok(r) if Some(r.get_ref().pod_sandbox_id.clone()) == last => {}
                Ok(r) => report.stuck.push(format!(
                    "{name}: another id {}",
                    r.into_inner().pod_sandbox_id
                )),
                Err(s) => report.stuck.push(format!("{name}: {s}")),
            }
        }
        let ctrs = c
            .list_containers(cri::ListContainersRequest { filter: None })
            .await
            .unwrap()
            .into_inner()
            .containers;
        for ct in &ctrs {
            let out = std::process::Command::new("runc")
                .arg("--root")
                .arg(&runc_root)
                .args(["state", &ct.id])
                .output()
                .unwrap();
            let status = serde_json::from_slice::<serde_json::Value>(&out.stdout)
                .ok()
                .and_then(|v| v["status"].as_str().map(str::to_string))
                .unwrap_or_else(|| "absent".into());
            let want = match cri::ContainerState::try_from(ct.state) {
                Ok(cri::ContainerState::ContainerRunning) => "running",
                Ok(cri::ContainerState::ContainerCreated) => "created",
                _ => "stopped",
            };
            if status != want && !(want == "stopped" && status == "absent") {
                report
                    .mismatched
                    .push(format!("{}: reported {want}, runtime {status}", ct.id));
            }
        }
        (report.orphans, report.audit_ms) = audit_orphans(&socket).await;
        for id in listed.keys() {
            let _ = c
                .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                })
                .await;
        }
        report.left = c
            .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
            .await
            .unwrap()
            .into_inner()
            .items
            .len()
            + c.list_containers(cri::ListContainersRequest { filter: None })
                .await
                .unwrap()
                .into_inner()
                .containers
                .len();
    });
    if let Some(mut d) = daemon.lock().unwrap().take() {
        d.sigterm();
    }
    report.seconds = started.elapsed().as_secs_f64();
    report
}
