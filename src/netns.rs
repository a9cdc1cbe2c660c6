//! Persistent namespaces pinned by bind mounts: creates network namespaces (and, for pods
//! without an infra process, IPC and UTS namespaces) without a helper process, closes and
//! removes them. Removal is idempotent, and a path that is not an nsfs mount is never
//! unmounted as if it were one.
//!
//! Creation happens on a dedicated OS thread that unshares, pins its own
//! `/proc/thread-self/ns/<kind>` onto an empty file, and exits: the namespace switch never
//! touches a thread that runs anything else.
#![allow(unsafe_code)]

use std::fs::OpenOptions;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::CloneFlags;

use crate::error::HostError;

/// `NSFS_MAGIC` from `linux/magic.h`.
const NSFS_MAGIC: i64 = 0x6e73_6673;

/// Which namespaces to pin, and where.
#[derive(Debug, Clone, Default)]
pub struct PinRequest {
    pub net: Option<PathBuf>,
    pub ipc: Option<PathBuf>,
    pub uts: Option<PathBuf>,
    /// Hostname to set inside the new UTS namespace.
    pub hostname: Option<String>,
    /// A user namespace with these maps, pinned at `.0`, owning the others.
    pub user: Option<(PathBuf, crate::model::sandbox::IdMap)>,
}

/// Namespaces being pinned on their own thread while the caller goes on (RunPodSandbox writes
/// the record that names them meanwhile); [`Pinning::wait`] says whether it worked. On error
/// nothing requested is left behind. `None`: nothing was requested.
pub struct Pinning(Option<std::thread::JoinHandle<Result<(), HostError>>>);

impl Pinning {
    /// A pinning whose outcome is known already (a test double's).
    #[cfg(test)]
    pub(crate) fn finished(outcome: Result<(), HostError>) -> Self {
        Pinning(Some(std::thread::spawn(move || outcome)))
    }

    pub fn wait(self) -> Result<(), HostError> {
        let Some(handle) = self.0 else {
            return Ok(());
        };
        let t = std::time::Instant::now();
        let r = handle
            .join()
            .map_err(|_| HostError::thread_panicked("namespace"))?;
        crate::counters::add(crate::counters::Wait::Namespace, t.elapsed());
        r
    }
}

/// Creates and pins the requested namespaces: returns once the namespace files exist; the
/// namespaces are made and bind-mounted onto them on a dedicated thread. (The files are created
/// here, on the caller's thread, so the thread does no filesystem metadata work that would
/// queue behind a record's fsync running meanwhile.) Their dirs must exist.
pub fn pin_in_background(req: &PinRequest) -> Result<Pinning, HostError> {
    let (targets, flags) = targets(req);
    if targets.is_empty() {
        return Ok(Pinning(None));
    }
    for (i, (path, _)) in targets.iter().enumerate() {
        if let Err(e) = create_empty_file(path) {
            for (made, _) in &targets[..i] {
                let _ = remove(made);
            }
            return Err(e);
        }
    }
    let (req, files) = (req.clone(), targets.clone());
    std::thread::Builder::new()
        .name("ns-pin".into())
        .spawn(move || enter_and_mount(&req, &files, flags))
        .map(|h| Pinning(Some(h)))
        .map_err(|e| {
            for (path, _) in &targets {
                let _ = remove(path);
            }
            HostError::thread_start("namespace", e)
        })
}

/// The requested namespace files with their kinds, and the unshare flags for them.
fn targets(req: &PinRequest) -> (Vec<(PathBuf, &'static str)>, CloneFlags) {
    let mut flags = CloneFlags::empty();
    let targets: Vec<(PathBuf, &'static str)> = [
        (req.net.clone(), "net"),
        (req.ipc.clone(), "ipc"),
        (req.uts.clone(), "uts"),
        (req.user.as_ref().map(|(p, _)| p.clone()), "user"),
    ]
    .into_iter()
    .filter_map(|(p, k)| p.map(|p| (p, k)))
    .collect();
    for (_, kind) in &targets {
        flags |= match *kind {
            "net" => CloneFlags::CLONE_NEWNET,
            "ipc" => CloneFlags::CLONE_NEWIPC,
            "uts" => CloneFlags::CLONE_NEWUTS,
            _ => CloneFlags::CLONE_NEWUSER,
        };
    }
    (targets, flags)
}

/// On a thread of its own: unshares, sets up `lo` and the hostname, and bind-mounts each new
/// namespace onto its (existing, empty) file; on error removes every file.
fn enter_and_mount(
    req: &PinRequest,
    targets: &[(PathBuf, &'static str)],
    flags: CloneFlags,
) -> Result<(), HostError> {
    let result = (|| {
        if let Some((_, map)) = &req.user {
            // Owned by a new user namespace: made by a child process (see `userns`).
            let others = (flags - CloneFlags::CLONE_NEWUSER).bits();
            return crate::userns::pin(map, targets, others, req.hostname.as_deref());
        }
        nix::sched::unshare(flags)
            .map_err(|e| HostError::sys("unshare namespaces for", &targets[0].0, e))?;
        if req.net.is_some() {
            loopback_up()?;
        }
        if let (Some(_), Some(h)) = (req.uts.as_ref(), req.hostname.as_ref()) {
            nix::unistd::sethostname(h).map_err(|e| {
                HostError::sys("set hostname in", req.uts.clone().unwrap_or_default(), e)
            })?;
        }
        for (path, kind) in targets {
            let src = format!("/proc/thread-self/ns/{kind}");
            mount(
                Some(src.as_str()),
                path,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(|e| HostError::sys("bind-mount namespace onto", path, e))?;
        }
        Ok(())
    })();
    if result.is_err() {
        for (path, _) in targets {
            let _ = remove(path);
        }
    }
    result
}

pub(crate) fn create_empty_file(path: &Path) -> Result<(), HostError> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map(drop)
        .map_err(|e| HostError::io("create namespace file", path, e))
}

/// Sets `lo` up in the calling thread's network namespace.
fn loopback_up() -> Result<(), HostError> {
    // SAFETY: socket(2) takes plain integers and returns a new fd or -1.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(HostError::last("socket for loopback"));
    }
    // SAFETY: an all-zero ifreq is a valid value of this plain C struct.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: `fd` is our socket and `ifr` a properly initialised ifreq that outlives the call.
    let mut r = unsafe { libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut ifr) };
    if r == 0 {
        // SAFETY: SIOCGIFFLAGS filled the flags member of the union, which we now update.
        unsafe { ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
        // SAFETY: as above; the kernel reads the name and the flags.
        r = unsafe { libc::ioctl(fd, libc::SIOCSIFFLAGS, &ifr) };
    }
    let err = std::io::Error::last_os_error();
    // SAFETY: `fd` is ours and closed once.
    unsafe { libc::close(fd) };
    if r != 0 {
        return Err(HostError::Call {
            op: "bring lo up",
            source: err,
        });
    }
    Ok(())
}

/// Writes `sysctls` (normalized names) inside the pinned namespaces they belong to, from a
/// thread of its own that enters them (a namespaced sysctl is written to the namespace of the
/// writing thread). The error names the sysctl and the kernel's answer.
pub fn apply_sysctls(
    net: Option<&Path>,
    ipc: Option<&Path>,
    uts: Option<&Path>,
    sysctls: &[(String, String, crate::sysctl::Ns)],
) -> Result<(), HostError> {
    use crate::sysctl::Ns;
    if sysctls.is_empty() {
        return Ok(());
    }
    let mut enter: Vec<(std::path::PathBuf, CloneFlags)> = Vec::new();
    for (kind, path, flag) in [
        (Ns::Net, net, CloneFlags::CLONE_NEWNET),
        (Ns::Ipc, ipc, CloneFlags::CLONE_NEWIPC),
        (Ns::Uts, uts, CloneFlags::CLONE_NEWUTS),
    ] {
        if sysctls.iter().any(|(_, _, k)| *k == kind) {
            let p = path.ok_or_else(|| {
                HostError::Other(format!(
                    "the pod has no {kind:?} namespace of its own for its sysctls"
                ))
            })?;
            enter.push((p.to_path_buf(), flag));
        }
    }
    let list = sysctls.to_vec();
    std::thread::Builder::new()
        .name("sysctl".into())
        .spawn(move || -> Result<(), HostError> {
            for (p, flag) in &enter {
                let f =
                    std::fs::File::open(p).map_err(|e| HostError::io("open namespace", p, e))?;
                nix::sched::setns(&f, *flag)
                    .map_err(|e| HostError::sys("enter namespace", p, e))?;
            }
            for (name, value, _) in &list {
                let path = crate::sysctl::proc_path(name);
                std::fs::write(&path, value.as_bytes())
                    .map_err(|e| HostError::io("write sysctl", &path, e))?;
            }
            Ok(())
        })
        .map_err(|e| HostError::thread_start("sysctl", e))?
        .join()
        .map_err(|_| HostError::thread_panicked("sysctl"))?
}

/// Is `path` a bind-mounted namespace file (nsfs)? Symlinks are not followed.
// f_type is i64 on x86_64 glibc but narrower elsewhere, hence the cast.
#[allow(clippy::unnecessary_cast)]
pub fn is_nsfs(path: &Path) -> bool {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_file() => {}
        _ => return false,
    }
    nix::sys::statfs::statfs(path)
        .map(|s| s.filesystem_type().0 as i64 == NSFS_MAGIC)
        .unwrap_or(false)
}

/// Closes a pinned namespace: lazy unmount, then unlink with a bounded EBUSY retry. A missing
/// path is success. A path that is not nsfs is never unmounted; an empty regular file (our own
/// stale placeholder) is unlinked; anything else (a directory, a symlink, a non-empty file) is
/// refused and left alone.
pub fn remove(path: &Path) -> Result<(), HostError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(HostError::io("inspect namespace file", path, e)),
    };
    if is_nsfs(path) {
        // Unmount every stacked mount: a retried pin could have mounted twice.
        for _ in 0..8 {
            match umount2(path, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW) {
                Ok(()) => {}
                Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => break,
                Err(e) => return Err(HostError::sys("unmount namespace", path, e)),
            }
            if !is_nsfs(path) {
                break;
            }
        }
    } else if !(meta.file_type().is_file() && meta.size() == 0) {
        // Only an empty regular file (our own stale placeholder) is removed unmounted.
        return Err(HostError::Refused {
            op: "remove",
            path: path.to_path_buf(),
            reason: "it is not a namespace file".into(),
        });
    }
    let mut delay = Duration::from_millis(1);
    for _ in 0..10 {
        match std::fs::remove_file(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                std::thread::sleep(delay);
                delay *= 2;
            }
            Err(e) => return Err(HostError::io("remove namespace file", path, e)),
        }
    }
    Err(HostError::Stuck {
        path: path.to_path_buf(),
        state: "stayed busy",
        attempts: 10,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request that fails part-way while making the namespace files leaves none behind and
    /// starts no thread.
    #[test]
    fn failed_file_creation_leaves_nothing() {
        struct Cleanup(PathBuf);
        impl Drop for Cleanup {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let dir = std::env::temp_dir().join(format!("sandboxd-netns-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let _cleanup = Cleanup(dir.clone());
        let blocker = dir.join("not-a-dir");
        std::fs::write(&blocker, b"x").unwrap();
        let req = PinRequest {
            net: Some(dir.join("net-ns")),
            ipc: Some(blocker.join("ipc-ns")),
            uts: None,
            hostname: None,
            user: None,
        };
        let err = pin_in_background(&req)
            .err()
            .expect("the ipc path cannot be made");
        assert!(err.to_string().contains("not-a-dir"), "{err}");
        assert!(!dir.join("net-ns").exists(), "net file left behind");
    }
}
