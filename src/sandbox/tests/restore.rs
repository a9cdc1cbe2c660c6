//! Restore decisions at start-up (`sandbox/restore.rs`): a `creating` record is rolled back, a
//! ready one whose netns or infra is gone becomes NotReady, a healthy one stays ready with
//! its name, a given-up CNI DEL is retried, and namespace files no record names are removed.

use super::*;
use Op::*;

/// A crash left a record saying `creating` (every resource named, some made): the restart
/// tears down everything it names, newest first, and forgets it.
#[test]
fn creating_record_is_rolled_back() {
    let h = Harness::new("restore-creating");
    let config = pod("restore-creating");
    let id = ready(&h, &config);
    h.rewrite_record(&id, |r| r.state = SandboxState::Creating);

    let fake = h.fake.clone();
    let h = h.restart(fake);
    assert_eq!(
        h.ops(),
        [
            CniDel,
            RemoveNamespace,
            RemoveNamespace,
            RemoveNamespace,
            Unmount,
            RemoveCgroup
        ]
    );
    h.assert_nothing_left();
    h.rt.run_pod_sandbox(&config)
        .expect("the name was released");
}

/// The host rebooted: the netns is gone, so the pod is NotReady (persisted) and nothing is
/// torn down; its name stays reserved for kubelet's Stop/Remove.
#[test]
fn ready_record_without_its_netns_is_not_ready() {
    let h = Harness::new("restore-no-netns");
    let config = pod("restore-no-netns");
    let id = ready(&h, &config);

    let h = h.restart(FakeHost::new());
    assert_eq!(h.ops(), [], "nothing torn down");
    assert_eq!(h.record(&id).state, SandboxState::NotReady);
    assert_eq!(h.record_on_disk(&id).state, SandboxState::NotReady);
    let err = h.rt.run_pod_sandbox(&config).expect_err("name still held");
    assert!(matches!(err, Error::NameReserved { .. }), "{err}");
}

/// The daemon restarted on a host that kept running: the pod is still ready and the same
/// RunPodSandbox request gets the same id. Its infra is asked about once.
#[test]
fn healthy_ready_record_stays_ready() {
    let h = Harness::new("restore-healthy");
    let config = infra_pod("restore-healthy");
    let id = ready(&h, &config);

    let fake = h.fake.clone();
    let h = h.restart(fake);
    assert_eq!(h.ops(), [RuntimeState]);
    assert_eq!(h.args(RuntimeState), [id.as_str()]);
    assert_eq!(h.record(&id).state, SandboxState::Ready);
    assert_eq!(h.rt.run_pod_sandbox(&config).unwrap(), id);
}

/// The infra container died while the daemon was down: NotReady, so kubelet recreates it.
#[test]
fn ready_record_with_a_dead_infra_is_not_ready() {
    let h = Harness::new("restore-dead-infra");
    let id = ready(&h, &infra_pod("restore-dead-infra"));
    h.fake.set_container(&id, "stopped");

    let fake = h.fake.clone();
    let h = h.restart(fake);
    assert_eq!(h.ops(), [RuntimeState]);
    assert_eq!(h.record_on_disk(&id).state, SandboxState::NotReady);
}

/// A DEL given up on before the restart is retried at start-up, with an empty netns, for a
/// sandbox that is still registered (its record is then cleared) and for one already
/// removed (its cache file is then deleted).
#[test]
fn given_up_del_is_retried_at_start_up() {
    let h = Harness::new("restore-give-up");
    let kept = ready(&h, &pod("kept"));
    let removed = ready(&h, &pod("removed"));
    h.fake.fail(CniDel);
    for id in [&kept, &removed] {
        for _ in 0..2 {
            h.rt.stop_pod_sandbox(id).expect_err("DEL failed");
        }
        h.rt.stop_pod_sandbox(id).expect("given up");
    }
    h.rt.remove_pod_sandbox(&removed).unwrap();
    assert!(h.cache_file(&removed).is_file() && h.cache_file(&kept).is_file());

    let fake = h.fake.clone();
    fake.heal(CniDel);
    let h = h.restart(fake);
    assert_eq!(h.ops(), [CniDel, CniDel]);
    assert_eq!(h.args(CniDel), ["", ""], "no netns: it is closed");
    let r = h.record_on_disk(&kept);
    assert!(!r.network.gave_up && r.network.last_del_error.is_none());
    assert!(!h.cache_file(&kept).exists() && !h.cache_file(&removed).exists());
    assert_eq!(h.fake.attachments(), Vec::<String>::new());
}

/// Namespace files with this root's prefix that no record names (a crash between the pin
/// and the first record) are removed; other files in the dir are left alone.
#[test]
fn unreferenced_namespace_files_are_removed() {
    let h = Harness::new("restore-sweep");
    let id = ready(&h, &pod("restore-sweep"));
    let ours = h
        .cfg
        .netns_dir
        .join(format!("{}0123456789abcdef", h.rt.ns_prefix()));
    let foreign = h.cfg.netns_dir.join("cni-1234");
    std::fs::write(&ours, b"").unwrap();
    std::fs::write(&foreign, b"").unwrap();

    let fake = h.fake.clone();
    let h = h.restart(fake);
    assert_eq!(h.ops(), [RemoveNamespace]);
    assert_eq!(h.args(RemoveNamespace), [ours.display().to_string()]);
    assert!(!ours.exists() && foreign.exists());
    assert_eq!(h.record(&id).state, SandboxState::Ready, "its own are kept");
}
