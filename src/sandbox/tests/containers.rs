//! The container verbs' host steps against the fake, in order, and what each verb does when
//! a step fails: StartContainer (a failed start leaves the container exited with
//! `StartError`), StopContainer (a refused stop signal or an ignored one ends in SIGKILL; a
//! failed SIGKILL leaves it running), RemoveContainer (every teardown step runs even when
//! one fails; the container stays removable until all succeed).

use std::sync::Arc;
use std::time::Duration;

use super::{pod, ready, step, Harness};
use crate::host::fake::Op;
use crate::model::container::{ContainerConfig, ContainerRecord, ContainerState};
use crate::runtime::ContainerEntry;
use crate::state::lock;

/// A created container of a Ready pod, as CreateContainer leaves it: its record on disk and
/// registered under its name, the runtime's container made (on the fake). The calls that
/// took are forgotten.
fn created(h: &Harness, tag: &str) -> String {
    let sb = ready(h, &pod(tag));
    let id = crate::validate::new_id();
    let dir = h.cfg.root.join("containers").join(&id);
    crate::state::files::private_dir_all(&dir).unwrap();
    let rec = ContainerRecord {
        format: crate::model::RECORD_FORMAT,
        id: id.clone(),
        name: format!("k8s_c_{tag}_default_uid-{tag}_0"),
        sandbox_id: sb,
        config: ContainerConfig::default(),
        image_id: String::new(),
        layers: Vec::new(),
        image_ref: String::new(),
        runtime_handler: "runc".into(),
        state: ContainerState::Created,
        created_at: crate::state::now_nanos(),
        started_at: 0,
        finished_at: 0,
        exit_code: 0,
        reason: String::new(),
        message: String::new(),
        // No such process: the verbs learn everything from the (fake) runtime.
        pid: i32::MAX,
        pid_start: 0,
        boot_id: String::new(),
        dir: dir.clone(),
        log_path: None,
        cgroup: format!("/sandboxd-unit/sandboxd-{id}"),
        stop_signal: "15".into(),
        shared_pid: false,
        user: None,
        attach_socket: None,
        console_socket: None,
        userns_dir: None,
        storage_dir: None,
    };
    let entry: Arc<ContainerEntry> = crate::state::Entry::new(rec.clone());
    entry.update(|_| {}).unwrap();
    {
        let mut reg = lock(&h.rt.registry);
        reg.names.reserve(&rec.name, &id).unwrap();
        reg.container_ids.insert(&id);
        reg.containers.insert(id.clone(), entry);
    }
    let runtime = h.rt.handler("runc").unwrap();
    h.rt.host
        .runtime_create(runtime, &id, &dir, &rec.files())
        .unwrap();
    h.fake.clear();
    id
}

fn state(h: &Harness, id: &str) -> ContainerRecord {
    h.rt.container_record(id).unwrap()
}

#[test]
fn start_is_the_runtime_start() {
    let h = Harness::new("ctr-start");
    let id = created(&h, "start");
    h.rt.start_container(&id).unwrap();
    assert_eq!(h.ops(), vec![Op::RuntimeStart]);
    let r = state(&h, &id);
    assert_eq!(r.state, ContainerState::Running);
    assert!(r.started_at > 0);
    // Started again (kubelet's retry): success, nothing called.
    h.fake.clear();
    h.rt.start_container(&id).unwrap();
    assert_eq!(h.ops(), vec![]);
}

#[test]
fn a_failed_start_leaves_the_container_exited_with_start_error() {
    let h = Harness::new("ctr-startfail");
    let id = created(&h, "startfail");
    h.fake.fail(Op::RuntimeStart);
    let e = h.rt.start_container(&id).unwrap_err();
    assert_eq!(step(&e), "start container");
    // The runtime is asked whether it started anyway (an earlier start's lost answer).
    assert_eq!(h.ops(), vec![Op::RuntimeStart, Op::RuntimeState]);
    let r = state(&h, &id);
    assert_eq!(
        (r.state, r.exit_code, r.reason.as_str()),
        (ContainerState::Exited, 128, "StartError")
    );
    assert!(r.finished_at > 0 && !r.message.is_empty(), "{r:?}");
    // As persisted.
    let on_disk: ContainerRecord = crate::state::read_json(&r.state_file()).unwrap().unwrap();
    assert_eq!(on_disk.reason, "StartError");
}

#[test]
fn stop_signals_waits_then_records_the_exit() {
    let h = Harness::new("ctr-stop");
    let id = created(&h, "stop");
    h.rt.start_container(&id).unwrap();
    h.fake.clear();
    h.rt.stop_container(&id, Duration::from_secs(5)).unwrap();
    assert_eq!(h.ops(), vec![Op::RuntimeKill, Op::WaitExit]);
    let r = state(&h, &id);
    // The fake's monitor records no exit file: the exit status is unknown, said so.
    assert_eq!((r.state, r.exit_code), (ContainerState::Exited, 137));
    // Stopped again: success, nothing called.
    h.fake.clear();
    h.rt.stop_container(&id, Duration::from_secs(5)).unwrap();
    assert_eq!(h.ops(), vec![]);
}

#[test]
fn a_refused_or_ignored_stop_signal_ends_in_sigkill() {
    let h = Harness::new("ctr-stopkill");
    // The stop signal cannot be sent: SIGKILL at once.
    let id = created(&h, "refused");
    h.rt.start_container(&id).unwrap();
    h.fake.clear();
    h.fake.fail_next(Op::RuntimeKill, 1);
    h.rt.stop_container(&id, Duration::from_secs(5)).unwrap();
    assert_eq!(
        h.ops(),
        vec![Op::RuntimeKill, Op::RuntimeKill, Op::WaitExit]
    );
    assert_eq!(state(&h, &id).state, ContainerState::Exited);
    // The signal is ignored past the grace: SIGKILL, then the wait for its exit.
    let id = created(&h, "ignored");
    h.rt.start_container(&id).unwrap();
    h.fake.clear();
    h.fake.fail_next(Op::WaitExit, 1);
    h.rt.stop_container(&id, Duration::from_secs(5)).unwrap();
    assert_eq!(
        h.ops(),
        vec![Op::RuntimeKill, Op::WaitExit, Op::RuntimeKill, Op::WaitExit]
    );
    assert_eq!(state(&h, &id).state, ContainerState::Exited);
    // Zero timeout: SIGKILL only.
    let id = created(&h, "zero");
    h.rt.start_container(&id).unwrap();
    h.fake.clear();
    h.rt.stop_container(&id, Duration::ZERO).unwrap();
    assert_eq!(h.ops(), vec![Op::RuntimeKill, Op::WaitExit]);
}

#[test]
fn a_failed_sigkill_leaves_the_container_running_and_stoppable() {
    let h = Harness::new("ctr-killfail");
    let id = created(&h, "killfail");
    h.rt.start_container(&id).unwrap();
    h.fake.clear();
    h.fake.fail(Op::RuntimeKill);
    let e = h.rt.stop_container(&id, Duration::ZERO).unwrap_err();
    assert_eq!(step(&e), "kill container");
    assert_eq!(state(&h, &id).state, ContainerState::Running);
    // Remove stops first: it fails the same way and removes nothing.
    h.fake.clear();
    let e = h.rt.remove_container(&id).unwrap_err();
    assert_eq!(step(&e), "kill container");
    assert_eq!(h.ops(), vec![Op::RuntimeKill]);
    assert!(state(&h, &id).dir.is_dir());
    h.fake.heal(Op::RuntimeKill);
    h.rt.stop_container(&id, Duration::ZERO).unwrap();
    assert_eq!(state(&h, &id).state, ContainerState::Exited);
}

#[test]
fn remove_runs_every_teardown_step_and_keeps_the_container_until_all_succeed() {
    let h = Harness::new("ctr-remove");
    let id = created(&h, "remove");
    let dir = state(&h, &id).dir;
    let rootfs = dir.join("rootfs");
    h.fake.fail(Op::RuntimeDelete);
    h.fake.fail(Op::Unmount);
    let e = h.rt.remove_container(&id).unwrap_err();
    // Both failures are reported; the cgroup step between them still ran.
    let msg = e.to_string();
    assert!(
        msg.contains("delete container") && msg.contains("unmount rootfs"),
        "{msg}"
    );
    assert_eq!(
        h.ops(),
        vec![
            Op::RuntimeKill,
            Op::WaitExit,
            Op::RuntimeDelete,
            Op::RemoveCgroup,
            Op::Unmount
        ]
    );
    assert_eq!(h.args(Op::Unmount), vec![rootfs.display().to_string()]);
    // Nothing is forgotten: the record, its dir and its name stay for the retry.
    assert!(dir.join("state.json").is_file());
    assert!(lock(&h.rt.registry).containers.contains_key(&id));
    h.fake.heal(Op::RuntimeDelete);
    h.fake.heal(Op::Unmount);
    h.fake.clear();
    h.rt.remove_container(&id).unwrap();
    assert_eq!(
        h.ops(),
        vec![Op::RuntimeDelete, Op::RemoveCgroup, Op::Unmount]
    );
    assert!(!dir.exists());
    assert!(h.rt.container_record(&id).is_err());
    assert!(lock(&h.rt.registry).containers.is_empty());
    assert!(h.fake.containers().is_empty());
    // Removed again: success, nothing called.
    h.fake.clear();
    h.rt.remove_container(&id).unwrap();
    assert_eq!(h.ops(), vec![]);
}
