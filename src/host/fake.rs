//! A recording [`Host`] for unit tests of the pod lifecycle's ordering and fault handling:
//! every call is logged in order (`calls`, `ops`), any operation can be made to fail
//! (`fail`, `fail_next`), and a hook can run when a call arrives (`on`). It keeps a small
//! model of what exists (pinned namespaces, mounts, CNI attachments, runtime containers) so
//! queries answer as the host would after those calls.
//!
//! It does no host work: namespace files are created and removed as empty files in the
//! test's own dirs, nothing is mounted, no process runs. The state root's files (records,
//! the CNI cache) stay real. It checks ordering and fault logic only; what the host really
//! does is the integration tests' business.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use super::Host;
use crate::cni::{Attachment, CacheEntry, Cni, CniError, NetworkList};
use crate::error::HostError;
use crate::netns::{PinRequest, Pinning};
use crate::oci::{ContainerFiles, OciRuntime, RuntimeError, RuntimeState};
use crate::state::lock;
use crate::sysctl::Ns;

/// One kind of host operation (one [`Host`] method, except the `is_namespace` query).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Op {
    MakeSharedDir,
    Pin,
    RemoveNamespace,
    ApplySysctls,
    CniAdd,
    CniDel,
    CniSaveCache,
    MountShm,
    Unmount,
    MountTreeCopy,
    MountOverlay,
    MountIdmappedOverlay,
    RuntimeCreate,
    RuntimeStart,
    RuntimeKill,
    WaitExit,
    RuntimeDelete,
    RuntimeState,
    RemoveCgroup,
    SetCgroupLimits,
}

/// One logged call: the operation and what it was about (a path, a container id, the
/// netns a CNI call was given: empty for none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Call {
    pub op: Op,
    pub arg: String,
}

type Hook = Box<dyn FnMut(&Call) + Send>;

#[derive(Default)]
struct Inner {
    calls: Vec<Call>,
    /// Operations that fail: `None` every time, `Some(n)` the next `n` times.
    faults: HashMap<Op, Option<u32>>,
    hooks: Vec<(Op, Hook)>,
    namespaces: BTreeSet<PathBuf>,
    mounts: BTreeSet<PathBuf>,
    attachments: BTreeSet<String>,
    containers: BTreeMap<String, &'static str>,
    last_pid: i32,
}

/// The recording fake. Share it with the runtime as `Arc<dyn Host>` and keep a handle to
/// inspect and steer it.
#[derive(Default)]
pub(crate) struct FakeHost(Mutex<Inner>);

impl FakeHost {
    pub fn new() -> Arc<Self> {
        Arc::new(FakeHost::default())
    }

    /// Every call of `op` fails from now on (until [`heal`](Self::heal)).
    pub fn fail(&self, op: Op) {
        lock(&self.0).faults.insert(op, None);
    }

    /// The next `n` calls of `op` fail, later ones succeed.
    pub fn fail_next(&self, op: Op, n: u32) {
        lock(&self.0).faults.insert(op, Some(n));
    }

    /// Calls of `op` succeed again.
    pub fn heal(&self, op: Op) {
        lock(&self.0).faults.remove(&op);
    }

    /// Runs `f` whenever `op` is called, after the call is logged and before it is answered
    /// (to change the world at that moment, e.g. to make the next record write fail).
    pub fn on(&self, op: Op, f: impl FnMut(&Call) + Send + 'static) {
        lock(&self.0).hooks.push((op, Box::new(f)));
    }

    /// Every call so far, oldest first.
    pub fn calls(&self) -> Vec<Call> {
        lock(&self.0).calls.clone()
    }

    /// The operations called so far, oldest first.
    pub fn ops(&self) -> Vec<Op> {
        lock(&self.0).calls.iter().map(|c| c.op).collect()
    }

    /// Forgets the calls so far (the model stays).
    pub fn clear(&self) {
        lock(&self.0).calls.clear();
    }

    /// Namespaces pinned now.
    pub fn namespaces(&self) -> Vec<PathBuf> {
        lock(&self.0).namespaces.iter().cloned().collect()
    }

    /// Forgets a pinned namespace (it vanished: a reboot, someone unmounted it). Its file
    /// stays, as an unmounted namespace file does.
    pub fn lose_namespace(&self, path: &Path) {
        lock(&self.0).namespaces.remove(path);
    }

    /// Mounts made and not unmounted.
    pub fn mounts(&self) -> Vec<PathBuf> {
        lock(&self.0).mounts.iter().cloned().collect()
    }

    /// Sandbox ids with a CNI attachment (ADD done, no DEL since).
    pub fn attachments(&self) -> Vec<String> {
        lock(&self.0).attachments.iter().cloned().collect()
    }

    /// Runtime containers and their status (`created`, `running`, `stopped`).
    pub fn containers(&self) -> BTreeMap<String, &'static str> {
        lock(&self.0).containers.clone()
    }

    /// Sets what the runtime says of container `id` (e.g. `stopped`: it died meanwhile).
    pub fn set_container(&self, id: &str, status: &'static str) {
        lock(&self.0).containers.insert(id.to_string(), status);
    }

    /// Logs the call, runs its hooks, and says whether it is to fail (with the message).
    fn call(&self, op: Op, arg: impl Into<String>) -> Option<String> {
        let call = Call {
            op,
            arg: arg.into(),
        };
        // Hooks run without the lock held: they may ask the fake questions.
        let mut hooks = {
            let mut inner = lock(&self.0);
            inner.calls.push(call.clone());
            std::mem::take(&mut inner.hooks)
        };
        for (o, hook) in hooks.iter_mut() {
            if *o == op {
                hook(&call);
            }
        }
        let mut inner = lock(&self.0);
        hooks.append(&mut inner.hooks);
        inner.hooks = hooks;
        let fails = match inner.faults.get_mut(&op) {
            None => false,
            Some(None) => true,
            Some(Some(0)) => false,
            Some(Some(n)) => {
                *n -= 1;
                true
            }
        };
        fails.then(|| format!("injected failure of {op:?} {}", call.arg))
    }

    /// A mount at `target`: an empty dir made there and remembered until unmounted.
    fn mount_at(&self, op: Op, target: &Path) -> Result<(), HostError> {
        self.host_result(op, target.display().to_string())?;
        crate::state::files::private_dir_all(target)?;
        lock(&self.0).mounts.insert(target.to_path_buf());
        Ok(())
    }

    fn host_result(&self, op: Op, arg: impl Into<String>) -> Result<(), HostError> {
        match self.call(op, arg) {
            Some(msg) => Err(HostError::Other(msg)),
            None => Ok(()),
        }
    }

    fn runtime_result(
        &self,
        op: Op,
        name: &'static str,
        runtime: &OciRuntime,
        id: &str,
    ) -> Result<(), RuntimeError> {
        match self.call(op, id) {
            Some(msg) => Err(RuntimeError::Failed {
                runtime: runtime.name.clone(),
                op: name,
                id: id.to_string(),
                msg,
            }),
            None => Ok(()),
        }
    }

    fn cni_result(&self, op: Op, command: &'static str, arg: String) -> Result<(), CniError> {
        match self.call(op, arg) {
            Some(msg) => Err(CniError::Plugin {
                plugin: "fake".into(),
                command,
                code: Some(11),
                msg,
                details: String::new(),
                stderr: String::new(),
            }),
            None => Ok(()),
        }
    }
}

fn show(p: Option<&Path>) -> String {
    p.map(|p| p.display().to_string()).unwrap_or_default()
}

impl Host for FakeHost {
    fn make_shared_dirs(&self, dirs: &[PathBuf]) -> Result<(), HostError> {
        for dir in dirs {
            self.host_result(Op::MakeSharedDir, dir.display().to_string())?;
            std::fs::create_dir_all(dir).map_err(|e| HostError::io("create dir", dir, e))?;
        }
        Ok(())
    }

    /// Logged once, with the namespace files it was asked for; a failure shows at `wait`,
    /// where the real pin's thread reports its own, and leaves no file behind.
    fn pin_namespaces(&self, req: &PinRequest) -> Result<Pinning, HostError> {
        let paths: Vec<PathBuf> = [&req.net, &req.ipc, &req.uts]
            .into_iter()
            .flatten()
            .cloned()
            .chain(req.user.as_ref().map(|(p, _)| p.clone()))
            .collect();
        let arg = paths
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" ");
        if let Some(msg) = self.call(Op::Pin, arg) {
            return Ok(Pinning::finished(Err(HostError::Other(msg))));
        }
        for p in &paths {
            crate::netns::create_empty_file(p)?;
            lock(&self.0).namespaces.insert(p.clone());
        }
        Ok(Pinning::finished(Ok(())))
    }

    fn remove_namespace(&self, path: &Path) -> Result<(), HostError> {
        self.host_result(Op::RemoveNamespace, path.display().to_string())?;
        lock(&self.0).namespaces.remove(path);
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(HostError::io("remove namespace file", path, e))
            }
            _ => Ok(()),
        }
    }

    fn is_namespace(&self, path: &Path) -> bool {
        lock(&self.0).namespaces.contains(path)
    }

    fn apply_sysctls(
        &self,
        _net: Option<&Path>,
        _ipc: Option<&Path>,
        _uts: Option<&Path>,
        sysctls: &[(String, String, Ns)],
    ) -> Result<(), HostError> {
        let names: Vec<&str> = sysctls.iter().map(|(n, _, _)| n.as_str()).collect();
        self.host_result(Op::ApplySysctls, names.join(" "))
    }

    /// Succeeds with a CNI 1.0.0 result holding one address.
    fn cni_add(
        &self,
        _cni: &Cni,
        _list: &NetworkList,
        att: &Attachment,
    ) -> Result<Value, CniError> {
        self.cni_result(Op::CniAdd, "ADD", show(att.netns.as_deref()))?;
        lock(&self.0).attachments.insert(att.container_id.clone());
        Ok(serde_json::json!({
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0"}],
            "ips": [{"address": "10.88.0.7/16", "interface": 0}],
        }))
    }

    /// Logged with the netns it was given (empty: none, the netns was gone).
    fn cni_del(
        &self,
        _cni: &Cni,
        _list: &NetworkList,
        att: &Attachment,
        _result: Option<&Value>,
    ) -> Result<(), CniError> {
        self.cni_result(Op::CniDel, "DEL", show(att.netns.as_deref()))?;
        lock(&self.0).attachments.remove(&att.container_id);
        Ok(())
    }

    /// The cache is a file under the state root: written for real unless told to fail.
    fn cni_save_cache(&self, cni: &Cni, id: &str, entry: &CacheEntry) -> Result<(), CniError> {
        if let Some(msg) = self.call(Op::CniSaveCache, id) {
            return Err(CniError::Cache {
                path: cni.cache_dir.join(format!("{id}.json")),
                reason: msg,
            });
        }
        cni.save_cache(id, entry)
    }

    fn mount_shm(&self, path: &Path, _size: u64) -> Result<(), HostError> {
        self.mount_at(Op::MountShm, path)
    }

    fn unmount_all(&self, path: &Path) -> Result<(), HostError> {
        self.host_result(Op::Unmount, path.display().to_string())?;
        lock(&self.0).mounts.remove(path);
        Ok(())
    }

    fn mount_tree_copy(
        &self,
        _source: &Path,
        target: &Path,
        _readonly: bool,
        _userns: Option<BorrowedFd<'_>>,
    ) -> Result<(), HostError> {
        self.mount_at(Op::MountTreeCopy, target)
    }

    /// An empty dir stands for the rootfs (the verbs read its account files: there are none).
    fn mount_overlay(
        &self,
        _lower: &[PathBuf],
        _upper: &Path,
        _work: &Path,
        target: &Path,
    ) -> Result<(), HostError> {
        self.mount_at(Op::MountOverlay, target)
    }

    fn mount_idmapped_overlay(
        &self,
        _userns: &File,
        _host_root: (u32, u32),
        _lower: &[PathBuf],
        _ovl: &Path,
        _scratch: &Path,
        target: &Path,
    ) -> Result<(), HostError> {
        self.mount_at(Op::MountIdmappedOverlay, target)
    }

    fn runtime_create(
        &self,
        runtime: &OciRuntime,
        id: &str,
        _bundle: &Path,
        _files: &ContainerFiles,
    ) -> Result<i32, RuntimeError> {
        self.runtime_result(Op::RuntimeCreate, "create", runtime, id)?;
        let mut inner = lock(&self.0);
        inner.containers.insert(id.to_string(), "created");
        inner.last_pid += 1;
        Ok(100_000 + inner.last_pid)
    }

    /// The fake's monitor watches at once.
    fn wait_oom_watch(&self, _files: &ContainerFiles, _limit: Duration) -> bool {
        true
    }

    fn runtime_start(
        &self,
        runtime: &OciRuntime,
        id: &str,
        _log: &Path,
    ) -> Result<(), RuntimeError> {
        self.runtime_result(Op::RuntimeStart, "start", runtime, id)?;
        lock(&self.0).containers.insert(id.to_string(), "running");
        Ok(())
    }

    fn runtime_kill(
        &self,
        runtime: &OciRuntime,
        id: &str,
        _signal: &str,
        _all: bool,
        _log: &Path,
    ) -> Result<(), RuntimeError> {
        self.runtime_result(Op::RuntimeKill, "kill", runtime, id)?;
        if let Some(s) = lock(&self.0).containers.get_mut(id) {
            *s = "stopped";
        }
        Ok(())
    }

    fn wait_exit(
        &self,
        _files: &ContainerFiles,
        proc: &crate::process::ProcId,
        _limit: Duration,
    ) -> Result<(), String> {
        match self.call(Op::WaitExit, proc.pid.to_string()) {
            Some(msg) => Err(msg),
            None => Ok(()),
        }
    }

    fn runtime_delete(
        &self,
        runtime: &OciRuntime,
        id: &str,
        _log: &Path,
    ) -> Result<(), RuntimeError> {
        self.runtime_result(Op::RuntimeDelete, "delete", runtime, id)?;
        lock(&self.0).containers.remove(id);
        Ok(())
    }

    fn runtime_state(
        &self,
        runtime: &OciRuntime,
        id: &str,
    ) -> Result<Option<RuntimeState>, RuntimeError> {
        self.runtime_result(Op::RuntimeState, "state", runtime, id)?;
        Ok(lock(&self.0).containers.get(id).map(|s| RuntimeState {
            status: s.to_string(),
            pid: 0,
            bundle: String::new(),
        }))
    }

    fn remove_cgroup(&self, cgroup: &str) -> Result<(), HostError> {
        self.host_result(Op::RemoveCgroup, cgroup)
    }

    fn set_cgroup_limits(
        &self,
        cgroup: &str,
        _: &crate::cgroups::PodLimits,
    ) -> Result<(), HostError> {
        self.host_result(Op::SetCgroupLimits, cgroup)
    }
}

mod tests {
    use super::*;

    /// `fail_next` fails that many calls, `fail` every one until `heal`; every call is
    /// logged, failed or not, with what it was about.
    #[test]
    fn faults_and_log() {
        let f = FakeHost::new();
        f.fail_next(Op::RemoveCgroup, 2);
        let results: Vec<bool> = (0..3)
            .map(|i| f.remove_cgroup(&format!("/c{i}")).is_ok())
            .collect();
        assert_eq!(results, [false, false, true]);
        f.fail(Op::Unmount);
        assert!(f.unmount_all(Path::new("/a")).is_err());
        assert!(f.unmount_all(Path::new("/a")).is_err());
        f.heal(Op::Unmount);
        assert!(f.unmount_all(Path::new("/a")).is_ok());
        assert_eq!(
            f.ops(),
            [
                Op::RemoveCgroup,
                Op::RemoveCgroup,
                Op::RemoveCgroup,
                Op::Unmount,
                Op::Unmount,
                Op::Unmount
            ]
        );
        assert_eq!(f.calls()[2].arg, "/c2");
    }
}
