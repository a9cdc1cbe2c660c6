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
    if now < last.load(Ordering::Relaxed) + 50 {
        return;
    }
    last.store(now, Ordering::Relaxed);
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(marker)
        .and_then(|f| f.set_modified(std::time::SystemTime::now()));
}

/// A background completion's input that pauses while containers read lazy layers (the
/// marker touched in the last 200 ms), at most 10 s in all, so that it never starves.
pub(crate) struct Gated<R> {
    pub inner: R,
    pub marker: PathBuf,
    pub paused: Duration,
}

impl<R: Read> Read for Gated<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let fresh = |m: &Path| {
            std::fs::metadata(m)
                .and_then(|x| x.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age < Duration::from_millis(200))
        };
        while self.paused < Duration::from_secs(10) && fresh(&self.marker) {
            std::thread::sleep(Duration::from_millis(50));
            self.paused += Duration::from_millis(50);
        }
        self.inner.read(buf)
    }
}
