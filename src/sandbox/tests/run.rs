//! RunPodSandbox: a failure at each step is rolled back, newest first, and leaves nothing.
//!
//! The rollback is `remove::teardown` with `rollback = true`: StopPodSandbox's steps (infra
//! kill → CNI DEL → close namespaces → unmount shm), then RemovePodSandbox's (runtime delete
//! → pod cgroup). It tears down everything the first record names, made or not (tearing
//! down what was never made is a no-op), so the teardown calls are the same whichever step
//! failed; what differs is how far the forward calls got.

use super::*;
use Op::*;

/// A pod without infra: its namespaces (net, IPC, UTS), network, shm, pod cgroup.
const TEARDOWN: &[Op] = &[
    CniDel,
    RemoveNamespace,
    RemoveNamespace,
    RemoveNamespace,
    Unmount,
    RemoveCgroup,
];

/// A pod with an infra container (which holds its IPC and UTS namespaces).
const INFRA_TEARDOWN: &[Op] = &[
    RuntimeKill,
    WaitExit,
    CniDel,
    RemoveNamespace,
    Unmount,
    RuntimeDelete,
    RemoveCgroup,
];

fn with_sysctl(mut p: PodSandboxConfig) -> PodSandboxConfig {
    p.sysctls
        .insert("net.ipv4.ip_unprivileged_port_start".into(), "0".into());
    p
}

/// Runs `pod` with `fail` failing; checks the error names `want_step`, the calls are
/// `forward` then `teardown`, and nothing is left. Then the same request runs again (the
/// name was released) and is ready.
fn rolls_back(pod: PodSandboxConfig, fail: Op, want_step: &str, forward: &[Op], teardown: &[Op]) {
    let h = Harness::new("run");
    h.fake.fail(fail);
    let err = h.rt.run_pod_sandbox(&pod).expect_err("the run fails");
    assert!(step(&err).contains(want_step), "{err}");
    assert_eq!(
        h.ops(),
        [forward, teardown].concat(),
        "calls: {:?}",
        h.fake.calls()
    );
    h.assert_nothing_left();

    h.fake.heal(fail);
    let id = h.rt.run_pod_sandbox(&pod).expect("the name was released");
    assert_eq!(h.record(&id).state, SandboxState::Ready);
}

#[test]
fn rollback_when_namespace_pin_fails() {
    rolls_back(pod("pin"), Pin, "create namespaces", &[Pin], TEARDOWN);
}

#[test]
fn rollback_when_sysctls_fail() {
    rolls_back(
        with_sysctl(pod("sysctl")),
        ApplySysctls,
        "linux.sysctls",
        &[Pin, ApplySysctls],
        TEARDOWN,
    );
}

#[test]
fn rollback_when_cni_add_fails() {
    rolls_back(
        with_sysctl(pod("add")),
        CniAdd,
        "set up network",
        &[Pin, ApplySysctls, CniAdd],
        TEARDOWN,
    );
}

#[test]
fn rollback_when_cni_cache_cannot_be_saved() {
    rolls_back(
        pod("cache"),
        CniSaveCache,
        "keep CNI attachment",
        &[Pin, CniAdd, CniSaveCache],
        TEARDOWN,
    );
}

#[test]
fn rollback_when_shm_mount_fails() {
    rolls_back(
        pod("shm"),
        MountShm,
        "mount shm",
        &[Pin, CniAdd, CniSaveCache, MountShm],
        TEARDOWN,
    );
}

/// A pod with pod-level resources and no cgroup_parent: its own cgroup is sized after the
/// shm mount; a failure there rolls everything back.
#[test]
fn rollback_when_the_pod_cgroup_cannot_be_sized() {
    let mut p = pod("limits");
    p.resources = Some(crate::model::container::Resources {
        memory_limit_in_bytes: 64 << 20,
        ..Default::default()
    });
    rolls_back(
        p,
        SetCgroupLimits,
        "size the pod's cgroup",
        &[Pin, CniAdd, CniSaveCache, MountShm, SetCgroupLimits],
        TEARDOWN,
    );
}

#[test]
fn rollback_when_infra_create_fails() {
    rolls_back(
        infra_pod("create"),
        RuntimeCreate,
        "create infra container",
        &[Pin, CniAdd, CniSaveCache, MountShm, RuntimeCreate],
        INFRA_TEARDOWN,
    );
}

#[test]
fn rollback_when_infra_start_fails() {
    rolls_back(
        infra_pod("start"),
        RuntimeStart,
        "start infra container",
        &[
            Pin,
            CniAdd,
            CniSaveCache,
            MountShm,
            RuntimeCreate,
            RuntimeStart,
        ],
        INFRA_TEARDOWN,
    );
}

/// The first record write (made while the namespaces are pinned) fails: the pin is waited
/// for and undone with the rest. The write is made to fail for real: a directory where the
/// record's temp file goes.
#[test]
fn rollback_when_the_first_record_write_fails() {
    let h = Harness::new("record");
    let sandboxes = h.cfg.root.join("sandboxes");
    h.fake.on(Pin, move |_| {
        let dirs = crate::state::list_dir(&sandboxes);
        let [dir] = dirs.as_slice() else {
            panic!("one sandbox dir expected, found {dirs:?}");
        };
        std::fs::create_dir(sandboxes.join(dir).join("state.tmp")).unwrap();
    });
    let err =
        h.rt.run_pod_sandbox(&pod("record"))
            .expect_err("the run fails");
    assert_eq!(step(&err), "persist sandbox state", "{err}");
    assert_eq!(h.ops(), [&[Pin][..], TEARDOWN].concat());
    h.assert_nothing_left();
}

/// The teardown of a pod without infra, argument by argument: the DEL is given the netns
/// (still pinned), the namespaces go net, IPC, UTS, then the shm, then the pod's cgroup.
#[test]
fn rollback_tears_down_what_the_record_names() {
    let h = Harness::new("args");
    h.fake.fail(MountShm);
    h.rt.run_pod_sandbox(&pod("args"))
        .expect_err("the run fails");
    let pinned = h.args(Pin);
    let [pinned] = pinned.as_slice() else {
        panic!("one pin: {pinned:?}");
    };
    let files: Vec<&str> = pinned.split(' ').collect();
    assert_eq!(files.len(), 3, "net, IPC, UTS: {files:?}");
    assert!(files[0].starts_with(h.cfg.netns_dir.to_str().unwrap()));
    assert!(files[1].starts_with(h.cfg.ipcns_dir.to_str().unwrap()));
    assert!(files[2].starts_with(h.cfg.utsns_dir.to_str().unwrap()));
    assert_eq!(h.args(CniDel), [files[0]]);
    assert_eq!(h.args(RemoveNamespace), files);
    let shm = h.args(MountShm);
    assert_eq!(h.args(Unmount), shm);
    assert!(shm[0].ends_with("/shm"), "{shm:?}");
    assert_eq!(h.args(RemoveCgroup).len(), 1);
    assert!(h.args(RemoveCgroup)[0].starts_with("/sandboxd-unit/pod-"));
}

/// A rollback whose CNI DEL keeps failing: DEL is tried three times, the record stays
/// (NotReady, its name reserved, its netns kept for the DEL) and both errors are returned;
/// RemovePodSandbox finishes the teardown once DEL works.
#[test]
fn failed_rollback_keeps_the_record_for_remove() {
    let h = Harness::new("undo");
    h.fake.fail(MountShm);
    h.fake.fail(CniDel);
    let config = pod("undo");
    let err = h.rt.run_pod_sandbox(&config).expect_err("the run fails");
    let Error::Many(errs) = &err else {
        panic!("the failure and the failed rollback: {err}");
    };
    assert_eq!(step(&errs[0]), "mount shm");
    assert_eq!(step(&errs[1]), "roll back");
    assert_eq!(
        h.ops(),
        [Pin, CniAdd, CniSaveCache, MountShm, CniDel, CniDel, CniDel]
    );
    let statuses = h.rt.list_pod_sandboxes(&Default::default());
    let [status] = statuses.as_slice() else {
        panic!("the record stays: {statuses:?}");
    };
    assert_eq!(status.state, SandboxState::NotReady);
    assert_eq!(h.fake.namespaces().len(), 3, "kept for the DEL");
    let again = h.rt.run_pod_sandbox(&config).expect_err("name still held");
    assert!(matches!(again, Error::NameReserved { .. }), "{again}");

    h.fake.heal(CniDel);
    h.fake.clear();
    h.rt.remove_pod_sandbox(&status.id)
        .expect("remove finishes");
    assert_eq!(h.ops(), TEARDOWN);
    h.assert_nothing_left();
}

/// The happy path, for reference: the forward calls in order and nothing torn down.
#[test]
fn run_calls_each_step_once_in_order() {
    let h = Harness::new("ok");
    let id = h.rt.run_pod_sandbox(&with_sysctl(pod("ok"))).unwrap();
    assert_eq!(h.ops(), [Pin, ApplySysctls, CniAdd, CniSaveCache, MountShm]);
    let r = h.record_on_disk(&id);
    assert_eq!(r.state, SandboxState::Ready);
    assert_eq!(r.network.ips, ["10.88.0.7"]);
    assert!(h.cache_file(&id).is_file());

    let h = Harness::new("ok-infra");
    let id = h.rt.run_pod_sandbox(&infra_pod("ok")).unwrap();
    assert_eq!(
        h.ops(),
        [
            Pin,
            CniAdd,
            CniSaveCache,
            MountShm,
            RuntimeCreate,
            RuntimeStart
        ]
    );
    let infra = h.record_on_disk(&id).infra.expect("infra recorded");
    assert!(infra.created && infra.started && !infra.stopped);
    assert_eq!(h.fake.containers()[&id], "running");
}
