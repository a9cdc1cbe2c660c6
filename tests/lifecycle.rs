//! Pod sandbox lifecycle against the real host: runc/crun, the Debian CNI plugins, real
//! namespaces and mounts. Run as root (scripts/test).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use sandboxd::probe::Readiness;
use sandboxd::{InfraMode, NamespaceMode, SandboxFilter, SandboxState};

fn runc_status(env: &Env, id: &str) -> Option<String> {
    let (ok, out) = sh_ok(&format!(
        "runc --root {} state {id}",
        env.runtime_root("runc").display()
    ));
    if !ok {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&out).ok()?;
    v["status"].as_str().map(str::to_string)
}

/// Test 1: run → stop → stop → remove → remove, with an infra process, asserting host facts.
#[test]
fn full_lifecycle_with_infra_process() {
    let env = Env::new("lifecycle");
    let rt = env.runtime();
    let pod = env.pod("web", true);
    let id = rt.run_pod_sandbox(&pod).unwrap();
    let rec = rt.sandbox_record(&id).unwrap();
    let st = rt.pod_sandbox_status(&id[..8]).unwrap();
    assert_eq!(st.state, SandboxState::Ready);
    assert_eq!(st.infra_mode, InfraMode::Process);

    // netns: exists, nsfs, eth0 holds the CNI address inside the test subnet.
    let netns = rec.netns.clone().unwrap();
    assert_eq!(mountinfo_fs(&netns).as_deref(), Some("nsfs"));
    assert_eq!(st.ips.len(), 1);
    assert!(st.ips[0].starts_with(&env.subnet_prefix), "{:?}", st.ips);
    let addrs = addrs_in(&netns, "eth0");
    assert!(addrs.contains(&format!("{}/24", st.ips[0])), "{addrs}");
    assert!(addrs_in(&netns, "lo").contains("127.0.0.1"));
    assert!(env.ipam_reservations().contains(&st.ips[0]));
    // shm tmpfs mounted; infra running; state recorded.
    let shm = rec.shm.clone().unwrap();
    assert_eq!(mountinfo_fs(&shm).as_deref(), Some("tmpfs"));
    assert_eq!(runc_status(&env, &id).as_deref(), Some("running"));
    let pid = st.infra_pid.unwrap();
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    // The infra process lives in the pod netns and sees the pod shm as /dev/shm.
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(format!("/proc/{pid}/ns/net"))
            .unwrap()
            .ino(),
        std::fs::metadata(&netns).unwrap().ino(),
        "infra is not in the pod netns"
    );
    assert!(rec.dir.join("state.json").is_file());
    let (_, veths) = sh_ok(&format!("ip -o link show master {}", env.bridge));
    assert!(veths.contains("veth"), "{veths}");

    rt.stop_pod_sandbox(&id).unwrap();
    assert_eq!(mountinfo_fs(&shm), None, "shm still mounted after stop");
    assert!(
        env.ipam_reservations().is_empty(),
        "host-local reservation kept"
    );
    let (_, veths) = sh_ok(&format!("ip -o link show master {}", env.bridge));
    assert!(!veths.contains("veth"), "veth kept: {veths}");
    assert!(!netns.exists(), "netns file kept after stop");
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists()
            || sh(&format!("cat /proc/{pid}/stat")).contains(" Z ")
    );
    assert_eq!(
        rt.pod_sandbox_status(&id).unwrap().state,
        SandboxState::NotReady
    );
    rt.stop_pod_sandbox(&id).unwrap();

    rt.remove_pod_sandbox(&id).unwrap();
    assert!(!rec.dir.exists());
    assert_eq!(
        runc_status(&env, &id),
        None,
        "runc still knows the infra container"
    );
    assert!(rt.pod_sandbox_status(&id).is_err());
    rt.remove_pod_sandbox(&id).unwrap();
    rt.stop_pod_sandbox(&id).unwrap();
    // The name is free again.
    let id2 = rt.run_pod_sandbox(&pod).unwrap();
    assert_ne!(id, id2);
    rt.remove_pod_sandbox(&id2).unwrap();
    env.assert_no_leaks();
}

/// Test 8 (pinned mode): a kubelet-default pod runs no process at all, yet its pinned net,
/// IPC and UTS namespaces exist, carry the hostname and the CNI address, and go on remove.
#[test]
fn default_pod_runs_no_process() {
    let env = Env::new("pinned");
    let rt = env.runtime();
    let mut pod = env.pod("quiet", false);
    pod.hostname = "quiet-host".into();
    let id = rt.run_pod_sandbox(&pod).unwrap();
    let rec = rt.sandbox_record(&id).unwrap();
    assert_eq!(rec.infra_mode, InfraMode::Pinned);
    assert!(rec.infra.is_none());
    assert_eq!(
        runc_status(&env, &id),
        None,
        "a runtime container was created"
    );
    let (net, ipc, uts) = (
        rec.netns.clone().unwrap(),
        rec.ipcns.clone().unwrap(),
        rec.utsns.clone().unwrap(),
    );
    for p in [&net, &ipc, &uts] {
        assert_eq!(mountinfo_fs(p).as_deref(), Some("nsfs"), "{}", p.display());
    }
    assert_ne!(
        sh(&format!(
            "nsenter --ipc={} readlink /proc/self/ns/ipc",
            ipc.display()
        )),
        sh("readlink /proc/self/ns/ipc")
    );
    assert_eq!(
        sh(&format!("nsenter --uts={} hostname", uts.display())).trim(),
        "quiet-host"
    );
    let ip = rt.pod_sandbox_status(&id).unwrap().ips[0].clone();
    assert!(addrs_in(&net, "eth0").contains(&ip));
    // No monitor and no pause anywhere for this pod.
    let procs = processes_mentioning(&id);
    assert!(procs.is_empty(), "processes for the pod: {procs:?}");
    rt.remove_pod_sandbox(&id).unwrap();
    for p in [&net, &ipc, &uts] {
        assert!(!p.exists());
    }
    env.assert_no_leaks();
}

/// Test 2: a host-network pod gets no netns and no CNI call; its infra runs in the host netns.
#[test]
fn host_network_pod() {
    let env = Env::new("hostnet");
    // Any CNI call would fail: the only config names a plugin that always errors.
    env.write_plugin(
        "always-fail",
        "#!/bin/sh\necho '{\"code\":100,\"msg\":\"must not be called\"}'\nexit 1\n",
    );
    std::fs::write(
        env.cfg.cni_conf_dir.join("10-fail.conflist"),
        r#"{"cniVersion":"1.0.0","name":"fail","plugins":[{"type":"always-fail"}]}"#,
    )
    .unwrap();
    let rt = env.runtime();
    let mut pod = env.pod("hostnet", true);
    pod.namespace_options.network = NamespaceMode::Node;
    pod.namespace_options.ipc = NamespaceMode::Node;
    let id = rt.run_pod_sandbox(&pod).unwrap();
    let rec = rt.sandbox_record(&id).unwrap();
    assert!(rec.netns.is_none());
    assert!(rec.shm.is_none(), "host-IPC pod got its own shm");
    assert!(!rec.dir.join("shm").exists());
    assert!(common::list_names(&env.cfg.netns_dir).is_empty());
    assert!(rec.network.ips.is_empty() && !rec.network.setup_started);
    let pid = rt.pod_sandbox_status(&id).unwrap().infra_pid.unwrap();
    assert_eq!(
        std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap(),
        std::fs::read_link("/proc/self/ns/net").unwrap()
    );
    rt.stop_pod_sandbox(&id).unwrap();
    rt.remove_pod_sandbox(&id).unwrap();
    env.assert_no_leaks();
}

/// Test 6: 20 sandboxes run, stopped and removed from 8 threads at once.
#[test]
fn concurrent_lifecycles() {
    let env = Env::new("concurrent");
    let rt = env.runtime();
    let ids = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for t in 0..8 {
            let (rt, env, ids) = (&rt, &env, &ids);
            s.spawn(move || {
                let mut mine = Vec::new();
                for i in (t..20).step_by(8) {
                    let pod = env.pod(&format!("c{i}"), i % 2 == 0);
                    mine.push(rt.run_pod_sandbox(&pod).unwrap());
                }
                ids.lock().unwrap().extend(mine.iter().cloned());
                for id in &mine {
                    rt.stop_pod_sandbox(id).unwrap();
                }
                for id in &mine {
                    rt.remove_pod_sandbox(id).unwrap();
                }
            });
        }
    });
    let mut ids = ids.into_inner().unwrap();
    assert_eq!(ids.len(), 20);
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 20, "ids not distinct");
    assert!(rt.list_pod_sandboxes(&SandboxFilter::default()).is_empty());
    env.assert_no_leaks();
}

/// Concurrent sandboxes get distinct IPs and are all listed; filters work.
#[test]
fn list_filters_and_distinct_ips() {
    let env = Env::new("list");
    let rt = env.runtime();
    let mut a = env.pod("a", false);
    a.labels.insert("app".into(), "x".into());
    let b = env.pod("b", false);
    let ia = rt.run_pod_sandbox(&a).unwrap();
    let ib = rt.run_pod_sandbox(&b).unwrap();
    let all = rt.list_pod_sandboxes(&SandboxFilter::default());
    assert_eq!(all.len(), 2);
    assert_ne!(all[0].ips, all[1].ips);
    let mut f = SandboxFilter::default();
    f.labels.insert("app".into(), "x".into());
    let l = rt.list_pod_sandboxes(&f);
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].id, ia);
    rt.stop_pod_sandbox(&ib).unwrap();
    let ready = rt.list_pod_sandboxes(&SandboxFilter {
        state: Some(SandboxState::Ready),
        ..Default::default()
    });
    assert_eq!(ready.len(), 1);
    let by_prefix = rt.list_pod_sandboxes(&SandboxFilter {
        id_prefix: Some(ib[..6].to_string()),
        ..Default::default()
    });
    assert_eq!(by_prefix.len(), 1);
    // A retried request with the same name and attempt returns the existing id.
    assert_eq!(rt.run_pod_sandbox(&a).unwrap(), ia);
    // Another request for the same name is refused, naming the holder.
    let mut other = a.clone();
    other.hostname = "different".into();
    let e = rt.run_pod_sandbox(&other).unwrap_err().to_string();
    assert!(e.contains(&ia), "{e}");
    env.remove_all(&rt);
    env.assert_no_leaks();
}

/// Test 9: the netns vanishes underneath (deleted as `ip netns del` does) or becomes a plain
/// file; stop and remove still succeed and CNI DEL still releases the IPAM reservation.
#[test]
fn netns_vanishes_underneath() {
    let env = Env::new("vanish");
    let rt = env.runtime();
    for (i, plain) in [false, true].into_iter().enumerate() {
        let id = rt
            .run_pod_sandbox(&env.pod(&format!("v{i}"), i == 1))
            .unwrap();
        let netns = rt.sandbox_record(&id).unwrap().netns.unwrap();
        assert_eq!(env.ipam_reservations().len(), 1);
        sh(&format!("umount -l {}", netns.display()));
        if !plain {
            std::fs::remove_file(&netns).unwrap();
        } else {
            assert!(netns.is_file());
        }
        rt.stop_pod_sandbox(&id).unwrap();
        assert!(
            env.ipam_reservations().is_empty(),
            "DEL did not release the address"
        );
        rt.remove_pod_sandbox(&id).unwrap();
        assert!(!netns.exists());
    }
    env.assert_no_leaks();
}

/// Test 8 (crun): the start-up probe's trial container decides whether crun is offered. Where
/// crun works, one full cycle with it; where the host refuses it (Debian's crun 1.8 on a
/// cgroup v1 hybrid host), it is left out of Status with crun's own reason and its pods are
/// refused at once with that reason, while runc is offered.
#[test]
fn crun_handler_cycle() {
    let env = Env::new("crun");
    if sandboxd::config::find_in_path("crun").is_none() {
        eprintln!("SKIP crun_handler_cycle: crun is not installed");
        return;
    }
    let rt = env.runtime();
    let probed = rt.wait_probed(Duration::from_secs(60));
    assert_eq!(probed["runc"], Readiness::Ready, "{probed:?}");
    let health = rt.health();
    let offered: Vec<_> = health.handlers.iter().map(|h| h.name.as_str()).collect();
    assert!(
        offered.contains(&"runc") && offered.contains(&""),
        "{offered:?}"
    );
    // The trial left nothing: no container, no dir, no cgroup.
    assert!(!env.cfg.root.join("probe").exists());
    let mut pod = env.pod("crunpod", true);
    pod.runtime_handler = "crun".into();
    match &probed["crun"] {
        Readiness::Ready => {
            assert!(offered.contains(&"crun"), "{offered:?}");
            let id = rt.run_pod_sandbox(&pod).unwrap();
            let pid = rt.pod_sandbox_status(&id).unwrap().infra_pid.unwrap();
            assert!(Path::new(&format!("/proc/{pid}")).exists());
            let (ok, out) = sh_ok(&format!(
                "crun --root {} state {id}",
                env.runtime_root("crun").display()
            ));
            assert!(ok && out.contains("running"), "{out}");
            rt.stop_pod_sandbox(&id).unwrap();
            rt.remove_pod_sandbox(&id).unwrap();
        }
        Readiness::NotReady(why) => {
            // Detected, not assumed: this host is cgroup v1 hybrid, which crun refuses.
            assert!(
                sandboxd::cgroups::hierarchies()
                    .iter()
                    .any(|h| h.controllers.is_some()),
                "crun refused a cgroup v2 host: {why}"
            );
            assert!(why.contains("crun"), "{why}");
            assert!(!offered.contains(&"crun"), "{offered:?}");
            assert!(
                health
                    .not_offered
                    .contains(&("crun".to_string(), why.clone())),
                "{:?}",
                health.not_offered
            );
            let t = Instant::now();
            let e = rt.run_pod_sandbox(&pod).unwrap_err();
            assert!(matches!(e, sandboxd::Error::FailedPrecondition(_)), "{e}");
            assert!(e.to_string().contains(why.as_str()), "{e}");
            assert!(
                t.elapsed() < Duration::from_millis(500),
                "{:?}",
                t.elapsed()
            );
            assert!(rt.list_pod_sandboxes(&Default::default()).is_empty());
            eprintln!("crun not offered here: {why}");
        }
        other => panic!("crun was not tried: {other:?}"),
    }
    env.assert_no_leaks();
}

/// Interop with iproute2: with the netns dir at /var/run/netns (as `ip netns` uses), `ip netns
/// list` shows the sandbox's netns and `ip netns exec` works in it. Only the entry this test
/// creates is touched.
#[test]
fn iproute2_sees_the_netns() {
    let mut env = Env::new("iproute2");
    env.cfg.netns_dir = "/var/run/netns".into();
    let rt = env.runtime();
    let id = rt.run_pod_sandbox(&env.pod("ipr", false)).unwrap();
    let netns = rt.sandbox_record(&id).unwrap().netns.unwrap();
    let name = netns.file_name().unwrap().to_str().unwrap().to_string();
    let ip = rt.pod_sandbox_status(&id).unwrap().ips[0].clone();
    let listed = sh("ip netns list");
    assert!(
        listed
            .lines()
            .any(|l| l.split_whitespace().next() == Some(name.as_str())),
        "{listed}"
    );
    let out = sh(&format!("ip netns exec {name} ip -4 -o addr show eth0"));
    assert!(out.contains(&ip), "{out}");
    rt.remove_pod_sandbox(&id).unwrap();
    assert!(!netns.exists());
    assert!(!sh("ip netns list").contains(&name));
    env.assert_no_leaks_except_netns_dir();
}

/// The Debian plugins in every CNI version we accept: ADD gives the address, DEL releases it.
#[test]
fn cni_versions() {
    let env = Env::new("cnivers");
    for version in ["0.3.0", "0.3.1", "0.4.0", "1.0.0"] {
        env.write_conflist(
            "10-test.conflist",
            r#",{"type":"portmap","capabilities":{"portMappings":true}}"#,
        );
        let path = env.cfg.cni_conf_dir.join("10-test.conflist");
        let doc = std::fs::read_to_string(&path)
            .unwrap()
            .replace("\"1.0.0\"", &format!("\"{version}\""));
        std::fs::write(&path, doc).unwrap();
        let rt = env.runtime();
        let id = rt
            .run_pod_sandbox(&env.pod(&format!("v{}", version.replace('.', "")), false))
            .unwrap();
        let st = rt.pod_sandbox_status(&id).unwrap();
        assert_eq!(st.ips.len(), 1, "{version}");
        assert!(
            addrs_in(st.netns_path.as_ref().unwrap(), "eth0").contains(&st.ips[0]),
            "{version}"
        );
        assert_eq!(
            env.ipam_reservations(),
            vec![st.ips[0].clone()],
            "{version}"
        );
        rt.stop_pod_sandbox(&id).unwrap();
        assert!(
            env.ipam_reservations().is_empty(),
            "{version}: DEL kept the address"
        );
        rt.remove_pod_sandbox(&id).unwrap();
    }
    env.assert_no_leaks();
}

/// Preparing a namespace dir reached through a symlink (as `/var/run` is on most hosts) twice
/// must not stack mounts: each bind onto a shared mount doubles the mounts there.
#[test]
fn shared_dir_through_a_symlink_is_mounted_once() {
    let env = Env::new("shareddir");
    let real = env.base.join("real-netns");
    let link = env.base.join("link-netns");
    std::fs::create_dir_all(&real).unwrap();
    std::os::unix::fs::symlink(&real, &link).unwrap();
    for _ in 0..3 {
        sandboxd::mounts::make_shared_dir(&link).unwrap();
    }
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mounts: Vec<&str> = table
        .lines()
        .filter(|l| l.split(' ').nth(4) == Some(real.to_str().unwrap()))
        .collect();
    assert_eq!(mounts.len(), 1, "mounts stacked on {}", real.display());
    // Shared, so that the pins made in it later reach the runtime's mount namespace.
    assert!(mounts[0].contains(" shared:"), "{}", mounts[0]);
}
