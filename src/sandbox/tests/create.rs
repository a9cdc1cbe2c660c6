//! CreateContainer's host steps against the fake, in order, and its rollback: each step that
//! fails (the rootfs mount, a staged mount, the runtime's create) leaves nothing behind —
//! no mount, no runtime container, no dir, no record, the name free for kubelet's retry —
//! and a rollback that fails itself keeps the container for RemoveContainer to finish.

use std::path::{Path, PathBuf};

use super::{pod, ready, step, Harness};
use crate::host::fake::Op;
use crate::image::store::{parse_config, NewImage};
use crate::model::container::{BindMount, ContainerConfig, ContainerMetadata, ContainerState};
use crate::state::lock;

const IMAGE: &str = "unit.test/app:1";

/// Puts a one-layer image in the harness's store (its layer an empty dir, as the fake
/// mounts nothing over it).
fn image(h: &Harness) {
    let layer = format!("sha256:{}", "1".repeat(64));
    std::fs::create_dir_all(h.rt.images.layer_dir(&layer).unwrap()).unwrap();
    let config = format!(
        r#"{{"rootfs":{{"type":"layers","diff_ids":["{layer}"]}},"config":{{"Cmd":["/app"]}}}}"#
    );
    h.rt.images
        .register(NewImage {
            id: &format!("sha256:{}", "2".repeat(64)),
            parsed: parse_config(config.as_bytes()).unwrap(),
            size: 0,
            blobs: Vec::new(),
            tag: Some(IMAGE),
            manifest_digest: None,
            artifact: false,
        })
        .unwrap();
}

fn container(name: &str) -> ContainerConfig {
    ContainerConfig {
        metadata: ContainerMetadata {
            name: name.into(),
            attempt: 0,
        },
        image: IMAGE.into(),
        ..Default::default()
    }
}

/// A Ready pod with the image in the store: the pod's id.
fn setup(h: &Harness, tag: &str) -> String {
    image(h);
    ready(h, &pod(tag))
}

fn container_dirs(h: &Harness) -> Vec<String> {
    crate::state::list_dir(&h.cfg.root.join("containers"))
}

/// Nothing of any container is left: on the (fake) host, under the state root, in the
/// registry.
fn assert_no_container_left(h: &Harness) {
    assert_eq!(h.fake.containers().len(), 0, "{:?}", h.fake.containers());
    let mounts: Vec<PathBuf> = h
        .fake
        .mounts()
        .into_iter()
        .filter(|m| m.starts_with(h.cfg.root.join("containers")))
        .collect();
    assert!(mounts.is_empty(), "{mounts:?}");
    assert!(container_dirs(h).is_empty(), "{:?}", container_dirs(h));
    let reg = lock(&h.rt.registry);
    assert!(reg.containers.is_empty());
    assert!(reg
        .names
        .holder("k8s_app_roll_default_uid-roll_0")
        .is_none());
}

#[test]
fn create_mounts_the_rootfs_then_has_the_runtime_create_the_container() {
    let h = Harness::new("ctr-create");
    let sb = setup(&h, "create");
    let id = h.rt.create_container(&sb, &container("app")).unwrap();
    assert_eq!(h.ops(), vec![Op::MountOverlay, Op::RuntimeCreate]);
    let r = h.rt.container_record(&id).unwrap();
    assert_eq!(
        h.args(Op::MountOverlay),
        vec![r.rootfs().display().to_string()]
    );
    assert_eq!(r.state, ContainerState::Created);
    assert!(r.pid > 100_000, "the runtime's pid is recorded: {}", r.pid);
    assert_eq!(h.fake.containers()[&id], "created");
    // The bundle the runtime was given: its spec names the rootfs and the command.
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(r.dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(spec["root"]["path"], r.rootfs().display().to_string());
    assert_eq!(spec["process"]["args"], serde_json::json!(["/app"]));
    // Persisted as Created.
    let on_disk: crate::model::container::ContainerRecord =
        crate::state::read_json(&r.state_file()).unwrap().unwrap();
    assert_eq!(on_disk.state, ContainerState::Created);
}

/// Fails `op` once in a create: the error names `step`, the calls are `done` then the
/// rollback's (whatever the runtime might have deleted, the cgroup, the rootfs unmounted),
/// nothing is left, and kubelet's retry succeeds (the name is free).
fn rolled_back(tag: &str, op: Op, step_named: &str, done: &[Op]) {
    let h = Harness::new(tag);
    let sb = setup(&h, "roll");
    h.fake.fail_next(op, 1);
    let e = h.rt.create_container(&sb, &container("app")).unwrap_err();
    assert_eq!(step(&e), step_named);
    assert!(e.to_string().contains("injected failure"), "{e}");
    let rollback = [Op::RuntimeDelete, Op::RemoveCgroup, Op::Unmount];
    assert_eq!(h.ops(), [done, &rollback].concat());
    assert_no_container_left(&h);
    h.rt.create_container(&sb, &container("app")).unwrap();
}

#[test]
fn a_failed_rootfs_mount_rolls_back_everything() {
    rolled_back(
        "ctr-rollmount",
        Op::MountOverlay,
        "mount rootfs",
        &[Op::MountOverlay],
    );
}

#[test]
fn a_failed_runtime_create_rolls_back_in_teardown_order() {
    rolled_back(
        "ctr-rollcreate",
        Op::RuntimeCreate,
        "create container",
        &[Op::MountOverlay, Op::RuntimeCreate],
    );
}

#[test]
fn a_failed_rollback_keeps_the_container_for_remove() {
    let h = Harness::new("ctr-rollfail");
    let sb = setup(&h, "roll");
    h.fake.fail_next(Op::RuntimeCreate, 1);
    h.fake.fail_next(Op::Unmount, 1);
    let e = h.rt.create_container(&sb, &container("app")).unwrap_err();
    // Both the failure and the rollback's own are reported.
    let msg = e.to_string();
    assert!(
        msg.contains("create container") && msg.contains("roll back"),
        "{msg}"
    );
    // The container is kept, with its dir and name, as not created: RemoveContainer
    // finishes the teardown.
    let listed = h.rt.list_containers(&Default::default());
    assert_eq!(listed.len(), 1, "{listed:?}");
    let id = listed[0].id.clone();
    assert_ne!(listed[0].state, ContainerState::Created);
    assert!(listed[0].dir.is_dir());
    h.fake.clear();
    h.rt.remove_container(&id).unwrap();
    assert!(h.ops().contains(&Op::Unmount), "{:?}", h.ops());
    assert_no_container_left(&h);
}

#[test]
fn a_recursively_read_only_mount_is_staged_then_detached_after_create() {
    if !crate::mounts::recursive_read_only_supported() {
        eprintln!("skipped: recursively read-only mounts are not supported here (mount_setattr needs root and kernel 5.12)");
        return;
    }
    let h = Harness::new("ctr-rro");
    let sb = setup(&h, "rro");
    let src = h.cfg.root.join("volume");
    std::fs::create_dir_all(&src).unwrap();
    let mut c = container("app");
    c.mounts.push(BindMount {
        container_path: "/data".into(),
        host_path: src.display().to_string(),
        readonly: true,
        recursive_read_only: true,
        ..Default::default()
    });
    let id = h.rt.create_container(&sb, &c).unwrap();
    let staged =
        h.rt.container_record(&id)
            .unwrap()
            .dir
            .join("mounts/0")
            .display()
            .to_string();
    assert_eq!(
        h.ops(),
        vec![
            Op::MountOverlay,
            Op::MountTreeCopy,
            Op::RuntimeCreate,
            Op::Unmount
        ]
    );
    assert_eq!(h.args(Op::MountTreeCopy), vec![staged.clone()]);
    // Detached once the runtime holds its copy (kubelet's volume teardown must not meet it).
    assert_eq!(h.args(Op::Unmount), vec![staged]);
    // A staged mount the runtime's create fails after: unmounted by the rollback.
    h.fake.clear();
    h.fake.fail_next(Op::RuntimeCreate, 1);
    c.metadata.name = "other".into();
    h.rt.create_container(&sb, &c).unwrap_err();
    let unmounted = h.args(Op::Unmount);
    assert!(
        unmounted.iter().any(|p| Path::new(p).ends_with("mounts/0")),
        "{unmounted:?}"
    );
    assert_eq!(
        h.fake
            .mounts()
            .iter()
            .filter(|m| m.ends_with("mounts/0"))
            .count(),
        0,
        "only the first container's staged mount was ever kept, and it was detached"
    );
}
