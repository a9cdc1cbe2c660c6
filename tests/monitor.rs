//! The monitor end to end with real runc: it reports the container pid, writes the
//! container's output in the CRI log format, records the exit status, and reports runc's own
//! error message when `create` fails.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use sandboxd::oci::{spec, ContainerFiles, OciRuntime};

fn bundle(env: &Env, name: &str, args: &[&str]) -> std::path::PathBuf {
    let dir = env.base.join(name);
    let rootfs = env.base.join("rootfs");
    spec::prepare_infra_rootfs(&rootfs, env.cfg.pause_path.as_ref().unwrap()).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["resolv.conf", "hosts", "hostname"] {
        std::fs::write(dir.join(f), "").unwrap();
    }
    let mut s = spec::infra(&spec::InfraSpec {
        sandbox_id: name.into(),
        metadata: Default::default(),
        rootfs,
        hostname: "m".into(),
        netns: None,
        private_netns: false,
        userns: None,
        host_ipc: true,
        host_pid: false,
        shm: None,
        resolv_conf: dir.join("resolv.conf"),
        hosts: dir.join("hosts"),
        hostname_file: dir.join("hostname"),
        cgroups_path: format!("/sandboxd-test-{name}"),
        oom_score_adj: spec::clamp_oom_score_adj(0),
        sysctls: Default::default(),
    })
    .unwrap();
    s.process_mut()
        .as_mut()
        .unwrap()
        .set_args(Some(args.iter().map(|a| a.to_string()).collect()));
    s.save(dir.join("config.json")).unwrap();
    dir
}

fn runtime(env: &Env) -> OciRuntime {
    OciRuntime {
        name: "runc".into(),
        family: sandboxd::handlers::FAMILIES[0],
        path: "/usr/sbin/runc".into(),
        args: Vec::new(),
        root: env.runtime_root("runc"),
        monitor: env.cfg.monitor_path.clone().unwrap(),
        timeout: Duration::from_secs(30),
        mount_ns: None,
    }
}

fn wait_for(p: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !p.exists() {
        assert!(Instant::now() < deadline, "{} never appeared", p.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn logs_output_and_exit_status() {
    let env = Env::new("monitorlog");
    let id = "a".repeat(64);
    let dir = bundle(&env, "logbundle", &["/pause", "--version"]);
    let log = env.base.join("ctr.log");
    let files = ContainerFiles::in_dir(&dir, Some(log.clone()));
    let rt = runtime(&env);
    let pid = rt.create(&id, &dir, &files).unwrap();
    assert!(pid > 0);
    assert_eq!(rt.state(&id).unwrap().unwrap().status, "created");
    let monitor = files.monitor_pid().unwrap();
    assert!(Path::new(&format!("/proc/{monitor}")).exists());
    rt.start(&id, &files.runtime_log).unwrap();
    wait_for(&files.exit_file);
    let exit = files.exit().unwrap();
    assert_eq!((exit.exit_code, exit.signal), (0, None));
    let text = std::fs::read_to_string(&log).unwrap();
    let line = text.lines().next().unwrap();
    let parts: Vec<&str> = line.splitn(4, ' ').collect();
    assert_eq!(parts.len(), 4, "{line}");
    assert!(
        parts[0].ends_with('Z') && parts[0].contains('T') && parts[0].len() == 30,
        "{line}"
    );
    assert_eq!(
        &parts[1..],
        ["stdout", "F", "sandboxd-pause 0.1.0"],
        "{line}"
    );
    // The monitor exits after writing the exit file.
    let deadline = Instant::now() + Duration::from_secs(5);
    while Path::new(&format!("/proc/{monitor}")).exists()
        && !sh(&format!("cat /proc/{monitor}/stat")).contains(" Z ")
    {
        assert!(Instant::now() < deadline, "monitor {monitor} lingers");
        std::thread::sleep(Duration::from_millis(10));
    }
    rt.delete(&id, &files.runtime_log).unwrap();
    assert!(rt.state(&id).unwrap().is_none());
    rt.delete(&id, &files.runtime_log).unwrap(); // idempotent
}

#[test]
fn create_failure_carries_the_runtime_message() {
    let env = Env::new("monitorfail");
    let id = "b".repeat(64);
    let dir = bundle(&env, "failbundle", &["/no-such-binary"]);
    let files = ContainerFiles::in_dir(&dir, None);
    let rt = runtime(&env);
    let e = rt.create(&id, &dir, &files).unwrap_err().to_string();
    assert!(
        e.contains("runc create failed") && e.contains("no-such-binary"),
        "{e}"
    );
    assert!(
        rt.state(&id).unwrap().is_none(),
        "runc kept a failed container"
    );
}
