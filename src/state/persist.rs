//! Atomic persistence: a record is written as tmp file + fsync + rename + fsync(dir), so a
//! crash leaves either the old or the new content, never a torn file.

use std::path::Path;

use sandboxd_shim_common::files::Durability;
use serde::{de::DeserializeOwned, Serialize};

use crate::error::HostError;

/// Writes `value` as JSON to `path` atomically.
pub fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> Result<(), HostError> {
    let data = serde_json::to_vec_pretty(value)
        .map_err(|e| HostError::format(path.display(), format!("serialize: {e}")))?;
    write_atomic(path, &data)
}

/// Writes `data` to `path` atomically (mode 0600): tmp file + fsync + rename + fsync of the
/// dir, for a replacement too. Without the last, a crash could bring back the old content: a
/// state the caller was already answered past (a RunPodSandbox acknowledged, then rolled
/// back on restore as half-made).
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<(), HostError> {
    if path.parent().is_none() {
        return Err(HostError::Other(format!(
            "{} has no parent",
            path.display()
        )));
    }
    let synced = sandboxd_shim_common::files::write_atomic(path, data, Durability::Fsync)
        .map_err(|e| HostError::io(e.op, e.path, e.source))?;
    crate::counters::add(crate::counters::Wait::Sync, synced);
    Ok(())
}

/// Makes the entries of `dir` durable (an fsync of the directory): what was removed from it
/// stays removed after a power cut.
pub fn sync_dir(dir: &Path) -> Result<(), HostError> {
    let started = std::time::Instant::now();
    let d = std::fs::File::open(dir).map_err(|e| HostError::io("open", dir, e))?;
    d.sync_all().map_err(|e| HostError::io("fsync", dir, e))?;
    crate::counters::add(crate::counters::Wait::Sync, started.elapsed());
    Ok(())
}

/// Makes everything written to the filesystem holding `path` durable (`syncfs(2)`): an
/// unpacked layer's files before the store gives them their name. Without it a power cut
/// soon after a pull can leave the name durable and the files empty (ext4 allocates and
/// writes a file's data after the metadata its commit made durable), as containerd's nodes
/// found (its opt-in `image_pull_with_sync_fs`). One call for a whole tree, where an fsync
/// per file would cost a flush each.
pub fn sync_filesystem(path: &Path) -> Result<(), HostError> {
    let started = std::time::Instant::now();
    let d = std::fs::File::open(path).map_err(|e| HostError::io("open", path, e))?;
    nix::unistd::syncfs(&d).map_err(|e| HostError::io("syncfs", path, e.into()))?;
    crate::counters::add(crate::counters::Wait::Sync, started.elapsed());
    Ok(())
}

/// The names in `dir` (none if it cannot be read).
pub fn list_dir(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Most entries [`disk_usage`] counts: a tree bigger than that (a tenant's million empty
/// files) is reported as this many, not walked for minutes.
pub const DISK_USAGE_MAX_ENTRIES: u64 = 1 << 20;
/// Deepest directory [`disk_usage`] descends into (one open descriptor per level).
const DISK_USAGE_MAX_DEPTH: usize = 128;

/// Bytes (allocated blocks, as `du` counts them: a sparse file counts what it uses) and
/// inodes below `path`. The tree may belong to a tenant and change while it is walked: each
/// dir is opened relative to its parent's descriptor without following symlinks, so a swap
/// cannot lead the walk out of the tree; depth and entries are capped.
pub fn disk_usage(path: &Path) -> (u64, u64) {
    use nix::dir::Dir;
    use nix::fcntl::{AtFlags, OFlag};
    use nix::sys::stat::{fstatat, Mode};
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let Ok(root) = Dir::open(path, flags, Mode::empty()) else {
        return (0, 0);
    };
    // Within the filesystem `path` is on: a mount below it (a lazy layer's FUSE view in the
    // image store) is not this filesystem's use.
    let Ok(dev) = nix::sys::stat::fstat(&root).map(|s| s.st_dev) else {
        return (0, 0);
    };
    let (mut bytes, mut inodes) = (0u64, 0u64);
    // Each level: the open dir and the names of its subdirs still to visit.
    let mut stack: Vec<Dir> = vec![root];
    let mut pending: Vec<Vec<std::ffi::CString>> = vec![Vec::new()];
    let mut fresh = true;
    while let Some(dir) = stack.last_mut() {
        if fresh {
            fresh = false;
            let names: Vec<std::ffi::CString> = dir
                .iter()
                .flatten()
                .map(|e| e.file_name().to_owned())
                .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
                .take((DISK_USAGE_MAX_ENTRIES - inodes) as usize)
                .collect();
            let mut subdirs = Vec::new();
            for name in names {
                let Ok(st) = fstatat(&*dir, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
                    continue;
                };
                inodes += 1;
                bytes += (st.st_blocks as u64).saturating_mul(512);
                if st.st_mode & libc::S_IFMT == libc::S_IFDIR && st.st_dev == dev {
                    subdirs.push(name);
                }
            }
            *pending.last_mut().expect("one per level") = subdirs;
        }
        let next = pending.last_mut().and_then(Vec::pop);
        match next {
            Some(name) if stack.len() < DISK_USAGE_MAX_DEPTH && inodes < DISK_USAGE_MAX_ENTRIES => {
                let parent = stack.last().expect("non-empty");
                if let Ok(d) = Dir::openat(parent, name.as_c_str(), flags, Mode::empty()) {
                    stack.push(d);
                    pending.push(Vec::new());
                    fresh = true;
                }
            }
            Some(_) => {}
            None => {
                stack.pop();
                pending.pop();
            }
        }
    }
    (bytes, inodes)
}

/// Threads reading records at start: the reads wait on the disk more than on a CPU when the
/// files are cold (after a reboot; on hosts that reclaim the page cache).
const RECORD_READERS: usize = 8;

/// One record dir: its id, its path and its record as [`read_json`] read it.
pub type RecordDir<T> = (String, std::path::PathBuf, Result<Option<T>, HostError>);

/// What is in a record dir: one subdirectory per full id, each holding `state.json`. Returns
/// `(id, its dir, its record as [`read_record`] reads it with `max_format`)`; other entries
/// are skipped with a warning naming `kind`. The records are read and parsed on several
/// threads: at 1,000 pods this was a third of a restart.
pub fn record_dirs<T: DeserializeOwned + Send>(
    dir: &Path,
    kind: &str,
    max_format: u32,
) -> Result<Vec<RecordDir<T>>, HostError> {
    let entries = std::fs::read_dir(dir).map_err(|e| HostError::io("read", dir, e))?;
    let mut found = Vec::new();
    for e in entries.filter_map(|e| e.ok()) {
        let path = e.path();
        let id = e.file_name().to_str().map(str::to_string);
        match id {
            Some(id)
                if crate::validate::full_id(&id).is_ok()
                    && e.file_type().is_ok_and(|t| t.is_dir()) =>
            {
                found.push((id, path));
            }
            _ => {
                tracing::warn!(path = %path.display(), "ignoring unexpected entry in the {kind} dir")
            }
        }
    }
    Ok(crate::metrics::par_map_on(
        RECORD_READERS,
        found,
        |(id, path)| {
            let rec = read_record(&path.join("state.json"), max_format);
            (id, path, rec)
        },
    ))
}

/// Reads a JSON record; a missing file is `Ok(None)`, a corrupt one an error.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, HostError> {
    match std::fs::read(path) {
        Ok(data) => serde_json::from_slice(&data)
            .map(Some)
            .map_err(|e| HostError::format(path.display(), format!("corrupt record: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(HostError::io("read", path, e)),
    }
}

/// Reads a record that carries a `format` number (absent: 0). A record of a format above
/// `max_format` is an error naming both formats, read no further: it was written by a newer
/// build, and reading it as this one understands it would drop what it does not know.
pub fn read_record<T: DeserializeOwned>(
    path: &Path,
    max_format: u32,
) -> Result<Option<T>, HostError> {
    #[derive(serde::Deserialize)]
    struct Head {
        #[serde(default)]
        format: u64,
    }
    let data = match std::fs::read(path) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(HostError::io("read", path, e)),
    };
    let corrupt =
        |e: serde_json::Error| HostError::format(path.display(), format!("corrupt record: {e}"));
    let head: Head = serde_json::from_slice(&data).map_err(corrupt)?;
    if head.format > u64::from(max_format) {
        return Err(HostError::format(
            path.display(),
            format!(
                "record format {} is newer than this sandboxd ({}) reads (formats up to \
                 {max_format}): it was written by a newer release, which reads it",
                head.format,
                env!("CARGO_PKG_VERSION"),
            ),
        ));
    }
    serde_json::from_slice(&data).map(Some).map_err(corrupt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let dir = std::env::temp_dir().join(format!("sandboxd-persist-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("state.json");
        write_json_atomic(&p, &vec![1, 2, 3]).unwrap();
        let v: Option<Vec<i32>> = read_json(&p).unwrap();
        assert_eq!(v, Some(vec![1, 2, 3]));
        std::fs::write(&p, b"{").unwrap();
        assert!(read_json::<Vec<i32>>(&p).is_err());
        assert!(read_json::<Vec<i32>>(&dir.join("none")).unwrap().is_none());
        // Formats: absent reads as 0, up to the maximum reads, above it is refused by name.
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct R {
            #[serde(default)]
            format: u32,
            x: i32,
        }
        std::fs::write(&p, br#"{"x": 1}"#).unwrap();
        assert_eq!(
            read_record::<R>(&p, 1).unwrap(),
            Some(R { format: 0, x: 1 })
        );
        std::fs::write(&p, br#"{"format": 1, "x": 2}"#).unwrap();
        assert_eq!(
            read_record::<R>(&p, 1).unwrap(),
            Some(R { format: 1, x: 2 })
        );
        std::fs::write(
            &p,
            br#"{"format": 7, "x": "a shape this build cannot read"}"#,
        )
        .unwrap();
        let e = read_record::<R>(&p, 1).unwrap_err().to_string();
        assert!(
            e.contains("record format 7 is newer") && e.contains("up to 1"),
            "{e}"
        );
        std::fs::write(&p, br#"{"format": -1}"#).unwrap();
        assert!(read_record::<R>(&p, 1)
            .unwrap_err()
            .to_string()
            .contains("corrupt"));
        assert!(read_record::<R>(&dir.join("none"), 1).unwrap().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(!dir.exists());
    }
}
