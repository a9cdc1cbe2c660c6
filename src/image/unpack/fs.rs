//! The filesystem side of unpacking: entry paths made safe, the layer dir reached by
//! descriptor without following links, whiteouts and opaque markers in overlayfs format,
//! ownership.
#![allow(unsafe_code)]

use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::fcntl::{openat, OFlag, AT_FDCWD};
use nix::sys::stat::{fchmodat, fstatat, mkdirat, FchmodatFlags, Mode, SFlag};
use nix::unistd::{fchownat, unlinkat, Gid, Uid, UnlinkatFlags};

use super::LayerError;
use crate::error::HostError;

/// Makes a tar path relative and free of `..`; `None` for the root itself.
pub(super) fn clean(path: &Path) -> Result<Option<PathBuf>, LayerError> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(LayerError::Hostile {
                    entry: path.display().to_string(),
                    reason: "it escapes the layer (\"..\")".into(),
                })
            }
        }
    }
    Ok(if out.as_os_str().is_empty() {
        None
    } else {
        Some(out)
    })
}

/// How the layer's directories are opened: never through a symlink, never anything else.
const DIR: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// How many of the last parent's components [`Tree`] keeps open.
const KEEP_OPEN: usize = 32;

/// The layer dir being written, reached by descriptor: an entry's parent is opened from the
/// root one component at a time, each `O_NOFOLLOW | O_DIRECTORY` (a symlink or file an earlier
/// entry planted there is refused, never followed), and every entry is made relative to its
/// parent's descriptor. The last parent's chain stays open (a tar's entries come grouped by
/// directory, so the next entry's parent shares most of it) until a directory is removed.
pub(super) struct Tree {
    root: Rc<OwnedFd>,
    path: PathBuf,
    /// The components of the last parent, each with its descriptor.
    open: Vec<(std::ffi::OsString, Rc<OwnedFd>)>,
}

impl Tree {
    pub(super) fn open(root: &Path) -> Result<Tree, HostError> {
        let fd = openat(AT_FDCWD, root, DIR, Mode::empty())
            .map_err(|e| HostError::sys("open", root, e))?;
        Ok(Tree {
            root: Rc::new(fd),
            path: root.to_path_buf(),
            open: Vec::new(),
        })
    }

    /// The directory `dir` (relative to the root, empty for the root) for the entry `entry`,
    /// its missing components created (0755, root's) when `create`.
    pub(super) fn dir(
        &mut self,
        entry: &Path,
        dir: &Path,
        create: bool,
    ) -> Result<Rc<OwnedFd>, LayerError> {
        let refused = |reason: &str| LayerError::Hostile {
            entry: entry.display().to_string(),
            reason: reason.into(),
        };
        let mut shared = 0;
        for (c, (open, _)) in dir.components().zip(&self.open) {
            if c.as_os_str() != open {
                break;
            }
            shared += 1;
        }
        self.open.truncate(shared);
        // Past KEEP_OPEN components, each is closed once its child is open: a hostile layer's
        // deep paths hold no more descriptors than that.
        let mut deep: Option<Rc<OwnedFd>> = None;
        for c in dir.components().skip(shared) {
            let name = c.as_os_str();
            let cur = deep
                .clone()
                .unwrap_or_else(|| self.open.last().map_or(&self.root, |(_, fd)| fd).clone());
            let next = match openat(cur.as_fd(), name, DIR, Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) if create => {
                    mkdirat(cur.as_fd(), name, Mode::from_bits_truncate(0o755))
                        .map_err(|e| HostError::sys("create", self.path.join(dir), e))?;
                    openat(cur.as_fd(), name, DIR, Mode::empty())
                        .map_err(|e| HostError::sys("open", self.path.join(dir), e))?
                }
                Err(Errno::ENOENT) => return Err(refused("a parent that does not exist")),
                Err(Errno::ENOTDIR | Errno::ELOOP) => {
                    return Err(refused("a parent that is not a directory (a symlink?)"))
                }
                Err(e) => return Err(HostError::sys("open", self.path.join(dir), e).into()),
            };
            let next = Rc::new(next);
            if deep.is_none() && self.open.len() < KEEP_OPEN {
                self.open.push((name.to_os_string(), next));
            } else {
                deep = Some(next);
            }
        }
        Ok(deep.unwrap_or_else(|| self.open.last().map_or(&self.root, |(_, fd)| fd).clone()))
    }

    /// Removes whatever `name` is in `parent` (`parent_rel`), a directory with all it holds;
    /// nothing if there is none. Best effort: what stays makes the next create fail.
    pub(super) fn remove(&mut self, parent: &OwnedFd, parent_rel: &Path, name: &OsStr) {
        match kind_at(parent, name) {
            Some(SFlag::S_IFDIR) => {
                // By path: every component up to `parent` was just opened without following
                // a link, the dir is private to the daemon, and remove_dir_all follows none.
                let _ = std::fs::remove_dir_all(self.path.join(parent_rel).join(name));
                self.open.clear();
            }
            Some(_) => {
                let _ = unlinkat(parent, name, UnlinkatFlags::NoRemoveDir);
            }
            None => {}
        }
    }

    /// Runs `make` (a create in `parent` that fails with EEXIST if `name` is there); if
    /// something is there, removes it and runs `make` once more.
    pub(super) fn replace<T>(
        &mut self,
        parent: &OwnedFd,
        parent_rel: &Path,
        name: &OsStr,
        mut make: impl FnMut() -> nix::Result<T>,
    ) -> nix::Result<T> {
        match make() {
            Err(Errno::EEXIST) => {
                self.remove(parent, parent_rel, name);
                make()
            }
            r => r,
        }
    }
}

/// What `name` in `dir` is (`S_IFDIR`, `S_IFREG`, …; a symlink is `S_IFLNK`, never what it
/// points at), if anything is there.
pub(super) fn kind_at(dir: &OwnedFd, name: &OsStr) -> Option<SFlag> {
    fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
        .ok()
        .map(|st| SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT)
}

/// Gives `name` in `parent` (`dest` on the host) the entry's owner, never through a link, and
/// its `mode` when there is one: `name` is then what this entry just made or checked, a
/// directory or a fifo, not a link.
pub(super) fn own_at(
    parent: &OwnedFd,
    name: &OsStr,
    (uid, gid): (Option<Uid>, Option<Gid>),
    mode: Option<Mode>,
    dest: &Path,
) -> Result<(), HostError> {
    fchownat(parent, name, uid, gid, AtFlags::AT_SYMLINK_NOFOLLOW)
        .map_err(|e| HostError::sys("chown", dest, e))?;
    if let Some(mode) = mode {
        fchmodat(parent, name, mode, FchmodatFlags::FollowSymlink)
            .map_err(|e| HostError::sys("chmod", dest, e))?;
    }
    Ok(())
}

/// Sets overlayfs's opaque marker on the open directory `dir`.
pub(super) fn opaque(dir: &OwnedFd, path: &Path) -> Result<(), HostError> {
    let name = c"trusted.overlay.opaque";
    // SAFETY: fsetxattr on a descriptor `dir` owns, with a NUL-terminated name and a 1-byte
    // value buffer.
    if unsafe { libc::fsetxattr(dir.as_raw_fd(), name.as_ptr(), b"y".as_ptr().cast(), 1, 0) } != 0 {
        return Err(HostError::io(
            "mark opaque",
            path,
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

pub(super) fn filetime(secs: u64) -> nix::sys::time::TimeSpec {
    nix::sys::time::TimeSpec::new(secs as i64, 0)
}

/// Starts writing `f`'s data to disk now, without waiting for it (`sync_file_range` with
/// `SYNC_FILE_RANGE_WRITE`): the layer's `syncfs` before it is named then waits for writes
/// already under way, overlapped with unpacking the rest, instead of issuing them all at the
/// end. Best effort: the `syncfs` is what makes the data durable.
pub(super) fn start_writeback(f: &std::fs::File) {
    // SAFETY: a plain syscall on a descriptor `f` owns for the call's duration; no memory is
    // passed.
    unsafe {
        libc::sync_file_range(f.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
    }
}
