//! The filesystem side of unpacking: entry paths made safe, parents created without
//! following links, whiteouts and opaque markers in overlayfs format, ownership.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

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

/// Creates the parents of `rel` under `root`, refusing any existing parent that is not a
/// real directory (a symlink planted by an earlier entry could otherwise redirect us).
pub(super) fn safe_parent(root: &Path, rel: &Path) -> Result<PathBuf, LayerError> {
    let mut cur = root.to_path_buf();
    if let Some(parent) = rel.parent() {
        for c in parent.components() {
            cur.push(c);
            match std::fs::symlink_metadata(&cur) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(LayerError::Hostile {
                        entry: rel.display().to_string(),
                        reason: "a parent that is not a directory (a symlink?)".into(),
                    })
                }
                Err(_) => {
                    std::fs::create_dir(&cur).map_err(|e| HostError::io("create", &cur, e))?;
                }
            }
        }
    }
    Ok(root.join(rel))
}

pub(super) fn remove_any(p: &Path) {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => {
            let _ = std::fs::remove_dir_all(p);
        }
        Ok(_) => {
            let _ = std::fs::remove_file(p);
        }
        Err(_) => {}
    }
}

fn cstr(p: &Path) -> Result<CString, HostError> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| HostError::io("use", p, std::io::ErrorKind::InvalidInput.into()))
}

pub(super) fn lchown(p: &Path, uid: u64, gid: u64) -> Result<(), HostError> {
    let c = cstr(p)?;
    // SAFETY: lchown with a valid NUL-terminated path; it does not follow symlinks.
    if unsafe { libc::lchown(c.as_ptr(), uid as libc::uid_t, gid as libc::gid_t) } != 0 {
        return Err(HostError::io("chown", p, std::io::Error::last_os_error()));
    }
    Ok(())
}

pub(super) fn whiteout(p: &Path) -> Result<(), HostError> {
    let c = cstr(p)?;
    // SAFETY: mknod with a valid path, a char-device mode and device 0:0 (overlay's whiteout).
    if unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR, 0) } != 0 {
        return Err(HostError::io(
            "create whiteout",
            p,
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

pub(super) fn opaque(dir: &Path) -> Result<(), HostError> {
    let c = cstr(dir)?;
    let name = c"trusted.overlay.opaque";
    // SAFETY: lsetxattr with valid NUL-terminated strings and a 1-byte value buffer.
    if unsafe { libc::lsetxattr(c.as_ptr(), name.as_ptr(), b"y".as_ptr().cast(), 1, 0) } != 0 {
        return Err(HostError::io(
            "mark opaque",
            dir,
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
    use std::os::fd::AsRawFd;
    // SAFETY: a plain syscall on a descriptor `f` owns for the call's duration; no memory is
    // passed.
    unsafe {
        libc::sync_file_range(f.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
    }
}
