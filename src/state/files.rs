//! Files and directories under the state root, created with their final permissions: dirs
//! 0700 and files 0600 (root's alone, with no window in which another user could open them),
//! except the few files a container reads through a bind mount (its `/etc/hosts`, say).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use crate::error::HostError;

/// Mode of every directory the daemon makes under its state root.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every file the daemon writes under its state root, unless a container reads it.
pub const FILE_MODE: u32 = 0o600;

/// Creates `dir` (0700); it must not exist yet.
pub fn private_dir(dir: &Path) -> Result<(), HostError> {
    std::fs::DirBuilder::new()
        .mode(DIR_MODE)
        .create(dir)
        .map_err(|e| HostError::io("create", dir, e))
}

/// Creates `dir` and its missing parents (each 0700); an existing dir is fine.
pub fn private_dir_all(dir: &Path) -> Result<(), HostError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
        .map_err(|e| HostError::io("create", dir, e))
}

/// ext2/3/4's "top of directory hierarchies" flag (`chattr +T`, `FS_TOPDIR_FL`).
const FS_TOPDIR_FL: libc::c_int = 0x0002_0000;

/// Marks `dir` as the top of directory hierarchies for the ext2/3/4 inode allocator
/// (`chattr +T`): a subdirectory made in it then starts in a block group of the allocator's
/// choosing instead of `dir`'s own. Every pod and container dir holds files made and deleted
/// within its life, and without a journal ext4 skips, one inode-table lookup each, every
/// inode freed in the last 30 s of the group it allocates from: with every pod in one group
/// a new file costs more the busier the node (bench/RESULTS.md). Best effort: whether the
/// flag is set (other filesystems refuse it, and nothing depends on it). Its two ioctls are
/// this module's only unsafe code.
#[allow(unsafe_code)]
pub fn spread_subdirs(dir: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(f) = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
    else {
        return false;
    };
    // The kernel reads and writes these flags as an int, whatever the ioctl's name says.
    let mut flags: libc::c_int = 0;
    // SAFETY: the fd is open; GETFLAGS writes an int into `flags`, SETFLAGS reads it.
    unsafe {
        if libc::ioctl(f.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) != 0 {
            return false;
        }
        if flags & FS_TOPDIR_FL != 0 {
            return true;
        }
        flags |= FS_TOPDIR_FL;
        libc::ioctl(f.as_raw_fd(), libc::FS_IOC_SETFLAGS, &flags) == 0
    }
}

/// Makes an existing dir 0700 (state roots made by older versions had 0755 dirs).
pub fn restrict_dir(dir: &Path) -> Result<(), HostError> {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(DIR_MODE))
        .map_err(|e| HostError::io("chmod", dir, e))
}

/// Creates (or truncates) a file with `mode` without following a symlink at `path`; an
/// existing file gets `mode` too.
pub fn create_file(path: &Path, mode: u32) -> Result<File, HostError> {
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| HostError::io("create", path, e))?;
    f.set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(|e| HostError::io("chmod", path, e))?;
    Ok(f)
}

/// Writes `data` to `path` (created or truncated) with `mode`.
pub fn write_file(path: &Path, data: &[u8], mode: u32) -> Result<(), HostError> {
    create_file(path, mode)?
        .write_all(data)
        .map_err(|e| HostError::io("write", path, e))
}

/// Writes `data` to `path` as root's alone (0600).
pub fn write_private(path: &Path, data: &[u8]) -> Result<(), HostError> {
    write_file(path, data, FILE_MODE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// The flag is set where the filesystem takes it: on ext2/3/4 (this host's /tmp), and on
    /// any other filesystem that answers GETFLAGS with it afterwards.
    #[test]
    #[allow(unsafe_code)]
    fn subdirs_are_spread_where_the_filesystem_allows() {
        let d = std::env::temp_dir().join(format!("sandboxd-topdir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        private_dir_all(&d).unwrap();
        let set = spread_subdirs(&d);
        let f = File::open(&d).unwrap();
        let mut flags: libc::c_int = 0;
        use std::os::fd::AsRawFd;
        // SAFETY: GETFLAGS writes an int into `flags`.
        let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) };
        let ext = nix::sys::statfs::statfs(&d).unwrap().filesystem_type()
            == nix::sys::statfs::EXT4_SUPER_MAGIC;
        std::fs::remove_dir_all(&d).unwrap();
        if !ext {
            eprintln!("skipped: the temp dir is not on ext2/3/4");
            return;
        }
        assert!(set, "spread_subdirs reported failure on ext4");
        assert_eq!(r, 0);
        assert_ne!(flags & FS_TOPDIR_FL, 0, "FS_TOPDIR_FL not set: {flags:#x}");
        assert!(!spread_subdirs(&d), "a missing dir is no success");
    }

    #[test]
    fn modes_from_the_start() {
        let d = std::env::temp_dir().join(format!("sandboxd-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        private_dir_all(&d.join("a/b")).unwrap();
        for p in [d.join("a"), d.join("a/b")] {
            assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o700);
        }
        write_private(&d.join("a/f"), b"x").unwrap();
        assert_eq!(
            std::fs::metadata(d.join("a/f")).unwrap().mode() & 0o777,
            0o600
        );
        std::os::unix::fs::symlink("/etc/passwd", d.join("a/link")).unwrap();
        assert!(
            write_private(&d.join("a/link"), b"x").is_err(),
            "followed a symlink"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
