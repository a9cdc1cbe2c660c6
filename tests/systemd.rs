//! The systemd cgroup driver, where systemd is PID 1 (the VM lane): kubelet's slices as pod
//! parents with a scope per container, a slice of the daemon's own sized by pod-level
//! resources, units gone after teardown, pods surviving a daemon restart and
//! `systemctl daemon-reexec`, and OOM kills attributed to the limit that caused them. The
//! cgroup v2 `unified` map runs on both lanes (refused on a host without pure cgroup v2), and
//! so does PSI under load (wherever the kernel keeps it).

mod common;

use std::time::{Duration, Instant};

use common::hostile::{ctr, setup};
use common::*;
use sandboxd::cgroups::{systemd, Driver};
use sandboxd::{ContainerConfig, ContainerState, Error, Runtime};

/// The env, or `None` (with the reason printed) where systemd is not the init system.
fn systemd_env(test: &str) -> Option<Env> {
    if !systemd::booted() {
        eprintln!("skipped: systemd is not PID 1 here (the VM lane runs this test)");
        return None;
    }
    Some(Env::new(test))
}

fn run(rt: &Runtime, sandbox: &str, c: &ContainerConfig) -> String {
    let id = rt.create_container(sandbox, c).unwrap();
    rt.start_container(&id).unwrap();
    id
}

fn wait_exited(rt: &Runtime, id: &str) -> sandboxd::ContainerRecord {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = rt.container_status(id).unwrap();
        if s.state == ContainerState::Exited {
            return s;
        }
        assert!(Instant::now() < deadline, "{id} still {:?}", s.state);
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One property of a unit as `systemctl show` says it.
fn unit_property(unit: &str, prop: &str) -> String {
    sh(&format!("systemctl show -p {prop} --value {unit}"))
        .trim()
        .to_string()
}

/// A unit gone after teardown: stopped, its transient files and runtime drop-ins removed, and
/// (for a scope) unloaded. systemd unloads a stopped unit in its garbage collection, after
/// the stop job: wait (bounded). A slice is never "not-found" — systemd loads any slice name
/// asked about, as an implicit parent — so for slices inactive and fileless is gone.
fn assert_unit_gone(unit: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let want_unloaded = !unit.ends_with(".slice");
    loop {
        let load = unit_property(unit, "LoadState");
        let active = unit_property(unit, "ActiveState");
        let files: Vec<String> = [
            format!("/run/systemd/transient/{unit}"),
            format!("/run/systemd/system.control/{unit}.d"),
            format!("/etc/systemd/system.control/{unit}.d"),
        ]
        .into_iter()
        .filter(|f| std::path::Path::new(f).exists())
        .collect();
        let gone = if want_unloaded {
            load == "not-found"
        } else {
            active == "inactive"
        };
        if gone && files.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{unit} not gone: LoadState={load} ActiveState={active} files={files:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The v2 cgroup of a process, from its `/proc/<pid>/cgroup`.
fn cgroup_of(pid: i32) -> String {
    let t = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    t.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap()
        .to_string()
}

fn read_cgroup_file(cgroup_path: &str, file: &str) -> String {
    std::fs::read_to_string(format!("/sys/fs/cgroup{cgroup_path}/{file}"))
        .unwrap_or_else(|e| panic!("{cgroup_path}/{file}: {e}"))
        .trim()
        .to_string()
}

/// Stops a unit when dropped (kubelet's slices, which are kubelet's to remove).
struct StopOnDrop(String);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        let _ = sh_ok(&format!("systemctl stop {}", self.0));
    }
}

#[test]
fn kubelets_pod_slice_holds_a_scope_per_container_and_keeps_none_after_teardown() {
    let Some(env) = systemd_env("sd-kubepods") else {
        return;
    };
    let rt = setup(&env);
    assert_eq!(rt.cgroup_driver(), Driver::Systemd);
    let slice = format!("kubepods-burstable-pod{}.slice", env.bridge);
    let _kubelet = StopOnDrop(slice.clone());
    let mut p = env.pod("kubepods", false);
    // kubelet's systemd driver sends the slice's whole path.
    p.cgroup_parent = format!("/kubepods.slice/kubepods-burstable.slice/{slice}");
    let sb = rt.run_pod_sandbox(&p).unwrap();
    assert_eq!(rt.pod_cgroup(&sb).unwrap(), slice);
    let mut c = ctr("app", "sleep 1000");
    c.resources.memory_limit_in_bytes = 64 << 20;
    c.resources.cpu_shares = 512;
    let id = run(&rt, &sb, &c);
    let pid = rt.container_status(&id).unwrap().pid;
    let scope = format!("sandboxd-{id}.scope");
    let path = format!("/kubepods.slice/kubepods-burstable.slice/{slice}/{scope}");
    assert_eq!(cgroup_of(pid), path);
    assert_eq!(unit_property(&scope, "ActiveState"), "active");
    assert_eq!(unit_property(&scope, "Slice"), slice);
    // The runtime set the resources as the scope's properties; the kernel has them.
    assert_eq!(
        unit_property(&scope, "MemoryMax"),
        (64u64 << 20).to_string()
    );
    assert_eq!(
        read_cgroup_file(&path, "memory.max"),
        (64u64 << 20).to_string()
    );
    // 512 shares → weight 20 (runc's and kubelet's conversion).
    assert_eq!(read_cgroup_file(&path, "cpu.weight"), "20");
    // Stats read the scope's files.
    let u = rt.container_usage(&id).unwrap();
    assert!(u.memory_bytes.is_some_and(|m| m > 0), "{u:?}");

    rt.stop_pod_sandbox(&sb).unwrap();
    rt.remove_pod_sandbox(&sb).unwrap();
    assert_unit_gone(&scope);
    assert!(!std::path::Path::new(&format!("/sys/fs/cgroup{path}")).exists());
    // kubelet's slice stays kubelet's.
    assert_eq!(unit_property(&slice, "ActiveState"), "active");
    env.assert_no_leaks();
}

#[test]
fn a_pod_without_a_parent_gets_its_own_slice_sized_by_pod_level_resources() {
    let Some(env) = systemd_env("sd-own-slice") else {
        return;
    };
    let rt = setup(&env);
    let mut p = env.pod("own", false);
    p.resources = Some(sandboxd::model::resources::Resources {
        memory_limit_in_bytes: 128 << 20,
        cpu_quota: 50_000,
        cpu_period: 100_000,
        ..Default::default()
    });
    let sb = rt.run_pod_sandbox(&p).unwrap();
    let slice = rt.pod_cgroup(&sb).unwrap();
    assert_eq!(
        slice,
        Driver::Systemd.own_pod_cgroup(&env.cfg.cgroup_parent, &sb)
    );
    assert!(slice.ends_with(&format!("-pod{sb}.slice")), "{slice}");
    let path = systemd::fs_path(&slice).into_owned();
    assert_eq!(unit_property(&slice, "ActiveState"), "active");
    assert_eq!(
        unit_property(&slice, "MemoryMax"),
        (128u64 << 20).to_string()
    );
    assert_eq!(
        read_cgroup_file(&path, "memory.max"),
        (128u64 << 20).to_string()
    );
    assert_eq!(read_cgroup_file(&path, "cpu.max"), "50000 100000");
    let id = run(&rt, &sb, &ctr("app", "sleep 1000"));
    let pid = rt.container_status(&id).unwrap().pid;
    assert_eq!(cgroup_of(pid), format!("{path}/sandboxd-{id}.scope"));

    // UpdatePodSandboxResources resizes the slice through systemd.
    rt.update_pod_sandbox_resources(
        &sb,
        None,
        Some(sandboxd::model::resources::Resources {
            memory_limit_in_bytes: 256 << 20,
            ..Default::default()
        }),
    )
    .unwrap();
    assert_eq!(
        unit_property(&slice, "MemoryMax"),
        (256u64 << 20).to_string()
    );
    assert_eq!(
        read_cgroup_file(&path, "memory.max"),
        (256u64 << 20).to_string()
    );
    assert_eq!(read_cgroup_file(&path, "cpu.max"), "max 100000");

    rt.remove_pod_sandbox(&sb).unwrap();
    assert_unit_gone(&slice);
    assert_unit_gone(&format!("sandboxd-{id}.scope"));
    assert!(!std::path::Path::new(&format!("/sys/fs/cgroup{path}")).exists());
    env.assert_no_leaks();
}

#[test]
fn pods_survive_a_daemon_restart_and_systemd_reexec() {
    let Some(env) = systemd_env("sd-reexec") else {
        return;
    };
    let rt = setup(&env);
    let sb = rt.run_pod_sandbox(&env.pod("survivor", true)).unwrap();
    let id = run(&rt, &sb, &ctr("app", "sleep 1000"));
    let scope = format!("sandboxd-{id}.scope");
    drop(rt);
    sh("systemctl daemon-reexec");
    // systemd is back on the bus when it answers again.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !sh_ok("systemctl show -p Version --value").0 {
        assert!(Instant::now() < deadline, "systemd did not come back");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(unit_property(&scope, "ActiveState"), "active");
    let rt = env.runtime();
    assert_eq!(
        rt.container_status(&id).unwrap().state,
        ContainerState::Running
    );
    rt.stop_container(&id, Duration::ZERO).unwrap();
    assert_eq!(wait_exited(&rt, &id).exit_code, 137);
    rt.remove_pod_sandbox(&sb).unwrap();
    assert_unit_gone(&scope);
    assert_unit_gone(&format!("sandboxd-{sb}.scope"));
    env.assert_no_leaks();
}

#[test]
fn an_oom_kill_names_the_limit_it_answered() {
    let Some(env) = systemd_env("sd-oom") else {
        return;
    };
    let rt = setup(&env);
    let hog = "dd if=/dev/zero of=/dev/null bs=128M count=1";
    // The container's own limit.
    let sb = rt.run_pod_sandbox(&env.pod("oom-ctr", false)).unwrap();
    let mut c = ctr("hog", hog);
    c.resources.memory_limit_in_bytes = 16 << 20;
    let s = wait_exited(&rt, &run(&rt, &sb, &c));
    assert_eq!(
        (s.exit_code, s.reason.as_str()),
        (137, "OOMKilled"),
        "{s:?}"
    );
    assert!(s.message.contains("container's memory limit"), "{s:?}");
    rt.remove_pod_sandbox(&sb).unwrap();
    // The pod's: no container limit, the pod-level one is hit. The scope is gone with the
    // container: the monitor saw the kill.
    let mut p = env.pod("oom-pod", false);
    p.resources = Some(sandboxd::model::resources::Resources {
        memory_limit_in_bytes: 24 << 20,
        ..Default::default()
    });
    let sb = rt.run_pod_sandbox(&p).unwrap();
    let s = wait_exited(&rt, &run(&rt, &sb, &ctr("hog", hog)));
    assert_eq!(
        (s.exit_code, s.reason.as_str()),
        (137, "OOMKilled"),
        "{s:?}"
    );
    assert!(s.message.contains("pod's memory limit"), "{s:?}");
    rt.remove_pod_sandbox(&sb).unwrap();
    env.assert_no_leaks();
}

/// kubelet's `unified` map (here `memory.oom.group`, which kubelet sends on cgroup v2) is
/// written as it is: with it, an OOM kill takes the whole container, not just the hog.
/// Refused where the runtime could not write it.
#[test]
fn the_unified_map_is_written_as_is_and_checked() {
    let env = Env::new("unified");
    let rt = setup(&env);
    let sb = rt.run_pod_sandbox(&env.pod("unified", false)).unwrap();
    let mut c = ctr(
        "group",
        "sleep 1000 & dd if=/dev/zero of=/dev/null bs=128M count=1; wait",
    );
    c.resources.memory_limit_in_bytes = 16 << 20;
    c.resources
        .unified
        .insert("memory.oom.group".into(), "1".into());
    c.resources
        .unified
        .insert("memory.high".into(), (12u64 << 20).to_string());
    let v2 = sandboxd::oci::spec::cgroup_v2_only();
    if !v2 {
        let e = rt.create_container(&sb, &c).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("cgroup v2")),
            "{e}"
        );
        rt.remove_pod_sandbox(&sb).unwrap();
        env.assert_no_leaks();
        return;
    }
    // Keys that are not a controller's file are refused, whatever the host.
    let mut bad = ctr("bad", "true");
    bad.resources
        .unified
        .insert("cgroup.procs".into(), "1".into());
    let e = rt.create_container(&sb, &bad).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    bad.resources.unified = [("../memory.max".to_string(), "1".to_string())].into();
    let e = rt.create_container(&sb, &bad).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");

    let mut quiet = ctr("quiet", "sleep 1000");
    quiet
        .resources
        .unified
        .insert("memory.high".into(), (12u64 << 20).to_string());
    let q = run(&rt, &sb, &quiet);
    let pid = rt.container_status(&q).unwrap().pid;
    assert_eq!(
        read_cgroup_file(&cgroup_of(pid), "memory.high"),
        (12u64 << 20).to_string()
    );
    // Without the group kill, `sleep` would keep the container running after dd's death.
    let s = wait_exited(&rt, &run(&rt, &sb, &c));
    assert_eq!(
        (s.exit_code, s.reason.as_str()),
        (137, "OOMKilled"),
        "{s:?}"
    );
    rt.remove_pod_sandbox(&sb).unwrap();
    env.assert_no_leaks();
}

/// Pressure stall information under load, on either lane wherever the kernel keeps PSI for
/// the container's cgroup: a CPU hog held to a fifth of a CPU stalls on cpu; a writer under a
/// tight memory limit stalls on page reclaim and on writeback; the usage that stats are made
/// of carries those stalls (totals in microseconds, non-zero and growing; their CRI and
/// Prometheus forms are checked in `cri_v136`).
#[test]
fn pressure_stall_totals_grow_under_load() {
    let env = Env::new("psi-load");
    let rt = setup(&env);
    let sb = rt.run_pod_sandbox(&env.pod("psi", false)).unwrap();
    let mut hog = ctr(
        "hog",
        "for i in 1 2 3; do (while :; do :; done) & done; wait",
    );
    hog.resources.cpu_quota = 20_000;
    hog.resources.cpu_period = 100_000;
    let hog = run(&rt, &sb, &hog);
    let mut writer = ctr(
        "writer",
        "while :; do dd if=/dev/zero of=/f bs=1M count=48 conv=fsync 2>/dev/null; \
         cat /f > /dev/null; rm -f /f; done",
    );
    writer.resources.memory_limit_in_bytes = 24 << 20;
    let writer = run(&rt, &sb, &writer);
    if rt.container_usage(&hog).unwrap().psi.cpu.is_none() {
        eprintln!("skipped: the kernel keeps no PSI for cgroups here (psi=0 or no cgroup2)");
        rt.remove_pod_sandbox(&sb).unwrap();
        return;
    }
    let stalled = |id: &str, pick: fn(&sandboxd::cgroups::Psi) -> u64| {
        pick(&rt.container_usage(id).unwrap().psi)
    };
    let cpu = |p: &sandboxd::cgroups::Psi| p.cpu.map_or(0, |p| p.some_total_us);
    let mem = |p: &sandboxd::cgroups::Psi| p.memory.map_or(0, |p| p.some_total_us);
    let io = |p: &sandboxd::cgroups::Psi| p.io.map_or(0, |p| p.some_total_us);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let seen = [
            stalled(&hog, cpu),
            stalled(&writer, mem),
            stalled(&writer, io),
        ];
        eprintln!("stall totals (us): hog cpu, writer memory, writer io = {seen:?}");
        if seen.iter().all(|&t| t > 0) {
            break;
        }
        assert!(Instant::now() < deadline, "no stall under load: {seen:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    // They grow while the load goes on.
    let before = stalled(&hog, cpu);
    std::thread::sleep(Duration::from_secs(1));
    assert!(stalled(&hog, cpu) > before);
    rt.remove_pod_sandbox(&sb).unwrap();
    env.assert_no_leaks();
}
