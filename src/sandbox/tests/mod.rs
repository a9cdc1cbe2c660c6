//! Unit tests of the pod lifecycle's ordering and fault handling, against the recording
//! [`FakeHost`]: no root, no namespaces, no CNI plugins, no runtime; records and the CNI
//! cache are real files under a temp state root. What the host really does is covered by the
//! privileged integration tests (`tests/`), which these do not replace.
//!
//! A test builds a [`Harness`] (a `Runtime` on a temp root with a fresh fake), tells the fake
//! what to fail, drives the public lifecycle calls, and asserts the fake's call log and what
//! is left (registry, record on disk, CNI cache, the fake's model of the host).

mod containers;
mod create;
mod restore;
mod run;
mod stop;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::config::{Config, RuntimeHandler};
use crate::error::Error;
use crate::host::fake::{FakeHost, Op};
use crate::model::sandbox::SandboxState;
use crate::model::sandbox::{PodSandboxConfig, SandboxRecord};
use crate::runtime::Runtime;
use crate::state::lock;

/// A dir of its own for one test, removed when dropped.
pub(super) struct TempDir(PathBuf);

impl TempDir {
    /// Under `/dev/shm` where it can be made (a tmpfs, where the records' fsyncs cost nothing
    /// and a test takes milliseconds), else under the temp dir.
    fn new(tag: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let name = format!("sandboxd-unit-{tag}-{}-{n}", std::process::id());
        let p = [Path::new("/dev/shm").to_path_buf(), std::env::temp_dir()]
            .into_iter()
            .map(|d| d.join(&name))
            .find(|p| {
                let _ = std::fs::remove_dir_all(p);
                std::fs::create_dir_all(p).is_ok()
            })
            .expect("a temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A runtime on a temp state root whose host is a [`FakeHost`].
pub(super) struct Harness {
    pub rt: Runtime,
    pub fake: Arc<FakeHost>,
    pub cfg: Config,
    // Dropped last: the runtime's files live in it.
    _base: TempDir,
}

impl Harness {
    pub fn new(tag: &str) -> Self {
        Self::with(tag, |_| {})
    }

    /// With the config changed by `f` first.
    pub fn with(tag: &str, f: impl FnOnce(&mut Config)) -> Self {
        let base = TempDir::new(tag);
        let mut cfg = config(&base.0);
        f(&mut cfg);
        let fake = FakeHost::new();
        let rt = Runtime::with_host(cfg.clone(), fake.clone()).expect("runtime opens");
        fake.clear();
        Harness {
            rt,
            fake,
            cfg,
            _base: base,
        }
    }

    /// The daemon restarts on the same state root with `fake` as the host: the same fake
    /// (`self.fake.clone()`) is a host that kept running, a new one a host that rebooted.
    /// The restart's calls are in the new fake's log.
    pub fn restart(self, fake: Arc<FakeHost>) -> Self {
        let Harness { rt, cfg, _base, .. } = self;
        drop(rt);
        fake.clear();
        let rt = Runtime::with_host(cfg.clone(), fake.clone()).expect("runtime restarts");
        Harness {
            rt,
            fake,
            cfg,
            _base,
        }
    }

    /// The lifecycle's calls so far (without the start-up's `MakeSharedDir`s).
    pub fn ops(&self) -> Vec<Op> {
        self.fake
            .ops()
            .into_iter()
            .filter(|o| *o != Op::MakeSharedDir)
            .collect()
    }

    /// What the calls of `op` were about, in order.
    pub fn args(&self, op: Op) -> Vec<String> {
        self.fake
            .calls()
            .into_iter()
            .filter(|c| c.op == op)
            .map(|c| c.arg)
            .collect()
    }

    pub fn record(&self, id: &str) -> SandboxRecord {
        self.rt.sandbox_record(id).expect("sandbox registered")
    }

    /// The record as persisted.
    pub fn record_on_disk(&self, id: &str) -> SandboxRecord {
        let p = self.cfg.root.join("sandboxes").join(id).join("state.json");
        crate::state::read_json(&p)
            .expect("readable record")
            .expect("record on disk")
    }

    /// Changes the record and persists it (as a daemon that crashed at that point left it).
    pub fn rewrite_record(&self, id: &str, f: impl FnOnce(&mut SandboxRecord)) {
        let entry = self.rt.lookup(id).unwrap().expect("registered");
        entry.update(f).expect("record persisted");
    }

    pub fn cache_file(&self, id: &str) -> PathBuf {
        self.cfg.root.join("cni/cache").join(format!("{id}.json"))
    }

    /// The sandbox dirs under the state root.
    pub fn sandbox_dirs(&self) -> Vec<String> {
        crate::state::list_dir(&self.cfg.root.join("sandboxes"))
    }

    /// Nothing of any sandbox is left: not in the registry (its name released), not on disk,
    /// not on the (fake) host.
    pub fn assert_nothing_left(&self) {
        {
            let reg = lock(&self.rt.registry);
            assert!(reg.sandboxes.is_empty(), "a sandbox is still registered");
            assert!(reg.ids.is_empty(), "an id is still indexed");
            assert!(reg.names.is_empty(), "a name is still reserved");
        }
        assert_eq!(
            self.sandbox_dirs(),
            Vec::<String>::new(),
            "sandbox dirs left"
        );
        assert_eq!(
            crate::state::list_dir(&self.cfg.root.join("cni/cache")),
            Vec::<String>::new(),
            "CNI cache left"
        );
        assert_eq!(self.fake.namespaces(), Vec::<PathBuf>::new(), "namespaces");
        assert_eq!(self.fake.mounts(), Vec::<PathBuf>::new(), "mounts");
        assert_eq!(self.fake.attachments(), Vec::<String>::new(), "attachments");
        assert!(self.fake.containers().is_empty(), "runtime containers");
    }
}

/// A config with every path under `base`, stand-in binaries where only their presence is
/// checked (runtime, monitor, CNI plugins) and a pause binary that passes the static-ELF check.
fn config(base: &Path) -> Config {
    let mut cfg = Config::rooted_at(base);
    let bin = base.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&cfg.cni_conf_dir).unwrap();
    for f in [
        "bridge",
        "host-local",
        "portmap",
        "loopback",
        "runc",
        "sandboxd-monitor",
    ] {
        std::fs::write(bin.join(f), b"").unwrap();
    }
    // A 64-bit little-endian ELF header without program headers: static.
    let mut elf = vec![0u8; 64];
    elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
    std::fs::write(bin.join("sandboxd-pause"), elf).unwrap();
    cfg.cni_bin_dirs = vec![bin.clone()];
    cfg.runtimes = [(
        "runc".to_string(),
        RuntimeHandler {
            path: bin.join("runc"),
            ..Default::default()
        },
    )]
    .into();
    cfg.default_runtime = "runc".into();
    cfg.monitor_path = Some(bin.join("sandboxd-monitor"));
    cfg.pause_path = Some(bin.join("sandboxd-pause"));
    cfg.cgroup_parent = "/sandboxd-unit".into();
    cfg.cni_del_max_attempts = 3;
    cfg
}

/// A pod without an infra process (its IPC and UTS namespaces pinned too).
pub(super) fn pod(name: &str) -> PodSandboxConfig {
    PodSandboxConfig::new(name, "default", &format!("uid-{name}"), false)
}

/// A pod with a shared PID namespace, so with an infra container.
pub(super) fn infra_pod(name: &str) -> PodSandboxConfig {
    PodSandboxConfig::new(name, "default", &format!("uid-{name}"), true)
}

/// The step a lifecycle error names (`Error::Step`), or its message.
pub(super) fn step(e: &Error) -> String {
    match e {
        Error::Step { step, .. } => step.to_string(),
        e => e.to_string(),
    }
}

/// Runs `pod` to Ready and forgets the calls that took.
pub(super) fn ready(h: &Harness, pod: &PodSandboxConfig) -> String {
    let id = h.rt.run_pod_sandbox(pod).expect("pod runs");
    assert_eq!(h.record(&id).state, SandboxState::Ready);
    h.fake.clear();
    id
}
