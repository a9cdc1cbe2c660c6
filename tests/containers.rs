//! Application containers for real: a busybox image the test builds and imports, overlay
//! rootfs, runc under the monitor, CRI logs, exit codes and reasons, stop grace, ExecSync,
//! security context, pod networking on localhost, restart with running containers.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use sandboxd::{ContainerConfig, ContainerState, Error, Runtime};

const IMAGE: &str = "sandboxd.test/busybox:latest";

fn setup(env: &Env) -> Runtime {
    let rt = env.runtime();
    let layout = busybox::oci_layout(&env.base, IMAGE);
    rt.images().import(&layout, None).unwrap();
    rt
}

fn pod(env: &Env, name: &str, shared_pid: bool) -> sandboxd::PodSandboxConfig {
    let mut p = env.pod(name, shared_pid);
    p.log_directory = env.base.join("logs").join(name).to_string_lossy().into();
    p
}

fn ctr(name: &str, script: &str) -> ContainerConfig {
    ContainerConfig {
        metadata: sandboxd::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        },
        image: IMAGE.into(),
        command: vec!["sh".into(), "-c".into(), script.into()],
        log_path: format!("{name}/0.log"),
        ..Default::default()
    }
}

fn run(rt: &Runtime, sandbox: &str, c: &ContainerConfig) -> String {
    let id = rt.create_container(sandbox, c).unwrap();
    rt.start_container(&id).unwrap();
    id
}

fn wait_exited(rt: &Runtime, id: &str) -> sandboxd::ContainerRecord {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = rt.container_status(id).unwrap();
        if s.state == ContainerState::Exited {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "container {id} still {:?}",
            s.state
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn runc_state(env: &Env, id: &str) -> (bool, String) {
    sh_ok(&format!(
        "runc --root {} state {id}",
        env.runtime_root("runc").display()
    ))
}

/// The `(stream, tag, text)` of every CRI log line; panics on a malformed line.
fn log_entries(path: &Path) -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|l| {
            let mut f = l.splitn(4, ' ');
            let ts = f.next().unwrap();
            assert!(
                ts.len() >= 20 && ts.as_bytes()[4] == b'-' && ts.as_bytes()[10] == b'T',
                "bad timestamp in {l:?}"
            );
            assert!(ts.ends_with('Z') || ts[19..].contains(['+', '-']), "{l:?}");
            let stream = f.next().unwrap().to_string();
            let tag = f.next().unwrap().to_string();
            assert!(stream == "stdout" || stream == "stderr", "{l:?}");
            assert!(tag == "F" || tag == "P", "{l:?}");
            (stream, tag, f.next().unwrap_or("").to_string())
        })
        .collect()
}

fn log_of(rt: &Runtime, id: &str) -> PathBuf {
    rt.container_record(id).unwrap().log_path.unwrap()
}

fn exec(rt: &Runtime, id: &str, script: &str) -> sandboxd::ExecResult {
    rt.exec_sync(
        id,
        &["sh".into(), "-c".into(), script.into()],
        Duration::from_secs(10),
    )
    .unwrap()
}

#[test]
fn logs_exit_codes_and_removal() {
    let env = Env::new("ctr-logs");
    let rt = setup(&env);
    let sb = rt.run_pod_sandbox(&pod(&env, "logs", false)).unwrap();

    let c = ctr("talk", "echo hello; echo oops >&2; printf partial; exit 3");
    let id = rt.create_container(&sb, &c).unwrap();
    let rec = rt.container_status(&id).unwrap();
    assert_eq!(rec.state, ContainerState::Created);
    assert_eq!(mountinfo_fs(&rec.rootfs()).as_deref(), Some("overlay"));
    assert!(runc_state(&env, &id).1.contains("\"created\""));
    rt.start_container(&id).unwrap();
    let done = wait_exited(&rt, &id);
    assert_eq!((done.exit_code, done.reason.as_str()), (3, "Error"));
    assert!(done.finished_at >= done.started_at && done.started_at >= done.created_at);
    // finished_at is the monitor's reap time from the exit file, to the nanosecond (not the
    // file's mtime: written after the output's drain, and tick-coarse).
    let exit_file = rt.container_record(&id).unwrap().dir.join("exit");
    let exit: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&exit_file).unwrap()).unwrap();
    let exited_at =
        sandboxd_shim_common::time::parse_rfc3339_nano(exit["exited_at"].as_str().unwrap());
    assert_eq!(Some(done.finished_at), exited_at, "{exit}");
    let log = log_of(&rt, &id);
    assert!(log.starts_with(env.base.join("logs/logs")));
    let entries = log_entries(&log);
    assert!(
        entries.contains(&("stdout".into(), "F".into(), "hello".into())),
        "{entries:?}"
    );
    assert!(
        entries.contains(&("stderr".into(), "F".into(), "oops".into())),
        "{entries:?}"
    );
    // The last line had no newline: a partial entry (`P`), as the peers write it, so a
    // reader adds none.
    assert!(
        entries.contains(&("stdout".into(), "P".into(), "partial".into())),
        "{entries:?}"
    );

    // A line longer than the monitor's 16 KiB entry limit is split into partial entries.
    let long = run(
        &rt,
        &sb,
        &ctr("long", "head -c 40000 /dev/zero | tr '\\0' x; echo"),
    );
    wait_exited(&rt, &long);
    let entries = log_entries(&log_of(&rt, &long));
    let tags: Vec<&str> = entries.iter().map(|(_, t, _)| t.as_str()).collect();
    assert_eq!(tags, ["P", "P", "F"], "{tags:?}");
    let joined: String = entries.iter().map(|(_, _, t)| t.as_str()).collect();
    assert_eq!(joined, "x".repeat(40000));

    let ok = run(&rt, &sb, &ctr("fine", "exit 0"));
    let done = wait_exited(&rt, &ok);
    assert_eq!((done.exit_code, done.reason.as_str()), (0, "Completed"));

    // The name is held until the container is removed.
    let e = rt.create_container(&sb, &c).unwrap_err();
    assert!(matches!(e, Error::NameReserved { .. }), "{e}");
    let rootfs = rec.rootfs();
    rt.remove_container(&id).unwrap();
    rt.remove_container(&id).unwrap(); // idempotent
    assert!(mountinfo_fs(&rootfs).is_none(), "rootfs still mounted");
    assert!(!rec.dir.exists(), "container dir left");
    assert!(!log.exists(), "log left");
    let (ok_state, msg) = runc_state(&env, &id);
    assert!(!ok_state && msg.contains("does not exist"), "{msg}");
    assert!(matches!(
        rt.container_status(&id),
        Err(Error::NotFound { .. })
    ));
    let again = rt.create_container(&sb, &c).unwrap();
    assert_ne!(again, id);

    // Removing the pod removes its containers, created or exited.
    rt.remove_pod_sandbox(&sb).unwrap();
    assert!(rt.list_containers(&Default::default()).is_empty());
    env.assert_no_leaks();
}

#[test]
fn stop_signal_grace_and_kill() {
    let env = Env::new("ctr-stop");
    let rt = setup(&env);
    let sb = rt.run_pod_sandbox(&pod(&env, "stop", false)).unwrap();
    let polite = run(
        &rt,
        &sb,
        &ctr(
            "polite",
            "trap 'echo got-term; exit 0' TERM; echo ready; while :; do sleep 0.1; done",
        ),
    );
    let stubborn = run(
        &rt,
        &sb,
        &ctr(
            "stubborn",
            "trap '' TERM; echo ready; while :; do sleep 0.1; done",
        ),
    );
    for id in [&polite, &stubborn] {
        let log = log_of(&rt, id);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("ready")
        {
            assert!(Instant::now() < deadline, "{id} never got ready");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    rt.stop_container(&polite, Duration::from_secs(30)).unwrap();
    let s = rt.container_status(&polite).unwrap();
    assert_eq!((s.state, s.exit_code), (ContainerState::Exited, 0));
    assert!(std::fs::read_to_string(log_of(&rt, &polite))
        .unwrap()
        .contains("got-term"));

    let t = Instant::now();
    rt.stop_container(&stubborn, Duration::from_secs(1))
        .unwrap();
    assert!(
        t.elapsed() >= Duration::from_secs(1),
        "killed before the grace period"
    );
    let s = rt.container_status(&stubborn).unwrap();
    assert_eq!((s.state, s.exit_code), (ContainerState::Exited, 137));
    // 137 from the monitor's exit file, not the fallback for a monitor that died.
    assert!(s.message.is_empty(), "{s:?}");
    assert!(runc_state(&env, &stubborn).1.contains("\"stopped\""));
    rt.stop_container(&stubborn, Duration::from_secs(1))
        .unwrap(); // idempotent

    // Timeout 0 kills at once.
    let now = run(
        &rt,
        &sb,
        &ctr("now", "trap 'exit 0' TERM; while :; do sleep 0.1; done"),
    );
    rt.stop_container(&now, Duration::ZERO).unwrap();
    let s = rt.container_status(&now).unwrap();
    assert_eq!(s.exit_code, 137);
    assert!(s.message.is_empty(), "{s:?}");

    // StopPodSandbox stops what still runs.
    let running = run(&rt, &sb, &ctr("running", "while :; do sleep 0.1; done"));
    rt.stop_pod_sandbox(&sb).unwrap();
    assert_eq!(
        rt.container_status(&running).unwrap().state,
        ContainerState::Exited
    );
    let e = rt.create_container(&sb, &ctr("late", "true")).unwrap_err();
    assert!(matches!(e, Error::FailedPrecondition(_)), "{e}");
    rt.remove_pod_sandbox(&sb).unwrap();
    env.assert_no_leaks();
}

#[test]
fn exec_sync_output_exit_code_and_timeout() {
    let env = Env::new("ctr-exec");
    let rt = setup(&env);
    let sb = rt.run_pod_sandbox(&pod(&env, "exec", false)).unwrap();
    let id = run(&rt, &sb, &ctr("idle", "exec sleep 1000"));
    let r = exec(&rt, &id, "echo out; echo err >&2; echo $IMAGE_VAR; exit 5");
    assert_eq!(r.stdout, b"out\nfrom-image\n");
    assert_eq!(r.stderr, b"err\n");
    assert_eq!(r.exit_code, 5);

    let t = Instant::now();
    let e = rt
        .exec_sync(&id, &["sleep".into(), "77".into()], Duration::from_secs(1))
        .unwrap_err();
    assert!(matches!(e, Error::DeadlineExceeded(_)), "{e}");
    assert!(t.elapsed() < Duration::from_secs(30));
    // The timed-out command was killed, not left running in the container.
    let ps = exec(&rt, &id, "ps -o args");
    assert!(
        !String::from_utf8_lossy(&ps.stdout).contains("sleep 77"),
        "{}",
        String::from_utf8_lossy(&ps.stdout)
    );
    // A timed-out command that started more processes: all of them are killed, and in a pod
    // whose init reaps (the shared-PID pause process) gone, before the call returns.
    let sb2 = rt.run_pod_sandbox(&pod(&env, "exec-tree", true)).unwrap();
    let id2 = run(&rt, &sb2, &ctr("idle2", "exec sleep 1000"));
    let e = rt
        .exec_sync(
            &id2,
            &[
                "sh".into(),
                "-c".into(),
                "sleep 78 & (sleep 79 &) ; sh -c 'sleep 80' & sleep 77".into(),
            ],
            Duration::from_secs(1),
        )
        .unwrap_err();
    assert!(matches!(e, Error::DeadlineExceeded(_)), "{e}");
    let ps = String::from_utf8_lossy(&exec(&rt, &id2, "ps -o stat,args").stdout).into_owned();
    for left in ["sleep 77", "sleep 78", "sleep 79", "sleep 80"] {
        assert!(!ps.contains(left), "{left} left after the timeout:\n{ps}");
    }
    assert!(
        !ps.lines().any(|l| l.trim_start().starts_with('Z')),
        "zombies left after the timeout:\n{ps}"
    );
    rt.remove_pod_sandbox(&sb2).unwrap();
    // A command that leaves a background process holding its output still returns.
    let t = Instant::now();
    let r = exec(&rt, &id, "echo started; sleep 60 & exit 0");
    assert_eq!((r.exit_code, r.stdout.as_slice()), (0, &b"started\n"[..]));
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "ExecSync waited for the background process"
    );
    // Output past the 16 MiB cap is dropped, but the command is not blocked by it.
    let r = exec(&rt, &id, "head -c 20000000 /dev/zero; echo done >&2");
    assert_eq!(
        (r.stdout.len(), r.stderr.as_slice()),
        (sandboxd::container::MAX_EXEC_OUTPUT - 5, &b"done\n"[..])
    );
    rt.stop_container(&id, Duration::ZERO).unwrap();
    let e = rt
        .exec_sync(&id, &["true".into()], Duration::ZERO)
        .unwrap_err();
    assert!(matches!(e, Error::FailedPrecondition(_)), "{e}");
    rt.remove_pod_sandbox(&sb).unwrap();
    env.assert_no_leaks();
}

#[test]
fn security_context_is_applied() {
    let env = Env::new("ctr-sec");
    let rt = setup(&env);
    let sb = rt.run_pod_sandbox(&pod(&env, "sec", false)).unwrap();

    let mut c = ctr("uid", "exec sleep 1000");
    c.security.run_as_user = Some(1234);
    let id = run(&rt, &sb, &c);
    assert_eq!(exec(&rt, &id, "id -u").stdout, b"1234\n");

    let mut c = ctr("byname", "exec sleep 1000");
    c.security.run_as_username = "app".into();
    c.security.supplemental_groups = vec![777];
    let id = run(&rt, &sb, &c);
    let groups = String::from_utf8(exec(&rt, &id, "id -u; id -g; id -G").stdout).unwrap();
    assert_eq!(groups, "1234\n1234\n1234 777 4321\n");

    // CAP_NET_RAW is bit 13 of CapEff/CapBnd.
    let caps = |id: &str| {
        let out = String::from_utf8(exec(&rt, id, "grep CapBnd /proc/self/status").stdout).unwrap();
        u64::from_str_radix(out.split_whitespace().nth(1).unwrap(), 16).unwrap()
    };
    let plain = run(&rt, &sb, &ctr("plain", "exec sleep 1000"));
    assert_ne!(caps(&plain) & (1 << 13), 0, "default set lacks CAP_NET_RAW");
    let mut c = ctr("noraw", "exec sleep 1000");
    c.security.drop_capabilities = vec!["NET_RAW".into()];
    let noraw = run(&rt, &sb, &c);
    assert_eq!(caps(&noraw) & (1 << 13), 0, "CAP_NET_RAW not dropped");
    assert_eq!(caps(&noraw) | (1 << 13), caps(&plain));

    let mut c = ctr("ro", "exec sleep 1000");
    c.security.readonly_rootfs = true;
    let ro = run(&rt, &sb, &c);
    let r = exec(&rt, &ro, "touch /newfile");
    assert_ne!(r.exit_code, 0);
    assert!(String::from_utf8_lossy(&r.stderr).contains("Read-only file system"));
    assert_eq!(
        exec(&rt, &plain, "touch /newfile && echo ok").stdout,
        b"ok\n"
    );

    // Bad settings are refused naming the field, and leave nothing behind.
    let mut c = ctr("badcap", "true");
    c.security.add_capabilities = vec!["CAP_TIME_TRAVEL".into()];
    let e = rt.create_container(&sb, &c).unwrap_err().to_string();
    assert!(
        e.contains("add_capabilities") && e.contains("CAP_TIME_TRAVEL"),
        "{e}"
    );
    let mut c = ctr("nouser", "true");
    c.security.run_as_username = "nobody-here".into();
    let e = rt.create_container(&sb, &c).unwrap_err().to_string();
    assert!(e.contains("run_as_username"), "{e}");
    let e = rt
        .create_container(&sb, &ctr("../evil", "true"))
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let mut c = ctr("noimage", "true");
    c.image = "sandboxd.test/none:latest".into();
    assert!(matches!(
        rt.create_container(&sb, &c).unwrap_err(),
        Error::NotFound { kind: "image", .. }
    ));
    // The failed creates left no dir and hold no name.
    assert_eq!(list_names(&env.cfg.root.join("containers")).len(), 5);
    rt.create_container(&sb, &ctr("nouser", "true")).unwrap();
    rt.remove_pod_sandbox(&sb).unwrap();
    env.assert_no_leaks();
}

#[test]
fn containers_of_a_pod_share_localhost_and_pid_namespace() {
    let env = Env::new("ctr-share");
    let rt = setup(&env);
    let sb = rt.run_pod_sandbox(&pod(&env, "share", true)).unwrap();
    let pod_ip = rt.pod_sandbox_status(&sb).unwrap().ips[0].clone();
    let mut server = ctr("server", "echo pong | nc -l -p 7777");
    server.security.pid = sandboxd::NamespaceMode::Pod;
    let server = run(&rt, &sb, &server);
    let mut client = ctr("client", "exec sleep 1000");
    client.security.pid = sandboxd::NamespaceMode::Pod;
    let client = run(&rt, &sb, &client);
    // Same PID namespace: the client sees the server's nc.
    let ps = String::from_utf8(exec(&rt, &client, "ps -o args").stdout).unwrap();
    assert!(ps.contains("nc -l -p 7777"), "{ps}");
    // Same network namespace: localhost reaches it; the client has the pod's IP.
    let r = exec(
        &rt,
        &client,
        "for i in $(seq 100); do nc 127.0.0.1 7777 </dev/null && exit 0; sleep 0.1; done; exit 1",
    );
    assert_eq!(
        (r.exit_code, r.stdout.as_slice()),
        (0, &b"pong\n"[..]),
        "{r:?}"
    );
    // Same /dev/shm: the pod's tmpfs.
    exec(&rt, &client, "echo shared > /dev/shm/token");
    let shm = rt.sandbox_record(&sb).unwrap().shm.unwrap();
    assert_eq!(
        std::fs::read_to_string(shm.join("token")).unwrap(),
        "shared\n"
    );
    let addrs = String::from_utf8(exec(&rt, &client, "ip -4 -o addr show eth0").stdout).unwrap();
    assert!(addrs.contains(&format!("{pod_ip}/")), "{addrs}");
    assert_eq!(wait_exited(&rt, &server).exit_code, 0);
    // StopContainer's signal goes to the init alone, even with a shared PID namespace: a
    // main process that handles SIGTERM finds its child still alive in its grace (the peers
    // do the same); what it leaves behind is killed once it exits.
    let mut graceful = ctr(
        "graceful",
        "sleep 1001 & c=$!; trap 'sleep 0.3; kill -0 $c && echo child-alive; exit 0' TERM; wait",
    );
    graceful.security.pid = sandboxd::NamespaceMode::Pod;
    let graceful = run(&rt, &sb, &graceful);
    std::thread::sleep(std::time::Duration::from_millis(300)); // the trap is set
    rt.stop_container(&graceful, std::time::Duration::from_secs(20))
        .unwrap();
    let done = rt.container_status(&graceful).unwrap();
    assert_eq!(done.exit_code, 0, "{done:?}");
    let log = std::fs::read_to_string(log_of(&rt, &graceful)).unwrap();
    assert!(
        log.contains("child-alive"),
        "the child died with the stop signal: {log}"
    );
    let gone = "for i in $(seq 50); do ps -o stat,args | grep -v '^Z' | grep -q '[s]leep 1001' || exit 0; sleep 0.1; done; exit 1";
    assert_eq!(
        exec(&rt, &client, gone).exit_code,
        0,
        "the init's child was left behind"
    );
    rt.remove_pod_sandbox(&sb).unwrap();
    env.assert_no_leaks();
}

#[test]
fn memory_limit_breach_is_oom_killed() {
    let env = Env::new("ctr-oom");
    let rt = setup(&env);
    let sb = rt.run_pod_sandbox(&pod(&env, "oom", false)).unwrap();
    let mut c = ctr("hog", "dd if=/dev/zero of=/dev/null bs=128M count=1");
    c.resources.memory_limit_in_bytes = 16 << 20;
    let id = run(&rt, &sb, &c);
    let s = wait_exited(&rt, &id);
    assert_eq!(
        (s.exit_code, s.reason.as_str()),
        (137, "OOMKilled"),
        "{s:?}"
    );
    // The monitor said it watched the container's OOM kills (or could not) before it was
    // started: StartContainer waits for that, so a kill right after start is never missed.
    assert!(s.dir.join("oom-watch").is_file(), "{s:?}");
    rt.remove_pod_sandbox(&sb).unwrap();
    env.assert_no_leaks();
}

#[test]
fn restart_keeps_containers_running_and_records_exits() {
    let env = Env::new("ctr-restart");
    let rt = setup(&env);
    let sb = rt.run_pod_sandbox(&pod(&env, "restart", false)).unwrap();
    let ticker = run(
        &rt,
        &sb,
        &ctr(
            "ticker",
            "i=0; while :; do echo tick $i; i=$((i+1)); sleep 0.1; done",
        ),
    );
    let quitter = run(&rt, &sb, &ctr("quitter", "sleep 2; exit 7"));
    let log = log_of(&rt, &ticker);
    drop(rt); // the daemon goes away; monitors and containers stay

    let rt = env.runtime();
    let s = rt.container_status(&ticker).unwrap();
    assert_eq!(s.state, ContainerState::Running);
    let before = log_entries(&log).len();
    std::thread::sleep(Duration::from_millis(600));
    assert!(log_entries(&log).len() > before, "log stopped flowing");
    let q = wait_exited(&rt, &quitter);
    assert_eq!((q.exit_code, q.reason.as_str()), (7, "Error"));
    // The name reservations came back too.
    let e = rt
        .create_container(&sb, &ctr("ticker", "true"))
        .unwrap_err();
    assert!(matches!(e, Error::NameReserved { .. }), "{e}");

    // Rotation: the monitor reopens the log after it was renamed. The call returns only
    // once it has: the new file exists the moment it returns (as critest checks it).
    for round in 1..=3 {
        std::fs::rename(&log, log.with_extension(round.to_string())).unwrap();
        rt.reopen_container_log(&ticker).unwrap();
        assert!(
            log.is_file(),
            "round {round}: no new log file when ReopenContainerLog returned"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while log_entries(&log).is_empty() {
        assert!(Instant::now() < deadline, "no new log after reopen");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A reopen that cannot be done (the log's dir is gone) fails, and makes no file.
    let dir = log.parent().unwrap().to_path_buf();
    let kept = dir.with_extension("kept");
    std::fs::rename(&dir, &kept).unwrap();
    let e = rt.reopen_container_log(&ticker).unwrap_err();
    assert!(e.to_string().contains("reopen"), "{e}");
    assert!(
        !log.exists() && !dir.exists(),
        "a failed reopen made {}",
        log.display()
    );
    std::fs::rename(&kept, &dir).unwrap();
    rt.reopen_container_log(&ticker).unwrap();
    rt.remove_pod_sandbox(&sb).unwrap();
    assert!(runc_state(&env, &ticker).1.contains("does not exist"));
    env.assert_no_leaks();
}

/// The limit a cgroup file shows, in whichever hierarchy holds the controller.
fn cgroup_value(cgroup: &str, controller: &str, v1: &str, v2: &str) -> String {
    let dir = sandboxd::cgroups::controller_dir(controller, cgroup).unwrap();
    std::fs::read_to_string(dir.join(v1))
        .or_else(|_| std::fs::read_to_string(dir.join(v2)))
        .unwrap()
        .trim()
        .to_string()
}

#[test]
fn resources_update_and_stats() {
    let env = Env::new("ctr-res");
    let rt = setup(&env);
    let sb = rt.run_pod_sandbox(&pod(&env, "res", false)).unwrap();
    let mut c = ctr("limited", "exec sleep 1000");
    c.resources.memory_limit_in_bytes = 64 << 20;
    c.resources.cpu_period = 100_000;
    c.resources.cpu_quota = 80_000;
    let id = run(&rt, &sb, &c);
    let cg = rt.container_record(&id).unwrap().cgroup;
    let mem = || cgroup_value(&cg, "memory", "memory.limit_in_bytes", "memory.max");
    let quota = || cgroup_value(&cg, "cpu", "cpu.cfs_quota_us", "cpu.max");
    assert_eq!(mem(), (64u64 << 20).to_string());
    assert!(quota().starts_with("80000"), "{}", quota());

    let mut r = c.resources.clone();
    r.memory_limit_in_bytes = 32 << 20;
    r.cpu_quota = 50_000;
    rt.update_container_resources(&id, &r).unwrap();
    assert_eq!(mem(), (32u64 << 20).to_string());
    assert!(quota().starts_with("50000"), "{}", quota());
    assert_eq!(
        rt.container_status(&id)
            .unwrap()
            .config
            .resources
            .memory_limit_in_bytes,
        32 << 20
    );
    r.cpu_quota = 10; // below the kernel's minimum: refused before the runtime is asked
    assert!(matches!(
        rt.update_container_resources(&id, &r),
        Err(Error::InvalidArgument(_))
    ));

    // Stats come from the cgroups: the container's, and the pod's holding it.
    exec(&rt, &id, "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done");
    let u = rt.container_usage(&id).unwrap();
    assert!(u.cpu_nanos.unwrap() > 1_000_000, "{u:?}");
    assert!(u.memory_bytes.unwrap() > 0, "{u:?}");
    let p = rt.pod_usage(&sb).unwrap();
    assert!(
        p.cpu_nanos.unwrap() >= u.cpu_nanos.unwrap(),
        "{p:?} vs {u:?}"
    );

    rt.stop_container(&id, Duration::ZERO).unwrap();
    assert!(matches!(
        rt.update_container_resources(&id, &c.resources),
        Err(Error::FailedPrecondition(_))
    ));
    rt.remove_pod_sandbox(&sb).unwrap();
    env.assert_no_leaks();
}

#[test]
fn seccomp_privileged_and_bind_mounts() {
    let env = Env::new("ctr-seccomp");
    let rt = setup(&env);
    let mut p = pod(&env, "sc", false);
    p.privileged = true; // it holds a privileged container below
    let sb = rt.run_pod_sandbox(&p).unwrap();
    let idle = "exec sleep 1000";

    // A user namespace needs no capability, only the syscall: RuntimeDefault refuses it.
    let plain = run(&rt, &sb, &ctr("plain", idle));
    assert_eq!(
        exec(&rt, &plain, "unshare -U true && echo ok").stdout,
        b"ok\n"
    );
    let mut c = ctr("default", idle);
    c.security.seccomp = sandboxd::container::Seccomp::RuntimeDefault;
    let confined = run(&rt, &sb, &c);
    let r = exec(&rt, &confined, "unshare -U true");
    assert_ne!(r.exit_code, 0);
    assert!(
        String::from_utf8_lossy(&r.stderr).contains("not permitted"),
        "{r:?}"
    );

    // A Localhost profile file: mkdir refused, everything else allowed.
    let profile = env.base.join("no-mkdir.json");
    std::fs::write(
        &profile,
        r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["mkdir","mkdirat"],"action":"SCMP_ACT_ERRNO","errnoRet":1}]}"#,
    )
    .unwrap();
    let mut c = ctr("local", idle);
    c.security.seccomp = sandboxd::container::Seccomp::Localhost(profile.to_string_lossy().into());
    let local = run(&rt, &sb, &c);
    assert_ne!(exec(&rt, &local, "mkdir /tmp/x").exit_code, 0);
    assert_eq!(exec(&rt, &local, "touch /tmp/y && echo ok").stdout, b"ok\n");
    let mut c = ctr("badprofile", idle);
    c.security.seccomp =
        sandboxd::container::Seccomp::Localhost("/nonexistent/profile.json".into());
    let e = rt.create_container(&sb, &c).unwrap_err().to_string();
    assert!(
        e.contains("seccomp") && e.contains("/nonexistent/profile.json"),
        "{e}"
    );

    // Privileged: every capability, writable /sys, no masked paths; mounting works. Only in
    // a privileged pod, as the peers: the same container in a plain pod is refused.
    let mut c = ctr("priv", idle);
    c.security.privileged = true;
    let plain_pod = rt.run_pod_sandbox(&pod(&env, "sc-plain", false)).unwrap();
    let e = rt.create_container(&plain_pod, &c).unwrap_err();
    assert!(
        matches!(e, sandboxd::Error::InvalidArgument(_)) && e.to_string().contains("privileged"),
        "{e}"
    );
    rt.remove_pod_sandbox(&plain_pod).unwrap();
    let privileged = run(&rt, &sb, &c);
    let m = "mkdir -p /m && mount -t tmpfs none /m && echo mounted";
    assert_eq!(exec(&rt, &privileged, m).stdout, b"mounted\n");
    // The host's device nodes are there for a privileged container only.
    let has_kmsg = "test -c /dev/kmsg && echo yes || echo no";
    assert_eq!(exec(&rt, &privileged, has_kmsg).stdout, b"yes\n");
    assert_eq!(exec(&rt, &plain, has_kmsg).stdout, b"no\n");
    assert_ne!(exec(&rt, &plain, m).exit_code, 0);

    // A host device, with its cgroup rule.
    let mut c = ctr("dev", idle);
    c.devices = vec![sandboxd::container::Device {
        container_path: "/dev/mynull".into(),
        host_path: "/dev/null".into(),
        permissions: "rwm".into(),
    }];
    let dev = run(&rt, &sb, &c);
    assert_eq!(
        exec(
            &rt,
            &dev,
            "stat -c %t:%T /dev/mynull && echo x > /dev/mynull && echo ok"
        )
        .stdout,
        b"1:3\nok\n"
    );
    let mut c = ctr("nodev", idle);
    c.devices = vec![sandboxd::container::Device {
        container_path: "/dev/x".into(),
        host_path: "/etc/hostname".into(),
        permissions: "r".into(),
    }];
    let e = rt.create_container(&sb, &c).unwrap_err().to_string();
    assert!(
        e.contains("devices.host_path") && e.contains("not a device"),
        "{e}"
    );

    // Bind mounts from the host, read-only and read-write: of a filesystem the host mounted
    // after the runtime started (the runtime's own mount namespace was made before it; what
    // a create binds is carried in from the host's, so it is this tmpfs, not the empty dir).
    let share = env.base.join("share");
    std::fs::create_dir_all(&share).unwrap();
    sh(&format!(
        "mount -t tmpfs -o size=1m share {}",
        share.display()
    ));
    std::fs::write(share.join("data"), "from-host").unwrap();
    let mut c = ctr("mounts", idle);
    c.mounts = vec![
        sandboxd::BindMount {
            container_path: "/ro".into(),
            host_path: share.to_string_lossy().into(),
            readonly: true,
            ..Default::default()
        },
        sandboxd::BindMount {
            container_path: "/rw".into(),
            host_path: share.to_string_lossy().into(),
            readonly: false,
            ..Default::default()
        },
    ];
    let mounts = run(&rt, &sb, &c);
    assert_eq!(exec(&rt, &mounts, "cat /ro/data").stdout, b"from-host");
    assert_ne!(exec(&rt, &mounts, "touch /ro/new").exit_code, 0);
    assert_eq!(
        exec(&rt, &mounts, "echo hi > /rw/new && echo ok").stdout,
        b"ok\n"
    );
    assert_eq!(std::fs::read_to_string(share.join("new")).unwrap(), "hi\n");
    rt.remove_pod_sandbox(&sb).unwrap();
    sh(&format!("umount {}", share.display()));
    env.assert_no_leaks();
}
