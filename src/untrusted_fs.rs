//! Reading files from trees someone else controls (an image's rootfs, an OCI layout, a path
//! a client names): never through a symlink inside the tree, never blocking on a FIFO or a
//! device (opened `O_NONBLOCK`, then checked with `fstat` to be a regular file), and never
//! more than a stated number of bytes.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path};

use nix::fcntl::{openat, OFlag};
use nix::sys::stat::Mode;

use crate::error::HostError;

/// Why a file of an untrusted tree was not read.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("{path}: {reason}")]
    NotRegular { path: String, reason: String },
    #[error("{path} is {size} bytes, over the limit of {max}")]
    TooLarge { path: String, size: u64, max: u64 },
    #[error(transparent)]
    Host(#[from] HostError),
}

fn errno_reason(e: nix::errno::Errno) -> String {
    match e {
        nix::errno::Errno::ELOOP => "is a symlink (not followed)".into(),
        nix::errno::Errno::ENOTDIR => "has a parent that is not a directory (or a symlink)".into(),
        e => e.desc().into(),
    }
}

/// Checks an open file: a regular file of at most `max` bytes.
fn check(f: File, shown: &str, max: u64) -> Result<File, Refused> {
    let m = f.metadata().map_err(|e| HostError::io("stat", shown, e))?;
    if !m.file_type().is_file() {
        return Err(Refused::NotRegular {
            path: shown.into(),
            reason: "is not a regular file".into(),
        });
    }
    if m.size() > max {
        return Err(Refused::TooLarge {
            path: shown.into(),
            size: m.size(),
            max,
        });
    }
    Ok(f)
}

/// Opens `rel` below the directory `root`, following no symlink on the way (neither in a
/// parent nor the file itself), without blocking, as a regular file of at most `max` bytes.
/// `Ok(None)`: it does not exist.
pub fn open_beneath(root: &Path, rel: &Path, max: u64) -> Result<Option<File>, Refused> {
    let shown = root.join(rel).display().to_string();
    let mut dir: OwnedFd = match nix::fcntl::open(
        root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(HostError::sys("open", root, e).into()),
    };
    let parts: Vec<&std::ffi::OsStr> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(p) => Some(Ok(p)),
            Component::CurDir | Component::RootDir => None,
            _ => Some(Err(())),
        })
        .collect::<Result<_, _>>()
        .map_err(|_| Refused::NotRegular {
            path: shown.clone(),
            reason: "leaves its tree (\"..\")".into(),
        })?;
    let Some((name, parents)) = parts.split_last() else {
        return Err(Refused::NotRegular {
            path: shown,
            reason: "names no file".into(),
        });
    };
    let refused = |e: nix::errno::Errno| -> Result<Option<File>, Refused> {
        match e {
            nix::errno::Errno::ENOENT => Ok(None),
            nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR => Err(Refused::NotRegular {
                path: shown.clone(),
                reason: errno_reason(e),
            }),
            e => Err(HostError::sys("open", &shown, e).into()),
        }
    };
    for p in parents {
        dir = match openat(
            dir.as_fd(),
            *p,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(e) => return refused(e),
        };
    }
    let fd = match openat(
        dir.as_fd(),
        *name,
        OFlag::O_RDONLY
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(e) => return refused(e),
    };
    check(File::from(fd), &shown, max).map(Some)
}

/// What `rel` is below `root`, resolving symlinks as a process whose root is `root` would
/// (never leaving it, no magic links), without opening it for reading: `None` if it does not
/// exist. Tells whether a runtime that reads the file inside the container could block on it.
pub fn kind_in_root(root: &Path, rel: &Path) -> Result<Option<std::fs::FileType>, HostError> {
    use nix::fcntl::{openat2, OpenHow, ResolveFlag};
    let dir = nix::fcntl::open(
        root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| HostError::sys("open", root, e))?;
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let fd = match openat2(dir.as_fd(), rel, how) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Ok(None),
        // No openat2 (kernel < 5.6): judge the path without following any symlink.
        Err(nix::errno::Errno::ENOSYS) => {
            return match std::fs::symlink_metadata(root.join(rel)) {
                Ok(m) => Ok(Some(m.file_type())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(HostError::io("inspect", root.join(rel), e)),
            }
        }
        Err(e) => return Err(HostError::sys("resolve", root.join(rel), e)),
    };
    File::from(fd)
        .metadata()
        .map(|m| Some(m.file_type()))
        .map_err(|e| HostError::io("stat", root.join(rel), e))
}

/// Opens a file a client or the host's configuration names (symlinks followed: the path is
/// the caller's own), without blocking, as a regular file of at most `max` bytes.
pub fn open_file(path: &Path, max: u64) -> Result<File, Refused> {
    let fd = nix::fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| HostError::sys("open", path, e))?;
    check(File::from(fd), &path.display().to_string(), max)
}

/// Reads a whole file [`open_file`] accepts.
pub fn read_file(path: &Path, max: u64) -> Result<Vec<u8>, Refused> {
    read_capped(open_file(path, max)?, &path.display().to_string(), max)
}

/// Reads at most `max` bytes (a file that grew past its checked size is refused).
pub fn read_capped(f: File, shown: &str, max: u64) -> Result<Vec<u8>, Refused> {
    let mut buf = Vec::new();
    f.take(max + 1)
        .read_to_end(&mut buf)
        .map_err(|e| HostError::io("read", shown, e))?;
    if buf.len() as u64 > max {
        return Err(Refused::TooLarge {
            path: shown.into(),
            size: buf.len() as u64,
            max,
        });
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_symlinks_fifos_and_big_files() {
        let d = std::env::temp_dir().join(format!("sandboxd-untrusted-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("etc")).unwrap();
        std::fs::write(d.join("etc/ok"), b"fine").unwrap();
        std::fs::write(d.join("etc/big"), vec![0u8; 100]).unwrap();
        std::os::unix::fs::symlink("/etc/shadow", d.join("etc/link")).unwrap();
        std::os::unix::fs::symlink("/etc", d.join("etclink")).unwrap();
        nix::unistd::mkfifo(&d.join("etc/fifo"), Mode::from_bits_truncate(0o644)).unwrap();
        let open = |p: &str| open_beneath(&d, Path::new(p), 50);
        let mut s = String::new();
        open("etc/ok")
            .unwrap()
            .unwrap()
            .read_to_string(&mut s)
            .unwrap();
        assert_eq!(s, "fine");
        assert!(open("etc/none").unwrap().is_none());
        for bad in [
            "etc/link",
            "etclink/passwd",
            "etc/fifo",
            "etc/big",
            "../etc/ok",
        ] {
            let t = std::time::Instant::now();
            assert!(open(bad).is_err(), "{bad} accepted");
            assert!(
                t.elapsed() < std::time::Duration::from_secs(1),
                "{bad} blocked"
            );
        }
        assert!(read_file(&d.join("etc/fifo"), 10).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
