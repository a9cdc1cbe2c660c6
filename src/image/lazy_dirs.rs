//! Where the image store keeps lazy layers (`images/lazy/<diff id>`: the mount point
//! `mnt`, the TOC, the read cache, the server's `pid`, the `ready` marker),
//! whether a layer is served, and its removal — the store's side of `lazy/`, which makes
//! them. Also the node-wide marker by which the servers' background completions give way to
//! containers reading (`.reads`), and the input that gives way.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::HostError;

/// A lazy layer's dir: `images/lazy/<hex>`, `hex` the diff id's (checked by the caller,
/// `store::digest_hex`).
pub fn dir(store_dir: &Path, hex: &str) -> PathBuf {
    store_dir.join("lazy").join(hex)
}

/// Its mount point.
pub fn mount_point(dir: &Path) -> PathBuf {
    dir.join("mnt")
}

/// Whether the layer of this dir is served (its server said so, and the marker is written
/// only then; a server ends only when its mount is gone).
pub fn is_ready(dir: &Path) -> bool {
    dir.join("ready").exists()
}

/// Whether the layer's server lives: the pid it wrote is a `sandboxd lazyfs` of this dir.
/// (Asked of the process table, not of the mount: a server busy with a slow registry would
/// hold a `statfs` of its mount as long.)
pub(crate) fn server_lives(dir: &Path) -> bool {
    let Some(pid) = std::fs::read_to_string(dir.join("pid"))
        .ok()
        .and_then(|p| p.trim().parse::<i32>().ok())
        .filter(|p| *p > 0)
    else {
        return false;
    };
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let want = dir.as_os_str().as_encoded_bytes();
    cmdline.split(|b| *b == 0).any(|a| a == b"lazyfs")
        && cmdline.split(|b| *b == 0).any(|a| a == want)
}

/// Unmounts a lazy layer (detached: containers using it keep their view until they go, and
/// its server ends with the last of them) and removes its dir.
pub fn remove(dir: &Path) -> Result<(), HostError> {
    let m = mount_point(dir);
    // Unmounted until nothing is mounted there (a mount made twice over).
    for _ in 0..4 {
        match nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH) {
            Ok(()) => continue,
            Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => break,
            Err(e) => return Err(HostError::sys("unmount lazy layer", &m, e)),
        }
    }
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(HostError::io("remove", dir, e)),
    }
}

/// At start: the lazy layers whose server is gone (a reboot, a killed server) are removed;
/// returns the diff ids of those not also unpacked (the images naming them are dropped).
pub fn sweep_lost(store_dir: &Path) -> Vec<String> {
    let root = store_dir.join("lazy");
    let mut lost = Vec::new();
    // (Dot files are the servers' shared markers and slots, no layer.)
    for name in crate::state::list_dir(&root)
        .into_iter()
        .filter(|n| !n.starts_with('.'))
    {
        let d = root.join(&name);
        if is_ready(&d) && server_lives(&d) {
            continue;
        }
        tracing::warn!(layer = %name, "lazy layer without its server (the node rebooted, or the server was killed): removed");
        if let Err(e) = remove(&d) {
            tracing::warn!(layer = %name, error = %e, "cannot remove a lost lazy layer");
        }
        let diff_id = format!("sha256:{name}");
        if !store_dir.join("layers").join(&name).is_dir() {
            lost.push(diff_id);
        }
    }
    lost
}

/// The node-wide marker that a container reads a lazy layer (its mtime, touched at most
/// every 50 ms by every layer's server): background completions pause while it is fresh.
pub(crate) fn reads_marker(store_dir: &Path) -> PathBuf {
    store_dir.join("lazy").join(".reads")
}

/// Touches the reads marker (rate-limited by `last`, ms since `born`).
pub(crate) fn touch_reads(
    marker: &Path,
    born: std::time::Instant,
    last: &std::sync::atomic::AtomicU64,
) {
    use std::sync::atomic::Ordering;
    let now = born.elapsed().as_millis() as u64 + 1;
    let prev = last.load(Ordering::Relaxed);
    // (0: never touched, the first read touches however soon after `born`.)
    if prev != 0 && now < prev + 50 {
        return;
    }
    last.store(now, Ordering::Relaxed);
    set_marker(marker, std::time::SystemTime::now());
}

/// The marker's mtime set to `t` (made 0600 where missing, never through a link).
fn set_marker(marker: &Path, t: std::time::SystemTime) {
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(marker)
        .and_then(|f| f.set_modified(t));
}

/// Holds the completions back for `d` from now (a container of lazy layers being made or
/// started: its first moments, whether it reads the lazy view or a layer completed
/// already): the marker's mtime set that far ahead; unless `replace`, never brought nearer
/// than a hold already there (a start ends its create's hold with its own, shorter one).
pub(crate) fn hold_reads(marker: &Path, d: Duration, replace: bool) {
    let until = std::time::SystemTime::now() + d;
    let later = std::fs::symlink_metadata(marker)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t >= until);
    if later && !replace {
        return;
    }
    set_marker(marker, until);
}

/// Whether the marker says containers read (or are being made): touched in the last
/// 100 ms (twice the servers' touch interval), or held until a time still ahead.
fn reads_now(marker: &Path) -> bool {
    let Ok(t) = std::fs::metadata(marker).and_then(|x| x.modified()) else {
        return false;
    };
    match std::time::SystemTime::now().duration_since(t) {
        Ok(age) => age < Duration::from_millis(100),
        Err(_) => true,
    }
}

/// A background completion's input that pauses while containers read lazy layers or are
/// being made ([`reads_now`]), at most 10 s in all, so that it never starves; looked at
/// again every 20 ms while paused, so that it leaves the cores idle little after the reads
/// stop. The marker is looked at once per 20 ms of reading, not at every read of the
/// decoder's (32 KiB each: some 65,000 `statx` for a 2 GiB layer).
pub(crate) struct Gated<R> {
    inner: R,
    marker: PathBuf,
    paused: Duration,
    looked: Option<std::time::Instant>,
}

impl<R> Gated<R> {
    pub(crate) fn new(inner: R, marker: PathBuf) -> Self {
        Gated {
            inner,
            marker,
            paused: Duration::ZERO,
            looked: None,
        }
    }
}

impl<R: Read> Read for Gated<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let due = self
            .looked
            .is_none_or(|t| t.elapsed() >= Duration::from_millis(20));
        if due {
            while self.paused < Duration::from_secs(10) && reads_now(&self.marker) {
                std::thread::sleep(Duration::from_millis(20));
                self.paused += Duration::from_millis(20);
            }
            self.looked = Some(std::time::Instant::now());
        }
        self.inner.read(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Instant, SystemTime};

    fn mtime(p: &Path) -> SystemTime {
        std::fs::metadata(p).unwrap().modified().unwrap()
    }

    /// A touch says "reads now" for 100 ms; a hold says it until its time, is not shortened
    /// by a shorter one unless that replaces it; a completion's input waits out a hold.
    #[test]
    fn holds_and_touches_pause_the_completion() {
        let d = tempfile::tempdir().unwrap();
        let m = d.path().join(".reads");
        assert!(!reads_now(&m), "no marker: nobody reads");
        let last = std::sync::atomic::AtomicU64::new(0);
        touch_reads(&m, Instant::now(), &last);
        assert!(reads_now(&m));
        std::fs::File::options()
            .write(true)
            .open(&m)
            .unwrap()
            .set_modified(SystemTime::now() - Duration::from_secs(1))
            .unwrap();
        assert!(!reads_now(&m), "a touch a second old");
        hold_reads(&m, Duration::from_secs(3), false);
        let held = mtime(&m);
        assert!(held > SystemTime::now() + Duration::from_millis(2500));
        hold_reads(&m, Duration::from_secs(1), false);
        assert_eq!(mtime(&m), held, "a shorter hold shortened a longer one");
        assert!(reads_now(&m));
        hold_reads(&m, Duration::from_millis(300), true);
        assert!(mtime(&m) < held, "a replacing hold kept the longer one");
        let t = Instant::now();
        let mut g = Gated::new(&b"abc"[..], m.clone());
        let mut out = Vec::new();
        g.read_to_end(&mut out).unwrap();
        assert_eq!(out, b"abc");
        assert!(
            t.elapsed() >= Duration::from_millis(250),
            "read through a hold in {:?}",
            t.elapsed()
        );
        assert!(!reads_now(&m));
    }
}
