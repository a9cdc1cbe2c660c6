//! The container's writable layer as a tar (CheckpointContainer's `rootfs-diff.tar`), read
//! while the container runs — so every name in it is the tenant's to change under us. The
//! walk is fd-relative from the upper dir and never follows a symlink (a directory swapped
//! for a link to the host mid-walk is still read as the directory we opened, or not at all);
//! files are opened `O_NONBLOCK` and checked to be regular after opening (a FIFO or device
//! swapped in never blocks us); only what a restore can use is archived (directories,
//! regular files, symlinks stored as links), overlay whiteouts are listed as deletions, the
//! rest skipped by name; and it is bounded in entries, bytes, depth and time.

use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};

/// How much of a layer is archived.
#[derive(Debug, Clone)]
pub struct Bounds {
    pub bytes: u64,
    pub entries: u64,
    pub depth: usize,
    pub deadline: Instant,
}

impl Bounds {
    /// The checkpoint's: 16 GiB, a million entries, 128 levels, ten minutes.
    pub fn checkpoint() -> Bounds {
        Bounds {
            bytes: 16 << 30,
            entries: 1 << 20,
            depth: 128,
            deadline: Instant::now() + std::time::Duration::from_secs(600),
        }
    }
}

/// What the walk found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    pub entries: u64,
    pub bytes: u64,
    /// Paths the layer deletes from the image (overlay whiteouts), relative.
    pub deleted: Vec<PathBuf>,
    /// Sockets, FIFOs and devices: not archived.
    pub skipped: Vec<PathBuf>,
}

/// Writes `upper`'s tree into a new tar file `out` (mode 0600).
pub fn write(upper: &Path, out: &Path, b: &Bounds) -> io::Result<Summary> {
    use std::os::unix::fs::OpenOptionsExt;
    let root = nix::fcntl::open(
        upper,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io::Error::from)?;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)?;
    let mut tar = tar::Builder::new(io::BufWriter::new(f));
    let mut s = Summary::default();
    walk(&mut tar, &root, Path::new(""), 0, &mut s, b)?;
    tar.into_inner()?
        .into_inner()
        .map_err(|e| e.into_error())?
        .sync_all()?;
    Ok(s)
}

fn over(what: &str) -> io::Error {
    io::Error::other(format!("the container's writable layer is over its {what}"))
}

fn walk<W: io::Write>(
    tar: &mut tar::Builder<W>,
    dir: &OwnedFd,
    rel: &Path,
    depth: usize,
    s: &mut Summary,
    b: &Bounds,
) -> io::Result<()> {
    if depth > b.depth {
        return Err(over("depth limit"));
    }
    let names = list(dir, b)?;
    for name in names {
        if Instant::now() > b.deadline {
            return Err(over("time limit"));
        }
        s.entries += 1;
        if s.entries > b.entries {
            return Err(over("entry limit"));
        }
        let path = rel.join(OsStr::from_bytes(name.as_bytes()));
        let st = match nix::sys::stat::fstatat(dir, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(nix::Error::ENOENT) => continue, // gone meanwhile
            Err(e) => return Err(e.into()),
        };
        let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
        if kind == SFlag::S_IFDIR {
            let Some(fd) = open_at(dir, &name, OFlag::O_DIRECTORY)? else {
                continue;
            };
            let meta = File::from(fd.try_clone()?).metadata()?;
            let mut h = tar::Header::new_gnu();
            h.set_metadata(&meta);
            h.set_size(0);
            tar.append_data(&mut h, &path, io::empty())?;
            walk(tar, &fd, &path, depth + 1, s, b)?;
        } else if kind == SFlag::S_IFREG {
            // O_NONBLOCK: what is there by now may be a FIFO; checked after opening.
            let Some(fd) = open_at(dir, &name, OFlag::O_NONBLOCK)? else {
                continue;
            };
            let f = File::from(fd);
            let meta = f.metadata()?;
            if !meta.is_file() {
                s.skipped.push(path);
                continue;
            }
            s.bytes += meta.len();
            if s.bytes > b.bytes {
                return Err(over("size limit"));
            }
            let mut h = tar::Header::new_gnu();
            h.set_metadata(&meta);
            // Exactly the size in the header, whatever the file does meanwhile.
            let body = f.take(meta.len()).chain(io::repeat(0)).take(meta.len());
            tar.append_data(&mut h, &path, body)?;
        } else if kind == SFlag::S_IFLNK {
            let target = match nix::fcntl::readlinkat(dir, name.as_c_str()) {
                Ok(t) => t,
                // Gone, or no longer a link (EINVAL: the tenant put a dir or file there).
                Err(nix::Error::ENOENT | nix::Error::EINVAL) => continue,
                Err(e) => return Err(e.into()),
            };
            let mut h = header_of(&st, tar::EntryType::Symlink);
            tar.append_link(&mut h, &path, Path::new(&target))?;
        } else if kind == SFlag::S_IFCHR && st.st_rdev == 0 {
            s.deleted.push(path);
        } else {
            s.skipped.push(path);
        }
    }
    Ok(())
}

/// The names in `dir`, sorted (at most the entry bound).
fn list(dir: &OwnedFd, b: &Bounds) -> io::Result<Vec<CString>> {
    let fd = dir.try_clone()?;
    let mut d = nix::dir::Dir::from_fd(fd).map_err(io::Error::from)?;
    let mut names = Vec::new();
    for e in d.iter() {
        let e = e.map_err(io::Error::from)?;
        let n: &CStr = e.file_name();
        if n.to_bytes() == b"." || n.to_bytes() == b".." {
            continue;
        }
        names.push(n.to_owned());
        if names.len() as u64 > b.entries {
            return Err(over("entry limit"));
        }
    }
    names.sort();
    Ok(names)
}

/// `name` in `dir`, never through a symlink; `None` if it went away.
fn open_at(dir: &OwnedFd, name: &CStr, extra: OFlag) -> io::Result<Option<OwnedFd>> {
    match nix::fcntl::openat(
        dir.as_fd(),
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | extra,
        Mode::empty(),
    ) {
        Ok(fd) => Ok(Some(fd)),
        // Gone, or replaced by a link (ELOOP) or a non-directory (ENOTDIR) meanwhile.
        Err(nix::Error::ENOENT | nix::Error::ELOOP | nix::Error::ENOTDIR) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn header_of(st: &FileStat, kind: tar::EntryType) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(st.st_mode & 0o7777);
    h.set_uid(st.st_uid as u64);
    h.set_gid(st.st_gid as u64);
    h.set_mtime(st.st_mtime.max(0) as u64);
    h.set_size(0);
    h
}
