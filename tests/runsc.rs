//! gVisor (`runsc`) as a runtime handler, end to end through the daemon's socket: the pod's
//! netns is made and CNI ADD done before `runsc create`, every container of the pod joins
//! the one sandbox (a server reached from a sibling over localhost), the pod IP is reached
//! from the host, exec/logs/exit codes/stats/stop work, a restarted daemon keeps the pod,
//! and teardown leaves nothing; port-forward and attach go through the streaming server; a
//! config file adds handlers. Skipped (saying why) only where runsc is absent.

mod common;

use std::io::Read;
use std::time::{Duration, Instant};

use common::cri::*;
use common::daemon::{client, Daemon};
use common::*;
use sandboxd::api::v1 as cri;

fn runsc_missing() -> Option<String> {
    match sh_ok("command -v runsc") {
        (true, _) => None,
        _ => Some("runsc is not installed (scripts/setup installs Debian's runsc)".into()),
    }
}

fn run_gvisor_pod(
    rt: &tokio::runtime::Runtime,
    c: &mut Client,
    p: &cri::PodSandboxConfig,
) -> String {
    rt.block_on(c.run_pod_sandbox(cri::RunPodSandboxRequest {
        config: Some(p.clone()),
        runtime_handler: "runsc".into(),
    }))
    .unwrap_or_else(|e| panic!("runsc pod: {e:?}"))
    .into_inner()
    .pod_sandbox_id
}

/// A container with its own PID namespace (what kubelet asks unless the pod shares one).
fn own_pid(name: &str, cmd: &[&str]) -> cri::ContainerConfig {
    ctr(
        name,
        cmd,
        serde_json::json!({"log_path": format!("{name}.log"),
            "linux": {"security_context": {"namespace_options": {"pid": 1}}}}),
    )
}

#[test]
fn gvisor_pod_end_to_end() {
    if let Some(why) = runsc_missing() {
        eprintln!("skipped: {why}");
        return;
    }
    let env = Env::new("runsc");
    let (mut d, rt, mut c) = daemon(&env);
    // The built-in handler is there, next to runc.
    let st = rt
        .block_on(c.status(cri::StatusRequest { verbose: false }))
        .unwrap()
        .into_inner();
    let names: Vec<&str> = st
        .runtime_handlers
        .iter()
        .map(|h| h.name.as_str())
        .collect();
    assert!(
        names.contains(&"runsc") && names.contains(&"runc"),
        "{names:?}"
    );

    let logs = env.base.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let p = pod(
        "gv",
        serde_json::json!({"log_directory": logs.to_string_lossy()}),
    );
    let sb = run_gvisor_pod(&rt, &mut c, &p);
    let ip = rt
        .block_on(c.pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: sb.clone(),
            verbose: false,
        }))
        .unwrap()
        .into_inner()
        .status
        .unwrap()
        .network
        .unwrap()
        .ip;
    assert!(ip.starts_with(&env.subnet_prefix), "{ip}");

    let srv = create(
        &rt,
        &mut c,
        &sb,
        &p,
        own_pid(
            "srv",
            &[
                "sh",
                "-c",
                "echo serving; while true; do echo hello | nc -l -p 8080; done",
            ],
        ),
    )
    .unwrap();
    start(&rt, &mut c, &srv);
    let cli = create(&rt, &mut c, &sb, &p, own_pid("cli", &["sleep", "1000"])).unwrap();
    start(&rt, &mut c, &cli);

    // Inside gVisor, not on the host kernel.
    let version = exec(&rt, &mut c, &cli, "cat /proc/version; dmesg | head -1");
    assert!(version.contains("gVisor"), "{version}");
    // An exec runs as the container's process does: its user, groups, env, cwd and (for a
    // non-root user) no capabilities — not as gVisor's root.
    let user = create(
        &rt,
        &mut c,
        &sb,
        &p,
        ctr(
            "user",
            &["sleep", "1000"],
            serde_json::json!({"working_dir": "/tmp", "envs": [{"key": "MYVAR", "value": "mine"}],
                "linux": {"security_context": {"run_as_user": {"value": 1001},
                    "run_as_group": {"value": 1002}, "namespace_options": {"pid": 1}}}}),
        ),
    )
    .unwrap();
    start(&rt, &mut c, &user);
    let who = exec(
        &rt,
        &mut c,
        &user,
        "id -u; id -g; echo $MYVAR; pwd; grep CapEff /proc/self/status",
    );
    assert_eq!(who, "1001\n1002\nmine\n/tmp\nCapEff:\t0000000000000000\n");
    // The pod's CNI address is the container's.
    let addrs = exec(&rt, &mut c, &cli, "ip addr");
    assert!(addrs.contains(&format!("inet {ip}/24")), "{addrs}");
    // One sandbox: the sibling's server over localhost.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = exec(&rt, &mut c, &cli, "nc 127.0.0.1 8080 </dev/null");
        if got.contains("hello") {
            break;
        }
        assert!(Instant::now() < deadline, "no server over localhost: {got}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // The host reaches the pod IP (the server listens again a moment after each client).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut s = loop {
        match std::net::TcpStream::connect((ip.as_str(), 8080)) {
            Ok(s) => break s,
            Err(e) => assert!(Instant::now() < deadline, "pod IP unreachable: {e}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 6];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"hello\n");
    drop(s);
    // Output reaches the CRI log through the monitor.
    let log = std::fs::read_to_string(logs.join("srv.log")).unwrap();
    assert!(log.contains("stdout F serving"), "{log}");
    // Stats come from the runtime (the container's own cgroup is empty under gVisor).
    let stats = rt
        .block_on(c.container_stats(cri::ContainerStatsRequest {
            container_id: cli.clone(),
        }))
        .unwrap()
        .into_inner()
        .stats
        .unwrap();
    assert!(stats.memory.unwrap().working_set_bytes.unwrap().value > 0);

    // An exit code, learned without polling the runtime.
    let quick = create(
        &rt,
        &mut c,
        &sb,
        &p,
        own_pid("quick", &["sh", "-c", "sleep 0.5; exit 3"]),
    )
    .unwrap();
    start(&rt, &mut c, &quick);
    let deadline = Instant::now() + Duration::from_secs(10);
    while container_status(&rt, &mut c, &quick).state != cri::ContainerState::ContainerExited as i32
    {
        assert!(Instant::now() < deadline, "the exit was never recorded");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(container_status(&rt, &mut c, &quick).exit_code, 3);

    // Stop one container: the others keep running.
    rt.block_on(c.stop_container(cri::StopContainerRequest {
        container_id: srv.clone(),
        timeout: 5,
    }))
    .unwrap();
    assert_eq!(
        container_status(&rt, &mut c, &srv).state,
        cri::ContainerState::ContainerExited as i32
    );
    assert_eq!(
        container_status(&rt, &mut c, &cli).state,
        cri::ContainerState::ContainerRunning as i32
    );

    // A daemon killed and restarted keeps the pod and its running container.
    d.kill9();
    let d2 = Daemon::start(&env);
    let mut c = rt.block_on(client(&d2.socket));
    assert_eq!(
        container_status(&rt, &mut c, &cli).state,
        cri::ContainerState::ContainerRunning as i32
    );
    assert!(exec(&rt, &mut c, &cli, "echo still").contains("still"));

    rt.block_on(c.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: sb.clone(),
    }))
    .unwrap();
    remove_pod(&rt, &mut c, &sb);
    drop(d2);
    env.assert_no_leaks();
    let left = processes_mentioning(&env.base.to_string_lossy());
    assert!(left.is_empty(), "processes left: {left:?}");
}

/// A config file's `[runtimes.NAME]` table adds a handler: the built-in ones stay, and
/// `--print-default-config` shows the merged list.
#[test]
fn a_config_file_adds_handlers_to_the_built_in_ones() {
    let env = Env::new("runsc-cfg");
    let f = env.base.join("extra.toml");
    std::fs::write(
        &f,
        "[runtimes.extra]\npath = \"/usr/sbin/runc\"\nruntime_args = [\"--debug\"]\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .arg("--config")
        .arg(&f)
        .arg("--print-default-config")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut want = vec!["[runtimes.runc]", "[runtimes.crun]", "[runtimes.extra]"];
    if runsc_missing().is_none() {
        want.push("[runtimes.runsc]");
    }
    for t in want {
        assert!(text.contains(t), "{t} missing from:\n{text}");
    }
    assert!(text.contains("default_runtime = \"runc\""), "{text}");
}

/// Through the streaming server for a gVisor pod: port-forward (made inside the pod's netns,
/// where a `--network=host` sandbox listens) and attach to a container's own stdio; the pod
/// reaches its gateway; a runtime error reaches the caller with the step that failed and
/// runsc's own words.
#[test]
fn gvisor_streams_gateway_and_errors() {
    use common::spdy::Client as Spdy;
    if let Some(why) = runsc_missing() {
        eprintln!("skipped: {why}");
        return;
    }
    let env = Env::new("runsc-streams");
    let (_d, rt, mut c) = daemon(&env);
    let p = pod("gvs", serde_json::json!({}));
    let sb = run_gvisor_pod(&rt, &mut c, &p);

    // Port-forward to a server in the pod.
    let srv = create(
        &rt,
        &mut c,
        &sb,
        &p,
        own_pid(
            "srv",
            &["sh", "-c", "while true; do echo pong | nc -l -p 8080; done"],
        ),
    )
    .unwrap();
    start(&rt, &mut c, &srv);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let url = rt
            .block_on(c.port_forward(cri::PortForwardRequest {
                pod_sandbox_id: sb.clone(),
                port: vec![8080],
            }))
            .unwrap()
            .into_inner()
            .url;
        let mut s = Spdy::connect(&url, &["portforward.k8s.io"]).unwrap();
        s.read_timeout(Some(Duration::from_secs(5)));
        let err = s.open(&[
            ("streamtype", "error"),
            ("port", "8080"),
            ("requestid", "0"),
        ]);
        let data = s.open(&[("streamtype", "data"), ("port", "8080"), ("requestid", "0")]);
        s.send(err, b"", true);
        s.send(data, b"ping\n", false);
        s.read_available(Duration::from_secs(2));
        if s.text(data).contains("pong") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no answer through port-forward: {:?} / {:?}",
            s.text(data),
            s.text(err)
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    // Attach to a container's own stdin and stdout.
    let talker = create(
        &rt,
        &mut c,
        &sb,
        &p,
        ctr(
            "talker",
            &["sh", "-c", "read x; echo heard $x; sleep 1000"],
            serde_json::json!({"stdin": true, "stdin_once": true,
                "linux": {"security_context": {"namespace_options": {"pid": 1}}}}),
        ),
    )
    .unwrap();
    start(&rt, &mut c, &talker);
    let url = rt
        .block_on(c.attach(cri::AttachRequest {
            container_id: talker.clone(),
            stdin: true,
            tty: false,
            stdout: true,
            stderr: true,
            ..Default::default()
        }))
        .unwrap()
        .into_inner()
        .url;
    let mut s = Spdy::connect(&url, &["v4.channel.k8s.io"]).unwrap();
    s.read_timeout(Some(Duration::from_secs(10)));
    let _err = s.open(&[("streamtype", "error")]);
    let stdin = s.open(&[("streamtype", "stdin")]);
    let stdout = s.open(&[("streamtype", "stdout")]);
    let _stderr = s.open(&[("streamtype", "stderr")]);
    s.send(stdin, b"you\n", true);
    s.wait_for(stdout, "heard you");
    drop(s);

    // The pod reaches its gateway (the bridge's address on the host, on the test's own
    // subnet).
    let gw = format!("{}1", env.subnet_prefix);
    let listener = std::net::TcpListener::bind((gw.as_str(), 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    // The host side reads what arrives and closes, which ends the pod's nc.
    listener.set_nonblocking(true).unwrap();
    let host = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut conn = loop {
            match listener.accept() {
                Ok((conn, _)) => break conn,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(_) => return "no connection".to_string(),
            }
        };
        conn.set_nonblocking(false).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = String::new();
        let _ = conn.read_to_string(&mut got);
        got
    });
    let out = exec(
        &rt,
        &mut c,
        &srv,
        &format!("echo from-pod | nc {gw} {port}; echo sent"),
    );
    assert!(out.contains("sent"), "{out}");
    let got = host.join().unwrap();
    assert_eq!(got, "from-pod\n");

    // A container whose command does not exist: the error names the step and carries runsc's
    // own message about the command.
    let e = create(
        &rt,
        &mut c,
        &sb,
        &p,
        own_pid("bad", &["/nonexistent-binary"]),
    )
    .and_then(|id| {
        rt.block_on(c.start_container(cri::StartContainerRequest { container_id: id }))
            .map(drop)
    })
    .unwrap_err();
    let msg = e.message();
    assert!(
        (msg.contains("create container") || msg.contains("start container"))
            && msg.contains("/nonexistent-binary"),
        "{msg}"
    );

    remove_pod(&rt, &mut c, &sb);
    env.assert_no_leaks();
}

/// An image volume in a gVisor pod: the gofer serves the read-only image mount the daemon made
/// (detached from the node's namespace after create, like any staged mount).
#[test]
fn gvisor_image_volume() {
    if let Some(why) = runsc_missing() {
        eprintln!("skipped: {why}");
        return;
    }
    let env = Env::new("runsc-imgvol");
    let (_d, rt, mut c) = daemon(&env);
    let p = pod("gv-imgvol", serde_json::json!({}));
    let sb = run_gvisor_pod(&rt, &mut c, &p);
    let mut cfg = own_pid("v", &["sleep", "1000"]);
    cfg.mounts = vec![image_mount("/img", IMAGE, "bin")];
    let id = create(&rt, &mut c, &sb, &p, cfg).unwrap();
    start(&rt, &mut c, &id);
    let out = exec(&rt, &mut c, &id, "ls /img/busybox && touch /img/x 2>&1");
    assert!(out.starts_with("/img/busybox\n"), "{out}");
    assert!(out.contains("Read-only"), "{out}");
    rt.block_on(c.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: sb.clone(),
    }))
    .unwrap();
    env.assert_no_leaks();
}

/// A container asking for every capability starts under gVisor: "ALL" means what its runtime
/// knows (runsc 20221219 refused `CAP_CHECKPOINT_RESTORE`, the host kernel's last), and the
/// container holds the ones gVisor has.
#[test]
fn gvisor_container_with_all_capabilities_starts() {
    if let Some(why) = runsc_missing() {
        eprintln!("skipped: {why}");
        return;
    }
    let env = Env::new("runsc-allcaps");
    let (_d, rt, mut c) = daemon(&env);
    let p = pod("gv-allcaps", serde_json::json!({}));
    let sb = run_gvisor_pod(&rt, &mut c, &p);
    let cfg = ctr(
        "all",
        &["sleep", "1000"],
        serde_json::json!({"log_path": "all.log", "linux": {"security_context": {
            "namespace_options": {"pid": 1},
            "capabilities": {"add_capabilities": ["ALL"]}}}}),
    );
    let id = create(&rt, &mut c, &sb, &p, cfg).unwrap();
    start(&rt, &mut c, &id);
    // CAP_AUDIT_READ (37) is the last bit set. (gVisor holds back CAP_NET_RAW without
    // --net-raw, and this host's root has no CAP_SYS_RESOURCE to hand on.)
    let caps = exec(&rt, &mut c, &id, "grep CapEff /proc/self/status");
    let eff = u64::from_str_radix(caps.split_whitespace().nth(1).unwrap(), 16).unwrap();
    assert!(eff & (1 << 37) != 0 && eff >> 38 == 0, "{caps}");
    assert!(eff & (1 << 21) != 0, "no CAP_SYS_ADMIN: {caps}");
    rt.block_on(c.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: sb.clone(),
    }))
    .unwrap();
    env.assert_no_leaks();
}

/// A recursively read-only volume under gVisor: its submount (a tmpfs) is read-only in the
/// container too — gVisor binds read-only all through by itself, so no staged copy is held
/// in the node's mount namespace — and the volume's owner can unmount the submount and
/// remove the dirs while the container lives (a staged copy kept them busy: the CRI
/// validation suite's cleanup got EBUSY).
#[test]
fn gvisor_recursive_read_only_volume_leaves_the_host_path_free() {
    if let Some(why) = runsc_missing() {
        eprintln!("skipped: {why}");
        return;
    }
    let env = Env::new("runsc-rro");
    let vol = env.base.join("vol");
    std::fs::create_dir_all(vol.join("tmpfs")).unwrap();
    sh(&format!(
        "mount -t tmpfs none {}",
        vol.join("tmpfs").display()
    ));
    let (_d, rt, mut c) = daemon(&env);
    let p = pod("gv-rro", serde_json::json!({}));
    let sb = run_gvisor_pod(&rt, &mut c, &p);
    let mut cfg = own_pid("v", &["sleep", "1000"]);
    cfg.mounts = vec![cri::Mount {
        container_path: "/mnt".into(),
        host_path: vol.display().to_string(),
        readonly: true,
        recursive_read_only: true,
        ..Default::default()
    }];
    let id = create(&rt, &mut c, &sb, &p, cfg).unwrap();
    start(&rt, &mut c, &id);
    let out = exec(&rt, &mut c, &id, "touch /mnt/tmpfs/x 2>&1; echo done");
    assert!(out.contains("Read-only"), "{out}");
    sh(&format!("umount -l {}", vol.join("tmpfs").display()));
    std::fs::remove_dir(vol.join("tmpfs"))
        .expect("the submount's dir is free while the container runs");
    rt.block_on(c.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: sb.clone(),
    }))
    .unwrap();
    env.assert_no_leaks();
}

/// The start-up probe tries runsc like any handler: its trial sandbox (a real gVisor sandbox
/// under ptrace, in a network namespace of its own) is created and deleted, so runsc is
/// offered, and nothing of the trial is left — no runsc process, no state, no dir.
#[test]
fn the_probe_offers_runsc_after_a_trial_sandbox() {
    if let Some(why) = runsc_missing() {
        eprintln!("skipped: {why}");
        return;
    }
    let env = Env::new("runsc-probe");
    let rt = env.runtime();
    let t = Instant::now();
    let probed = rt.wait_probed(Duration::from_secs(120));
    eprintln!("probed in {:?}: {probed:?}", t.elapsed());
    assert_eq!(probed["runsc"], sandboxd::probe::Readiness::Ready);
    assert!(rt.health().handlers.iter().any(|h| h.name == "runsc"));
    assert!(!env.cfg.root.join("probe").exists());
    let base = env.base.display().to_string();
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            (cmd.contains("runsc") && cmd.contains(&base)).then_some(cmd)
        })
        .collect();
    assert!(left.is_empty(), "runsc processes left: {left:?}");
    drop(rt);
    env.assert_no_leaks();
}
