//! Mount helpers: the pod's shm tmpfs, shared-propagation namespace dirs, lazy unmounts, and
//! "is it mounted" decided from `/proc/self/mountinfo` (never by guessing from a directory).

#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use crate::error::HostError;

/// One line of `/proc/self/mountinfo`, the fields we use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    pub mount_point: PathBuf,
    pub fs_type: String,
    pub source: String,
    /// Optional fields, e.g. `shared:12`, `master:3`.
    pub optional: Vec<String>,
}

/// Parses the mount table of this process.
pub fn mountinfo() -> Result<Vec<MountInfo>, HostError> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| HostError::io("read", "/proc/self/mountinfo", e))?;
    Ok(parse_mountinfo(&text))
}

pub(crate) fn parse_mountinfo(text: &str) -> Vec<MountInfo> {
    text.lines()
        .filter_map(|line| {
            let (pre, post) = line.split_once(" - ")?;
            let fields: Vec<&str> = pre.split(' ').collect();
            let mount_point = unescape(fields.get(4)?);
            let optional = fields[6.min(fields.len())..]
                .iter()
                .map(|s| s.to_string())
                .collect();
            let mut post = post.split(' ');
            let fs_type = post.next()?.to_string();
            let source = unescape(post.next().unwrap_or(""));
            Some(MountInfo {
                mount_point: PathBuf::from(mount_point),
                fs_type,
                source,
                optional,
            })
        })
        .collect()
}

/// Undoes the kernel's octal escaping of space, tab, newline and backslash.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The topmost mount at exactly `path`, if any. mountinfo names real paths, so the parent of
/// `path` is resolved first (its last component is not followed, as `UMOUNT_NOFOLLOW` does not).
pub fn mounted_at(path: &Path) -> Result<Option<MountInfo>, HostError> {
    let real = match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) => std::fs::canonicalize(dir)
            .map(|d| d.join(name))
            .unwrap_or_else(|_| path.to_path_buf()),
        _ => path.to_path_buf(),
    };
    Ok(mountinfo()?
        .into_iter()
        .rev()
        .find(|m| m.mount_point == real))
}

/// Mounts the pod's shm: a tmpfs at `path`, mode 1777, nosuid/nodev/noexec, `size` bytes.
/// Creates the directory; the caller mounts each sandbox's shm once.
pub fn mount_shm(path: &Path, size: u64) -> Result<(), HostError> {
    crate::state::files::private_dir_all(path)?;
    let data = format!("mode=1777,size={size}");
    mount(
        Some("shm"),
        path,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(data.as_str()),
    )
    .map_err(|e| HostError::sys("mount shm tmpfs on", path, e))
}

/// Mounts an overlayfs at `target`: `lower` top layer first, read-write `upper` and `work`
/// (created here). The mount data must fit in a page, which bounds the number of layers.
pub fn mount_overlay(
    lower: &[PathBuf],
    upper: &Path,
    work: &Path,
    target: &Path,
) -> Result<(), HostError> {
    overlay_dirs(upper, work)?;
    crate::state::files::private_dir_all(target)?;
    overlay_at(target, &overlay_data(lower, upper, work)?)
}

/// Mounts an overlay with the options `data` at `target`.
pub(crate) fn overlay_at(target: &Path, data: &str) -> Result<(), HostError> {
    mount(
        Some("overlay"),
        target,
        Some("overlay"),
        MsFlags::empty(),
        Some(data),
    )
    .map_err(|e| HostError::sys("mount overlay rootfs on", target, e))
}

/// Creates an overlay's `upper` and `work` dirs. The upper dir is the container's `/` (an
/// overlay's root takes the upper dir's mode): 0755 like any root directory; the container
/// dir around it (0700) keeps others out.
pub(crate) fn overlay_dirs(upper: &Path, work: &Path) -> Result<(), HostError> {
    use std::os::unix::fs::DirBuilderExt;
    crate::state::files::private_dir_all(work)?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(upper)
        .map_err(|e| HostError::io("create", upper, e))
}

/// Overlay mount options for `lower` (top layer first), `upper` and `work`. The mount data
/// must fit in a page, which bounds the number of layers.
pub(crate) fn overlay_data(
    lower: &[PathBuf],
    upper: &Path,
    work: &Path,
) -> Result<String, HostError> {
    fit_in_page(
        format!(
            "{},upperdir={},workdir={}",
            lowerdir(lower),
            overlay_escape(upper),
            overlay_escape(work)
        ),
        lower.len(),
    )
}

/// `lowerdir=a:b:…`, each path escaped.
fn lowerdir(lower: &[PathBuf]) -> String {
    let lowers: Vec<String> = lower.iter().map(|p| overlay_escape(p)).collect();
    format!("lowerdir={}", lowers.join(":"))
}

fn overlay_escape(p: &Path) -> String {
    p.to_string_lossy()
        .replace('\\', "\\\\")
        .replace(':', "\\:")
}

fn fit_in_page(data: String, layers: usize) -> Result<String, HostError> {
    if data.len() >= 4096 {
        return Err(HostError::Other(format!(
            "overlay mount data for {layers} layers is {} bytes, over the kernel's page-size limit",
            data.len()
        )));
    }
    Ok(data)
}

/// Lazily unmounts every mount stacked at `path`. Not mounted is success. Asks the kernel
/// about `path` alone (statx), so its cost does not grow with the node's mount table.
pub fn unmount_all(path: &Path) -> Result<(), HostError> {
    for _ in 0..16 {
        if !is_mounted(path)? {
            return Ok(());
        }
        match umount2(path, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW) {
            Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => return Err(HostError::sys("unmount", path, e)),
        }
    }
    Err(HostError::Stuck {
        path: path.to_path_buf(),
        state: "still mounted",
        attempts: 16,
    })
}

/// Makes `dir` a mount point with shared propagation, as `ip netns` does for `/var/run/netns`,
/// so namespace bind mounts made under it propagate into mount namespaces created later.
pub fn make_shared_dir(dir: &Path) -> Result<(), HostError> {
    make_shared_dirs(&[dir.to_path_buf()])
}

/// [`make_shared_dir`] for each of `dirs`. Whether each is a mount root already comes from
/// statx (5.8); only a kernel without that reads the mount table, once for all of them (at
/// 1,000 pods it is 5,000 lines, tens of ms to read).
pub fn make_shared_dirs(dirs: &[PathBuf]) -> Result<(), HostError> {
    let mut real = Vec::new();
    for dir in dirs {
        std::fs::create_dir_all(dir).map_err(|e| HostError::io("create dir", dir, e))?;
        // mountinfo names the real path (`/var/run/netns` is `/run/netns` on most hosts):
        // compare with that, or every call would bind the dir onto itself again, and with
        // shared propagation each bind doubles the mounts there.
        let r = std::fs::canonicalize(dir).map_err(|e| HostError::io("resolve", dir, e))?;
        // (Dirs named twice are bound once.)
        if !real.contains(&r) {
            real.push(r);
        }
    }
    let mut unknown = Vec::new();
    for dir in &real {
        match mount_root_attr(dir) {
            Some(true) => make_shared(dir, MsFlags::empty())?,
            Some(false) => bind_shared(dir)?,
            None => unknown.push(dir),
        }
    }
    if unknown.is_empty() {
        return Ok(());
    }
    let table = mountinfo()?;
    for dir in unknown {
        match table.iter().rev().find(|m| &m.mount_point == dir) {
            Some(m) if m.optional.iter().any(|o| o.starts_with("shared:")) => {}
            Some(_) => make_shared(dir, MsFlags::empty())?,
            None => bind_shared(dir)?,
        }
    }
    Ok(())
}

/// Makes the mount at `dir` shared (`MS_REC` in `more`: with its submounts). A mount root
/// already shared is left as it is by the kernel; its submounts (the pins) are not touched
/// unless asked.
fn make_shared(dir: &Path, more: MsFlags) -> Result<(), HostError> {
    mount(
        None::<&str>,
        dir,
        None::<&str>,
        MsFlags::MS_SHARED | more,
        None::<&str>,
    )
    .map_err(|e| HostError::sys("make shared", dir, e))
}

/// Binds `dir` onto itself and makes the new mount (with what it carried along) shared.
fn bind_shared(dir: &Path) -> Result<(), HostError> {
    mount(
        Some(dir),
        dir,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| HostError::sys("bind-mount onto itself", dir, e))?;
    make_shared(dir, MsFlags::MS_REC)
}

/// Is `path` the root of a mount (a mount point), whatever the filesystem (bind mounts of
/// the same filesystem included)? Symlinks are not followed.
pub fn is_mount_root(path: &Path) -> bool {
    mount_root_attr(path) == Some(true)
}

/// Is a mount at exactly `path` (its last component not followed)? statx's mount-root
/// attribute where the kernel has it (5.8), else the mount table.
pub fn is_mounted(path: &Path) -> Result<bool, HostError> {
    match mount_root_attr(path) {
        Some(m) => Ok(m),
        None if std::fs::symlink_metadata(path).is_err() => Ok(false),
        None => Ok(mounted_at(path)?.is_some()),
    }
}

/// statx's STATX_ATTR_MOUNT_ROOT of `path`; `None` if statx fails or does not report it.
fn mount_root_attr(path: &Path) -> Option<bool> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: an all-zero statx is a valid value of this plain C struct.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and a statx buffer we own, for the call.
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            0,
            &mut st,
        )
    };
    let known = st.stx_attributes_mask & libc::STATX_ATTR_MOUNT_ROOT as u64 != 0;
    (r == 0 && known).then_some(st.stx_attributes & libc::STATX_ATTR_MOUNT_ROOT as u64 != 0)
}

/// Removes a record directory tree, durably (its parent fsynced). Missing is success. Refuses
/// to follow a symlink.
pub fn remove_record_dir(dir: &Path) -> Result<(), HostError> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => Err(HostError::io("inspect", dir, e)),
        Ok(m) if m.file_type().is_symlink() => {
            std::fs::remove_file(dir).map_err(|e| HostError::io("remove symlink", dir, e))
        }
        Ok(_) => remove_tree(dir),
    }?;
    // Durable before the call that removed it is answered: a removal acknowledged to kubelet
    // must not come back after a power cut (the parent's fsync commits the unlinks before it).
    match dir.parent() {
        Some(parent) => crate::state::sync_dir(parent),
        None => Ok(()),
    }
}

/// Removes a directory tree without ever descending into a mount inside it (a container's
/// rootfs, a pod's shm, a bind mount of a host dir): each mount found is lazily unmounted
/// first, so a removal can never delete what another filesystem holds. Missing is success.
pub fn remove_tree(dir: &Path) -> Result<(), HostError> {
    fn walk(p: &Path) -> Result<(), HostError> {
        let m = match std::fs::symlink_metadata(p) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(HostError::io("inspect", p, e)),
        };
        if !m.is_dir() {
            return match std::fs::remove_file(p) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(HostError::io("remove", p, e))
                }
                _ => Ok(()),
            };
        }
        for _ in 0..16 {
            if !is_mount_root(p) {
                break;
            }
            match umount2(p, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW) {
                Ok(()) | Err(nix::errno::Errno::EINVAL) => {}
                Err(e) => return Err(HostError::sys("unmount", p, e)),
            }
        }
        let rd = match std::fs::read_dir(p) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(HostError::io("read", p, e)),
        };
        for e in rd {
            let e = e.map_err(|e| HostError::io("read", p, e))?;
            walk(&e.path())?;
        }
        match std::fs::remove_dir(p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(HostError::io("remove dir", p, e))
            }
            _ => Ok(()),
        }
    }
    walk(dir)
}

/// Propagation of the mount that holds `path`: `(its mount point, shared, slave)`.
pub fn propagation_of(path: &Path) -> Result<(PathBuf, bool, bool), HostError> {
    let real = std::fs::canonicalize(path).map_err(|e| HostError::io("resolve", path, e))?;
    let m = mountinfo()?
        .into_iter()
        .rev()
        .filter(|m| real.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.as_os_str().len())
        .ok_or_else(|| HostError::Other(format!("no mount holds {}", real.display())))?;
    let shared = m.optional.iter().any(|o| o.starts_with("shared:"));
    let slave = m.optional.iter().any(|o| o.starts_with("master:"));
    Ok((m.mount_point, shared, slave))
}

/// Can this kernel make a recursively read-only mount tree (open_tree + mount_setattr,
/// Linux 5.12)? Probed once.
pub fn recursive_read_only_supported() -> bool {
    static PROBE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PROBE.get_or_init(|| match clone_tree(Path::new("/proc/self"), true) {
        Ok(fd) => set_attrs(&fd, MOUNT_ATTR_RDONLY, None, true).is_ok(),
        Err(_) => false,
    })
}

/// `mount_attr` of mount_setattr(2).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

pub(crate) const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub(crate) const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
pub(crate) const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub(crate) const MOUNT_ATTR_NODEV: u64 = 0x4;

fn cpath(path: &Path) -> Result<std::ffi::CString, HostError> {
    std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| HostError::format(path.display(), "the path contains NUL"))
}

/// A detached copy of the mount at `path` (open_tree with OPEN_TREE_CLONE), with its
/// submounts if `recursive`.
pub(crate) fn clone_tree(path: &Path, recursive: bool) -> Result<OwnedFd, HostError> {
    let c = cpath(path)?;
    let mut flags = (libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC) as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: open_tree takes a dirfd, a valid NUL-terminated path and flags; returns a fd.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c.as_ptr(), flags) };
    if fd < 0 {
        return Err(HostError::io(
            "open_tree",
            path,
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: a fresh fd the kernel returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A detached copy of the mount tree at the file or dir `fd` (an `O_PATH` fd resolved by the
/// caller, so no path is looked up again), with its submounts.
pub(crate) fn clone_tree_of(fd: std::os::fd::BorrowedFd<'_>) -> Result<OwnedFd, HostError> {
    let flags = (libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC) as libc::c_uint
        | (libc::AT_RECURSIVE | libc::AT_EMPTY_PATH) as libc::c_uint;
    let empty = c"";
    // SAFETY: open_tree on a fd we borrow, an empty NUL-terminated path and flags; returns a
    // new fd.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, fd.as_raw_fd(), empty.as_ptr(), flags) };
    if fd < 0 {
        return Err(HostError::Other(format!(
            "open_tree: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: a fresh fd the kernel returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Mounts a read-only overlay of `lower` (top layer first; two or more) at `target`, with no
/// upper layer: nothing can be written to it.
pub(crate) fn overlay_read_only(lower: &[PathBuf], target: &Path) -> Result<(), HostError> {
    let data = fit_in_page(lowerdir(lower), lower.len())?;
    crate::state::files::private_dir_all(target)?;
    mount(
        Some("overlay"),
        target,
        Some("overlay"),
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(data.as_str()),
    )
    .map_err(|e| HostError::sys("mount read-only overlay on", target, e))
}

/// Sets `attr_set` (MOUNT_ATTR_*) and private propagation on a detached tree; with a user
/// namespace, idmaps it with that namespace's maps.
pub(crate) fn set_attrs(
    tree: &OwnedFd,
    attr_set: u64,
    userns: Option<std::os::fd::BorrowedFd<'_>>,
    recursive: bool,
) -> Result<(), HostError> {
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        // c_ulong: u64 here, narrower on some targets.
        #[allow(clippy::unnecessary_cast)]
        propagation: libc::MS_PRIVATE as u64,
        userns_fd: userns.map_or(0, |u| u.as_raw_fd() as u64),
    };
    let mut flags = libc::AT_EMPTY_PATH as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    let empty = c"";
    // SAFETY: mount_setattr on a mount fd we own, with an empty path and a mount_attr we own
    // of the size we pass.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        return Err(HostError::Other(format!(
            "mount_setattr {}: {}",
            if userns.is_some() {
                "idmap"
            } else {
                "read-only"
            },
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// Attaches a detached tree at `target`.
pub(crate) fn attach(tree: &OwnedFd, target: &Path) -> Result<(), HostError> {
    let t = cpath(target)?;
    let empty = c"";
    // SAFETY: move_mount of a detached tree fd we own onto a valid NUL-terminated path.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH as libc::c_uint,
        )
    };
    if r < 0 {
        return Err(HostError::io(
            "attach mount tree onto",
            target,
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Mounts a private copy of the tree at `source` onto `target` (an empty dir, created here),
/// read-only all through if `readonly` (every submount too, which a runtime's `ro` bind does
/// not give: runc before 1.2 has no `rro`), idmapped with the user namespace `idmap` if given
/// (runc 1.1 makes no idmapped mounts). The runtime then binds `target`.
pub fn mount_tree_copy(
    source: &Path,
    target: &Path,
    readonly: bool,
    idmap: Option<std::os::fd::BorrowedFd<'_>>,
) -> Result<(), HostError> {
    crate::state::files::private_dir_all(target)?;
    let tree = clone_tree(source, true)?;
    let mut attrs = 0;
    if readonly {
        attrs |= MOUNT_ATTR_RDONLY;
    }
    if idmap.is_some() {
        attrs |= MOUNT_ATTR_IDMAP;
    }
    set_attrs(&tree, attrs, idmap, true).map_err(|e| match e {
        HostError::Other(m) => HostError::Other(format!("{}: {m}", source.display())),
        e => e,
    })?;
    attach(&tree, target)
}

#[cfg(test)]
mod tests;
