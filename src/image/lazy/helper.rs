//! `sandboxd lazyfs --dir D`: the server of one lazy layer. Reads its [`Spec`] from stdin
//! and the TOC from `D/toc.json`, forks (the daemon reaps the first process at once; the
//! server lives on in a session of its own, as a pod's monitor does), mounts `D/mnt`, answers
//! the kernel's handshake, says `ready` on stdout (or `error: …`), then serves until the
//! mount is gone, fetching the rest of the layer in the background and unpacking it into the
//! store once complete.
#![allow(unsafe_code)]

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::super::estargz::{self, Tree};
use super::super::registry::Registry;
use super::super::store::ImageStore;
use super::blob::Blob;
use super::fs::LazyFs;
use super::Spec;

/// Runs the server; the process's exit status.
pub fn main(dir: &Path) -> i32 {
    let fail = |m: String| {
        let _ = writeln!(std::io::stdout(), "error: {m}");
        let _ = std::io::stdout().flush();
        1
    };
    let mut raw = Vec::new();
    if let Err(e) = std::io::stdin().take(1 << 20).read_to_end(&mut raw) {
        return fail(format!("read the spec: {e}"));
    }
    let spec: Spec = match serde_json::from_slice(&raw) {
        Ok(s) => s,
        Err(e) => return fail(format!("the spec: {e}")),
    };
    let json = match crate::untrusted_fs::read_file(&dir.join("toc.json"), estargz::MAX_TOC_BYTES) {
        Ok(j) => j,
        Err(e) => return fail(format!("read the TOC: {e}")),
    };
    let limits = estargz::TocLimits {
        max_entries: spec.store_cfg.max_layer_entries,
        max_bytes: spec.store_cfg.max_layer_bytes,
    };
    let tree = match Tree::parse(&json, spec.toc_offset, limits) {
        Ok(t) => Arc::new(t),
        Err(e) => return fail(e),
    };
    drop(json);
    // Still one thread: the fork is safe. The first process exits, the daemon reaps it.
    // SAFETY: fork in a single-threaded process; the child only goes on with this code.
    match unsafe { libc::fork() } {
        -1 => return fail(format!("fork: {}", std::io::Error::last_os_error())),
        0 => {}
        _ => return 0,
    }
    // SAFETY: setsid in the child, which leads no group; SIGPIPE ignored (the daemon's
    // stderr, which this server logs to, may close under it: a daemon run in a terminal).
    unsafe {
        libc::setsid();
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    // Nothing of the daemon's working dir is held.
    let _ = std::env::set_current_dir("/");
    if let Err(e) = crate::state::files::write_private(
        &dir.join("pid"),
        std::process::id().to_string().as_bytes(),
    ) {
        return fail(format!("write the pid file: {e}"));
    }
    match serve(dir, spec, tree) {
        Ok(()) => 0,
        Err(m) => {
            tracing::error!(dir = %dir.display(), error = %m, "lazy layer server failed");
            fail(m)
        }
    }
}

fn serve(dir: &Path, spec: Spec, tree: Arc<Tree>) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("lazyfs-io")
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let reg = {
        let _in = rt.enter();
        Registry::new(&spec.endpoint, spec.creds.clone()).map_err(|e| e.to_string())?
    };
    let cache = dir.join("blob");
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&cache)
            .map_err(|e| format!("create {}: {e}", cache.display()))?
    };
    let timeout = Duration::from_secs(spec.store_cfg.lazy_fetch_timeout_seconds.max(1));
    let blob = Arc::new(
        Blob::new(
            file,
            spec.size,
            spec.digest.clone(),
            reg,
            rt.handle().clone(),
            timeout,
        )
        .map_err(|e| format!("the blob cache {}: {e}", cache.display()))?,
    );
    let mnt = super::super::lazy_dirs::mount_point(dir);
    let fuse = mount(&mnt)?;
    let unpacked = Arc::new(std::sync::OnceLock::new());
    let fs = LazyFs::new(
        tree.clone(),
        blob.clone(),
        unpacked.clone(),
        super::super::lazy_dirs::reads_marker(&spec.store),
    );
    let config = {
        let mut c = fuser::Config::default();
        c.acl = fuser::SessionACL::All;
        c.n_threads = Some(8);
        c.clone_fd = true;
        c
    };
    let session =
        fuser::Session::from_fd(fs, fuse, fuser::SessionACL::All, config).map_err(|e| {
            let _ = nix::mount::umount2(&mnt, nix::mount::MntFlags::MNT_DETACH);
            format!("FUSE handshake on {}: {e}", mnt.display())
        })?;
    // Ready: the daemon may stack the mount now. stdout goes quiet after.
    println!("ready");
    let _ = std::io::stdout().flush();
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        // SAFETY: dup2 of an fd we own onto stdout.
        unsafe { libc::dup2(null.as_raw_fd(), 1) };
    }
    tracing::info!(layer = %spec.digest, mount = %mnt.display(), files = tree.nodes.len(), "lazy layer served");
    // The files the image names to read first (before its prefetch landmark), now: the
    // container is still being made.
    if let Some(end) = tree.prefetch_end.filter(|e| *e > 0) {
        let blob = blob.clone();
        std::thread::Builder::new()
            .name("lazyfs-prefetch".into())
            .spawn(move || {
                let t = Instant::now();
                match blob.prefetch(0, end, 2) {
                    Ok(()) => tracing::info!(layer = %blob.digest, bytes = end, seconds = t.elapsed().as_secs_f64(), "lazy layer: prefetched the files before its landmark"),
                    Err(e) => tracing::warn!(layer = %blob.digest, error = %e, "lazy layer: prefetch failed; files are fetched as read"),
                }
            })
            .map_err(|e| format!("start the prefetch thread: {e}"))?;
    }
    {
        let delay = Duration::from_secs(spec.store_cfg.lazy_background_delay_seconds);
        std::thread::Builder::new()
            .name("lazyfs-complete".into())
            .spawn(move || {
                std::thread::sleep(delay);
                complete(&spec, &unpacked)
            })
            .map_err(|e| format!("start the completion thread: {e}"))?;
    }
    let r = session.run();
    tracing::info!(layer = %blob.digest, fetched = blob.fetched.load(std::sync::atomic::Ordering::Relaxed), "lazy layer unmounted: server ends");
    // The completion thread and the runtime end with the process.
    std::process::exit(if r.is_ok() { 0 } else { 1 });
}

/// Opens /dev/fuse and mounts it at `mnt`: read-only, nosuid, nodev, any user may read
/// through it, the kernel checks permissions by the modes.
fn mount(mnt: &Path) -> Result<OwnedFd, String> {
    use nix::fcntl::OFlag;
    let fuse = nix::fcntl::open(
        "/dev/fuse",
        OFlag::O_RDWR | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| format!("open /dev/fuse: {e}"))?;
    let data = format!(
        "fd={},rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions",
        fuse.as_raw_fd()
    );
    use nix::mount::MsFlags;
    nix::mount::mount(
        Some(super::SUBTYPE),
        mnt,
        Some(format!("fuse.{}", super::SUBTYPE).as_str()),
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(data.as_str()),
    )
    .map_err(|e| format!("mount FUSE on {}: {e}", mnt.display()))?;
    Ok(fuse)
}

/// Fetches the whole layer and unpacks it as it arrives, as a pull does (the blob's digest
/// and the diff id checked before the layer is committed, the format's own files left out),
/// then hands the unpacked layer to the filesystem (`unpacked`): reads of what no read has
/// fetched are served from it from then on. All of it at the lowest CPU and I/O priority, on
/// a runtime of its own: the containers' reads come first.
fn complete(spec: &Spec, unpacked: &std::sync::OnceLock<OwnedFd>) {
    background_priority();
    let started = Instant::now();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(2)
        .thread_name("lazyfs-bg")
        .on_thread_start(background_priority)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(layer = %spec.digest, error = %e, "lazy layer: no runtime for the background fetch");
            return;
        }
    };
    // As many completions at a time on the node as a pull fetches layers at once.
    let _slot = completion_slot(&spec.store, spec.store_cfg.max_concurrent_downloads);
    let mut cfg = spec.store_cfg.clone();
    (cfg.lazy_pull, cfg.keep_layer_blobs) = (false, false);
    let store = ImageStore::for_layer_server(spec.store.clone(), cfg);
    // (A pull of the layer whole may have unpacked it meanwhile: not fetched twice.)
    let done = rt.block_on(async {
        if store.has_layer(&spec.diff_id) {
            return Ok(());
        }
        let reg = Arc::new(
            Registry::new(&spec.endpoint, spec.creds.clone()).map_err(|e| {
                crate::error::Error::Host(crate::error::HostError::Other(e.to_string()))
            })?,
        );
        super::super::fetch::fetch_whole(
            &store,
            &reg,
            &spec.digest,
            spec.size,
            &spec.diff_id,
            &estargz::META_NAMES,
            Some(super::super::lazy_dirs::reads_marker(&spec.store)),
        )
        .await
    });
    if let Err(e) = done {
        tracing::error!(layer = %spec.digest, error = %e, "lazy layer: the background fetch failed; files are still fetched as read");
        return;
    }
    let layer = match store.layer_dir(&spec.diff_id) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(layer = %spec.digest, error = %e, "lazy layer: no layer dir");
            return;
        }
    };
    match nix::fcntl::open(
        &layer,
        nix::fcntl::OFlag::O_PATH
            | nix::fcntl::OFlag::O_DIRECTORY
            | nix::fcntl::OFlag::O_NOFOLLOW
            | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    ) {
        Ok(fd) => {
            let _ = unpacked.set(fd);
        }
        Err(e) => {
            tracing::warn!(layer = %spec.digest, error = %e, "lazy layer: cannot open the unpacked layer; reads stay on the blob")
        }
    }
    tracing::info!(
        layer = %spec.digest,
        diff_id = %spec.diff_id,
        bytes = spec.size,
        seconds = started.elapsed().as_secs_f64(),
        "lazy layer complete: unpacked for the containers created from now on"
    );
}

/// One of the node's `n` completion slots (`lazy/.complete-<k>`, flock): a free one, else
/// waits for one. None when the lock files cannot be made (then no limit).
fn completion_slot(store: &Path, n: usize) -> Option<std::fs::File> {
    let n = n.clamp(1, 64) as u64;
    let lock = |k: u64, how: libc::c_int| -> Option<std::fs::File> {
        let p = store.join("lazy").join(format!(".complete-{k}"));
        let f = crate::state::files::create_file(&p, crate::state::files::FILE_MODE).ok()?;
        // SAFETY: flock on an fd we own; released when the file is dropped.
        (unsafe { libc::flock(f.as_raw_fd(), how) } == 0).then_some(f)
    };
    (0..n)
        .find_map(|k| lock(k, libc::LOCK_EX | libc::LOCK_NB))
        .or_else(|| lock(u64::from(std::process::id()) % n, libc::LOCK_EX))
}

/// This thread (and those it starts) at nice 19 and the idle I/O class.
fn background_priority() {
    crate::process::priority::lower_this_thread(true);
}
