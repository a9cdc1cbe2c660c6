//! End-to-end tests of the daemon through its unix socket with a tonic client: lifecycle,
//! status codes, socket handling, concurrency, restart after kill -9, malformed requests,
//! and two daemons side by side.

mod common;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::daemon::*;
use common::*;
use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;
use tonic::Code;

/// `sandboxctl -r EP ARGS…`.
fn sandboxctl(ep: &str, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sandboxctl"));
    c.arg("-r").arg(ep).args(args);
    c
}

/// Runs sandboxctl, asserts it succeeded and returns its stdout.
fn sandboxctl_ok(ep: &str, args: &[&str]) -> String {
    let out = sandboxctl(ep, args).output().unwrap();
    assert!(
        out.status.success(),
        "sandboxctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn pod_config(name: &str, uid: &str, share_pid: bool) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            namespace: "e2e".into(),
            uid: uid.into(),
            attempt: 0,
        }),
        linux: Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    pid: if share_pid {
                        cri::NamespaceMode::Pod
                    } else {
                        cri::NamespaceMode::Container
                    } as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn run_req(c: cri::PodSandboxConfig) -> cri::RunPodSandboxRequest {
    cri::RunPodSandboxRequest {
        config: Some(c),
        runtime_handler: String::new(),
    }
}

async fn list(c: &mut RuntimeServiceClient<Channel>) -> Vec<cri::PodSandbox> {
    c.list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .items
}

async fn status(
    c: &mut RuntimeServiceClient<Channel>,
    id: &str,
) -> Result<cri::PodSandboxStatus, tonic::Status> {
    c.pod_sandbox_status(cri::PodSandboxStatusRequest {
        pod_sandbox_id: id.into(),
        verbose: false,
    })
    .await
    .map(|r| r.into_inner().status.unwrap())
}

#[test]
fn lifecycle_and_status_codes() {
    let env = Env::new("e2e");
    let mut d = Daemon::start(&env);
    assert_eq!(
        std::fs::metadata(&d.socket).unwrap().permissions().mode() & 0o777,
        0o660
    );
    assert_eq!(
        std::fs::metadata(d.socket.parent().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    rt().block_on(async {
        let mut c = client(&d.socket).await;
        let v = c
            .version(cri::VersionRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (v.runtime_name.as_str(), v.runtime_api_version.as_str()),
            ("sandboxd", "v1")
        );
        let st = c
            .status(cri::StatusRequest { verbose: false })
            .await
            .unwrap()
            .into_inner()
            .status
            .unwrap();
        assert!(st.conditions.iter().all(|c| c.status), "{st:?}");
        let cfg = c
            .runtime_config(cri::RuntimeConfigRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            cfg.linux.unwrap().cgroup_driver,
            cri::CgroupDriver::Cgroupfs as i32
        );

        let id = c
            .run_pod_sandbox(run_req(pod_config("web", "u-web", true)))
            .await
            .unwrap()
            .into_inner()
            .pod_sandbox_id;
        let s = status(&mut c, &id).await.unwrap();
        assert_eq!(s.state, cri::PodSandboxState::SandboxReady as i32);
        let ip = s.network.unwrap().ip;
        assert!(ip.starts_with(&env.subnet_prefix), "{ip}");
        let netns = env
            .cfg
            .netns_dir
            .join(list_names(&env.cfg.netns_dir).pop().unwrap());
        assert!(addrs_in(&netns, "eth0").contains(&ip));
        // Prefixes resolve; verbose status carries the record.
        let v = c
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: id[..10].into(),
                verbose: true,
            })
            .await
            .unwrap()
            .into_inner();
        assert!(v.info["info"].contains(&id));

        // The same request again returns the same id; another one for the name is AlreadyExists.
        assert_eq!(
            c.run_pod_sandbox(run_req(pod_config("web", "u-web", true)))
                .await
                .unwrap()
                .into_inner()
                .pod_sandbox_id,
            id
        );
        let mut other = pod_config("web", "u-web", true);
        other.hostname = "other".into();
        let e = c.run_pod_sandbox(run_req(other)).await.unwrap_err();
        assert_eq!(e.code(), Code::AlreadyExists);
        assert!(e.message().contains(&id), "{}", e.message());

        // Status codes.
        let unknown = "cd".repeat(32);
        assert_eq!(
            status(&mut c, &unknown).await.unwrap_err().code(),
            Code::NotFound
        );
        c.stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: unknown.clone(),
        })
        .await
        .unwrap();
        c.remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: unknown.clone(),
        })
        .await
        .unwrap();
        let e = c
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(cri::PodSandboxConfig::default()),
                runtime_handler: String::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("config.metadata"), "{}", e.message());
        let e = c
            .run_pod_sandbox(run_req(pod_config("", "u", false)))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("metadata.name"), "{}", e.message());
        let mut r = run_req(pod_config("h", "u-h", false));
        r.runtime_handler = "nope".into();
        assert_eq!(
            c.run_pod_sandbox(r).await.unwrap_err().code(),
            Code::InvalidArgument
        );
        let e = c
            .create_container(cri::CreateContainerRequest::default())
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("config"), "{}", e.message());
        let e = c.exec(cri::ExecRequest::default()).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        let e = c.attach(cri::AttachRequest::default()).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        // Features that do not exist say so instead of pretending.
        let e = c
            .checkpoint_container(cri::CheckpointContainerRequest::default())
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unimplemented);
        assert!(e.message().contains("checkpoint"), "{}", e.message());
        let mut img =
            k8s_cri::v1::image_service_client::ImageServiceClient::new(channel(&d.socket).await);
        assert!(img
            .list_images(cri::ListImagesRequest::default())
            .await
            .unwrap()
            .into_inner()
            .images
            .is_empty());
        let e = img
            .pull_image(cri::PullImageRequest::default())
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("image reference"), "{}", e.message());

        // Filters.
        let ready = c
            .list_pod_sandbox(cri::ListPodSandboxRequest {
                filter: Some(cri::PodSandboxFilter {
                    state: Some(cri::PodSandboxStateValue {
                        state: cri::PodSandboxState::SandboxNotready as i32,
                    }),
                    ..Default::default()
                }),
            })
            .await
            .unwrap()
            .into_inner()
            .items;
        assert!(ready.is_empty());

        c.stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: id.clone(),
        })
        .await
        .unwrap();
        c.stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: id.clone(),
        })
        .await
        .unwrap();
        assert_eq!(
            status(&mut c, &id).await.unwrap().state,
            cri::PodSandboxState::SandboxNotready as i32
        );
        c.remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.clone(),
        })
        .await
        .unwrap();
        assert!(list(&mut c).await.is_empty());
    });
    // A second daemon on the same socket is refused while the first answers.
    let out = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .arg("--config")
        .arg(&d.config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("already listening"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // SIGTERM: clean exit, socket removed.
    assert!(d.sigterm().success());
    assert!(!d.socket.exists(), "socket left after SIGTERM");
    env.assert_no_leaks();
}

/// kill -9 with 3 pods running; a restarted daemon (replacing the stale socket) lists them
/// Ready with the same IPs, and stop/remove work.
#[test]
fn restart_after_kill9() {
    let env = Env::new("e2ekill");
    let mut d = Daemon::start(&env);
    let rt = rt();
    let before: HashMap<String, String> = rt.block_on(async {
        let mut c = client(&d.socket).await;
        let mut m = HashMap::new();
        for i in 0..3 {
            let id = c
                .run_pod_sandbox(run_req(pod_config(
                    &format!("k{i}"),
                    &format!("uk{i}"),
                    i == 0,
                )))
                .await
                .unwrap()
                .into_inner()
                .pod_sandbox_id;
            let ip = status(&mut c, &id).await.unwrap().network.unwrap().ip;
            m.insert(id, ip);
        }
        m
    });
    d.kill9();
    assert!(d.socket.exists(), "kill -9 cannot remove the socket");
    let d = Daemon::start(&env);
    rt.block_on(async {
        let mut c = client(&d.socket).await;
        let pods = list(&mut c).await;
        assert_eq!(pods.len(), 3);
        for (id, ip) in &before {
            let s = status(&mut c, id).await.unwrap();
            assert_eq!(s.state, cri::PodSandboxState::SandboxReady as i32);
            assert_eq!(&s.network.unwrap().ip, ip);
            c.stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await
            .unwrap();
            c.remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await
            .unwrap();
        }
    });
    env.assert_no_leaks();
}

/// 50 pods created concurrently from 16 tasks, all distinct, then stopped and removed: no leak.
#[test]
fn fifty_pods_from_sixteen_tasks() {
    let env = Env::new("e2e50");
    let d = Daemon::start(&env);
    rt().block_on(async {
        let c = client(&d.socket).await;
        let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let (mut c, next) = (c.clone(), next.clone());
            tasks.push(tokio::spawn(async move {
                let mut ids = Vec::new();
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if i >= 50 {
                        return ids;
                    }
                    let r = c
                        .run_pod_sandbox(run_req(pod_config(
                            &format!("p{i}"),
                            &format!("u{i}"),
                            i % 3 == 0,
                        )))
                        .await;
                    ids.push(r.unwrap().into_inner().pod_sandbox_id);
                }
            }));
        }
        let mut ids = Vec::new();
        for t in tasks {
            ids.extend(t.await.unwrap());
        }
        let mut c = c;
        assert_eq!(list(&mut c).await.len(), 50);
        let mut ips: Vec<String> = Vec::new();
        for id in &ids {
            ips.push(status(&mut c, id).await.unwrap().network.unwrap().ip);
        }
        ips.sort();
        ips.dedup();
        assert_eq!(ips.len(), 50, "IPs not distinct");
        let mut tasks = Vec::new();
        for chunk in ids.chunks(4) {
            let (mut c, chunk) = (c.clone(), chunk.to_vec());
            tasks.push(tokio::spawn(async move {
                for id in chunk {
                    c.stop_pod_sandbox(cri::StopPodSandboxRequest {
                        pod_sandbox_id: id.clone(),
                    })
                    .await
                    .unwrap();
                    c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id })
                        .await
                        .unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert!(list(&mut c).await.is_empty());
    });
    env.assert_no_leaks();
}

/// Malformed requests: empty names, 10 MB annotations, 10 000 labels get InvalidArgument or
/// ResourceExhausted, and nothing is created.
#[test]
fn malformed_requests_create_nothing() {
    let env = Env::new("e2ebad");
    let d = Daemon::start(&env);
    rt().block_on(async {
        let mut c = client(&d.socket).await;
        let mut big = pod_config("big", "u-big", false);
        big.annotations.insert("a".into(), "x".repeat(10 << 20));
        let mut many = pod_config("many", "u-many", false);
        for i in 0..10_000 {
            many.labels.insert(format!("label-{i}"), "v".into());
        }
        let mut noname = pod_config("n", "", false);
        noname.metadata.as_mut().unwrap().namespace = String::new();
        for (what, cfg) in [
            ("10 MB annotations", big),
            ("10000 labels", many),
            ("empty uid and namespace", noname),
        ] {
            let e = c.run_pod_sandbox(run_req(cfg)).await.unwrap_err();
            assert!(
                matches!(e.code(), Code::InvalidArgument | Code::ResourceExhausted),
                "{what}: {e:?}"
            );
        }
        assert!(list(&mut c).await.is_empty());
    });
    env.assert_no_leaks();
}

/// Two daemons with their own socket, root and netns dir run side by side, each seeing only
/// its own pods.
#[test]
fn two_daemons_side_by_side() {
    let a = Env::new("e2eA");
    let b = Env::new("e2eB");
    let (da, db) = (Daemon::start(&a), Daemon::start(&b));
    rt().block_on(async {
        let mut ca = client(&da.socket).await;
        let mut cb = client(&db.socket).await;
        let ia = ca
            .run_pod_sandbox(run_req(pod_config("same", "same", false)))
            .await
            .unwrap()
            .into_inner()
            .pod_sandbox_id;
        let ib = cb
            .run_pod_sandbox(run_req(pod_config("same", "same", false)))
            .await
            .unwrap()
            .into_inner()
            .pod_sandbox_id;
        assert_eq!(
            list(&mut ca)
                .await
                .iter()
                .map(|p| p.id.clone())
                .collect::<Vec<_>>(),
            vec![ia.clone()]
        );
        assert_eq!(
            list(&mut cb)
                .await
                .iter()
                .map(|p| p.id.clone())
                .collect::<Vec<_>>(),
            vec![ib.clone()]
        );
        ca.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: ia })
            .await
            .unwrap();
        assert_eq!(list(&mut cb).await.len(), 1);
        cb.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: ib })
            .await
            .unwrap();
    });
    a.assert_no_leaks();
    b.assert_no_leaks();
}

/// kill -9 in the middle of a running workload: the restarted daemon rolls back what was
/// half-created, every pod it lists can be removed, and nothing leaks.
#[test]
fn kill9_mid_workload() {
    let env = Env::new("e2emid");
    let mut d = Daemon::start(&env);
    let rt = rt();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let finished = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let done = rt.block_on(async {
        let c = client(&d.socket).await;
        let mut tasks = Vec::new();
        for t in 0..4 {
            let (mut c, stop, finished) = (c.clone(), stop.clone(), finished.clone());
            tasks.push(tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let Ok(r) = c
                        .run_pod_sandbox(run_req(pod_config(
                            &format!("m{t}-{n}"),
                            &format!("um{t}-{n}"),
                            n % 2 == 0,
                        )))
                        .await
                    else {
                        return n;
                    };
                    let id = r.into_inner().pod_sandbox_id;
                    if c.stop_pod_sandbox(cri::StopPodSandboxRequest {
                        pod_sandbox_id: id.clone(),
                    })
                    .await
                    .is_err()
                    {
                        return n;
                    }
                    if c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id })
                        .await
                        .is_err()
                    {
                        return n;
                    }
                    n += 1;
                    finished.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                n
            }));
        }
        // Kill once the workload is demonstrably running (a few lifecycles done, more in flight).
        let deadline = Instant::now() + Duration::from_secs(30);
        while finished.load(std::sync::atomic::Ordering::SeqCst) < 4 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tasks
    });
    d.kill9();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let completed: usize = rt.block_on(async {
        let mut total = 0;
        for t in done {
            total += t.await.unwrap();
        }
        total
    });
    assert!(completed > 0, "the workload never ran");
    let d = Daemon::start(&env);
    rt.block_on(async {
        let mut c = client(&d.socket).await;
        for p in list(&mut c).await {
            c.remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: p.id,
            })
            .await
            .unwrap();
        }
        assert!(list(&mut c).await.is_empty());
    });
    env.assert_no_leaks();
}

/// A conf dir with only a broken config: Status says NetworkReady=false with the reason, and
/// RunPodSandbox fails without creating anything.
#[test]
fn network_not_ready_is_reported() {
    let env = Env::new("e2enet");
    std::fs::write(env.cfg.cni_conf_dir.join("10-broken.conflist"), "{ nope").unwrap();
    let d = Daemon::start(&env);
    rt().block_on(async {
        let mut c = client(&d.socket).await;
        let st = c
            .status(cri::StatusRequest { verbose: false })
            .await
            .unwrap()
            .into_inner()
            .status
            .unwrap();
        let net = st
            .conditions
            .iter()
            .find(|c| c.r#type == "NetworkReady")
            .unwrap();
        assert!(!net.status);
        assert_eq!(net.reason, "NetworkPluginNotReady");
        assert!(
            net.message.contains("10-broken.conflist"),
            "{}",
            net.message
        );
        let rtc = st
            .conditions
            .iter()
            .find(|c| c.r#type == "RuntimeReady")
            .unwrap();
        assert!(rtc.status);
        let e = c
            .run_pod_sandbox(run_req(pod_config("n", "u-n", false)))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Internal);
        assert!(
            e.message().contains("10-broken.conflist"),
            "{}",
            e.message()
        );
        assert!(list(&mut c).await.is_empty());
    });
    env.assert_no_leaks();
}

/// sandboxctl against the daemon with a crictl-style file: runp, pods, inspectp by prefix,
/// stopp, rmp.
#[test]
fn sandboxctl_drives_the_daemon() {
    let env = Env::new("e2ectl");
    let d = Daemon::start(&env);
    let ep = format!("unix://{}", d.socket.display());
    let ctl = |args: &[&str]| sandboxctl_ok(&ep, args);
    let pod = env.base.join("pod.json");
    std::fs::write(
        &pod,
        r#"{"metadata":{"name":"ctl","namespace":"default","uid":"ctl-uid","attempt":1},
            "log_directory":"/tmp/ctl-logs","hostname":"ctl-host","labels":{"app":"ctl"},
            "port_mappings":[{"protocol":"TCP","container_port":80,"host_port":0}],
            "linux":{"security_context":{"namespace_options":{"pid":"CONTAINER","network":0}}}}"#,
    )
    .unwrap();
    let id = ctl(&["runp", pod.to_str().unwrap()]).trim().to_string();
    assert_eq!(id.len(), 64);
    let pods: serde_json::Value =
        serde_json::from_str(&ctl(&["-o", "json", "pods", "--label", "app=ctl"])).unwrap();
    assert_eq!(pods["items"][0]["id"], serde_json::json!(id));
    assert!(ctl(&["pods"]).contains("ctl"));
    let inspect: serde_json::Value = serde_json::from_str(&ctl(&["inspectp", &id[..7]])).unwrap();
    assert_eq!(
        inspect["status"]["metadata"]["attempt"],
        serde_json::json!(1)
    );
    assert!(inspect["status"]["network"]["ip"]
        .as_str()
        .unwrap()
        .starts_with(&env.subnet_prefix));
    assert_eq!(
        inspect["info"]["info"]["infra_mode"],
        serde_json::json!("pinned")
    );
    assert!(ctl(&["version"]).contains("sandboxd"));
    assert!(ctl(&["stopp", &id[..9]]).contains(&id));
    assert!(ctl(&["rmp", &id[..9]]).contains(&id));
    assert!(ctl(&["pods", "-q"]).trim().is_empty());
    env.assert_no_leaks();
}

/// Containers and images through sandboxctl and the daemon: import, create, start, logs,
/// exec, ps, inspect, stop, rm, rmi (refused while used), with crictl-style JSON files.
#[test]
fn sandboxctl_containers_and_images() {
    let env = Env::new("e2ectr");
    let d = Daemon::start(&env);
    let ep = format!("unix://{}", d.socket.display());
    let ctl_out = |args: &[&str]| sandboxctl(&ep, args).output().unwrap();
    let ctl = |args: &[&str]| sandboxctl_ok(&ep, args);
    let archive = busybox::docker_archive(&env.base, "sandboxd.test/busybox:e2e");
    let root = env.cfg.root.to_string_lossy().into_owned();
    assert!(ctl(&[
        "images",
        "import",
        "--root",
        &root,
        archive.to_str().unwrap()
    ])
    .contains("sha256:"));
    assert!(ctl(&["images"]).contains("sandboxd.test/busybox"));

    let logs = env.base.join("logs");
    let pod = env.base.join("pod.json");
    std::fs::write(
        &pod,
        format!(
            r#"{{"metadata":{{"name":"e2e","namespace":"default","uid":"e2e-uid"}},
                "log_directory":"{}"}}"#,
            logs.display()
        ),
    )
    .unwrap();
    let ctr = env.base.join("ctr.json");
    std::fs::write(
        &ctr,
        r#"{"metadata":{"name":"talker"},"image":{"image":"sandboxd.test/busybox:e2e"},
            "command":["sh","-c","echo hello from $WHO; exec sleep 1000"],
            "envs":[{"key":"WHO","value":"e2e"}],"log_path":"talker.log",
            "linux":{"security_context":{"run_as_user":{"value":1234},
                     "capabilities":{"drop_capabilities":["NET_RAW"]}}}}"#,
    )
    .unwrap();
    let pod_id = ctl(&["runp", pod.to_str().unwrap()]).trim().to_string();
    let id = ctl(&[
        "create",
        &pod_id[..8],
        ctr.to_str().unwrap(),
        pod.to_str().unwrap(),
    ])
    .trim()
    .to_string();
    assert_eq!(id.len(), 64);
    assert!(ctl(&["ps", "-a"]).contains("CONTAINER_CREATED"));
    ctl(&["start", &id[..8]]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ctl(&["logs", &id[..8]]).contains("hello from e2e") {
        assert!(Instant::now() < deadline, "no log output");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(logs.join("talker.log").is_file());
    assert_eq!(ctl(&["exec", &id[..8], "id", "-u"]), "1234\n");
    let out = ctl_out(&["exec", &id[..8], "sh", "-c", "exit 4"]);
    assert_eq!(out.status.code(), Some(4));
    let ps: serde_json::Value = serde_json::from_str(&ctl(&["-o", "json", "ps"])).unwrap();
    assert_eq!(ps["containers"][0]["id"], serde_json::json!(id));
    let inspect: serde_json::Value = serde_json::from_str(&ctl(&["inspect", &id[..8]])).unwrap();
    assert_eq!(
        inspect["status"]["state"],
        serde_json::json!(cri::ContainerState::ContainerRunning as i32)
    );
    assert_eq!(
        inspect["info"]["info"]["sandbox_id"],
        serde_json::json!(pod_id)
    );
    ctl(&[
        "exec",
        &id[..8],
        "sh",
        "-c",
        "head -c 100000 /dev/zero > /tmp/blob",
    ]);
    let stats: serde_json::Value = serde_json::from_str(&ctl(&["-o", "json", "stats"])).unwrap();
    // What the container wrote lands in its writable layer.
    assert!(
        stats["stats"][0]["writable_layer"]["used_bytes"]["value"]
            .as_u64()
            .unwrap()
            >= 100_000,
        "{stats}"
    );
    assert_eq!(stats["stats"][0]["attributes"]["id"], serde_json::json!(id));
    assert!(
        stats["stats"][0]["memory"]["usage_bytes"]["value"]
            .as_u64()
            .unwrap()
            > 0,
        "{stats}"
    );
    // Removing the image it runs from removes the image; the container keeps its layers
    // (they go with it).
    let layers = env.cfg.root.join("images/layers");
    let before = list_names(&layers);
    assert!(!before.is_empty());
    ctl(&["images", "rm", "sandboxd.test/busybox:e2e"]);
    assert!(!ctl(&["images"]).contains("busybox"));
    assert_eq!(list_names(&layers), before, "a layer in use was collected");
    assert!(ctl(&["exec", &id[..8], "true"]).is_empty());
    ctl(&["stop", "-t", "0", &id[..8]]);
    let inspect: serde_json::Value = serde_json::from_str(&ctl(&["inspect", &id[..8]])).unwrap();
    assert_eq!(inspect["status"]["exit_code"], serde_json::json!(137));
    ctl(&["rm", &id[..8]]);
    assert!(ctl(&["ps", "-a", "-q"]).trim().is_empty());
    assert!(
        list_names(&layers).is_empty(),
        "layers left after the container went"
    );
    ctl(&["rmp", &pod_id[..8]]);
    env.assert_no_leaks();
}

/// PullImage through the daemon with credentials, from an htpasswd-protected registry.
#[test]
fn sandboxctl_pulls_with_credentials() {
    let env = Env::new("e2epull");
    let user = ("kube", "pa55");
    let reg = common::registry::Registry::start(&env.base.join("registry"), Some(user));
    reg.push_busybox("app/busybox", "v1", Some(user));
    let d = Daemon::start(&env);
    let ep = format!("unix://{}", d.socket.display());
    let ctl = |args: &[&str]| sandboxctl(&ep, args).output().unwrap();
    let name = format!("{}/app/busybox:v1", reg.addr);
    let out = ctl(&["pull", &name]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Unauthenticated"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = ctl(&["pull", "--creds", "kube:pa55", &name]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("sha256:"));
    let list = String::from_utf8(ctl(&["images"]).stdout).unwrap();
    assert!(
        list.contains(&format!("{}/app/busybox", reg.addr)),
        "{list}"
    );
    env.assert_no_leaks();
}

/// Exec and PortForward through the CRI: the daemon hands out a streaming URL; a SPDY client
/// runs the command on it; requests for a stopped container are refused.
#[test]
fn exec_url_through_the_cri() {
    let env = Env::new("e2eexec");
    let d = Daemon::start(&env);
    let layout = busybox::oci_layout(&env.base, "sandboxd.test/busybox:exec");
    sandboxd::image::ImageStore::new(env.cfg.root.join("images"))
        .unwrap()
        .import(&layout, None)
        .unwrap();
    rt().block_on(async {
        let mut c = client(&d.socket).await;
        let pod = pod_config("exec", "exec-uid", false);
        let sb = c
            .run_pod_sandbox(run_req(pod.clone()))
            .await
            .unwrap()
            .into_inner()
            .pod_sandbox_id;
        let id = c
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: sb.clone(),
                config: Some(cri::ContainerConfig {
                    metadata: Some(cri::ContainerMetadata {
                        name: "idle".into(),
                        attempt: 0,
                    }),
                    image: Some(cri::ImageSpec {
                        image: "sandboxd.test/busybox:exec".into(),
                        ..Default::default()
                    }),
                    command: vec!["sleep".into(), "1000".into()],
                    ..Default::default()
                }),
                sandbox_config: Some(pod),
            })
            .await
            .unwrap()
            .into_inner()
            .container_id;
        c.start_container(cri::StartContainerRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap();
        let url = c
            .exec(cri::ExecRequest {
                container_id: id.clone(),
                cmd: vec!["sh".into(), "-c".into(), "hostname; exit 7".into()],
                stdout: true,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .url;
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");
        let (out, status) = tokio::task::spawn_blocking(move || {
            let mut s = common::spdy::Client::connect(&url, &["v4.channel.k8s.io"]).unwrap();
            let err = s.open(&[("streamtype", "error")]);
            let out = s.open(&[("streamtype", "stdout")]);
            s.wait_ended(&[err, out]);
            (s.text(out), s.text(err))
        })
        .await
        .unwrap();
        assert_eq!(out, "exec\n");
        assert!(
            status.contains("\"NonZeroExitCode\"") && status.contains("\"7\""),
            "{status}"
        );
        let pf = c
            .port_forward(cri::PortForwardRequest {
                pod_sandbox_id: sb.clone(),
                port: vec![80],
            })
            .await
            .unwrap()
            .into_inner()
            .url;
        assert!(pf.contains("/portforward/"), "{pf}");
        let e = c
            .exec(cri::ExecRequest {
                container_id: id.clone(),
                cmd: vec!["true".into()],
                tty: true,
                stdout: true,
                stderr: true,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        c.stop_container(cri::StopContainerRequest {
            container_id: id.clone(),
            timeout: 0,
        })
        .await
        .unwrap();
        let e = c
            .exec(cri::ExecRequest {
                container_id: id.clone(),
                cmd: vec!["true".into()],
                stdout: true,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: sb })
            .await
            .unwrap();
    });
    env.assert_no_leaks();
}

/// sandboxctl's interactive commands over the streaming server: exec -i with stdin EOF,
/// exec -it with the remote exit code, and port-forward to a server in the pod.
#[test]
fn sandboxctl_exec_interactive_and_port_forward() {
    use std::io::{BufRead, Read, Write};
    let env = Env::new("e2estream");
    let d = Daemon::start(&env);
    let ep = format!("unix://{}", d.socket.display());
    let layout = busybox::oci_layout(&env.base, "sandboxd.test/busybox:streams");
    let root = env.cfg.root.to_string_lossy().into_owned();
    let ctl_cmd = |args: &[&str]| sandboxctl(&ep, args);
    let ctl = |args: &[&str]| sandboxctl_ok(&ep, args);
    let with_stdin = |args: &[&str], input: &[u8]| {
        let mut child = ctl_cmd(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        child.wait_with_output().unwrap()
    };
    ctl(&[
        "images",
        "import",
        "--root",
        &root,
        layout.to_str().unwrap(),
    ]);
    let pod = env.base.join("pod.json");
    std::fs::write(
        &pod,
        r#"{"metadata":{"name":"streams","namespace":"default","uid":"streams-uid"}}"#,
    )
    .unwrap();
    let ctr = env.base.join("ctr.json");
    std::fs::write(
        &ctr,
        r#"{"metadata":{"name":"srv"},"image":{"image":"sandboxd.test/busybox:streams"},
            "command":["sh","-c","while :; do echo pong | nc -l -p 8080; done"]}"#,
    )
    .unwrap();
    let pod_id = ctl(&["runp", pod.to_str().unwrap()]).trim().to_string();
    let id = ctl(&[
        "create",
        &pod_id,
        ctr.to_str().unwrap(),
        pod.to_str().unwrap(),
    ])
    .trim()
    .to_string();
    ctl(&["start", &id]);

    let out = with_stdin(&["exec", "-i", &id, "cat"], b"hello stdin\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"hello stdin\n");
    let out = with_stdin(
        &["exec", "-i", &id, "sh", "-c", "cat; echo oops >&2; exit 5"],
        b"x",
    );
    assert_eq!(out.status.code(), Some(5));
    assert_eq!(out.stdout, b"x");
    assert_eq!(out.stderr, b"oops\n");
    let out = with_stdin(
        &["exec", "-i", "-t", &id, "sh"],
        b"echo in-$((6*7))\nexit 4\n",
    );
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("in-42"));

    // Attach to the container's own output: nc's loop prints nothing, so give it a second
    // container that does, created with stdin.
    let talker = env.base.join("talker.json");
    std::fs::write(
        &talker,
        r#"{"metadata":{"name":"talker"},"image":{"image":"sandboxd.test/busybox:streams"},
            "command":["sh","-c","read x; echo heard $x; exit 0"],"stdin":true}"#,
    )
    .unwrap();
    let tid = ctl(&[
        "create",
        &pod_id,
        talker.to_str().unwrap(),
        pod.to_str().unwrap(),
    ])
    .trim()
    .to_string();
    ctl(&["start", &tid]);
    let out = with_stdin(&["attach", "-i", &tid], b"you\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "heard you\n");

    let mut pf = ctl_cmd(&["port-forward", &pod_id, "127.0.0.1:0:8080"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(pf.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let local = line
        .strip_prefix("Forwarding from ")
        .and_then(|l| l.split(" -> ").next())
        .unwrap_or_else(|| panic!("{line:?}"))
        .to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    let got = loop {
        let mut conn = std::net::TcpStream::connect(&local).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        conn.write_all(b"ping\n").unwrap();
        let mut got = String::new();
        let _ = conn.read_to_string(&mut got);
        if got.contains("pong") || Instant::now() > deadline {
            break got;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(got, "pong\n");
    let _ = pf.kill();
    let _ = pf.wait();
    ctl(&["rmp", &pod_id]);
    env.assert_no_leaks();
}

/// kill -9 of the daemon with containers running: after the restart they still run, their
/// logs keep flowing, and an exit that happens later is recorded with its code.
#[test]
fn containers_survive_daemon_kill9() {
    let env = Env::new("e2ectr9");
    let mut d = Daemon::start(&env);
    let ep = format!("unix://{}", d.socket.display());
    let ctl = |args: &[&str]| sandboxctl_ok(&ep, args);
    let layout = busybox::oci_layout(&env.base, "sandboxd.test/busybox:k9");
    let root = env.cfg.root.to_string_lossy().into_owned();
    ctl(&[
        "images",
        "import",
        "--root",
        &root,
        layout.to_str().unwrap(),
    ]);
    let logs = env.base.join("logs");
    let pod = env.base.join("pod.json");
    std::fs::write(
        &pod,
        format!(
            r#"{{"metadata":{{"name":"k9","namespace":"default","uid":"k9-uid"}},
                "log_directory":"{}"}}"#,
            logs.display()
        ),
    )
    .unwrap();
    let mk = |name: &str, script: &str| {
        let f = env.base.join(format!("{name}.json"));
        std::fs::write(
            &f,
            serde_json::json!({"metadata": {"name": name},
                "image": {"image": "sandboxd.test/busybox:k9"},
                "command": ["sh", "-c", script], "log_path": format!("{name}.log")})
            .to_string(),
        )
        .unwrap();
        f
    };
    let pod_id = ctl(&["runp", pod.to_str().unwrap()]).trim().to_string();
    let ticker = mk("ticker", "while :; do echo tick; sleep 0.1; done");
    let quitter = mk("quitter", "sleep 3; exit 9");
    let mut ids = Vec::new();
    for f in [&ticker, &quitter] {
        let id = ctl(&[
            "create",
            &pod_id,
            f.to_str().unwrap(),
            pod.to_str().unwrap(),
        ])
        .trim()
        .to_string();
        ctl(&["start", &id]);
        ids.push(id);
    }
    d.kill9();
    let _d = Daemon::start(&env);
    assert!(ctl(&["ps", "-q"]).contains(&ids[0]));
    let log = logs.join("ticker.log");
    let before = std::fs::read_to_string(&log).unwrap().lines().count();
    std::thread::sleep(Duration::from_millis(500));
    assert!(std::fs::read_to_string(&log).unwrap().lines().count() > before);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let v: serde_json::Value = serde_json::from_str(&ctl(&["inspect", &ids[1]])).unwrap();
        if v["status"]["state"] == serde_json::json!(cri::ContainerState::ContainerExited as i32) {
            assert_eq!(v["status"]["exit_code"], serde_json::json!(9));
            assert_eq!(v["status"]["reason"], serde_json::json!("Error"));
            break;
        }
        assert!(Instant::now() < deadline, "quitter never exited: {v}");
        std::thread::sleep(Duration::from_millis(100));
    }
    ctl(&["stopp", &pod_id]);
    ctl(&["rmp", &pod_id]);
    env.assert_no_leaks();
}

/// Config: flags override the file, the effective config prints as TOML, unknown keys and a
/// bad value are refused with the key named.
#[test]
fn config_file_and_flags() {
    let env = Env::new("e2ecfg");
    let cfg = Daemon::config_file(&env);
    let out = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .args([
            "--config",
            cfg.to_str().unwrap(),
            "--socket",
            "/tmp/other.sock",
            "--cni-bin-dir",
            "/a:/b",
            "--cni-bin-dir",
            "/c",
        ])
        .arg("--print-default-config")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let parsed: toml::Table = toml::from_str(&text).unwrap();
    assert_eq!(parsed["socket"].as_str(), Some("/tmp/other.sock"));
    assert_eq!(
        parsed["root"].as_str(),
        Some(env.cfg.root.to_str().unwrap())
    );
    assert_eq!(parsed["cni_bin_dirs"].as_array().unwrap().len(), 3);
    let bad = env.base.join("bad.toml");
    std::fs::write(&bad, "sockett = \"/x\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .args(["--config", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown key \"sockett\""),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&bad, "infra = \"sometimes\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .args(["--config", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("infra"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Nothing was created by refused configs.
    assert!(!Path::new("/tmp/other.sock").exists());
}

/// A storm of pod starts (each with a running container) from 8 clients, with the daemon
/// SIGKILLed twice at random moments and restarted: no pod a client got an id for is lost,
/// every container's state matches the runtime's, every name runs again (the same id back),
/// and the teardown through the daemon leaves nothing on the host. (Reliability item: keep
/// the storm guarantees; the chaos benchmark runs the big version.)
#[test]
fn storm_with_kills_loses_nothing() {
    const IMAGE: &str = "sandboxd.test/busybox:chaos";
    let env = Env::new("e2echaos");
    sandboxd::image::ImageStore::new(env.cfg.root.join("images"))
        .unwrap()
        .import(&busybox::oci_layout(&env.base, IMAGE), None)
        .unwrap();
    let r = common::chaos::round(&env, 24, 8, 2, 0, IMAGE);
    assert!(r.kills >= 1, "{r:?}");
    assert!(r.lost.is_empty(), "lost: {:?}", r.lost);
    assert!(r.mismatched.is_empty(), "mismatched: {:?}", r.mismatched);
    assert!(r.stuck.is_empty(), "stuck: {:?}", r.stuck);
    assert_eq!(r.left, 0, "{r:?}");
    env.assert_no_leaks();
}

/// A hung OCI runtime never delays unrelated RPCs: while a CreateContainer hangs in its
/// runtime, Version and ListPodSandbox keep answering at once.
#[test]
fn a_hung_runtime_does_not_delay_other_rpcs() {
    const IMAGE: &str = "sandboxd.test/busybox:hungrpc";
    let mut env = Env::new("e2ehung");
    let wrapper = env.base.join("bin/hanging-runtime");
    std::fs::write(
        &wrapper,
        "#!/bin/sh\nfor a in \"$@\"; do\n  if [ \"$a\" = create ]; then sleep 6291; fi\ndone\nexec /usr/sbin/runc \"$@\"\n",
    )
    .unwrap();
    sh(&format!("chmod 755 {}", wrapper.display()));
    env.cfg.runtimes.insert(
        "hang".into(),
        sandboxd::RuntimeHandler {
            path: wrapper,
            root: None,
            needs_sandbox_process: false,
            runtime_args: Vec::new(),
        },
    );
    env.cfg.runtime_timeout = Duration::from_secs(4);
    sandboxd::image::ImageStore::new(env.cfg.root.join("images"))
        .unwrap()
        .import(&busybox::oci_layout(&env.base, IMAGE), None)
        .unwrap();
    let d = Daemon::start(&env);
    let rt = rt();
    rt.block_on(async {
        let mut c = client(&d.socket).await;
        let mut pod = pod_config("hung", "hung-uid", false);
        let sb = c
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(pod.clone()),
                runtime_handler: "hang".into(),
            })
            .await
            .unwrap()
            .into_inner()
            .pod_sandbox_id;
        pod.metadata.as_mut().unwrap().attempt = 0;
        let ctr = sandboxd::cri::crictl_json::container_config(
            format!(r#"{{"metadata": {{"name": "c"}}, "image": {{"image": "{IMAGE}"}}, "command": ["sleep", "100"]}}"#).as_bytes(),
        )
        .unwrap();
        let mut cc = c.clone();
        let (sb2, pod2) = (sb.clone(), pod.clone());
        let hung = tokio::spawn(async move {
            cc.create_container(cri::CreateContainerRequest {
                pod_sandbox_id: sb2,
                config: Some(ctr),
                sandbox_config: Some(pod2),
            })
            .await
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut lat = Vec::new();
        while !hung.is_finished() {
            let t = Instant::now();
            c.version(cri::VersionRequest::default()).await.unwrap();
            c.list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
                .await
                .unwrap();
            lat.push(t.elapsed());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let e = hung.await.unwrap().unwrap_err();
        assert!(e.message().contains("runtime handler hang"), "{e:?}");
        lat.sort();
        assert!(lat.len() > 20, "{lat:?}");
        let p50 = lat[lat.len() / 2];
        assert!(p50 < Duration::from_millis(50), "Version+List p50 {p50:?} while the runtime hangs");
        assert!(*lat.last().unwrap() < Duration::from_secs(1), "{lat:?}");
        c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: sb })
            .await
            .unwrap();
    });
    sh_ok("pkill -f 'sleep 6291'");
    env.assert_no_leaks();
}
