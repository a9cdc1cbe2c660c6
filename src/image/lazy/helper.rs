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
    let tree = match Tree::parse_as(spec.format, &json, spec.toc_offset, limits) {
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
            spec.format,
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
    let mut prefetch = None;
    if let Some(end) = tree.prefetch_end.filter(|e| *e > 0) {
        let blob = blob.clone();
        let t = std::thread::Builder::new()
            .name("lazyfs-prefetch".into())
            .spawn(move || {
                let t = Instant::now();
                match blob.prefetch(0, end, 2) {
                    Ok(()) => tracing::info!(layer = %blob.digest, bytes = end, seconds = t.elapsed().as_secs_f64(), "lazy layer: prefetched the files before its landmark"),
                    Err(e) => tracing::warn!(layer = %blob.digest, error = %e, "lazy layer: prefetch failed; files are fetched as read"),
                }
            })
            .map_err(|e| format!("start the prefetch thread: {e}"))?;
        prefetch = Some(t);
    }
    {
        let delay = Duration::from_secs(spec.store_cfg.lazy_background_delay_seconds);
        let blob = blob.clone();
        std::thread::Builder::new()
            .name("lazyfs-complete".into())
            .spawn(move || {
                std::thread::sleep(delay);
                // What the prefetch brings is read from the cache, not fetched twice.
                if let Some(p) = prefetch {
                    let _ = p.join();
                }
                complete(&spec, &unpacked, &blob)
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
/// fetched are served from it from then on. The start of the blob that reads (the prefetch)
/// fetched already is read from `blob`'s cache, not fetched again (a layer the prefetch took
/// whole needs no request at all); should that fail, the layer is fetched whole once more.
/// All of it at the lowest CPU and I/O priority, on a runtime of its own: the containers'
/// reads come first.
fn complete(spec: &Spec, unpacked: &std::sync::OnceLock<OwnedFd>, blob: &Blob) {
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
    // As many completions at a time on the node as a pull fetches layers at once; one that
    // has all but a few MiB from its reads (the prefetch took the layer) fetches no bulk and
    // takes none: it would wait behind big layers for what it mostly holds.
    let left = |b: &Blob| spec.size - b.present_start().map_or(0, |(_, n)| n);
    let _slot = (left(blob) > SLOTLESS_BYTES)
        .then(|| completion_slot(&spec.store, spec.store_cfg.max_concurrent_downloads))
        .flatten();
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
        let whole = |local| {
            super::super::fetch::fetch_whole(
                &store,
                &reg,
                &spec.digest,
                spec.size,
                &spec.diff_id,
                spec.format.meta_names(),
                super::super::fetch::Completion {
                    gate: super::super::lazy_dirs::reads_marker(&spec.store),
                    local,
                },
            )
        };
        let local = blob.present_start();
        let had = local.as_ref().map_or(0, |(_, n)| *n);
        match whole(local).await {
            Err(e) if had > 0 => {
                tracing::warn!(layer = %spec.digest, local_bytes = had, error = %e, "lazy layer: the completion from what the reads fetched failed; fetching it whole");
                whole(None).await
            }
            r => {
                tracing::debug!(layer = %spec.digest, local_bytes = had, "lazy layer: fetched; its start read from the read cache");
                r
            }
        }
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

/// A completion with at most this much of its blob left to fetch takes no slot.
const SLOTLESS_BYTES: u64 = 4 << 20;

/// One of the node's `n` completion slots (`lazy/.complete-<k>`, flock): the first one free,
/// waiting until one is (each looked at every 50 ms: waiting on one slot chosen in advance
/// left a layer queued behind a long one while another slot stood free). None when the lock
/// files cannot be made (then no limit).
fn completion_slot(store: &Path, n: usize) -> Option<std::fs::File> {
    let n = n.clamp(1, 64) as u64;
    let files: Vec<std::fs::File> = (0..n)
        .filter_map(|k| {
            let p = store.join("lazy").join(format!(".complete-{k}"));
            crate::state::files::create_file(&p, crate::state::files::FILE_MODE).ok()
        })
        .collect();
    if files.is_empty() {
        return None;
    }
    loop {
        // SAFETY: flock on fds we own; the lock is released when its file is dropped.
        let free = files.iter().position(
            |f| unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0,
        );
        if let Some(k) = free {
            return files.into_iter().nth(k);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// This thread (and those it starts) at nice 19 and the idle I/O class.
fn background_priority() {
    crate::process::priority::lower_this_thread(true);
}
