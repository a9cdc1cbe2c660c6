//! Fault injection and bad input: failing CNI plugins (ADD and DEL), the give-up policy, a
//! recording runtime wrapper (the Kata-style contract), and requests that must be refused
//! without touching anything.

mod common;

use common::*;
use sandboxd::{ContainerState, Error, Runtime, RuntimeHandler, SandboxFilter, SandboxState};

/// A plugin that fails the CNI command named by a marker file, else behaves as portmap.
fn flaky_plugin(env: &Env) -> std::path::PathBuf {
    let markers = env.base.join("markers");
    std::fs::create_dir_all(&markers).unwrap();
    env.write_plugin(
        "flaky",
        &format!(
            "#!/bin/sh\ninput=$(cat)\necho \"$CNI_COMMAND netns=$CNI_NETNS\" >> {m}/calls\nif [ -e {m}/fail-$CNI_COMMAND ]; then\n  echo '{{\"cniVersion\":\"1.0.0\",\"code\":999,\"msg\":\"injected '$CNI_COMMAND' failure\",\"details\":\"flaky plugin\"}}'\n  echo 'flaky stderr' >&2\n  exit 1\nfi\nprintf '%s' \"$input\" | exec /usr/lib/cni/portmap\n",
            m = markers.display()
        ),
    );
    env.write_conflist(
        "10-test.conflist",
        r#",{"type":"flaky","capabilities":{"portMappings":true}}"#,
    );
    markers
}

fn assert_nothing_created(env: &Env, rt: &Runtime) {
    assert!(rt.list_pod_sandboxes(&SandboxFilter::default()).is_empty());
    env.assert_no_leaks();
}

/// Test 3a: ADD fails in the 2nd plugin → full rollback, checked item by item.
#[test]
fn add_failure_rolls_back_everything() {
    let env = Env::new("addfail");
    let markers = flaky_plugin(&env);
    std::fs::write(markers.join("fail-ADD"), "").unwrap();
    let rt = env.runtime();
    let pod = env.pod("addfail", true);
    let err = rt.run_pod_sandbox(&pod).unwrap_err().to_string();
    assert!(err.contains("set up network"), "{err}");
    assert!(
        err.contains("flaky: ADD: injected ADD failure (code 999): flaky plugin"),
        "{err}"
    );
    assert!(err.contains("flaky stderr"), "{err}");
    assert!(list_names(&env.cfg.netns_dir).is_empty(), "netns file left");
    assert!(
        list_names(&env.cfg.root.join("sandboxes")).is_empty(),
        "sandbox dir left"
    );
    assert!(env.ipam_reservations().is_empty(), "IPAM reservation left");
    assert!(
        list_names(&env.cfg.root.join("cni/cache")).is_empty(),
        "CNI cache left"
    );
    assert_nothing_created(&env, &rt);
    // The name was released: the same request succeeds once the plugin is fixed.
    std::fs::remove_file(markers.join("fail-ADD")).unwrap();
    let id = rt.run_pod_sandbox(&pod).unwrap();
    rt.remove_pod_sandbox(&id).unwrap();
    env.assert_no_leaks();
}

/// Test 3b: DEL fails → stop returns the plugin's message and keeps the netns; fix, retry → clean.
#[test]
fn del_failure_keeps_netns_until_retry() {
    let env = Env::new("delfail");
    let markers = flaky_plugin(&env);
    let rt = env.runtime();
    let id = rt.run_pod_sandbox(&env.pod("delfail", false)).unwrap();
    let netns = rt.sandbox_record(&id).unwrap().netns.unwrap();
    std::fs::write(markers.join("fail-DEL"), "").unwrap();
    let err = rt.stop_pod_sandbox(&id).unwrap_err().to_string();
    assert!(err.contains("tear down network"), "{err}");
    assert!(err.contains("injected DEL failure"), "{err}");
    assert_eq!(
        mountinfo_fs(&netns).as_deref(),
        Some("nsfs"),
        "netns closed despite failed DEL"
    );
    let st = rt.pod_sandbox_status(&id).unwrap();
    assert_eq!(st.state, SandboxState::NotReady);
    assert!(st.network_error.unwrap().contains("injected DEL failure"));
    // Remove cannot finish either while DEL fails.
    assert!(rt.remove_pod_sandbox(&id).is_err());
    std::fs::remove_file(markers.join("fail-DEL")).unwrap();
    rt.stop_pod_sandbox(&id).unwrap();
    assert!(!netns.exists());
    assert!(env.ipam_reservations().is_empty());
    rt.remove_pod_sandbox(&id).unwrap();
    env.assert_no_leaks();
}

/// The give-up policy: after `cni_del_max_attempts` failures the network is recorded as given
/// up, the pod can be removed, and the next start-up retries DEL and releases the address.
#[test]
fn del_give_up_is_recorded_and_retried_at_start() {
    let mut env = Env::new("giveup");
    env.cfg.cni_del_max_attempts = 2;
    let markers = flaky_plugin(&env);
    let rt = env.runtime();
    let id = rt.run_pod_sandbox(&env.pod("giveup", false)).unwrap();
    std::fs::write(markers.join("fail-DEL"), "").unwrap();
    assert!(rt.stop_pod_sandbox(&id).is_err());
    rt.stop_pod_sandbox(&id).unwrap(); // second failure: given up, with a warning
    let rec = rt.sandbox_record(&id).unwrap();
    assert!(rec.network.gave_up && rec.network.stopped);
    assert_eq!(rec.network.del_failures, 2);
    rt.remove_pod_sandbox(&id).unwrap();
    // The cache stays for the start-up retry.
    assert_eq!(
        list_names(&env.cfg.root.join("cni/cache")),
        vec![format!("{id}.json")]
    );
    drop(rt);
    std::fs::remove_file(markers.join("fail-DEL")).unwrap();
    std::fs::write(markers.join("calls"), "").unwrap();
    let rt = env.runtime();
    let calls = std::fs::read_to_string(markers.join("calls")).unwrap();
    assert_eq!(
        calls, "DEL netns=\n",
        "start-up did not retry DEL with an empty netns"
    );
    drop(rt);
    env.assert_no_leaks();
}

/// Test 5: a runtime that must find the netns before `create` (Kata-style) sees it existing,
/// nsfs, and holding eth0 with the CNI address, at `create` time.
#[test]
fn netns_ready_before_runtime_create() {
    let mut env = Env::new("katalike");
    let record = env.base.join("create-record");
    let wrapper = env.base.join("bin/recording-runtime");
    std::fs::write(
        &wrapper,
        format!(
            r#"#!/bin/sh
prev=; bundle=
for a in "$@"; do
  if [ "$prev" = --bundle ]; then bundle=$a; fi
  prev=$a
done
if [ -n "$bundle" ]; then
  ns=$(tr -d ' \n' < "$bundle/config.json" | grep -o '"type":"network","path":"[^"]*"' | sed 's/.*"path":"//; s/"$//')
  {{ echo "argv: $*"; echo "netns=$ns"; stat -f -c %T "$ns"; nsenter --net="$ns" ip -4 -o addr show eth0; }} > {rec} 2>&1
fi
exec /usr/sbin/runc "$@"
"#,
            rec = record.display()
        ),
    )
    .unwrap();
    sh(&format!("chmod 755 {}", wrapper.display()));
    env.cfg.runtimes.insert(
        "kata-like".into(),
        RuntimeHandler {
            path: wrapper,
            root: None,
            needs_sandbox_process: true,
            runtime_args: Vec::new(),
        },
    );
    let rt = env.runtime();
    let mut pod = env.pod("vm", false); // no shared PID ns: the handler alone asks for a process
    pod.runtime_handler = "kata-like".into();
    let id = rt.run_pod_sandbox(&pod).unwrap();
    let st = rt.pod_sandbox_status(&id).unwrap();
    assert!(st.infra_pid.is_some());
    let rec = std::fs::read_to_string(&record).unwrap();
    let netns = st.netns_path.unwrap();
    assert!(rec.contains(&format!("netns={}", netns.display())), "{rec}");
    assert!(rec.contains("\nnsfs\n"), "{rec}");
    assert!(rec.contains(&format!("{}/24", st.ips[0])), "{rec}");
    assert!(rec.contains(" create --bundle "), "{rec}");
    rt.remove_pod_sandbox(&id).unwrap();
    env.assert_no_leaks();
}

/// Test 7: bad input gets a clear error and creates nothing.
#[test]
fn bad_input_is_refused_without_side_effects() {
    let mut env = Env::new("badinput");
    env.cfg.runtimes.insert(
        "ghost".into(),
        RuntimeHandler {
            path: "/nonexistent/runc".into(),
            root: None,
            needs_sandbox_process: false,
            runtime_args: Vec::new(),
        },
    );
    let rt = env.runtime();
    type Mutate = fn(&mut sandboxd::PodSandboxConfig);
    let cases: Vec<(&str, Mutate, &str)> = vec![
        (
            "empty name",
            |p| p.metadata.name.clear(),
            "metadata.name must not be empty",
        ),
        (
            "slash",
            |p| p.metadata.name = "a/b".into(),
            "forbidden character '/'",
        ),
        ("dotdot", |p| p.metadata.namespace = "..".into(), "\"..\""),
        (
            "nul",
            |p| p.metadata.uid = "a\0b".into(),
            "forbidden character",
        ),
        (
            "too long",
            |p| p.metadata.name = "n".repeat(300),
            "limit is 253",
        ),
        (
            "unknown handler",
            |p| p.runtime_handler = "nope".into(),
            "unknown runtime handler \"nope\"",
        ),
        (
            "missing runtime binary",
            |p| p.runtime_handler = "ghost".into(),
            "/nonexistent/runc does not exist",
        ),
        (
            "bad dns",
            |p| {
                p.dns = Some(sandboxd::DnsConfig {
                    servers: vec!["not-an-ip".into()],
                    ..Default::default()
                })
            },
            "dns_config.servers",
        ),
        ("bad hostname", |p| p.hostname = "a b".into(), "hostname"),
        (
            "cgroup escape",
            |p| p.cgroup_parent = "/a/../../etc".into(),
            "cgroup_parent",
        ),
        (
            "huge annotations",
            |p| {
                p.annotations.insert("big".into(), "x".repeat(10 << 20));
            },
            "limit is 262144",
        ),
        (
            "too many labels",
            |p| {
                for i in 0..10_000 {
                    p.labels.insert(format!("l{i}"), "v".into());
                }
            },
            "at most 1024 labels",
        ),
    ];
    for (what, mutate, expect) in cases {
        let mut pod = env.pod("bad", true);
        mutate(&mut pod);
        let e = rt.run_pod_sandbox(&pod).unwrap_err();
        assert!(e.to_string().contains(expect), "{what}: {e}");
        assert!(
            matches!(e, Error::InvalidArgument(_) | Error::Config(_)),
            "{what}: {e:?}"
        );
        assert_nothing_created(&env, &rt);
    }
    // Lookups: unknown is NotFound for status, success for stop and remove; bad ids refused.
    let unknown = "ab".repeat(32);
    assert!(matches!(
        rt.pod_sandbox_status(&unknown),
        Err(Error::NotFound { .. })
    ));
    rt.stop_pod_sandbox(&unknown).unwrap();
    rt.remove_pod_sandbox(&unknown).unwrap();
    assert!(matches!(
        rt.pod_sandbox_status("../etc"),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        rt.remove_pod_sandbox("a/b"),
        Err(Error::InvalidArgument(_))
    ));
    // A valid pod still runs afterwards.
    let id = rt.run_pod_sandbox(&env.pod("good", false)).unwrap();
    rt.remove_pod_sandbox(&id).unwrap();
    env.assert_no_leaks();
}

/// Malformed CNI config and missing plugins are errors naming the file or plugin, before
/// anything is created.
#[test]
fn broken_cni_config_is_refused() {
    let env = Env::new("badcni");
    std::fs::write(
        env.cfg.cni_conf_dir.join("10-broken.conflist"),
        "{ not json",
    )
    .unwrap();
    let rt = env.runtime();
    let e = rt
        .run_pod_sandbox(&env.pod("n", false))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("10-broken.conflist") && e.contains("not JSON"),
        "{e}"
    );
    assert_nothing_created(&env, &rt);
    std::fs::write(
        env.cfg.cni_conf_dir.join("20-missing.conflist"),
        r#"{"cniVersion":"1.0.0","name":"m","plugins":[{"type":"no-such-plugin"}]}"#,
    )
    .unwrap();
    let e = rt
        .run_pod_sandbox(&env.pod("n", false))
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"no-such-plugin\" not found"), "{e}");
    assert_nothing_created(&env, &rt);
}

/// A state root that is a symlink is refused.
#[test]
fn symlinked_state_root_is_refused() {
    let mut env = Env::new("symroot");
    let real = env.base.join("real-root");
    std::fs::create_dir_all(&real).unwrap();
    let link = env.base.join("link-root");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    env.cfg.root = link;
    let e = Runtime::new(env.cfg.clone())
        .err()
        .expect("symlinked root accepted")
        .to_string();
    assert!(e.contains("is a symlink"), "{e}");
    assert!(list_names(&real).is_empty(), "wrote through the symlink");
}

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
    assert_nothing_created(&env, &rt);

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
    assert_nothing_created(&env, &rt);
}

/// The OCI runtime hangs in `create`: the call fails in time naming the handler and its
/// binary, and nothing stays: not the monitor (it wrote its pid before create), not the
/// runtime, not the runtime's children; the container is force-deleted.
/// (Reliability item: hung OCI runtime.)
#[test]
fn a_hung_runtime_leaves_nothing_running() {
    const IMAGE: &str = "sandboxd.test/busybox:hang";
    let mut env = Env::new("faults-hungrt");
    let wrapper = env.base.join("bin/hanging-runtime");
    std::fs::write(
        &wrapper,
        "#!/bin/sh\nfor a in \"$@\"; do\n  if [ \"$a\" = create ]; then sleep 6281 & sleep 6282; exit 1; fi\ndone\nexec /usr/sbin/runc \"$@\"\n",
    )
    .unwrap();
    sh(&format!("chmod 755 {}", wrapper.display()));
    env.cfg.runtimes.insert(
        "hang".into(),
        RuntimeHandler {
            path: wrapper.clone(),
            root: None,
            needs_sandbox_process: false,
            runtime_args: Vec::new(),
        },
    );
    env.cfg.runtime_timeout = std::time::Duration::from_secs(3);
    let rt = env.runtime();
    rt.images()
        .import(&busybox::oci_layout(&env.base, IMAGE), None)
        .unwrap();
    let mut pod = env.pod("hungrt", false);
    pod.runtime_handler = "hang".into();
    let sb = rt.run_pod_sandbox(&pod).unwrap();
    let ctr = sandboxd::ContainerConfig {
        metadata: sandboxd::ContainerMetadata {
            name: "c".into(),
            attempt: 0,
        },
        image: IMAGE.into(),
        command: vec!["sleep".into(), "100".into()],
        ..Default::default()
    };
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
