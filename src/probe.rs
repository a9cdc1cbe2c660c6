//! The host, probed as a step of its own: each handler's binary, family flags and whether it
//! can create a container here (found by trying), and the node's facts. `Status`, the verbs
//! and the tests read the results; `Config::default()` probes nothing.
//!
//! When things run:
//! - at start (`Runtime::new`): each handler's binary is found and its family's host flags
//!   probed, all handlers in parallel, each call under a time limit;
//! - in the background, once (the daemon starts it before serving; `Status` starts it if
//!   nobody did): one trial container per handler, built like an infra container, created
//!   and deleted. A handler whose trial fails is not offered in `Status` and its pods are
//!   refused at once with the runtime's own reason (e.g. crun on a cgroup v1 hybrid host);
//! - never on a request's path: a pod of a handler still being tried is run as before, so a
//!   runtime that hangs costs its trial's time limit in the background only.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Once, OnceLock};
use std::time::{Duration, Instant};

use crate::config::RuntimeHandler;
use crate::error::{Error, Result};
use crate::handlers::{family_of, Family};
use crate::oci::{spec, OciRuntime};

/// What the probe found of one handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Not tried (yet, or there is nothing to try with: no pause binary).
    NotProbed,
    /// Its trial container is being created.
    Probing,
    /// Its trial container was created and deleted.
    Ready,
    /// It cannot run pods here; the reason is the runtime's own message.
    NotReady(String),
}

/// A handler as the runtime resolved it at start.
#[derive(Clone)]
pub(crate) struct Resolved {
    pub family: &'static dyn Family,
    pub path: PathBuf,
    /// The family's flags for this host (`Family::host_args`) not already configured.
    pub host_args: Vec<String>,
}

/// What the trials found so far, and how many are still running (one thread per handler: a
/// hung runtime delays only its own answer). `changed` is signalled when a trial ends.
#[derive(Default)]
struct Results {
    state: Mutex<TrialState>,
    changed: Condvar,
}

#[derive(Default)]
struct TrialState {
    found: BTreeMap<String, Readiness>,
    running: usize,
}

/// The probe's results, held by the runtime.
pub(crate) struct Probe {
    results: Arc<Results>,
    trials: Once,
    cancel: Arc<AtomicBool>,
    /// Whether pods can have user namespaces here (`userns::probe`, tried at first need).
    pub userns: OnceLock<std::result::Result<(), String>>,
}

impl Default for Probe {
    fn default() -> Self {
        Probe {
            results: Default::default(),
            trials: Once::new(),
            cancel: Arc::default(),
            userns: OnceLock::new(),
        }
    }
}

/// How long a dropped runtime waits for trials in progress, so that a test's clean-up does
/// not race a trial container being made.
const DROP_WAIT: Duration = Duration::from_secs(10);

impl Results {
    /// Waits (up to `limit`) while `busy` holds of the state; returns the state then.
    fn wait_while(
        &self,
        limit: Duration,
        busy: impl FnMut(&mut TrialState) -> bool,
    ) -> std::sync::MutexGuard<'_, TrialState> {
        let guard = crate::state::lock(&self.state);
        match self.changed.wait_timeout_while(guard, limit, busy) {
            Ok((g, _)) => g,
            Err(poisoned) => poisoned.into_inner().0,
        }
    }

    fn set(&self, handler: &str, r: Readiness) {
        crate::state::lock(&self.state)
            .found
            .insert(handler.to_string(), r);
    }
}

/// A trial in progress: counted out when its thread ends, however it ends. The last one
/// out removes the trials' shared dir, under the lock, so that no trial is between making
/// its own dir in it and using it.
struct Running(Arc<Results>, PathBuf);

impl Drop for Running {
    fn drop(&mut self) {
        let mut s = crate::state::lock(&self.0.state);
        s.running -= 1;
        if s.running == 0 {
            let _ = std::fs::remove_dir(&self.1);
        }
        drop(s);
        self.0.changed.notify_all();
    }
}

impl Probe {
    /// Skips the trials not begun and waits up to `limit` for those in progress.
    pub(crate) fn stop(&self, limit: Duration) {
        self.cancel.store(true, Ordering::Relaxed);
        drop(self.results.wait_while(limit, |s| s.running > 0));
    }
}

/// Why a handler cannot run anything here without trying it: its binary is missing.
pub(crate) fn missing_binary(path: &Path) -> Option<String> {
    (!path.is_file()).then(|| format!("binary {} not found", path.display()))
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.stop(DROP_WAIT);
    }
}

/// Finds each handler's binary and family, and probes its family's host flags: all handlers
/// at once, each probe under its own time limit.
///
/// With `cache` (a file under the runtime state dir, which is forgotten with the boot that
/// made it), a binary's host flags are probed once per boot and per binary: the file keeps
/// them by the binary's identity (family, path, device, inode, size, mtime and ctime), so a
/// restart does not pay for the calls again (runsc's two: ~90 ms of a restart at 1,000
/// pods), while a binary replaced or changed in place is probed anew.
pub(crate) fn resolve_handlers(
    handlers: &BTreeMap<String, RuntimeHandler>,
    cache: Option<&Path>,
) -> Result<BTreeMap<String, Resolved>> {
    let mut out = BTreeMap::new();
    let mut jobs = Vec::new();
    let known = cache.map(read_host_args).unwrap_or_default();
    let mut seen = BTreeMap::new();
    let flag = |a: &str| a.split('=').next().unwrap_or(a).to_string();
    for (name, h) in handlers {
        let family =
            family_of(h).map_err(|e| Error::Config(format!("runtime handler {name:?}: {e}")))?;
        let path = binary_path(&h.path);
        if path.is_file() {
            let configured = h.runtime_args.clone();
            let key = binary_identity(family, &path);
            let job = match key.as_ref().and_then(|k| known.get(k)) {
                Some(args) => Probed::Known(args.clone()),
                None => {
                    let p = path.clone();
                    Probed::Probing(std::thread::spawn(move || family.host_args(&p)))
                }
            };
            jobs.push((name.clone(), key, configured, job));
        }
        out.insert(
            name.clone(),
            Resolved {
                family,
                path,
                host_args: Vec::new(),
            },
        );
    }
    let mut probed = false;
    for (name, key, configured, job) in jobs {
        let args = match job {
            Probed::Known(args) => args,
            Probed::Probing(t) => {
                probed = true;
                t.join().unwrap_or_default()
            }
        };
        if let Some(k) = key {
            seen.insert(k, args.clone());
        }
        if let Some(r) = out.get_mut(&name) {
            r.host_args = args
                .into_iter()
                .filter(|a| !configured.iter().any(|c| flag(c) == flag(a)))
                .collect();
        }
    }
    if let (Some(file), true) = (cache, probed || seen.len() != known.len()) {
        // Only today's binaries are kept.
        let text = serde_json::to_vec(&seen).unwrap_or_default();
        if let Err(e) = crate::state::write_atomic(file, &text) {
            tracing::debug!(error = %e, "cannot keep the runtimes' host flags");
        }
    }
    Ok(out)
}

/// A handler's host flags: known from the cache, or being probed on a thread.
enum Probed {
    Known(Vec<String>),
    Probing(std::thread::JoinHandle<Vec<String>>),
}

/// What identifies a runtime binary for the host-flag cache; `None` when it cannot be read.
fn binary_identity(family: &dyn Family, path: &Path) -> Option<String> {
    let id = spec::file_identity(path)?;
    Some(format!("{} {} {id}", family.name(), path.display()))
}

/// The host-flag cache (binary identity → flags); empty when missing or unreadable (the
/// flags are probed again). Bounded: it is ours, under the state root, but read as any file.
fn read_host_args(file: &Path) -> BTreeMap<String, Vec<String>> {
    crate::untrusted_fs::read_file(file, 64 << 10)
        .ok()
        .and_then(|raw| serde_json::from_slice(&raw).ok())
        .unwrap_or_default()
}

/// A bare program name is looked up in PATH; a relative path is made absolute (a call that
/// enters the runtime's mount namespace starts in `/`).
pub(crate) fn binary_path(p: &Path) -> PathBuf {
    let bare = p.is_relative() && p.components().count() == 1;
    match p.to_str() {
        Some(name) if bare => crate::config::find_in_path(name).unwrap_or_else(|| p.to_path_buf()),
        _ if p.is_relative() => std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()),
        _ => p.to_path_buf(),
    }
}

/// Everything one handler's trial needs, owned (it runs on its own thread).
struct Trial {
    rt: OciRuntime,
    infra_rootfs: Option<PathBuf>,
    dir: PathBuf,
    driver: crate::cgroups::Driver,
    cgroup_parent: String,
    results: Arc<Results>,
    cancel: Arc<AtomicBool>,
}

/// Where the trials run: the infra rootfs they are built on, their dir, and the pods' cgroup
/// parent and driver.
pub(crate) struct TrialPlace {
    pub infra_rootfs: Option<PathBuf>,
    pub dir: PathBuf,
    pub driver: crate::cgroups::Driver,
    pub cgroup_parent: String,
}

impl Probe {
    /// Starts one trial container per handler in the background, once.
    pub(crate) fn start<'a>(
        &self,
        handlers: impl Iterator<Item = &'a OciRuntime>,
        place: impl FnOnce() -> TrialPlace,
    ) {
        self.trials.call_once(|| {
            let place = place();
            for rt in handlers {
                {
                    let mut s = crate::state::lock(&self.results.state);
                    s.found.insert(rt.name.clone(), Readiness::Probing);
                    s.running += 1;
                }
                let t = Trial {
                    rt: rt.clone(),
                    infra_rootfs: place.infra_rootfs.clone(),
                    dir: place.dir.clone(),
                    driver: place.driver,
                    cgroup_parent: place.cgroup_parent.clone(),
                    results: self.results.clone(),
                    cancel: self.cancel.clone(),
                };
                if let Err(e) = std::thread::Builder::new()
                    .name(format!("probe-{}", rt.name))
                    .spawn(move || t.run())
                {
                    tracing::warn!(handler = %rt.name, error = %e, "cannot start the handler's probe");
                    let mut s = crate::state::lock(&self.results.state);
                    s.found.insert(rt.name.clone(), Readiness::NotProbed);
                    s.running -= 1;
                }
            }
        });
    }

    /// What the probe found of handler `name`.
    pub(crate) fn readiness(&self, name: &str) -> Readiness {
        crate::state::lock(&self.results.state)
            .found
            .get(name)
            .cloned()
            .unwrap_or(Readiness::NotProbed)
    }

    /// Waits (up to `limit`) until no handler is being tried; what it found of each.
    pub(crate) fn wait(&self, limit: Duration) -> BTreeMap<String, Readiness> {
        let s = self.results.wait_while(limit, |s| {
            s.found.values().any(|r| *r == Readiness::Probing)
        });
        s.found.clone()
    }
}

impl Trial {
    fn run(self) {
        let _running = Running(self.results.clone(), self.dir.clone());
        let rt = &self.rt;
        let found = if self.cancel.load(Ordering::Relaxed) {
            Readiness::NotProbed
        } else if let Some(why) = missing_binary(&rt.path) {
            Readiness::NotReady(why)
        } else if let Some(rootfs) = &self.infra_rootfs {
            let started = Instant::now();
            let r = match self.trial(rt, rootfs) {
                Ok(()) => Readiness::Ready,
                Err(e) => Readiness::NotReady(e),
            };
            match &r {
                Readiness::NotReady(reason) => tracing::warn!(handler = %rt.name, %reason,
                    "runtime handler cannot create a container on this host: not offered"),
                _ => tracing::info!(handler = %rt.name,
                    elapsed_ms = started.elapsed().as_millis() as u64, "runtime handler works"),
            }
            r
        } else {
            // Nothing to try with: offered as before, its first pod will tell.
            Readiness::NotProbed
        };
        self.results.set(&rt.name, found);
    }

    /// One trial container of `rt`, built like an infra container in a new network
    /// namespace, created and deleted; its dir and cgroup go with it.
    fn trial(&self, rt: &OciRuntime, rootfs: &Path) -> std::result::Result<(), String> {
        let id = format!("probe{}", crate::state::short_hash(&rt.name));
        let dir = self.dir.join(&rt.name);
        let pod_cgroup = self.driver.own_pod_cgroup(&self.cgroup_parent, &id);
        let trial = OciRuntime {
            root: dir.join("state"),
            mount_ns: None,
            ..rt.clone()
        };
        let log = dir.join("log.json");
        // A trial a killed daemon left (its container may still exist).
        if trial.root.exists() {
            let _ = trial.delete(&id, &log);
        }
        // Its processes no state names (the daemon died while `create` ran).
        let cgroup = crate::cgroups::child(&pod_cgroup, &id);
        crate::cgroups::kill_all(&cgroup);
        crate::cgroups::kill_all(&pod_cgroup);
        let _ = std::fs::remove_dir_all(&dir);
        crate::state::files::private_dir_all(&dir).map_err(|e| e.to_string())?;
        let result = (|| -> std::result::Result<(), String> {
            for f in ["resolv.conf", "hosts", "hostname"] {
                std::fs::write(dir.join(f), "").map_err(|e| format!("{f}: {e}"))?;
            }
            let s = spec::infra(&spec::InfraSpec {
                sandbox_id: id.clone(),
                metadata: Default::default(),
                rootfs: rootfs.to_path_buf(),
                hostname: "probe".into(),
                netns: None,
                private_netns: true,
                userns: None,
                host_ipc: false,
                host_pid: false,
                shm: None,
                resolv_conf: dir.join("resolv.conf"),
                hosts: dir.join("hosts"),
                hostname_file: dir.join("hostname"),
                cgroups_path: cgroup.clone(),
                oom_score_adj: spec::clamp_oom_score_adj(-998),
                sysctls: Default::default(),
            })
            .map_err(|e| e.to_string())?;
            spec::save(&s, &dir.join("config.json")).map_err(|e| e.to_string())?;
            trial
                .create_detached(&id, &dir, &log)
                .map_err(|e| e.to_string())
        })();
        if let Err(e) = trial.delete(&id, &log) {
            tracing::warn!(handler = %rt.name, error = %e, "cannot delete the probe's trial container");
        }
        // The container's cgroup, then the pod's: runsc's sandbox leaves its own a moment
        // after `delete` returns.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let r =
                crate::cgroups::remove(&cgroup).and_then(|()| crate::cgroups::remove(&pod_cgroup));
            match r {
                Ok(()) => break,
                Err(e) if Instant::now() >= deadline => {
                    tracing::warn!(handler = %rt.name, error = %e, "cannot remove the probe's trial cgroup");
                    break;
                }
                Err(_) => {
                    // Whatever is still inside after `delete` is stray (a sandbox process of
                    // a trial a killed daemon left while `create` ran, which no state names).
                    crate::cgroups::kill_all(&cgroup);
                    crate::cgroups::kill_all(&pod_cgroup);
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binaries_are_found_in_path_or_made_absolute() {
        assert_eq!(
            binary_path(Path::new("/usr/sbin/runc")),
            PathBuf::from("/usr/sbin/runc")
        );
        assert!(binary_path(Path::new("./bin/runc")).is_absolute());
        // Not in PATH: kept as the bare name (the handler is then reported not ready).
        assert_eq!(
            binary_path(Path::new("no-such-runtime-xyz")),
            PathBuf::from("no-such-runtime-xyz")
        );
    }

    #[test]
    fn host_flags_already_configured_are_not_added_twice() {
        let handlers = BTreeMap::from([(
            "x".to_string(),
            RuntimeHandler {
                path: "/bin/true".into(),
                ..Default::default()
            },
        )]);
        let r = resolve_handlers(&handlers, None).unwrap();
        assert_eq!(r["x"].family.name(), "runc");
        assert!(r["x"].host_args.is_empty());
        let bad = BTreeMap::from([(
            "x".to_string(),
            RuntimeHandler {
                family: Some("nope".into()),
                ..Default::default()
            },
        )]);
        assert!(resolve_handlers(&bad, None).is_err());
    }

    #[test]
    fn host_flags_are_probed_once_per_binary_and_again_when_it_changes() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("sandboxd-hostargs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (bin, calls, cache) = (dir.join("runsc"), dir.join("calls"), dir.join("cache.json"));
        // A runsc that counts its calls: a release new enough for its own netstack, with
        // --oci-seccomp, then (rewritten) without it.
        let write = |flags: &str| {
            std::fs::write(
                &bin,
                format!(
                    "#!/bin/sh\necho \"$1\" >> {}\n[ \"$1\" = flags ] && echo '{flags}'\necho 'runsc version release-20990101.0'\n",
                    calls.display()
                ),
            )
            .unwrap();
            std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
            // A thread of this test process forking meanwhile holds the file open for
            // writing until it execs ("text file busy"): run it until it can be.
            for _ in 0..500 {
                if std::process::Command::new(&bin)
                    .arg("noop")
                    .output()
                    .is_ok()
                {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        };
        write("-oci-seccomp  use the profile of the spec");
        let handlers = BTreeMap::from([(
            "runsc".to_string(),
            RuntimeHandler {
                path: bin.clone(),
                ..Default::default()
            },
        )]);
        let n = || {
            std::fs::read_to_string(&calls)
                .unwrap_or_default()
                .lines()
                .filter(|l| *l != "noop")
                .count()
        };
        let r = resolve_handlers(&handlers, Some(&cache)).unwrap();
        assert_eq!(r["runsc"].host_args, ["--oci-seccomp"]);
        assert_eq!(n(), 2, "--version and flags");
        // The same binary: from the cache, no call.
        let r = resolve_handlers(&handlers, Some(&cache)).unwrap();
        assert_eq!(r["runsc"].host_args, ["--oci-seccomp"]);
        assert_eq!(n(), 2);
        // Changed in place (an upgrade): probed again.
        std::thread::sleep(std::time::Duration::from_millis(20));
        write("-other-flag");
        let r = resolve_handlers(&handlers, Some(&cache)).unwrap();
        assert!(
            r["runsc"].host_args.is_empty(),
            "{:?}",
            r["runsc"].host_args
        );
        assert_eq!(n(), 4);
        // A cache that cannot be read is probed past.
        std::fs::write(&cache, b"not json").unwrap();
        assert!(resolve_handlers(&handlers, Some(&cache)).unwrap()["runsc"]
            .host_args
            .is_empty());
        assert_eq!(n(), 6);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
