//! NRI through the daemon: a real plugin (the test suite's own, over the protocol's ttrpc and
//! multiplexed socket) connects to the daemon's NRI socket. It sees every lifecycle event in
//! order with names (StopPodSandbox once however often it is called); its adjustments (env, a
//! mount, the cpuset, an annotation, a CDI device) show in the running container; a validator
//! may reject the merged adjustments; a blocked RunPodSandbox hook hides the pod from List; a refused
//! CreateContainer fails cleanly and a retry works; a plugin joining late is sent every pod
//! and container, and its own updates are applied; a hung plugin costs its timeout once and
//! is dropped, a vanished one too;
//! nothing is left behind.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::cri::*;
use common::nri_plugin::{Behavior, TestPlugin};
use common::*;
use sandboxd::api::v1 as cri;
use sandboxd_nri_api::{api, ttrpc};
use std::path::Path;

fn behavior(idx: &str, name: &str) -> Behavior {
    Behavior {
        name: name.into(),
        idx: idx.into(),
        ..Default::default()
    }
}

fn pod_names(rt: &tokio::runtime::Runtime, c: &mut Client) -> Vec<String> {
    rt.block_on(c.list_pod_sandbox(cri::ListPodSandboxRequest { filter: None }))
        .unwrap()
        .into_inner()
        .items
        .into_iter()
        .map(|p| p.metadata.unwrap().name)
        .collect()
}

fn container_ids(rt: &tokio::runtime::Runtime, c: &mut Client) -> Vec<String> {
    rt.block_on(c.list_containers(cri::ListContainersRequest { filter: None }))
        .unwrap()
        .into_inner()
        .containers
        .into_iter()
        .map(|c| c.id)
        .collect()
}

/// The plugins verbose Status lists.
fn plugins(rt: &tokio::runtime::Runtime, c: &mut Client) -> Vec<String> {
    let info = rt
        .block_on(c.status(cri::StatusRequest { verbose: true }))
        .unwrap()
        .into_inner()
        .info;
    let nri: serde_json::Value = serde_json::from_str(&info["nri"]).unwrap();
    nri["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn events_in_order_and_adjustments_show_in_the_container() {
    let env = Env::new("nri-adjust");
    let data = env.base.join("nri-data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("marker"), "from the plugin's mount\n").unwrap();
    let (_d, rt, mut c) = daemon(&env);
    let adjust = api::ContainerAdjustment {
        annotations: HashMap::from([("nri.test/adjusted".to_string(), "yes".to_string())]),
        env: vec![api::KeyValue {
            key: "NRI_ADJUSTED".into(),
            value: "yes".into(),
        }],
        mounts: vec![api::Mount {
            destination: "/nri-data".into(),
            r#type: "bind".into(),
            source: data.display().to_string(),
            options: vec!["rbind".into(), "ro".into()],
        }],
        linux: Some(api::LinuxContainerAdjustment {
            resources: Some(api::LinuxResources {
                cpu: Some(api::LinuxCpu {
                    cpus: "0".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    // A CDI device the plugin asks for, through the node's CDI registry.
    let cdi = env.base.join("cdi");
    std::fs::create_dir_all(&cdi).unwrap();
    std::fs::write(
        cdi.join("nri-test.json"),
        serde_json::json!({
            "cdiVersion": "0.6.0",
            "kind": "sandboxd.test/nri",
            "devices": [{"name": "zero", "containerEdits": {
                "deviceNodes": [{"path": "/dev/nri-zero", "hostPath": "/dev/zero"}],
                "env": ["FROM_CDI=1"]}}]
        })
        .to_string(),
    )
    .unwrap();
    let mut adjust = adjust;
    adjust.cdi_devices = vec![api::CdiDevice {
        name: "sandboxd.test/nri=zero".into(),
    }];
    let plugin = TestPlugin::connect(
        &env.cfg.nri.socket_path,
        Behavior {
            adjust: Some(adjust),
            ..behavior("10", "adjust")
        },
    );
    assert_eq!(plugins(&rt, &mut c), ["10-adjust"]);
    let p = pod("nri", serde_json::json!({}));
    let sb = run_pod(&rt, &mut c, &p);
    let id = create(
        &rt,
        &mut c,
        &sb,
        &p,
        ctr("work", &["sleep", "1000"], serde_json::json!({})),
    )
    .unwrap();
    start(&rt, &mut c, &id);
    let out = exec(
        &rt,
        &mut c,
        &id,
        "echo env=$NRI_ADJUSTED cdi=$FROM_CDI; cat /nri-data/marker; touch /nri-data/x 2>/dev/null || echo read-only; grep Cpus_allowed_list /proc/self/status; head -c 2 /dev/nri-zero | od -An -tx1",
    );
    for want in [
        "env=yes cdi=1",
        "from the plugin's mount",
        "read-only",
        "Cpus_allowed_list:\t0\n",
        "00 00",
    ] {
        assert!(out.contains(want), "{want:?} not in:\n{out}");
    }
    let spec: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            env.cfg
                .root
                .join("containers")
                .join(&id)
                .join("config.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(spec["annotations"]["nri.test/adjusted"], "yes");
    rt.block_on(
        c.update_container_resources(cri::UpdateContainerResourcesRequest {
            container_id: id.clone(),
            linux: Some(cri::LinuxContainerResources {
                memory_limit_in_bytes: 200 << 20,
                ..Default::default()
            }),
            ..Default::default()
        }),
    )
    .unwrap();
    rt.block_on(c.stop_container(cri::StopContainerRequest {
        container_id: id.clone(),
        timeout: 0,
    }))
    .unwrap();
    // StopPodSandbox twice: one event.
    for _ in 0..2 {
        rt.block_on(c.stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: sb.clone(),
        }))
        .unwrap();
    }
    remove_pod(&rt, &mut c, &sb);
    plugin.wait_for("REMOVE_POD_SANDBOX nri");
    assert_eq!(
        plugin.events(),
        [
            "RUN_POD_SANDBOX nri",
            "CREATE_CONTAINER work",
            "VALIDATE work env=NRI_ADJUSTED plugins=10-adjust",
            "POST_CREATE_CONTAINER work",
            "START_CONTAINER work",
            "POST_START_CONTAINER work",
            "UPDATE_CONTAINER work",
            "POST_UPDATE_CONTAINER work",
            "STOP_CONTAINER work",
            "STOP_POD_SANDBOX nri",
            "REMOVE_CONTAINER work",
            "REMOVE_POD_SANDBOX nri",
        ]
    );
    // A plugin sees what it set in every later event (the container as adjusted, not as
    // asked), and RemovePodSandbox still names the pod's old network namespace.
    let details = plugin.details();
    for e in [
        "POST_CREATE_CONTAINER",
        "START_CONTAINER",
        "REMOVE_CONTAINER",
    ] {
        assert!(
            details
                .iter()
                .any(|d| d.starts_with(&format!("{e} work ")) && d.contains(" adjusted=true ")),
            "{e}: {details:?}"
        );
    }
    let netns = env.cfg.netns_dir.display().to_string();
    assert!(
        details
            .iter()
            .any(|d| d.starts_with("REMOVE_POD_SANDBOX nri netns=") && d.contains(&netns)),
        "{details:?}"
    );
    env.assert_no_leaks();
}

#[test]
fn a_blocked_hook_hides_the_pod_and_a_refusal_fails_cleanly_then_a_retry_works() {
    let env = Env::new("nri-block");
    let (_d, rt, mut c) = daemon(&env);
    let plugin = TestPlugin::connect(
        &env.cfg.nri.socket_path,
        Behavior {
            block: Some("RUN_POD_SANDBOX"),
            fail: Some(("CREATE_CONTAINER", 1)),
            ..behavior("20", "gate")
        },
    );
    let p = pod("gated", serde_json::json!({}));
    let mut c2 = c.clone();
    let req = cri::RunPodSandboxRequest {
        config: Some(p.clone()),
        runtime_handler: String::new(),
    };
    let running = rt.spawn(async move { c2.run_pod_sandbox(req).await });
    plugin.wait_for("RUN_POD_SANDBOX gated");
    // While the hook runs the pod is nobody's to see, and not ready: CreateContainer by the
    // id the plugin was given is refused at once (it used to wait for the hook and succeed).
    assert!(pod_names(&rt, &mut c).is_empty());
    let hooked = plugin
        .details()
        .iter()
        .find_map(|d| d.strip_prefix("RUN_POD_SANDBOX gated ").map(String::from))
        .and_then(|d| d.rsplit(" pod=").next().map(String::from))
        .unwrap();
    let t = Instant::now();
    let e = create(
        &rt,
        &mut c,
        &hooked,
        &p,
        ctr("early", &["sleep", "1"], serde_json::json!({})),
    )
    .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    plugin.release();
    let sb = rt
        .block_on(running)
        .unwrap()
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    assert_eq!(pod_names(&rt, &mut c), ["gated"]);

    // Refused once: CreateContainer fails with the plugin's word, nothing is left, and the
    // retry works.
    let cfg = ctr("work", &["sleep", "1000"], serde_json::json!({}));
    let e = create(&rt, &mut c, &sb, &p, cfg.clone()).unwrap_err();
    assert!(
        e.message()
            .contains("test plugin gate refuses CREATE_CONTAINER"),
        "{e:?}"
    );
    assert!(container_ids(&rt, &mut c).is_empty());
    assert!(list_names(&env.cfg.root.join("containers")).is_empty());
    let id = create(&rt, &mut c, &sb, &p, cfg).unwrap();
    start(&rt, &mut c, &id);
    assert_eq!(container_ids(&rt, &mut c), std::slice::from_ref(&id));
    remove_pod(&rt, &mut c, &sb);
    let ev = plugin.events();
    // The refused creation got no other event; the retried one the whole life.
    assert_eq!(
        ev.iter()
            .filter(|e| e.ends_with(" work"))
            .map(String::as_str)
            .collect::<Vec<_>>(),
        [
            "CREATE_CONTAINER work",
            "CREATE_CONTAINER work",
            "POST_CREATE_CONTAINER work",
            "START_CONTAINER work",
            "POST_START_CONTAINER work",
            "STOP_CONTAINER work",
            "REMOVE_CONTAINER work",
        ]
    );
    env.assert_no_leaks();
}

#[test]
fn a_late_plugin_is_sent_every_pod_and_container() {
    let env = Env::new("nri-sync");
    let (_d, rt, mut c) = daemon(&env);
    let p = pod("early", serde_json::json!({}));
    let sb = run_pod(&rt, &mut c, &p);
    sleeper(&rt, &mut c, &sb, &p, "first");
    let plugin = TestPlugin::connect(&env.cfg.nri.socket_path, behavior("30", "late"));
    assert_eq!(
        plugin.synced(),
        (vec!["early".to_string()], vec!["first".to_string()])
    );
    // And what comes after, as events.
    let second = sleeper(&rt, &mut c, &sb, &p, "second");
    plugin.wait_for("POST_START_CONTAINER second");
    // An update the plugin sends on its own is applied (and an unknown container's fails).
    assert!(plugin.update_memory(&second, 96 << 20).is_empty());
    let res = container_status(&rt, &mut c, &second).resources.unwrap();
    assert_eq!(res.linux.unwrap().memory_limit_in_bytes, 96 << 20);
    assert_eq!(plugin.update_memory("no-such-container", 96 << 20).len(), 1);
    // A pod resize: UpdatePodSandbox with the new resources, then PostUpdatePodSandbox.
    rt.block_on(
        c.update_pod_sandbox_resources(cri::UpdatePodSandboxResourcesRequest {
            pod_sandbox_id: sb.clone(),
            overhead: None,
            resources: Some(cri::LinuxContainerResources {
                memory_limit_in_bytes: 512 << 20,
                ..Default::default()
            }),
        }),
    )
    .unwrap();
    plugin.wait_for("POST_UPDATE_POD_SANDBOX early");
    let ev = plugin.events();
    let at = |e: &str| {
        ev.iter()
            .position(|x| x == e)
            .unwrap_or_else(|| panic!("{e:?} not in {ev:?}"))
    };
    assert!(
        at(&format!("UPDATE_POD_SANDBOX early memory={}", 512 << 20))
            < at("POST_UPDATE_POD_SANDBOX early")
    );
    remove_pod(&rt, &mut c, &sb);
    env.assert_no_leaks();
}

#[test]
fn a_hung_or_vanished_plugin_costs_its_timeout_once_and_is_dropped() {
    let env = Env::new("nri-hung");
    let mut cfg = env.cfg.clone();
    cfg.nri.plugin_request_timeout = Duration::from_secs(1);
    let (_d, rt, mut c) = daemon_with(&env, &cfg);
    let hung = TestPlugin::connect(
        &env.cfg.nri.socket_path,
        Behavior {
            hang: Some("CREATE_CONTAINER"),
            ..behavior("40", "hung")
        },
    );
    let gone = TestPlugin::connect(&env.cfg.nri.socket_path, behavior("50", "gone"));
    assert_eq!(plugins(&rt, &mut c), ["40-hung", "50-gone"]);
    let p = pod("patient", serde_json::json!({}));
    let sb = run_pod(&rt, &mut c, &p);
    let t = Instant::now();
    let id = create(
        &rt,
        &mut c,
        &sb,
        &p,
        ctr("work", &["sleep", "1000"], serde_json::json!({})),
    )
    .unwrap();
    let took = t.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert_eq!(plugins(&rt, &mut c), ["50-gone"]);
    // The other plugin disappears (its process dies): the next event drops it.
    drop(gone);
    start(&rt, &mut c, &id);
    let t = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !plugins(&rt, &mut c).is_empty() {
        assert!(Instant::now() < deadline, "{:?}", plugins(&rt, &mut c));
        let q = pod(
            &format!("probe-{}", t.elapsed().as_millis()),
            serde_json::json!({}),
        );
        let s = run_pod(&rt, &mut c, &q);
        remove_pod(&rt, &mut c, &s);
    }
    // With no plugin, pods are as quick as ever.
    let t = Instant::now();
    let q = pod("after", serde_json::json!({}));
    let s = run_pod(&rt, &mut c, &q);
    remove_pod(&rt, &mut c, &s);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    remove_pod(&rt, &mut c, &sb);
    drop(hung);
    env.assert_no_leaks();
}

/// A plugin in `plugin_path` (`NN-name`, here the project's `sandboxd-nri-logger`) is started
/// by the daemon with its config file, registered under its file's name, adjusts containers,
/// and goes when the daemon does (its socket closes: it ends; nothing is left).
#[test]
fn a_preinstalled_plugin_is_started_configured_and_gone_with_the_daemon() {
    let env = Env::new("nri-pre");
    let events = env.base.join("nri-events");
    std::fs::create_dir_all(&env.cfg.nri.plugin_path).unwrap();
    std::fs::create_dir_all(&env.cfg.nri.plugin_config_path).unwrap();
    let exe = env.cfg.nri.plugin_path.join("05-logger");
    std::fs::copy(env!("CARGO_BIN_EXE_sandboxd-nri-logger"), &exe).unwrap();
    // Not NN-name, or not executable: not started.
    std::fs::write(env.cfg.nri.plugin_path.join("logger"), "#!/bin/sh\n").unwrap();
    std::fs::write(
        env.cfg.nri.plugin_config_path.join("logger.conf"),
        serde_json::json!({"events_file": events, "env": {"FROM_LOGGER": "1"}}).to_string(),
    )
    .unwrap();
    let (d, rt, mut c) = daemon(&env);
    let deadline = Instant::now() + Duration::from_secs(10);
    while plugins(&rt, &mut c) != ["05-logger"] {
        assert!(Instant::now() < deadline, "{:?}", plugins(&rt, &mut c));
        std::thread::sleep(Duration::from_millis(50));
    }
    let p = pod("pre", serde_json::json!({}));
    let sb = run_pod(&rt, &mut c, &p);
    let id = sleeper(&rt, &mut c, &sb, &p, "work");
    assert_eq!(exec(&rt, &mut c, &id, "echo from=$FROM_LOGGER"), "from=1\n");
    remove_pod(&rt, &mut c, &sb);
    let log = std::fs::read_to_string(&events).unwrap();
    assert!(log.starts_with("CONFIGURE sandboxd "), "{log}");
    for want in [
        "SYNCHRONIZE 0 pods 0 containers",
        "RUN_POD_SANDBOX pre",
        "CREATE_CONTAINER work",
        "START_CONTAINER work",
        "STOP_CONTAINER work",
        "REMOVE_POD_SANDBOX pre",
    ] {
        assert!(log.contains(want), "{want:?} not in:\n{log}");
    }
    let needle = exe.display().to_string();
    assert_eq!(processes_mentioning(&needle).len(), 1);
    drop(d);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !processes_mentioning(&needle).is_empty() {
        assert!(
            Instant::now() < deadline,
            "{:?}",
            processes_mentioning(&needle)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    env.assert_no_leaks();
}

/// A container created while a plugin is being synchronized waits for the sync and then
/// reaches the plugin as an event: nothing created meanwhile is missed.
#[test]
fn a_container_created_during_a_plugins_sync_is_not_missed() {
    let env = Env::new("nri-syncrace");
    // The default limits: a Synchronize held past the request limit (2 s) but within the
    // registration's (5 s), as the CRI validation suite holds it, still joins the plugin.
    let (_d, rt, mut c) = daemon(&env);
    let p = pod("racing", serde_json::json!({}));
    let sb = run_pod(&rt, &mut c, &p);
    let plugin = TestPlugin::connect(
        &env.cfg.nri.socket_path,
        Behavior {
            block: Some("SYNCHRONIZE"),
            ..behavior("60", "slow-sync")
        },
    );
    let mut c2 = c.clone();
    let req = cri::CreateContainerRequest {
        pod_sandbox_id: sb.clone(),
        config: Some(ctr("during", &["sleep", "1000"], serde_json::json!({}))),
        sandbox_config: Some(p.clone()),
    };
    let creating = rt.spawn(async move { c2.create_container(req).await });
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !creating.is_finished(),
        "created while the plugin synchronizes"
    );
    std::thread::sleep(Duration::from_millis(2500));
    plugin.release();
    rt.block_on(creating).unwrap().unwrap();
    plugin.wait_for("CREATE_CONTAINER during");
    assert_eq!(plugin.synced(), (vec!["racing".to_string()], vec![]));
    remove_pod(&rt, &mut c, &sb);
    env.assert_no_leaks();
}

/// A validator (a policy plugin) sees every plugin's adjustments merged and may reject them:
/// the creation fails with its reason and leaves nothing; without it the retry works.
#[test]
fn a_validator_rejects_the_adjustments_and_nothing_is_left() {
    let env = Env::new("nri-validate");
    let (_d, rt, mut c) = daemon(&env);
    let adjuster = TestPlugin::connect(
        &env.cfg.nri.socket_path,
        Behavior {
            adjust: Some(api::ContainerAdjustment {
                env: vec![api::KeyValue {
                    key: "INJECTED".into(),
                    value: "1".into(),
                }],
                ..Default::default()
            }),
            events: sandboxd_nri_api::event_bit(api::Event::CreateContainer),
            ..behavior("10", "adjuster")
        },
    );
    let policy = TestPlugin::connect(
        &env.cfg.nri.socket_path,
        Behavior {
            reject: true,
            events: sandboxd_nri_api::event_bit(api::Event::ValidateContainerAdjustment),
            ..behavior("90", "policy")
        },
    );
    let p = pod("validated", serde_json::json!({}));
    let sb = run_pod(&rt, &mut c, &p);
    let cfg = ctr("work", &["sleep", "1000"], serde_json::json!({}));
    let e = create(&rt, &mut c, &sb, &p, cfg.clone()).unwrap_err();
    assert!(
        e.message().contains("NRI validator 90-policy rejected")
            && e.message().contains("test policy policy says no"),
        "{e:?}"
    );
    assert_eq!(
        policy.events(),
        ["VALIDATE work env=INJECTED plugins=10-adjuster"]
    );
    assert!(container_ids(&rt, &mut c).is_empty());
    assert!(list_names(&env.cfg.root.join("containers")).is_empty());
    drop(policy);
    // The validator is gone (its socket closed): the next creation drops it and succeeds.
    let id = create(&rt, &mut c, &sb, &p, cfg).unwrap();
    start(&rt, &mut c, &id);
    assert_eq!(exec(&rt, &mut c, &id, "echo $INJECTED"), "1\n");
    drop(adjuster);
    remove_pod(&rt, &mut c, &sb);
    env.assert_no_leaks();
}

/// A plugin that restarts faster than a failed write could tell us connects again with the
/// same name and index while its old connection is still listed: the newcomer takes its
/// place (NRI's reference runtime does so), the old one is closed, and events reach only the
/// new one.
#[test]
fn a_plugin_reconnecting_with_its_name_and_index_replaces_the_old_one() {
    let env = Env::new("nri-reconnect");
    let (_d, rt, mut c) = daemon(&env);
    let old = TestPlugin::connect(&env.cfg.nri.socket_path, behavior("40", "again"));
    assert_eq!(plugins(&rt, &mut c), ["40-again"]);
    let new = TestPlugin::connect(&env.cfg.nri.socket_path, behavior("40", "again"));
    assert_eq!(plugins(&rt, &mut c), ["40-again"]);
    let p = pod("again", serde_json::json!({}));
    let sb = run_pod(&rt, &mut c, &p);
    new.wait_for("RUN_POD_SANDBOX again");
    assert!(
        !old.events()
            .iter()
            .any(|e| e.starts_with("RUN_POD_SANDBOX")),
        "the replaced connection still gets events: {:?}",
        old.events()
    );
    remove_pod(&rt, &mut c, &sb);
    env.assert_no_leaks();
}

/// The NRI socket's dir (issue 36): one that exists is the host's and keeps its mode (a
/// socket directly under a 0755 dir such as `/run` left it 0755); one others can write in is
/// refused (NRI off, the CRI served, the dir untouched); dirs the daemon makes are 0700 and
/// go with the socket at a clean shutdown, which leaves no socket behind.
#[test]
fn the_sockets_dir_is_never_chmodded_and_the_socket_goes_at_shutdown() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new("nri-sockdir");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    let host = env.base.join("host-run");
    std::fs::create_dir(&host).unwrap();
    std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o755)).unwrap();
    let open = env.base.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let cases = [
        (host.join("nri.sock"), true),
        (open.join("nri.sock"), false),
        (env.base.join("made/by/us/nri.sock"), true),
    ];
    for (sock, serves) in cases {
        let mut cfg = env.cfg.clone();
        cfg.nri.socket_path = sock.clone();
        let mut d = daemon::Daemon::start_with(&env, &cfg);
        let rt = daemon::rt();
        let deadline = Instant::now() + Duration::from_secs(10);
        while serves && !sock.exists() {
            assert!(Instant::now() < deadline, "no socket at {}", sock.display());
            std::thread::sleep(Duration::from_millis(20));
        }
        if serves {
            assert_eq!(mode(&sock), 0o600);
            assert_eq!(
                mode(sock.parent().unwrap()),
                if sock.starts_with(&host) {
                    0o755
                } else {
                    0o700
                }
            );
            let plugin = TestPlugin::connect(&sock, behavior("10", "here"));
            drop(plugin);
        } else {
            // The CRI is served; NRI is not, and says why in the log.
            let mut client = rt.block_on(daemon::client(&d.socket));
            rt.block_on(client.version(cri::VersionRequest::default()))
                .unwrap();
            assert!(!sock.exists());
            let log = std::fs::read_to_string(&d.log).unwrap();
            assert!(log.contains("writable by others than root"), "{log}");
        }
        assert_eq!(d.sigterm().code(), Some(0));
        assert!(
            !sock.exists(),
            "{} left after a clean shutdown",
            sock.display()
        );
        assert_eq!(mode(&host), 0o755);
        assert_eq!(mode(&open), 0o1777);
        assert!(
            !env.base.join("made").exists(),
            "the dirs made for the socket stay"
        );
    }
    env.assert_no_leaks();
}

/// The cgroup v1 `cpu.shares` of the container whose process is `pid` (this host's layout).
fn cpu_shares_of(pid: &str) -> Option<String> {
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let line = cg.lines().find(|l| {
        l.split(':')
            .nth(1)
            .is_some_and(|c| c.split(',').any(|x| x == "cpu"))
    })?;
    let (ctls, path) = line.split_once(':')?.1.split_once(':')?;
    let mount = Path::new("/sys/fs/cgroup").join(ctls);
    let mount = if mount.exists() {
        mount
    } else {
        Path::new("/sys/fs/cgroup/cpu").to_path_buf()
    };
    std::fs::read_to_string(mount.join(path.trim_start_matches('/')).join("cpu.shares")).ok()
}

/// A plugin's own updates (UpdateContainers, issue 36) are checked as CreateContainer's
/// resources are (out of range or a core cgroup file: refused before anything is written);
/// one request of a plugin is applied at a time and one more meanwhile is refused at once,
/// so 64 at once cannot fill the daemon's memory; what a plugin that went still had queued
/// is dropped; and its evictions cannot flood the node's log.
#[test]
fn a_plugins_own_updates_are_checked_bounded_and_dropped_with_it() {
    let env = Env::new("nri-updates");
    let (d, rt, mut c) = daemon(&env);
    let plugin = TestPlugin::connect(&env.cfg.nri.socket_path, behavior("10", "updater"));
    let p = pod("upd", serde_json::json!({}));
    let sb = run_pod(&rt, &mut c, &p);
    let id = sleeper(&rt, &mut c, &sb, &p, "target");
    let info = rt
        .block_on(c.container_status(cri::ContainerStatusRequest {
            container_id: id.clone(),
            verbose: true,
        }))
        .unwrap()
        .into_inner()
        .info;
    let pid = serde_json::from_str::<serde_json::Value>(&info["info"]).unwrap()["pid"].to_string();
    let before = cpu_shares_of(&pid);
    let update = |res: api::LinuxResources| api::ContainerUpdate {
        container_id: id.clone(),
        linux: Some(api::LinuxContainerUpdate {
            resources: Some(res),
        }),
        ignore_failure: false,
    };
    let shares = |v: u64| api::LinuxResources {
        cpu: Some(api::LinuxCpu {
            shares: Some(api::OptionalUInt64 { value: v }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let procs = api::LinuxResources {
        unified: HashMap::from([("cgroup.procs".to_string(), "1".to_string())]),
        ..Default::default()
    };
    for bad in [shares(i64::MAX as u64), procs] {
        let r = plugin
            .update(api::UpdateContainersRequest {
                update: vec![update(bad)],
                evict: vec![],
            })
            .unwrap();
        assert_eq!(r.failed.len(), 1, "{r:?}");
    }
    assert!(before.is_some());
    assert_eq!(cpu_shares_of(&pid), before, "a refused update was written");
    let log = std::fs::read_to_string(&d.log).unwrap();
    assert!(log.contains("outside the kernel's"), "{log}");

    // One request of 1,024 real updates is applied (a runtime call each) while 63 more
    // arrive: those are refused at once, and the daemon's memory stays put.
    let long = api::UpdateContainersRequest {
        update: (0..1024u64)
            .map(|i| update(shares(1024 + (i % 2) * 2)))
            .collect(),
        evict: vec![],
    };
    let rss = d.status_kib("VmRSS");
    plugin.send_update(long.clone());
    std::thread::sleep(Duration::from_millis(200));
    let answers = plugin.updates_at_once(vec![long; 63]);
    let busy = answers
        .iter()
        .filter(|a| matches!(a, Err(ttrpc::Error::RpcStatus(s)) if s.code == ttrpc::Code::RESOURCE_EXHAUSTED as i32))
        .count();
    assert_eq!(busy, 63, "{:?}", answers.iter().find(|a| a.is_ok()));
    let grown = d.status_kib("VmRSS").saturating_sub(rss);
    assert!(grown < 64 << 10, "the daemon grew by {grown} KiB");
    // The plugin goes: what it had left is dropped, not applied for seconds more.
    drop(plugin);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = std::fs::read_to_string(&d.log).unwrap();
        if log.contains("NRI plugin gone: the rest of its updates dropped") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the gone plugin's updates went on"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // 10 × 1,024 evictions of containers that do not exist: a bounded number of lines.
    let evictor = TestPlugin::connect(&env.cfg.nri.socket_path, behavior("20", "evictor"));
    for round in 0..10 {
        let r = evictor
            .update(api::UpdateContainersRequest {
                update: vec![],
                evict: (0..1024)
                    .map(|i| api::ContainerEviction {
                        container_id: format!("gone-{round}-{i}"),
                        reason: "x".repeat(200),
                    })
                    .collect(),
            })
            .unwrap();
        assert!(r.failed.is_empty());
    }
    let log = std::fs::read_to_string(&d.log).unwrap();
    let lines = log.lines().filter(|l| l.contains("20-evictor")).count();
    assert!(
        lines <= 25,
        "{lines} log lines for the evictor's 10,240 evictions"
    );
    drop(evictor);
    remove_pod(&rt, &mut c, &sb);
    env.assert_no_leaks();
}
