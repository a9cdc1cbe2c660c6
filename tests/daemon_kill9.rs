//! The daemon SIGKILLed and restarted on the same root: pods come back Ready with their
//! addresses, a workload killed mid-flight is rolled back, running containers survive and
//! their later exits are recorded, and a storm of starts with kills loses nothing.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::daemon::*;
use common::pods::*;
use common::sandboxctl::sandboxctl_ok;
use common::*;
use sandboxd::api::v1 as cri;

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
    // The self-audit after the storm, pods still up: every host object has its record.
    assert!(r.orphans.is_empty(), "orphans: {:?}", r.orphans);
    assert_eq!(r.left, 0, "{r:?}");
    env.assert_no_leaks();
}

/// A daemon killed while its start-up probe holds a half-made trial container (created, not
/// yet deleted) leaves it behind; the next start deletes it before its own trial, and then
/// nothing is left: no container in the trial's runtime root, no cgroup, no probe dir.
#[test]
fn a_trial_cut_by_kill9_is_cleaned_at_the_next_start() {
    let mut env = Env::new("k9probe");
    // runc, holding on for 3 s after each `create`: the trial stays half-made that long.
    let wrapper = env.base.join("bin/slow-runc");
    std::fs::create_dir_all(wrapper.parent().unwrap()).unwrap();
    std::fs::write(
        &wrapper,
        "#!/bin/sh\n/usr/sbin/runc \"$@\"; rc=$?\nfor a in \"$@\"; do [ \"$a\" = create ] && sleep 3; done\nexit $rc\n",
    )
    .unwrap();
    sh(&format!("chmod 755 {}", wrapper.display()));
    env.cfg.runtimes.insert(
        "slow".into(),
        sandboxd::RuntimeHandler {
            path: wrapper,
            family: Some("runc".into()),
            ..Default::default()
        },
    );
    let state = env.cfg.root.join("probe/slow/state");
    let mut d = Daemon::start(&env);
    let deadline = Instant::now() + Duration::from_secs(20);
    let listed = || {
        sh(&format!(
            "runc --root {} list 2>/dev/null || true",
            state.display()
        ))
    };
    while !listed().contains("created") {
        assert!(Instant::now() < deadline, "no half-made trial container");
        std::thread::sleep(Duration::from_millis(20));
    }
    d.kill9();
    let trials = cgroups_under(&env.cfg.cgroup_parent);
    assert!(!trials.is_empty());
    // A process of the half-made trial that no runtime state names (a runtime's sandbox
    // process whose `create` the kill cut short): in the trial container's cgroup.
    let mut stray = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .unwrap();
    let moved = trials
        .iter()
        .filter(|d| {
            d.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("sandboxd-probe"))
        })
        .filter(|d| std::fs::write(d.join("cgroup.procs"), stray.id().to_string()).is_ok())
        .count();
    assert!(moved > 0, "no trial cgroup took the stray: {trials:?}");
    // The next start: its probe deletes the leftover, tries again, and cleans up.
    let d = Daemon::start(&env);
    let deadline = Instant::now() + Duration::from_secs(30);
    while env.cfg.root.join("probe").exists() {
        assert!(Instant::now() < deadline, "the second probe never ended");
        std::thread::sleep(Duration::from_millis(20));
    }
    let stray_ran = stray.try_wait().unwrap().is_none();
    let _ = stray.kill();
    let _ = stray.wait();
    assert!(
        !stray_ran,
        "the stray process in the trial's cgroup still runs"
    );
    assert!(!state.exists());
    let left = cgroups_under(&env.cfg.cgroup_parent);
    assert!(
        left.is_empty(),
        "cgroups left: {left:?}\nthe second daemon's log:\n{}",
        std::fs::read_to_string(&d.log).unwrap_or_default()
    );
    drop(d);
    env.assert_no_leaks();
}
