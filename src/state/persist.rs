//! Atomic persistence: a record is written as tmp file + fsync + rename + fsync(dir), so a
//! crash leaves either the old or the new content, never a torn file.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{de::DeserializeOwned, Serialize};

use crate::error::HostError;

/// Wall time spent waiting in fsync for records (summed over threads), for the benchmark's
/// breakdown of our own time.
static SYNC_NANOS: AtomicU64 = AtomicU64::new(0);

/// Total time spent in record fsyncs so far.
pub fn sync_wait() -> Duration {
    Duration::from_nanos(SYNC_NANOS.load(Ordering::Relaxed))
}

fn timed_sync<T>(f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = f();
    SYNC_NANOS.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    r
}

/// Writes `value` as JSON to `path` atomically.
pub fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> Result<(), HostError> {
    let data = serde_json::to_vec_pretty(value)
        .map_err(|e| HostError::Other(format!("serialize {}: {e}", path.display())))?;
    write_atomic(path, &data)
}

/// Writes `data` to `path` atomically (mode 0600).
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<(), HostError> {
    let dir = path
        .parent()
        .ok_or_else(|| HostError::Other(format!("{} has no parent", path.display())))?;
    let tmp = path.with_extension("tmp");
    {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
            .map_err(|e| HostError::io("create", &tmp, e))?;
        f.write_all(data)
            .map_err(|e| HostError::io("write", &tmp, e))?;
        timed_sync(|| f.sync_data()).map_err(|e| HostError::io("fsync", &tmp, e))?;
    }
    // Replacing an existing record needs no directory fsync: after a crash the name points at
    // either the old complete file or the new complete one, and every record is written so
    // that its predecessor is a state restore can finish or roll back. A new name does.
    let replacing = std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file());
    std::fs::rename(&tmp, path).map_err(|e| HostError::io("rename into", path, e))?;
    if replacing {
        return Ok(());
    }
    File::open(dir)
        .and_then(|d| timed_sync(|| d.sync_all()))
        .map_err(|e| HostError::io("fsync dir", dir, e))
}

/// Bytes and inodes used below `path` (symlinks are counted, never followed).
pub fn disk_usage(path: &Path) -> (u64, u64) {
    fn walk(p: &Path, acc: &mut (u64, u64)) {
        if let Ok(rd) = std::fs::read_dir(p) {
            for e in rd.flatten() {
                if let Ok(m) = e.metadata() {
                    acc.1 += 1;
                    acc.0 += m.len();
                    if m.is_dir() {
                        walk(&e.path(), acc);
                    }
                }
            }
        }
    }
    let mut acc = (0, 0);
    walk(path, &mut acc);
    acc
}

/// One record dir: its id, its path and its record as [`read_json`] read it.
pub type RecordDir<T> = (String, std::path::PathBuf, Result<Option<T>, HostError>);

/// What is in a record dir: one subdirectory per full id, each holding `state.json`. Returns
/// `(id, its dir, its record as read_json reads it)`; other entries are skipped with a
/// warning naming `kind`.
pub fn record_dirs<T: DeserializeOwned>(
    dir: &Path,
    kind: &str,
) -> Result<Vec<RecordDir<T>>, HostError> {
    let entries = std::fs::read_dir(dir).map_err(|e| HostError::io("read", dir, e))?;
    let mut out = Vec::new();
    for e in entries.filter_map(|e| e.ok()) {
        let path = e.path();
        let id = e.file_name().to_str().map(str::to_string);
        match id {
            Some(id)
                if crate::validate::full_id(&id).is_ok()
                    && e.file_type().is_ok_and(|t| t.is_dir()) =>
            {
                let rec = read_json(&path.join("state.json"));
                out.push((id, path, rec));
            }
            _ => {
                tracing::warn!(path = %path.display(), "ignoring unexpected entry in the {kind} dir")
            }
        }
    }
    Ok(out)
}

/// Reads a JSON record; a missing file is `Ok(None)`, a corrupt one an error.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, HostError> {
    match std::fs::read(path) {
        Ok(data) => serde_json::from_slice(&data)
            .map(Some)
            .map_err(|e| HostError::Other(format!("corrupt record {}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(HostError::io("read", path, e)),
    }
}

/// Removes a record directory tree. Missing is success. Refuses to follow a symlink.
pub fn remove_record_dir(dir: &Path) -> Result<(), HostError> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(HostError::io("inspect", dir, e)),
        Ok(m) if m.file_type().is_symlink() => {
            std::fs::remove_file(dir).map_err(|e| HostError::io("remove symlink", dir, e))
        }
        Ok(_) => match std::fs::remove_dir_all(dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(HostError::io("remove dir", dir, e)),
        },
    }
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
        remove_record_dir(&dir).unwrap();
        assert!(!dir.exists());
    }
}
