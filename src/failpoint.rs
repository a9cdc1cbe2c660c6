//! Failpoints for crash-safety tests: when `SANDBOXD_FAILPOINT` names a step, the process
//! aborts right there, as a daemon killed at that moment would. Unset, it costs one load.

use std::sync::OnceLock;

static ARMED: OnceLock<Option<String>> = OnceLock::new();

/// Aborts the process if the failpoint `name` is armed.
pub fn hit(name: &str) {
    let armed = ARMED.get_or_init(|| std::env::var("SANDBOXD_FAILPOINT").ok());
    if armed.as_deref() == Some(name) {
        eprintln!("sandboxd: failpoint {name} hit, aborting");
        std::process::abort();
    }
}

/// Every failpoint the lifecycle code defines, in the order a run then a stop reaches them.
pub const ALL: &[&str] = &[
    "run:recorded",
    "run:dir",
    "run:netns",
    "run:cni-add",
    "run:shm",
    "run:infra-created",
    "run:infra-started",
    "stop:containers",
    "stop:infra",
    "stop:cni-del",
    "stop:netns",
    "stop:shm",
];

/// The failpoints of CreateContainer, in the order it reaches them.
pub const CONTAINER: &[&str] = &["create:recorded", "create:rootfs", "create:runtime"];

/// The failpoints of StartContainer, StopContainer and RemoveContainer, in order.
pub const CONTAINER_OPS: &[&str] = &[
    "start:runtime",
    "start:recorded",
    "stopctr:signalled",
    "stopctr:killed",
    "removectr:stopped",
    "removectr:runtime",
    "removectr:unmounted",
    "removectr:dir",
];
