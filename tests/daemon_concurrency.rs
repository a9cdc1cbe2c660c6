//! The daemon under concurrent use: 50 pods from 16 clients, two daemons side by side each
//! seeing only its own pods, and other RPCs answering at once while a runtime call hangs.

mod common;

use std::time::{Duration, Instant};

use common::daemon::*;
use common::pods::*;
use common::*;
use sandboxd::api::v1 as cri;

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
            family: None,
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
