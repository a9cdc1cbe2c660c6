//! A node's bad day: a hung CNI plugin or OCI runtime, a stopped or dead monitor, a full state
//! disk. Each fails in time, names what failed, and leaves nothing running or half-done.

mod common;

use common::*;
use sandboxd::{ContainerState, Runtime, RuntimeHandler, SandboxFilter, SandboxState};

/// A CNI plugin that hangs is killed with everything it started (its process group), in
/// time, and the error names it; one that leaves a child holding its stderr does not hold
/// RunPodSandbox. (Reliability item: hung CNI plugin; hardening: stderr held open.)
#[test]
fn hung_plugins_are_killed_with_their_children() {
    let env = Env::new("faults-hang");
    let mut cfg = env.cfg.clone();
    cfg.cni_plugin_timeout = std::time::Duration::from_secs(2);
    env.write_plugin(
        "hang",
        "#!/bin/sh\ncat >/dev/null\nsleep 6172 &\nsleep 6173\n",
    );
    env.write_conflist("10-test.conflist", r#",{"type":"hang"}"#);
    let rt = Runtime::new(cfg.clone()).unwrap();
    let t = std::time::Instant::now();
    let e = rt.run_pod_sandbox(&env.pod("hang", false)).unwrap_err();
    assert!(
        t.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        t.elapsed()
    );
    let msg = e.to_string();
    assert!(
        msg.contains("hang") && msg.contains("did not finish"),
        "{msg}"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let left = processes_mentioning("sleep 617");
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "plugin processes left: {left:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // Its DEL hangs too, so the rollback could not finish: the pod stays (not ready, its
    // name held) for StopPodSandbox/RemovePodSandbox to finish once the plugin behaves.
    let pods = rt.list_pod_sandboxes(&SandboxFilter::default());
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0].state, SandboxState::NotReady);
    env.write_plugin(
        "hang",
        "#!/bin/sh
input=$(cat)
printf '%s' \"$input\" | /usr/lib/cni/portmap
",
    );
    rt.remove_pod_sandbox(&pods[0].id).unwrap();
    env.assert_nothing_created(&rt);

    // A plugin whose child keeps stderr (and stdout) open after it answered.
    env.write_plugin(
        "holder",
        "#!/bin/sh\ninput=$(cat)\nsleep 6174 &\nprintf '%s' \"$input\" | /usr/lib/cni/portmap\n",
    );
    env.write_conflist(
        "10-test.conflist",
        r#",{"type":"holder","capabilities":{"portMappings":true}}"#,
    );
    let t = std::time::Instant::now();
    let sb = rt.run_pod_sandbox(&env.pod("holder", false)).unwrap();
    assert!(
        t.elapsed() < std::time::Duration::from_secs(5),
        "RunPodSandbox waited for the plugin's child: {:?}",
        t.elapsed()
    );
    rt.remove_pod_sandbox(&sb).unwrap();
    sh_ok("pkill -f 'sleep 6174'");
    env.assert_nothing_created(&rt);
}

/// The OCI runtime hangs in `create`: the call fails in time naming the handler and its
/// binary, and nothing stays: not the monitor (it wrote its pid before create), not the
/// runtime, not the runtime's children; the container is force-deleted.
/// (Reliability item: hung OCI runtime.)
#[test]
fn a_hung_runtime_leaves_nothing_running() {
    let mut env = Env::new("faults-hungrt");
    let wrapper = env.base.join("bin/hanging-runtime");
    env.cfg.runtime_timeout = std::time::Duration::from_secs(3);
    let (rt, sb, ctr) = wrapped_runtime_pod(
        &mut env,
        "hang",
        &wrapper,
        "#!/bin/sh\nfor a in \"$@\"; do\n  if [ \"$a\" = create ]; then sleep 6281 & sleep 6282; exit 1; fi\ndone\nexec /usr/sbin/runc \"$@\"\n",
        &["sleep", "100"],
    );
    let t = std::time::Instant::now();
    let e = rt.create_container(&sb, &ctr).unwrap_err().to_string();
    assert!(
        t.elapsed() < std::time::Duration::from_secs(30),
        "{:?}",
        t.elapsed()
    );
    assert!(
        e.contains("runtime handler hang") && e.contains(&wrapper.display().to_string()),
        "{e}"
    );
    assert!(!e.contains("sandboxd-monitor did not"), "{e}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let mut left = processes_mentioning("sleep 628");
        left.extend(processes_mentioning(&format!(
            "--runtime-root {}",
            env.cfg.root.display()
        )));
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "left running: {left:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(rt.list_containers(&Default::default()).is_empty());
    rt.remove_pod_sandbox(&sb).unwrap();
    env.assert_no_leaks();
    let left = list_names(&env.runtime_root("hang"));
    assert!(left.is_empty(), "runtime containers left: {left:?}");
}

/// A stopped (SIGSTOP) monitor cannot reap its container: StopContainer still succeeds once
/// the container's processes are gone (exit unknown, 137), instead of timing out with the
/// container reported running. A dead monitor with a dead container is noticed by status.
/// (Reliability item: a stopped or dead monitor.)
#[test]
fn a_stopped_or_dead_monitor_does_not_wedge_the_container() {
    const IMAGE: &str = "sandboxd.test/busybox:mon";
    let env = Env::new("faults-monitor");
    let rt = env.runtime();
    rt.images()
        .import(&busybox::oci_layout(&env.base, IMAGE), None)
        .unwrap();
    let sb = rt.run_pod_sandbox(&env.pod("mon", false)).unwrap();
    let run = |name: &str| {
        let ctr = sandboxd::ContainerConfig {
            metadata: sandboxd::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            },
            image: IMAGE.into(),
            command: vec!["sleep".into(), "1000".into()],
            ..Default::default()
        };
        let id = rt.create_container(&sb, &ctr).unwrap();
        rt.start_container(&id).unwrap();
        id
    };
    let monitor_of = |id: &str| -> i32 {
        let dir = env.cfg.root.join("containers").join(id);
        std::fs::read_to_string(dir.join("monitor.pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    // Stopped monitor.
    let a = run("a");
    let mon = monitor_of(&a);
    sh(&format!("kill -STOP {mon}"));
    let t = std::time::Instant::now();
    rt.stop_container(&a, std::time::Duration::from_secs(2))
        .unwrap();
    assert!(
        t.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        t.elapsed()
    );
    let s = rt.container_status(&a).unwrap();
    assert_eq!(
        (s.state, s.exit_code),
        (ContainerState::Exited, 137),
        "{s:?}"
    );
    assert!(s.message.contains("monitor"), "{s:?}");
    sh(&format!("kill -CONT {mon}"));
    rt.remove_container(&a).unwrap();
    // Dead monitor, container still running: still running; once its process dies too,
    // status says it exited.
    let b = run("b");
    let mon = monitor_of(&b);
    sh(&format!("kill -KILL {mon}"));
    std::thread::sleep(std::time::Duration::from_millis(200));
    let s = rt.container_status(&b).unwrap();
    assert_eq!(s.state, ContainerState::Running, "{s:?}");
    sh(&format!("kill -KILL {}", s.pid));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let s = rt.container_status(&b).unwrap();
        if s.state == ContainerState::Exited {
            assert_eq!(s.reason, "Unknown", "{s:?}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{s:?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    rt.remove_pod_sandbox(&sb).unwrap();
    env.assert_no_leaks();
}

/// Fills the filesystem at `dir` (a file of zeros until ENOSPC); returns its path.
fn fill(dir: &std::path::Path) -> std::path::PathBuf {
    let f = dir.join("filler");
    let _ = sh_ok(&format!(
        "dd if=/dev/zero of={} bs=64k 2>/dev/null",
        f.display()
    ));
    f
}

/// The state disk is full: RunPodSandbox fails with ResourceExhausted naming the path and
/// rolls back completely (no record, no name held, no namespace, no address), so the same
/// request succeeds once there is space; the daemon starts on a full disk, and its pods are
/// listed, stopped and removed. (Reliability item: disk full.)
#[test]
fn a_full_state_disk_rolls_back_and_starts() {
    let env = Env::new("faults-full");
    let small = env.base.join("small");
    std::fs::create_dir_all(&small).unwrap();
    sh(&format!(
        "mount -t tmpfs -o size=4m sandboxd-test-full {}",
        small.display()
    ));
    let mut cfg = env.cfg.clone();
    cfg.root = small.join("root");
    let rt = Runtime::new(cfg.clone()).unwrap();
    let filler = fill(&small);
    let pod = env.pod("full", false);
    let e = rt.run_pod_sandbox(&pod).unwrap_err();
    let status = sandboxd::cri::codes::status_of(&e);
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{e}");
    assert!(
        status.message().contains(&small.display().to_string()),
        "{e}"
    );
    assert!(rt.list_pod_sandboxes(&SandboxFilter::default()).is_empty());
    assert!(list_names(&cfg.root.join("sandboxes")).is_empty());
    assert!(list_names(&cfg.netns_dir).is_empty());
    // Space again: the same request runs (its name was released).
    std::fs::remove_file(&filler).unwrap();
    let id = rt.run_pod_sandbox(&pod).unwrap();
    drop(rt);
    // Full again, and the daemon restarts — with a pause binary that differs from the one
    // installed, which cannot be copied now: it starts anyway (keeping the installed one);
    // its pod is there, can be stopped and removed.
    let filler = fill(&small);
    let pause = env.base.join("pause-new");
    let mut bin = std::fs::read(std::env::var("SANDBOXD_PAUSE").unwrap()).unwrap();
    bin.extend_from_slice(&[0u8; 4096]);
    std::fs::write(&pause, &bin).unwrap();
    cfg.pause_path = Some(pause);
    let rt = Runtime::new(cfg.clone()).unwrap();
    let pods = rt.list_pod_sandboxes(&SandboxFilter::default());
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0].id, id);
    rt.stop_pod_sandbox(&id).unwrap();
    rt.remove_pod_sandbox(&id).unwrap();
    assert!(rt.list_pod_sandboxes(&SandboxFilter::default()).is_empty());
    std::fs::remove_file(&filler).unwrap();
    drop(rt);
    assert!(list_names(&cfg.netns_dir).is_empty());
    assert!(list_names(&cfg.root.join("sandboxes")).is_empty());
    assert!(
        list_names(&cfg.root.join("cni/networks").join(&env.net_name))
            .iter()
            .all(|n| !n.starts_with("10."))
    );
    sh(&format!("umount {}", small.display()));
    env.assert_no_leaks();
}

/// ExecSync's deadline comes before the runtime recorded the exec'd process (under
/// emulation `runc exec` takes 1.5 s; kubelet's probes allow 1): the process must still be
/// killed before DeadlineExceeded returns, not only the runtime's helper. The wrapper runtime
/// hands runc's pid file over 2 s late.
#[test]
fn a_timed_out_exec_is_killed_even_before_its_pid_is_recorded() {
    let mut env = Env::new("faults-slowexec");
    let wrapper = env.base.join("bin/slow-exec-runtime");
    let (rt, sb, ctr) = wrapped_runtime_pod(
        &mut env,
        "slowexec",
        &wrapper,
        r#"#!/bin/sh
case " $* " in *" exec "*) ;; *) exec /usr/sbin/runc "$@" ;; esac
n=$#; prev=; pf=
for a in "$@"; do
  if [ "$prev" = --pid-file ]; then pf=$a; set -- "$@" "$a.late"; else set -- "$@" "$a"; fi
  prev=$a
done
shift $n
/usr/sbin/runc "$@" || exit $?
sleep 2
mv "$pf.late" "$pf"
"#,
        &["sleep", "1000"],
    );
    let id = rt.create_container(&sb, &ctr).unwrap();
    rt.start_container(&id).unwrap();
    let e = rt
        .exec_sync(
            &id,
            &["sleep".into(), "6377".into()],
            std::time::Duration::from_secs(1),
        )
        .unwrap_err();
    assert!(matches!(e, sandboxd::Error::DeadlineExceeded(_)), "{e}");
    let left = sh("pgrep -f '[s]leep 6377' || true");
    assert!(
        left.trim().is_empty(),
        "the timed-out exec lives on: {left}"
    );
    rt.remove_pod_sandbox(&sb).unwrap();
    env.assert_no_leaks();
}

/// A runtime handler `handler`: `wrapper` (written from `script`, runc-like), the test's busybox image and
/// a pod of that handler; the container config to create in it runs `cmd`.
fn wrapped_runtime_pod(
    env: &mut Env,
    handler: &str,
    wrapper: &std::path::Path,
    script: &str,
    cmd: &[&str],
) -> (Runtime, String, sandboxd::ContainerConfig) {
    const IMAGE: &str = "sandboxd.test/busybox:wrapped";
    std::fs::write(wrapper, script).unwrap();
    sh(&format!("chmod 755 {}", wrapper.display()));
    env.cfg.runtimes.insert(
        handler.into(),
        RuntimeHandler {
            path: wrapper.to_path_buf(),
            root: None,
            family: Some("runc".into()),
            needs_sandbox_process: false,
            runtime_args: Vec::new(),
        },
    );
    let rt = env.runtime();
    rt.images()
        .import(&busybox::oci_layout(&env.base, IMAGE), None)
        .unwrap();
    let mut pod = env.pod(handler, false);
    pod.runtime_handler = handler.into();
    let sb = rt.run_pod_sandbox(&pod).unwrap();
    let ctr = sandboxd::ContainerConfig {
        metadata: sandboxd::ContainerMetadata {
            name: "c".into(),
            attempt: 0,
        },
        image: IMAGE.into(),
        command: cmd.iter().map(|c| c.to_string()).collect(),
        ..Default::default()
    };
    (rt, sb, ctr)
}
