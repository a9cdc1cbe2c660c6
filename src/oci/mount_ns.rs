//! The mount namespace the OCI runtime's own processes run in, so that what a runtime call
//! costs does not grow with the number of pods on the node.
//!
//! runc 1.1 reads the whole of `/proc/self/mountinfo` in every call (its Intel RDT probe),
//! and again while creating (the rootfs' parent mount, the cgroup v1 mount): five reads per
//! pod brought up. Every pod adds about five mounts to the host's table (its namespace pins,
//! its shm, a rootfs overlay per container), so at 1000 pods each read is ~5000 lines, and
//! generating and parsing them was over a third of the node's CPU during bring-up.
//!
//! So the runtime runs in a *template*: a copy of the host's mount namespace, slave to it
//! (the host's later mounts and unmounts in shared trees reach it; nothing done in it reaches
//! the host), in which every mount where pods' mounts go (the state root's `containers`,
//! `sandboxes` and `userns` dirs, the namespace pin dirs) is detached. Calls on an existing container (`start`, `state`, `kill`,
//! `delete`, `update`, `events`, and `exec` for an ExecSync with a time limit: kubelet's
//! probes) enter the template; an open-ended exec session runs in the host's namespace, so it
//! holds no template for long. `create` runs in a throwaway copy
//! of the template into which exactly the paths the bundle names (the rootfs, the namespace
//! files, every bind-mount source) are carried as fresh clones of the host's view
//! (`open_tree` + `move_mount`): shared sources stay peers of the host's, so mount propagation
//! is what it would be in the host's namespace. The container itself, after the runtime's
//! `pivot_root`, sees what it always did. A template older than [`MAX_AGE`] is made anew (in
//! the background) at its next use, or dropped by a timer when no call came, so a host mount
//! unmounted meanwhile is held at most about twice that.
//!
//! Anything that cannot be done (a kernel without `open_tree`, a path the template lacks, a
//! monitor that cannot open or enter the namespace it is given) runs that call in the host's
//! namespace as before: slower, never different.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::CloneFlags;
use nix::sys::stat::Mode;

use crate::error::HostError;

/// The dirs under the state root where pods' mounts go (rootfs overlays, shm, idmapped
/// trees) and lazy image layers' FUSE mounts (a copy held here would keep a removed layer's
/// server alive): their mounts are what the template leaves out.
const POD_MOUNT_DIRS: [&str; 4] = ["containers", "sandboxes", "userns", "images/lazy"];

/// How long one template serves before the next use makes a new one.
pub const MAX_AGE: Duration = Duration::from_secs(30);

/// A dir whose mounts the runtime does not see.
#[derive(Debug, Clone)]
struct Hidden {
    dir: PathBuf,
    /// Hide a mount at `dir` itself too (a pin dir bound onto itself), not only those below.
    with_self: bool,
}

impl Hidden {
    fn covers(&self, p: &Path) -> bool {
        p.starts_with(&self.dir) && (self.with_self || p != self.dir)
    }
}

/// One template namespace: its nsfs fd and its root dir.
#[derive(Debug)]
struct Template {
    ns: Arc<OwnedFd>,
    root: OwnedFd,
    made: Instant,
}

/// The runtime's mount namespace; see the module doc.
#[derive(Debug)]
pub struct RuntimeMountNs {
    hidden: Vec<Hidden>,
    max_age: Duration,
    state: Mutex<State>,
}

/// The template in use and its making: a template is made on a thread of its own (at 1000
/// pods it detaches ~2000 mounts, each waiting for an RCU grace period: ~0.1-0.6 s), while
/// calls go on with the one they have — or, before the first exists, in the host's namespace.
#[derive(Debug, Default)]
struct State {
    current: Option<Arc<Template>>,
    making: bool,
    /// When the last making started: a failed one is tried again after `max_age`.
    tried: Option<Instant>,
    /// The first one failed: this host cannot (logged once); calls stay in the host's.
    disabled: bool,
    /// The last one was dropped for its age with no call to renew it.
    dropped: bool,
}

impl RuntimeMountNs {
    /// The runtime's mount namespace, hiding every mount below the pods' dirs of
    /// `state_root` and at or below each of `pin_dirs` (a pin dir that holds the state root
    /// is left alone: the runtime needs its state). Until it exists, and for good if it cannot be made (logged),
    /// runtime calls run in the host's namespace.
    pub fn new(state_root: &Path, pin_dirs: &[&Path]) -> Result<Arc<Self>, HostError> {
        Self::with_max_age(state_root, pin_dirs, MAX_AGE)
    }

    pub(crate) fn with_max_age(
        state_root: &Path,
        pin_dirs: &[&Path],
        max_age: Duration,
    ) -> Result<Arc<Self>, HostError> {
        let real = |p: &Path| std::fs::canonicalize(p).map_err(|e| HostError::io("resolve", p, e));
        let root = real(state_root)?;
        // Only where pods' mounts go: a mount elsewhere under the root (the runtime's state
        // dir on a tmpfs of its own, say) stays, the runtime needs it.
        let mut hidden: Vec<Hidden> = POD_MOUNT_DIRS
            .iter()
            .map(|d| Hidden {
                dir: root.join(d),
                with_self: false,
            })
            .collect();
        for d in pin_dirs {
            let dir = real(d)?;
            if !root.starts_with(&dir) {
                hidden.push(Hidden {
                    dir,
                    with_self: true,
                });
            }
        }
        let ns = Arc::new(RuntimeMountNs {
            hidden,
            max_age,
            state: Mutex::new(State::default()),
        });
        // (The first template is made on first use or `prepare`, not here: at 1,000 pods
        // its thousands of unmounts slowed the daemon's start, which needs none of it.)
        // An idle node renews nothing: a template too old is dropped instead (the next call
        // starts a new one), so what it holds of the host's mounts lives at most ~2 × max_age.
        let weak = Arc::downgrade(&ns);
        let period = max_age.max(Duration::from_secs(1));
        let _ = std::thread::Builder::new()
            .name("runtime-mntns-gc".into())
            .spawn(move || loop {
                std::thread::sleep(period);
                let Some(ns) = weak.upgrade() else {
                    return;
                };
                let mut st = ns.lock();
                if st
                    .current
                    .as_ref()
                    .is_some_and(|t| t.made.elapsed() >= ns.max_age)
                {
                    let old = st.current.take();
                    st.dropped = true;
                    drop(st);
                    drop(old);
                }
            });
        Ok(ns)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The template to use now (`None`: the host's namespace); starts making a new one in
    /// the background when it is older than `max_age`.
    fn template(self: &Arc<Self>) -> Option<Arc<Template>> {
        let mut st = self.lock();
        if st.disabled {
            return None;
        }
        let stale = st
            .current
            .as_ref()
            .is_none_or(|t| t.made.elapsed() >= self.max_age);
        // A failed making is tried again after max_age (a dropped old one: at once).
        let may_try = st
            .tried
            .is_none_or(|t| st.dropped || t.elapsed() >= self.max_age);
        if stale && !st.making && may_try {
            st.making = true;
            st.tried = Some(Instant::now());
            let me = Arc::clone(self);
            let first = st.current.is_none() && !st.dropped;
            let spawned = std::thread::Builder::new()
                .name("runtime-mntns".into())
                .spawn(move || me.make(first));
            if spawned.is_err() {
                st.making = false;
            }
        }
        st.current.clone()
    }

    /// Makes a template and puts it in use (the first one also proves a thread can enter it:
    /// a host that refuses that, an LSM or a seccomp filter, keeps the runtime in its own).
    fn make(&self, first: bool) {
        let made = make_template(&self.hidden).and_then(|t| {
            if first {
                let ns =
                    t.ns.try_clone()
                        .map_err(|e| HostError::io("dup", "the runtime's mount namespace", e))?;
                on_own_thread("entering the runtime's mount namespace", move || {
                    nix::sched::setns(&ns, CloneFlags::CLONE_NEWNS)
                        .map_err(|e| HostError::sys("enter", "the runtime's mount namespace", e))
                })?;
            }
            Ok(t)
        });
        let mut st = self.lock();
        st.making = false;
        let mut old = None;
        match made {
            Ok(t) => {
                old = st.current.replace(Arc::new(t));
                st.dropped = false;
            }
            Err(e) if first => {
                st.disabled = true;
                tracing::warn!(error = %e, "the OCI runtime runs in the host's mount namespace");
            }
            Err(e) => {
                st.dropped = false; // tried again after max_age, not at every call
                tracing::warn!(error = %e, "cannot renew the runtime's mount namespace; the old one (if any) serves on")
            }
        }
        // Tearing the old namespace down (thousands of mounts) happens without the lock.
        drop(st);
        drop(old);
    }

    /// Starts making the first template in the background (on a thread that inherits the
    /// caller's priority), if no call has yet.
    pub fn prepare(self: &Arc<Self>) {
        let _ = self.template();
    }

    /// Waits until the first template is in use (or cannot be made); whether it is.
    #[cfg(test)]
    pub(crate) fn wait_ready(self: &Arc<Self>, within: Duration) -> bool {
        self.prepare();
        let deadline = Instant::now() + within;
        loop {
            let st = self.lock();
            if st.current.is_some() || st.disabled || Instant::now() >= deadline {
                return st.current.is_some();
            }
            drop(st);
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The template's namespace, for calls on existing containers to be spawned in
    /// ([`crate::process::Within`]); `None`: they run in the daemon's.
    pub fn current(self: &Arc<Self>) -> Option<Arc<OwnedFd>> {
        self.template().map(|t| Arc::clone(&t.ns))
    }

    /// The namespace for `runtime create` of the bundle at `bundle`: a copy of the template
    /// with the paths the bundle's spec names carried in from the host. `None` (and why, in
    /// the log) when it cannot be made: create runs in the host's namespace then.
    pub fn for_create(self: &Arc<Self>, id: &str, bundle: &Path) -> Option<OwnedFd> {
        let t = self.template()?;
        match spec_paths(bundle).and_then(|paths| carry_into_copy(&t, &paths)) {
            Ok(fd) => Some(fd),
            Err(e) => {
                tracing::info!(container_id = id, error = %e, "runtime create runs in the host's mount namespace");
                None
            }
        }
    }
}

/// Opens `path` (`O_CLOEXEC` plus `flags`).
fn open_fd(path: &Path, flags: OFlag) -> Result<OwnedFd, HostError> {
    nix::fcntl::open(path, flags | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| HostError::sys("open", path, e))
}

/// Runs `f` on a thread of its own (its own fs struct, so its namespace switch touches no
/// other thread) and returns what it returned.
fn on_own_thread<T: Send + 'static>(
    what: &'static str,
    f: impl FnOnce() -> Result<T, HostError> + Send + 'static,
) -> Result<T, HostError> {
    std::thread::Builder::new()
        .name("runtime-mntns".into())
        .spawn(move || {
            nix::sched::unshare(CloneFlags::CLONE_FS)
                .map_err(|e| HostError::sys("unshare fs for", what, e))?;
            f()
        })
        .map_err(|e| HostError::thread_start(what, e))?
        .join()
        .map_err(|_| HostError::thread_panicked(what))?
}

/// A new template: a slave copy of our namespace with the hidden dirs' mounts detached.
fn make_template(hidden: &[Hidden]) -> Result<Template, HostError> {
    let hidden = hidden.to_vec();
    let started = Instant::now();
    on_own_thread("the runtime's mount namespace", move || {
        nix::sched::unshare(CloneFlags::CLONE_NEWNS)
            .map_err(|e| HostError::sys("unshare", "a mount namespace", e))?;
        // Before anything else: the copy's mounts are peers of the host's, and an unmount
        // in a peer would unmount the host's. As slaves, nothing done here leaves.
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REC | MsFlags::MS_SLAVE,
            None::<&str>,
        )
        .map_err(|e| HostError::sys("make slave", "/ of the runtime's mount namespace", e))?;
        let text = std::fs::read_to_string("/proc/thread-self/mountinfo")
            .map_err(|e| HostError::io("read", "/proc/thread-self/mountinfo", e))?;
        let mut points: Vec<PathBuf> = crate::mounts::parse_mountinfo(&text)
            .into_iter()
            .map(|m| m.mount_point)
            .filter(|p| hidden.iter().any(|h| h.covers(p)))
            .collect();
        // Outermost first: detaching one takes everything below it along.
        points.sort_by_key(|p| p.as_os_str().len());
        points.dedup();
        // (A set looked up by each point's ancestors: a scan of everything detached so far
        // for each point was quadratic, ~12 M comparisons and a core's worth of a start at
        // 1,000 pods.)
        let mut gone: std::collections::HashSet<&Path> = std::collections::HashSet::new();
        for p in &points {
            if p.ancestors().any(|a| gone.contains(a)) {
                continue;
            }
            // Mounts stacked on one point go one by one.
            for _ in 0..64 {
                if umount2(p.as_path(), MntFlags::MNT_DETACH).is_err() {
                    break;
                }
            }
            gone.insert(p);
        }
        tracing::debug!(
            detached = gone.len(),
            elapsed_ms = started.elapsed().as_secs_f64() * 1000.0,
            "made the runtime's mount namespace"
        );
        Ok(Template {
            ns: Arc::new(open_fd(
                Path::new("/proc/thread-self/ns/mnt"),
                OFlag::O_RDONLY,
            )?),
            root: open_fd(Path::new("/"), OFlag::O_PATH | OFlag::O_DIRECTORY)?,
            made: Instant::now(),
        })
    })
}

/// The host paths the runtime resolves while creating the container of this bundle: its
/// rootfs, the namespace files it joins, the sources of its bind mounts.
fn spec_paths(bundle: &Path) -> Result<Vec<PathBuf>, HostError> {
    let file = bundle.join("config.json");
    let text = std::fs::read(&file).map_err(|e| HostError::io("read", &file, e))?;
    let spec: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| HostError::format(file.display(), e))?;
    let mut paths = Vec::new();
    if let Some(root) = spec.pointer("/root/path").and_then(|v| v.as_str()) {
        paths.push(bundle.join(root));
    }
    let list = |ptr: &str| {
        spec.pointer(ptr)
            .and_then(|v| v.as_array())
            .cloned()
            .unwrap_or_default()
    };
    for ns in list("/linux/namespaces") {
        if let Some(p) = ns.get("path").and_then(|v| v.as_str()) {
            paths.push(PathBuf::from(p));
        }
    }
    for m in list("/mounts") {
        let is_bind = m.get("type").and_then(|v| v.as_str()) == Some("bind")
            || m.get("options")
                .and_then(|v| v.as_array())
                .is_some_and(|o| {
                    o.iter()
                        .any(|o| matches!(o.as_str(), Some("bind" | "rbind")))
                });
        if let (true, Some(src)) = (is_bind, m.get("source").and_then(|v| v.as_str())) {
            paths.push(PathBuf::from(src));
        }
    }
    Ok(paths)
}

/// A copy of the template with each of `paths` (resolved in the host's view) carried in as a
/// recursive clone of the host's, mounted at the same path.
fn carry_into_copy(t: &Template, paths: &[PathBuf]) -> Result<OwnedFd, HostError> {
    let mut real = Vec::with_capacity(paths.len());
    for p in paths {
        if !p.is_absolute() {
            return Err(HostError::format(p.display(), "not an absolute path"));
        }
        if p.starts_with("/proc") {
            // The template's /proc is the host's procfs (an infra process's namespaces).
            continue;
        }
        real.push(std::fs::canonicalize(p).map_err(|e| HostError::io("resolve", p, e))?);
    }
    real.sort_by_key(|p| p.as_os_str().len());
    real.dedup();
    let mut carried: Vec<(PathBuf, OwnedFd)> = Vec::with_capacity(real.len());
    for p in real {
        if carried.iter().any(|(c, _)| p.starts_with(c)) {
            continue; // inside a tree already carried
        }
        if p == Path::new("/") {
            return Err(HostError::format("/", "the whole root cannot be carried"));
        }
        exists_in(t, &p)?;
        // A dir with its submounts (rbind); a file alone: a recursive clone of a file would
        // walk every submount of the filesystem holding it (`/`: all the pods').
        let tree = crate::mounts::clone_tree(&p, p.is_dir())?;
        carried.push((p, tree));
    }
    let ns =
        t.ns.try_clone()
            .map_err(|e| HostError::io("dup", "the runtime's mount namespace", e))?;
    on_own_thread("a runtime create's mount namespace", move || {
        nix::sched::setns(&ns, CloneFlags::CLONE_NEWNS)
            .map_err(|e| HostError::sys("enter", "the runtime's mount namespace", e))?;
        nix::sched::unshare(CloneFlags::CLONE_NEWNS)
            .map_err(|e| HostError::sys("unshare", "a mount namespace", e))?;
        for (p, tree) in &carried {
            crate::mounts::attach(tree, p)?;
        }
        open_fd(Path::new("/proc/thread-self/ns/mnt"), OFlag::O_RDONLY)
    })
}

/// `Ok` if `p` (absolute, no symlinks) exists in the template, so a clone can go there.
fn exists_in(t: &Template, p: &Path) -> Result<(), HostError> {
    let rel = p.strip_prefix("/").unwrap_or(p);
    nix::fcntl::openat(
        &t.root,
        rel,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map(drop)
    .map_err(|e| HostError::sys("find in the runtime's mount namespace", p, e))
}

#[cfg(test)]
mod tests;
