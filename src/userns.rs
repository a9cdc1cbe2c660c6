//! Pod user namespaces (CRI `userns_options` in POD mode), made by the daemon itself since
//! Debian's runc 1.1 makes no idmapped mounts:
//!
//! - the pod's user namespace, with kubelet's maps, pinned like the other namespaces, and
//!   owning the pod's network, IPC and UTS namespaces (so root in the pod is root over them,
//!   as CRI-O's pinns makes them);
//! - idmapped mounts: the image layers and the writable layer under the container's overlay,
//!   and volumes that ask for it, so the pod's root owns what the node's root owns there;
//! - a probe of all that, once, for `Status` to advertise `user_namespaces` only where it works.
//!
//! The namespaces come from a forked child (a user namespace can only be entered by a
//! single-threaded process); the child makes only raw syscalls between fork and exit.
#![allow(unsafe_code)]

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use crate::error::HostError;
use crate::model::sandbox::IdMap;

/// A child process holding new namespaces until it is told to exit.
struct NsChild {
    pid: libc::pid_t,
    /// Parent → child: one byte per go-ahead; closed = exit.
    go: Option<OwnedFd>,
    /// Child → parent: 5-byte reports (step, errno).
    report: OwnedFd,
}

/// What the child reports: the step it reached and, if that step failed, its errno.
const STEP_USERNS: u8 = 1;
const STEP_UNSHARE: u8 = 2;
const STEP_LOOPBACK: u8 = 3;
const STEP_HOSTNAME: u8 = 4;
const STEP_READY: u8 = 5;

fn pipe() -> Result<(OwnedFd, OwnedFd), HostError> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two fds into the array we pass.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(HostError::last("pipe"));
    }
    // SAFETY: two fresh fds from pipe2, each owned once.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

impl NsChild {
    /// Forks a child that makes a user namespace with `map` and, owned by it, the namespaces
    /// in `flags` (lo up in a new network namespace, `hostname` set in a new UTS one), then
    /// waits. Returns once the child holds them all.
    fn spawn(map: &IdMap, flags: libc::c_int, hostname: Option<&str>) -> Result<Self, HostError> {
        let host = hostname
            .map(|h| {
                std::ffi::CString::new(h)
                    .map_err(|_| HostError::Other("hostname contains NUL".into()))
            })
            .transpose()?;
        let (report_r, report_w) = pipe()?;
        let (go_r, go_w) = pipe()?;
        // SAFETY: fork; the child below makes only async-signal-safe calls (raw syscalls on
        // memory prepared before the fork) and leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(HostError::last("fork for the pod's user namespace"));
        }
        if pid == 0 {
            // SAFETY: in the forked child, see above.
            unsafe {
                child(
                    report_w.as_raw_fd(),
                    go_r.as_raw_fd(),
                    [report_r.as_raw_fd(), go_w.as_raw_fd()],
                    flags,
                    host.as_deref(),
                )
            }
        }
        drop((report_w, go_r));
        let c = NsChild {
            pid,
            go: Some(go_w),
            report: report_r,
        };
        c.expect(STEP_USERNS)?;
        for (file, ranges) in [("uid_map", &map.uids), ("gid_map", &map.gids)] {
            let p = format!("/proc/{pid}/{file}");
            std::fs::write(&p, IdMap::proc_map(ranges))
                .map_err(|e| HostError::io("write", &p, e))?;
        }
        c.go()?;
        c.expect(STEP_READY)?;
        Ok(c)
    }

    fn go(&self) -> Result<(), HostError> {
        let fd = self.go.as_ref().map_or(-1, |f| f.as_raw_fd());
        // SAFETY: write of one byte from a local to our pipe's write end.
        if unsafe { libc::write(fd, [1u8].as_ptr().cast(), 1) } != 1 {
            return Err(HostError::last("signal the namespace child"));
        }
        Ok(())
    }

    /// Waits (bounded) for the child's next report and checks it is `want`.
    fn expect(&self, want: u8) -> Result<(), HostError> {
        let mut pfd = libc::pollfd {
            fd: self.report.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one pollfd we own.
        let ready = unsafe { libc::poll(&mut pfd, 1, 10_000) };
        let mut buf = [0u8; 5];
        let n = if ready == 1 {
            // SAFETY: read into a local buffer of the length we pass.
            unsafe { libc::read(self.report.as_raw_fd(), buf.as_mut_ptr().cast(), 5) }
        } else {
            -1
        };
        if n != 5 {
            return Err(HostError::Other(format!(
                "the namespace child {} stopped before step {want}",
                self.pid
            )));
        }
        let errno = i32::from_ne_bytes([buf[1], buf[2], buf[3], buf[4]]);
        if buf[0] == want && errno == 0 {
            return Ok(());
        }
        let what = match buf[0] {
            STEP_USERNS => "create the user namespace",
            STEP_UNSHARE => "create namespaces in the pod's user namespace",
            STEP_LOOPBACK => "bring lo up",
            STEP_HOSTNAME => "set the hostname",
            _ => "make the pod's namespaces",
        };
        Err(HostError::Call {
            op: what,
            source: std::io::Error::from_raw_os_error(errno),
        })
    }

    /// `/proc/<pid>/ns/<kind>` of the child.
    fn ns(&self, kind: &str) -> String {
        format!("/proc/{}/ns/{kind}", self.pid)
    }
}

impl Drop for NsChild {
    fn drop(&mut self) {
        // Closing the go pipe lets the child exit; a child stuck anywhere is killed.
        self.go = None;
        let mut status = 0;
        for _ in 0..100 {
            // SAFETY: waitpid on our own child with a local status word.
            let r = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
            if r != 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        // SAFETY: kill and reap our own child.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, &mut status, 0);
        }
    }
}

/// The forked child: user namespace, wait for its maps, the other namespaces, report, wait.
///
/// # Safety
/// Only in a freshly forked child: it makes raw syscalls on memory prepared before the fork.
unsafe fn child(
    report: libc::c_int,
    go: libc::c_int,
    parent_ends: [libc::c_int; 2],
    flags: libc::c_int,
    hostname: Option<&std::ffi::CStr>,
) -> ! {
    // SAFETY: see the function's contract: raw syscalls on locals and on memory prepared
    // before the fork.
    unsafe {
        // The parent's ends: closed here, so that the parent closing its go end is our EOF.
        for fd in parent_ends {
            libc::close(fd);
        }
        // Reports a failed step (and exits), or the two steps the parent waits for.
        let say = |step: u8, ok: bool| {
            if ok && step != STEP_USERNS && step != STEP_READY {
                return;
            }
            let e = if ok { 0 } else { *libc::__errno_location() };
            let b = e.to_ne_bytes();
            let msg = [step, b[0], b[1], b[2], b[3]];
            libc::write(report, msg.as_ptr().cast(), 5);
            if !ok {
                libc::_exit(1);
            }
        };
        let wait = || {
            let mut b = 0u8;
            if libc::read(go, (&mut b as *mut u8).cast(), 1) != 1 {
                libc::_exit(0);
            }
        };
        say(STEP_USERNS, libc::unshare(libc::CLONE_NEWUSER) == 0);
        wait(); // maps written
        if flags != 0 {
            say(STEP_UNSHARE, libc::unshare(flags) == 0);
        }
        if flags & libc::CLONE_NEWNET != 0 {
            say(STEP_LOOPBACK, loopback_up_raw());
        }
        if let (true, Some(h)) = (flags & libc::CLONE_NEWUTS != 0, hostname) {
            say(
                STEP_HOSTNAME,
                libc::sethostname(h.as_ptr(), h.to_bytes().len()) == 0,
            );
        }
        say(STEP_READY, true);
        let mut b = 0u8;
        libc::read(go, (&mut b as *mut u8).cast(), 1); // until the parent is done with us
        libc::_exit(0)
    }
}

/// Brings `lo` up in the calling process's network namespace with raw syscalls only.
///
/// # Safety
/// Plain syscalls on locals; safe in a forked child.
unsafe fn loopback_up_raw() -> bool {
    // SAFETY: plain syscalls on locals we own.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return false;
        }
        let mut ifr: libc::ifreq = std::mem::zeroed();
        ifr.ifr_name[0] = b'l' as libc::c_char;
        ifr.ifr_name[1] = b'o' as libc::c_char;
        let mut ok = libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut ifr) == 0;
        if ok {
            ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            ok = libc::ioctl(fd, libc::SIOCSIFFLAGS, &ifr) == 0;
        }
        libc::close(fd);
        ok
    }
}

/// Makes the pod's user namespace with `map` and, owned by it, the namespaces in `flags`
/// (`CLONE_NEWNET` with lo up, `CLONE_NEWIPC`, `CLONE_NEWUTS` with `hostname` set), and
/// bind-mounts each of `targets` (the `user` file too) onto its (existing, empty) file.
pub fn pin(
    map: &IdMap,
    targets: &[(PathBuf, &'static str)],
    flags: libc::c_int,
    hostname: Option<&str>,
) -> Result<(), HostError> {
    let c = NsChild::spawn(map, flags, hostname)?;
    for (p, kind) in targets {
        mount(
            Some(c.ns(kind).as_str()),
            p,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| HostError::sys("bind-mount namespace onto", p, e))?;
    }
    Ok(())
}

/// A user namespace with `map`, held by the returned fd alone (for idmapped mounts whose maps
/// are not a pinned pod's).
pub fn open(map: &IdMap) -> Result<File, HostError> {
    let c = NsChild::spawn(map, 0, None)?;
    File::open(c.ns("user")).map_err(|e| HostError::io("open", c.ns("user"), e))
}

/// Mounts a container's overlay rootfs at `target` for a pod with the user namespace `userns`
/// (whose root is `host_root` on the node): each image layer and the dir holding `upper`
/// and `work` are idmapped (temporarily, under `scratch`), and the overlay is mounted over
/// those as the pod's root, so that its files appear to the pod as they appear to the node —
/// the node's root's files are the pod root's — and what the pod writes is stored with its
/// in-pod ids. The overlay keeps its own copies of the layer mounts: the temporary ones are
/// detached before returning.
pub fn mount_overlay(
    userns: &File,
    host_root: (u32, u32),
    lower: &[PathBuf],
    ovl: &Path,
    scratch: &Path,
    target: &Path,
) -> Result<(), HostError> {
    crate::mounts::overlay_dirs(&ovl.join("upper"), &ovl.join("work"))?;
    crate::state::files::private_dir_all(target)?;
    crate::state::files::private_dir_all(scratch)?;
    let mut mapped = Vec::with_capacity(lower.len());
    let result = (|| {
        for (i, l) in lower.iter().enumerate() {
            let at = scratch.join(i.to_string());
            crate::mounts::mount_tree_copy(l, &at, false, Some(userns.as_fd()))?;
            mapped.push(at);
        }
        let at = scratch.join("ovl");
        crate::mounts::mount_tree_copy(ovl, &at, false, Some(userns.as_fd()))?;
        let data = crate::mounts::overlay_data(&mapped, &at.join("upper"), &at.join("work"))?;
        mapped.push(at);
        as_pod_root(host_root, || crate::mounts::overlay_at(target, &data))
    })();
    for m in &mapped {
        let _ = umount2(m, MntFlags::MNT_DETACH);
    }
    let _ = crate::mounts::remove_tree(scratch);
    result
}

/// Runs `f` on a thread of its own whose filesystem ids are the pod root's (overlay records
/// its mounter's credentials for every later copy-up and whiteout, and those must map through
/// the idmapped layers), with every capability effective again (changing the filesystem uid
/// from 0 drops the file capabilities from the effective set).
fn as_pod_root<T: Send>(
    (uid, gid): (u32, u32),
    f: impl FnOnce() -> Result<T, HostError> + Send,
) -> Result<T, HostError> {
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setfsgid/setfsuid change this thread's credentials only (raw syscalls,
            // not glibc's process-wide set*id broadcast); the thread ends after `f`.
            unsafe {
                libc::syscall(libc::SYS_setfsgid, gid);
                libc::syscall(libc::SYS_setfsuid, uid);
            }
            let permitted = caps::read(None, caps::CapSet::Permitted)
                .map_err(|e| HostError::format("capabilities", e))?;
            caps::set(None, caps::CapSet::Effective, &permitted)
                .map_err(|e| HostError::format("raising capabilities", e))?;
            f()
        })
        .join()
        .map_err(|_| HostError::thread_panicked("mount"))?
    })
}

/// Can a process with the filesystem ids `(uid, gid)` and no capability over the node's files
/// (what a pod's root is, seen from the node) reach `path`? runc pivots into a pod's rootfs
/// under `<root>/userns/<id>` with those credentials, so every dir above the state root must
/// let others through. `Err` names the dir that stops it.
pub fn reachable_as(path: &Path, (uid, gid): (u32, u32)) -> Result<(), HostError> {
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setfsgid/setfsuid change this thread's credentials only (raw syscalls,
            // not glibc's process-wide set*id broadcast); the thread ends after the check.
            // Changing the filesystem uid from 0 drops the file capabilities (DAC override,
            // search) from the effective set, so the check is the pod root's own.
            unsafe {
                libc::syscall(libc::SYS_setfsgid, gid);
                libc::syscall(libc::SYS_setfsuid, uid);
            }
            match std::fs::symlink_metadata(path) {
                Ok(_) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                    // The dir it cannot pass: the parent of the shortest prefix it cannot stat.
                    let mut prefixes: Vec<&Path> = path.ancestors().collect();
                    prefixes.reverse();
                    let blocker = prefixes
                        .iter()
                        .find(|p| std::fs::symlink_metadata(p).is_err())
                        .and_then(|p| p.parent())
                        .unwrap_or(path);
                    Err(HostError::Other(format!(
                        "{} is not reachable by a pod's root (host uid {uid}): {} lets no \
                         other user through; make it traversable (chmod o+x) or move the \
                         state root",
                        path.display(),
                        blocker.display()
                    )))
                }
                Err(e) => Err(HostError::io("inspect", path, e)),
            }
        })
        .join()
        .map_err(|_| HostError::thread_panicked("reachable_as"))?
    })
}

/// Can this node run pods in user namespaces: user namespaces, idmapped mounts of the state
/// root's filesystem, and an overlay over idmapped layers written as the pod's root? Tried
/// once under `scratch` (removed after); `Err` says what failed. `scratch`'s parent (the
/// state root) must be reachable by a pod's root, as its pods' rootfs dirs will be.
pub fn probe(scratch: &Path) -> Result<(), String> {
    let map = IdMap {
        uids: vec![crate::model::sandbox::IdMapping {
            container_id: 0,
            host_id: 1 << 30,
            length: 65536,
        }],
        gids: vec![crate::model::sandbox::IdMapping {
            container_id: 0,
            host_id: 1 << 30,
            length: 65536,
        }],
    };
    let _ = crate::mounts::remove_tree(scratch);
    let r = (|| -> Result<(), HostError> {
        if let Some(root) = scratch.parent() {
            reachable_as(root, (1 << 30, 1 << 30))?;
        }
        let ns = open(&map)?;
        let lower = scratch.join("lower");
        crate::state::files::private_dir_all(&lower.join("etc"))?;
        let merged = scratch.join("merged");
        mount_overlay(
            &ns,
            (1 << 30, 1 << 30),
            &[lower],
            &scratch.join("ovl"),
            &scratch.join("idmap"),
            &merged,
        )?;
        // A copy-up and a new file, written as the pod's root would write them.
        let written = as_pod_root((1 << 30, 1 << 30), || {
            std::fs::write(merged.join("etc/probe"), b"x")
                .map_err(|e| HostError::io("write", merged.join("etc/probe"), e))
        });
        let _ = umount2(&merged, MntFlags::MNT_DETACH);
        written?;
        use std::os::unix::fs::MetadataExt;
        let on_disk = std::fs::metadata(scratch.join("ovl/upper/etc/probe"))
            .map_err(|e| HostError::io("inspect", scratch.join("ovl/upper/etc/probe"), e))?;
        if on_disk.uid() != 0 {
            return Err(HostError::Other(format!(
                "a file the pod's root wrote is stored as uid {}, not 0",
                on_disk.uid()
            )));
        }
        Ok(())
    })();
    let _ = crate::mounts::remove_tree(scratch);
    r.map_err(|e| e.to_string())
}

/// `<root>/userns/<id>`: a dir only the pod's root (`owner` on the node) and the node's root
/// can enter, for the mounts the runtime reaches as the pod's root (runc pivots into the
/// rootfs with the pod root's credentials, which cannot pass the root-only dirs of the state
/// root). The state root and `userns/` become 0711 for that — traversable, not listable;
/// every other dir under the root stays 0700.
pub fn pod_root_dir(root: &Path, id: &str, owner: (u32, u32)) -> Result<PathBuf, HostError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let _modes = crate::state::lock(&ROOT_MODES);
    let parent = root.join(DIR);
    for d in [root, &parent] {
        match std::fs::DirBuilder::new().mode(0o711).create(d) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(HostError::io("create", d, e))
            }
            _ => {}
        }
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o711))
            .map_err(|e| HostError::io("chmod", d, e))?;
    }
    let dir = parent.join(id);
    match crate::state::files::private_dir(&dir) {
        Err(HostError::Io { source, .. }) if source.kind() == std::io::ErrorKind::AlreadyExists => {
        }
        r => r?,
    }
    std::os::unix::fs::lchown(&dir, Some(owner.0), Some(owner.1))
        .map_err(|e| HostError::io("chown", &dir, e))?;
    Ok(dir)
}

/// The dir under the state root that holds the pods' user-namespace mount dirs.
pub const DIR: &str = "userns";

/// Held while a dir under `userns/` is made or removed and the root's mode follows: a root
/// made 0700 again must never catch a pod whose dir exists.
static ROOT_MODES: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Removes `<root>/userns/<id>` (a pod's or a container's); when it was the last one, the
/// state root and `userns/` go back to 0700 — listable and traversable by root only, as
/// before the first pod in a user namespace — not at the next restart.
pub fn remove_pod_root_dir(root: &Path, id: &str) -> Result<(), HostError> {
    use std::os::unix::fs::PermissionsExt;
    let _modes = crate::state::lock(&ROOT_MODES);
    let parent = root.join(DIR);
    crate::mounts::remove_record_dir(&parent.join(id))?;
    let empty = std::fs::read_dir(&parent).is_ok_and(|mut d| d.next().is_none());
    if empty {
        for d in [&parent, &root.to_path_buf()] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| HostError::io("chmod", d, e))?;
        }
    }
    Ok(())
}

/// At start-up: the state root stays traversable (0711) while pods in user namespaces have
/// mount dirs under it; otherwise it is 0700 like everything else.
pub fn root_mode(root: &Path) -> u32 {
    let in_use = std::fs::read_dir(root.join(DIR))
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    if in_use {
        0o711
    } else {
        0o700
    }
}
