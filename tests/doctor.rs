//! The node's self-audit (`Runtime::audit`, `sandboxctl doctor`): every kind of host object
//! the lifecycle makes is found when no record owns it, and `--fix` removes exactly those.
//!
//! The orphans are real: a second `Runtime` on the same root runs a pod with a container
//! that the audited one has no record of — its runtime containers, CNI attachment and IPAM
//! reservation, shm and rootfs mounts, namespace files, dirs, sockets and pod cgroup. What a
//! crash leaves that a pod cannot make (a user-namespace mount dir, a half-unpacked layer of a
//! killed pull, a layer no image names) is planted by hand.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use common::*;
use sandboxd::audit::Kind;
use sandboxd::{ContainerConfig, ContainerState, Runtime, SandboxState};

const IMAGE: &str = "sandboxd.test/busybox:latest";

fn sleeper(rt: &Runtime, pod: &str) -> String {
    let c = ContainerConfig {
        metadata: sandboxd::ContainerMetadata {
            name: "sleeper".into(),
            attempt: 0,
        },
        image: IMAGE.into(),
        command: vec!["sleep".into(), "3600".into()],
        log_path: "sleeper/0.log".into(),
        ..Default::default()
    };
    let id = rt.create_container(pod, &c).unwrap();
    rt.start_container(&id).unwrap();
    id
}

fn pod(env: &Env, name: &str) -> sandboxd::PodSandboxConfig {
    let mut p = env.pod(name, true);
    p.log_directory = env.base.join("logs").join(name).to_string_lossy().into();
    p
}

fn orphan_gauge(rt: &Runtime, kind: &str) -> Option<f64> {
    let (p, c) = rt.counts_by_state();
    let text = rt.daemon_metrics().encode(&p, &c);
    let prefix = format!("sandboxd_orphans{{kind=\"{kind}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn the_audit_finds_every_kind_of_orphan_and_fix_removes_exactly_those() {
    let env = Env::new("doctor");
    // Both opened on the empty root: neither knows the other's pods.
    let live = env.runtime();
    let other = env.runtime();
    live.images()
        .import(&busybox::oci_layout(&env.base, IMAGE), None)
        .unwrap();

    let keep_cfg = pod(&env, "keep");
    let keep = live.run_pod_sandbox(&keep_cfg).unwrap();
    let keep_ctr = sleeper(&live, &keep);
    let before = live.audit();
    assert!(
        before.orphans.is_empty(),
        "live pods reported: {:?}",
        before.orphans
    );
    assert_eq!(orphan_gauge(&live, "cni_cache"), Some(0.0));

    let lost_cfg = pod(&env, "lost");
    let lost = other.run_pod_sandbox(&lost_cfg).unwrap();
    let lost_ctr = sleeper(&other, &lost);
    let lost_infra = other.pod_sandbox_status(&lost).unwrap().infra_pid.unwrap();
    let lost_ip = other.pod_sandbox_status(&lost).unwrap().ips[0].clone();
    drop(other);
    // What no pod makes: a user-namespace mount dir a crash left, a killed pull's layer.
    let userns_dir = env.cfg.root.join("userns").join("e".repeat(64));
    std::fs::create_dir_all(&userns_dir).unwrap();
    let partial = env.cfg.root.join("images/tmp/layer-999999999-x");
    std::fs::create_dir_all(partial.join("usr/bin")).unwrap();
    std::fs::write(partial.join("usr/bin/half"), vec![0u8; 4096]).unwrap();
    // A layer no image names (a crash between an image's removal and its collection).
    let unused_layer = env.cfg.root.join("images/layers").join("a".repeat(64));
    std::fs::create_dir_all(unused_layer.join("etc")).unwrap();
    // An address a killed ADD reserved, which no record and no cache names.
    let ip: std::net::Ipv4Addr = lost_ip.parse().unwrap();
    let leaked = env
        .ipam_dir()
        .join(std::net::Ipv4Addr::from(u32::from(ip) + 100).to_string());
    std::fs::write(&leaked, format!("{}\r\neth0", "d".repeat(64))).unwrap();

    let found = live.audit();
    let kinds: BTreeSet<&str> = found.orphans.iter().map(|o| o.kind.as_str()).collect();
    let all: BTreeSet<&str> = Kind::ALL.iter().map(|k| k.as_str()).collect();
    assert_eq!(kinds, all, "orphans: {:#?}", found.orphans);
    for o in &found.orphans {
        let ok = match o.kind {
            Kind::UsernsDir => o.path == userns_dir,
            Kind::PartialPull => o.path == partial,
            Kind::UnusedImageContent => o.path == unused_layer,
            Kind::IpamReservation => o.path == leaked,
            // Namespace files and sockets carry the id's first 16 characters.
            Kind::Namespace | Kind::Socket => {
                lost.starts_with(&o.owner) || lost_ctr.starts_with(&o.owner)
            }
            _ => o.owner == lost || o.owner == lost_ctr,
        };
        assert!(
            ok,
            "not an orphan: {o:?} (lost pod {lost}, container {lost_ctr})"
        );
        assert!(!o.owner.is_empty() || o.kind == Kind::PartialPull, "{o:?}");
    }
    assert_eq!(orphan_gauge(&live, "cni_cache"), Some(1.0));
    assert_eq!(orphan_gauge(&live, "runtime_container"), Some(2.0));

    // Too new for the grace period: nothing is touched.
    let kept = live.audit_fix(Duration::from_secs(3600));
    assert!(kept.orphans.iter().all(|o| o.fixed.is_none()), "{kept:#?}");
    assert_eq!(kept.orphans.len(), found.orphans.len());

    let fixed = live.audit_fix(Duration::ZERO);
    for o in &fixed.orphans {
        assert_eq!(o.fixed, Some(Ok(())), "{o:?}");
    }
    // The host facts: the lost pod's processes, address, mounts and files are gone...
    assert!(
        !Path::new(&format!("/proc/{lost_infra}")).exists(),
        "lost infra {lost_infra} still runs"
    );
    let reservations = env.ipam_reservations();
    assert!(
        !reservations.contains(&lost_ip),
        "lost pod's address {lost_ip} still reserved: {reservations:?}"
    );
    assert_eq!(reservations.len(), 1, "{reservations:?}");
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mountinfo.contains(&lost), "lost pod's mounts remain");
    assert!(
        !mountinfo.contains(&lost_ctr),
        "lost container's rootfs remains"
    );
    let runc = list_names(&env.runtime_root("runc"));
    assert!(
        !runc.contains(&lost) && !runc.contains(&lost_ctr),
        "runc still has {runc:?}"
    );
    assert!(!userns_dir.exists() && !partial.exists() && !unused_layer.exists());
    // The image the containers run stays.
    assert_eq!(live.images().list().len(), 1);
    assert!(cgroups_under(&env.cfg.cgroup_parent)
        .iter()
        .all(|c| !c.to_string_lossy().contains(&lost)));
    let after = live.audit();
    assert!(after.orphans.is_empty(), "left: {:#?}", after.orphans);
    assert_eq!(orphan_gauge(&live, "cni_cache"), Some(0.0));

    // ...and the live pod is untouched.
    let s = live.pod_sandbox_status(&keep).unwrap();
    assert_eq!(s.state, SandboxState::Ready);
    assert!(Path::new(&format!("/proc/{}", s.infra_pid.unwrap())).exists());
    assert_eq!(
        live.container_status(&keep_ctr).unwrap().state,
        ContainerState::Running
    );
    assert!(runc.contains(&keep) && runc.contains(&keep_ctr));

    live.stop_pod_sandbox(&keep).unwrap();
    live.remove_pod_sandbox(&keep).unwrap();
    env.assert_no_leaks();
}

/// Two daemons with their own state roots (issue 36): each one's pod cgroups are its own, even
/// when an operator gives both the same cgroup parent. The second one's start-up sweep, audit
/// and `--fix` leave the first one's pod and its cgroup alone; with no parent configured,
/// each root gets a parent of its own.
#[test]
fn a_second_daemon_never_collects_the_first_ones_cgroups() {
    let env = Env::new("doctor-two-roots");
    let first = env.runtime();
    first
        .images()
        .import(&busybox::oci_layout(&env.base, IMAGE), None)
        .unwrap();
    let p = pod(&env, "first");
    let sb = first.run_pod_sandbox(&p).unwrap();
    let ctr = sleeper(&first, &sb);
    let mine = cgroups_under(&env.cfg.cgroup_parent);
    assert!(
        mine.iter().any(|c| c.to_string_lossy().contains(&sb)),
        "{mine:?}"
    );
    let second_cfg = sandboxd::Config {
        root: env.base.join("second-root"),
        ..env.cfg.clone()
    };
    assert_eq!(second_cfg.cgroup_parent, env.cfg.cgroup_parent);
    let second = Runtime::new(second_cfg.clone()).unwrap();
    let audit = second.audit();
    assert!(
        audit
            .orphans
            .iter()
            .all(|o| !o.owner.contains(&sb) && !o.owner.contains(&ctr)),
        "the second daemon claims the first one's pod: {:#?}",
        audit.orphans
    );
    let fixed = second.audit_fix(Duration::ZERO);
    assert!(
        fixed.orphans.iter().all(|o| o.kind != Kind::Cgroup),
        "{:#?}",
        fixed.orphans
    );
    assert_eq!(cgroups_under(&env.cfg.cgroup_parent), mine);
    assert_eq!(
        first.container_status(&ctr).unwrap().state,
        ContainerState::Running
    );
    // No parent configured: one per root (the default root keeps `/sandboxd`).
    let unset = |root: &str| {
        sandboxd::Config {
            root: root.into(),
            cgroup_parent: String::new(),
            ..sandboxd::Config::default()
        }
        .effective_cgroup_parent()
    };
    assert_eq!(unset("/var/lib/sandboxd"), "/sandboxd");
    assert_ne!(unset("/srv/a"), unset("/srv/b"));
    assert!(unset("/srv/a").starts_with("/sandboxd-"));
    drop(second);
    first.stop_pod_sandbox(&sb).unwrap();
    first.remove_pod_sandbox(&sb).unwrap();
    let _ = std::fs::remove_dir_all(&second_cfg.root);
    env.assert_no_leaks();
}

/// A host-local reservation no record and no CNI cache names (issue 36: a plugin killed
/// mid-ADD, the classic "no IP addresses available" leak) is found and released through CNI
/// DEL; a live pod's reservation is left alone.
#[test]
fn an_ipam_reservation_no_record_names_is_released() {
    let env = Env::new("doctor-ipam");
    let rt = env.runtime();
    let p = env.pod("alive", false);
    let sb = rt.run_pod_sandbox(&p).unwrap();
    let live = env.ipam_reservations();
    assert_eq!(live.len(), 1, "{live:?}");
    // The address a killed ADD left: reserved for an id nothing else names.
    let ip: std::net::Ipv4Addr = live[0].parse().unwrap();
    let lost = std::net::Ipv4Addr::from(u32::from(ip) + 100).to_string();
    let lost_id = "f".repeat(64);
    std::fs::write(env.ipam_dir().join(&lost), format!("{lost_id}\r\neth0")).unwrap();
    let found: Vec<_> = rt
        .audit()
        .orphans
        .into_iter()
        .filter(|o| o.kind == Kind::IpamReservation)
        .collect();
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].owner, lost_id);
    let fixed = rt.audit_fix(Duration::ZERO);
    assert!(
        fixed.orphans.iter().all(|o| o.fixed == Some(Ok(()))),
        "{:#?}",
        fixed.orphans
    );
    assert_eq!(env.ipam_reservations(), live);
    assert!(rt.audit().orphans.is_empty());
    rt.stop_pod_sandbox(&sb).unwrap();
    rt.remove_pod_sandbox(&sb).unwrap();
    env.assert_no_leaks();
}

/// The daemon's start (`Runtime::restored`) lists every pod before the start-up sweep runs;
/// the sweep then runs beside the verbs (`sweep_left_over`, on a thread of its own as the
/// daemon runs it), and an audit asked meanwhile waits for it rather than reporting what it
/// is about to remove.
#[test]
fn the_start_up_sweep_runs_after_the_restore_and_an_audit_waits_for_it() {
    let env = Env::new("sweepbg");
    let first = env.runtime();
    let kept = first.run_pod_sandbox(&pod(&env, "kept")).unwrap();
    drop(first);
    // What a crash left: a user-namespace mount dir and an address no record names.
    let userns_dir = env.cfg.root.join("userns").join("e".repeat(64));
    std::fs::create_dir_all(&userns_dir).unwrap();
    std::fs::create_dir_all(env.ipam_dir()).unwrap();
    let leaked = env.ipam_dir().join("10.255.255.254");
    std::fs::write(&leaked, format!("{}\r\neth0", "d".repeat(64))).unwrap();

    let rt = std::sync::Arc::new(Runtime::restored(env.cfg.clone()).unwrap());
    // Restored and listed; the leftovers not yet collected.
    assert_eq!(
        rt.pod_sandbox_status(&kept).unwrap().state,
        SandboxState::Ready
    );
    assert!(userns_dir.exists() && leaked.exists());
    let sweeper = rt.clone();
    let sweep = std::thread::spawn(move || sweeper.sweep_left_over());
    let audit = rt.audit();
    assert!(audit.orphans.is_empty(), "{:#?}", audit.orphans);
    assert!(!userns_dir.exists() && !leaked.exists());
    sweep.join().unwrap();
    rt.stop_pod_sandbox(&kept).unwrap();
    rt.remove_pod_sandbox(&kept).unwrap();
    drop(rt);
    env.assert_no_leaks();
}
