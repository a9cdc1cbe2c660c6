//! Mount helpers: the pod's shm tmpfs, shared-propagation namespace dirs, lazy unmounts, and
//! "is it mounted" decided from `/proc/self/mountinfo` (never by guessing from a directory).

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

fn parse_mountinfo(text: &str) -> Vec<MountInfo> {
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
    std::fs::create_dir_all(path).map_err(|e| HostError::io("create shm dir", path, e))?;
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
    for d in [upper, work, target] {
        std::fs::create_dir_all(d).map_err(|e| HostError::io("create", d, e))?;
    }
    let join = |p: &Path| {
        p.to_string_lossy()
            .replace('\\', "\\\\")
            .replace(':', "\\:")
    };
    let lowers: Vec<String> = lower.iter().map(|p| join(p)).collect();
    let data = format!(
        "lowerdir={},upperdir={},workdir={}",
        lowers.join(":"),
        join(upper),
        join(work)
    );
    if data.len() >= 4096 {
        return Err(HostError::Other(format!(
            "overlay mount data for {} layers is {} bytes, over the kernel's page-size limit",
            lower.len(),
            data.len()
        )));
    }
    mount(
        Some("overlay"),
        target,
        Some("overlay"),
        MsFlags::empty(),
        Some(data.as_str()),
    )
    .map_err(|e| HostError::sys("mount overlay rootfs on", target, e))
}

/// Lazily unmounts every mount stacked at `path`. Not mounted is success.
pub fn unmount_all(path: &Path) -> Result<(), HostError> {
    for _ in 0..16 {
        if mounted_at(path)?.is_none() {
            return Ok(());
        }
        match umount2(path, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW) {
            Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => return Err(HostError::sys("unmount", path, e)),
        }
    }
    Err(HostError::Other(format!(
        "{} is still mounted after 16 unmounts",
        path.display()
    )))
}

/// Makes `dir` a mount point with shared propagation, as `ip netns` does for `/var/run/netns`,
/// so namespace bind mounts made under it propagate into mount namespaces created later.
pub fn make_shared_dir(dir: &Path) -> Result<(), HostError> {
    std::fs::create_dir_all(dir).map_err(|e| HostError::io("create dir", dir, e))?;
    // mountinfo names the real path (`/var/run/netns` is `/run/netns` on most hosts): compare
    // with that, or every call would bind the dir onto itself again, and with shared
    // propagation each bind doubles the mounts there.
    let real = std::fs::canonicalize(dir).map_err(|e| HostError::io("resolve", dir, e))?;
    let dir = real.as_path();
    if let Some(m) = mounted_at(dir)? {
        if m.optional.iter().any(|o| o.starts_with("shared:")) {
            return Ok(());
        }
    } else {
        mount(
            Some(dir),
            dir,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(|e| HostError::sys("bind-mount onto itself", dir, e))?;
    }
    mount(
        None::<&str>,
        dir,
        None::<&str>,
        MsFlags::MS_SHARED | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| HostError::sys("make shared", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mountinfo_lines() {
        let text = "36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n\
                    40 22 0:50 / /run/netns rw shared:7 - tmpfs tmpfs rw\n";
        let m = parse_mountinfo(text);
        assert_eq!(m[0].mount_point, PathBuf::from("/mnt/with space"));
        assert_eq!(m[0].fs_type, "ext3");
        assert_eq!(m[0].optional, vec!["master:1".to_string()]);
        assert_eq!(m[1].optional, vec!["shared:7".to_string()]);
        assert_eq!(m[1].fs_type, "tmpfs");
    }

    #[test]
    fn reads_own_table() {
        let t = mountinfo().unwrap();
        assert!(t.iter().any(|m| m.mount_point == Path::new("/proc")));
    }
}
