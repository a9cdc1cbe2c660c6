//! Fault injection and bad input: failing CNI plugins (ADD and DEL), the give-up policy, a
//! recording runtime wrapper (the Kata-style contract), and requests that must be refused
//! without touching anything.

mod common;

use common::*;
use sandboxd::{Error, Runtime, RuntimeHandler, SandboxState};

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
    env.assert_nothing_created(&rt);
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
            family: None,
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
            family: None,
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
        env.assert_nothing_created(&rt);
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
    env.assert_nothing_created(&rt);
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
    env.assert_nothing_created(&rt);
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
