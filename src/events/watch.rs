//! Learns container exits as they happen: inotify watches each live container's dir, and the
//! monitor's atomic write of the exit file (a rename into the dir) wakes one thread, which
//! folds the exit into the record (publishing the STOPPED event). No polling; queries still
//! fold exits lazily, so a missed wake-up (a full inotify queue) only delays the event until
//! the next query or the next relist.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

use crate::state::lock;

use sandboxd_shim_common::exit::EXIT_FILE;

#[derive(Default)]
struct Watches {
    by_wd: HashMap<WatchDescriptor, String>,
    by_id: HashMap<String, WatchDescriptor>,
}

/// The inotify instance and which dir belongs to which container.
struct Shared {
    inotify: Inotify,
    watches: Mutex<Watches>,
}

/// Owned by the runtime; dropping it stops the thread. Without an inotify instance (the
/// per-user limit reached) it does nothing: exits are then learned on queries.
pub struct ExitWatcher {
    shared: Option<Arc<Shared>>,
    /// Closed (dropped) to stop the thread.
    stop: Mutex<Option<OwnedFd>>,
}

impl Default for ExitWatcher {
    fn default() -> Self {
        Self::new()
    }
}

impl ExitWatcher {
    pub fn new() -> Self {
        let shared = match Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC) {
            Ok(inotify) => Some(Arc::new(Shared {
                inotify,
                watches: Mutex::new(Watches::default()),
            })),
            Err(e) => {
                tracing::warn!(error = %e, "no inotify instance (fs.inotify.max_user_instances?); container exits are learned on queries");
                None
            }
        };
        ExitWatcher {
            shared,
            stop: Mutex::new(None),
        }
    }

    /// Watches `dir` for `id`'s exit file. A failure (the per-user watch limit) is logged:
    /// the exit is then learned on the next query.
    pub fn add(&self, id: &str, dir: &Path) {
        let Some(shared) = &self.shared else { return };
        let flags = AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_CLOSE_WRITE;
        match shared.inotify.add_watch(dir, flags) {
            Ok(wd) => {
                let mut w = lock(&shared.watches);
                w.by_wd.insert(wd, id.to_string());
                w.by_id.insert(id.to_string(), wd);
            }
            Err(e) => tracing::warn!(
                container_id = %id,
                error = %e,
                "cannot watch the container's exit file (fs.inotify.max_user_watches?); its exit is learned on the next query"
            ),
        }
    }

    /// Stops watching `id` (its dir is going away).
    pub fn remove(&self, id: &str) {
        let Some(shared) = &self.shared else { return };
        let wd = {
            let mut w = lock(&shared.watches);
            let wd = w.by_id.remove(id);
            if let Some(wd) = wd {
                w.by_wd.remove(&wd);
            }
            wd
        };
        if let Some(wd) = wd {
            // ENOENT/EINVAL: the dir is already gone, and the kernel dropped the watch.
            let _ = shared.inotify.rm_watch(wd);
        }
    }

    /// Is the thread running and watching `id`'s dir (its exit is folded in as it happens)?
    pub fn covers(&self, id: &str) -> bool {
        let Some(shared) = &self.shared else {
            return false;
        };
        lock(&self.stop).is_some() && lock(&shared.watches).by_id.contains_key(id)
    }

    /// Containers watched now.
    pub fn watched(&self) -> usize {
        self.shared
            .as_ref()
            .map_or(0, |s| lock(&s.watches).by_id.len())
    }

    /// Starts the thread that calls `on_exit(owner, id)` for each exit file written, while
    /// `owner` lives. It ends when this watcher is dropped or [`ExitWatcher::shutdown`] runs.
    /// A second call does nothing.
    pub fn spawn<T: Send + Sync + 'static>(
        &self,
        owner: Weak<T>,
        on_exit: impl Fn(&T, &str) + Send + 'static,
    ) -> std::io::Result<()> {
        let Some(shared) = self.shared.clone() else {
            return Ok(());
        };
        let mut stop = lock(&self.stop);
        if stop.is_some() {
            return Ok(());
        }
        let (rd, wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        std::thread::Builder::new()
            .name("exit-watch".into())
            .spawn(move || run(&shared, owner, on_exit, rd))?;
        *stop = Some(wr);
        Ok(())
    }

    /// Stops the thread.
    pub fn shutdown(&self) {
        lock(&self.stop).take();
    }
}

/// How often the watcher also checks every watched container against the host (a monitor
/// that died without writing the exit file leaves no event): off the request path, so lists
/// need not.
pub const SWEEP: std::time::Duration = std::time::Duration::from_secs(5);

fn run<T>(shared: &Shared, owner: Weak<T>, on_exit: impl Fn(&T, &str), stop: OwnedFd) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut last_sweep = std::time::Instant::now();
    loop {
        if last_sweep.elapsed() >= SWEEP {
            last_sweep = std::time::Instant::now();
            let ids: Vec<String> = lock(&shared.watches).by_id.keys().cloned().collect();
            let Some(o) = owner.upgrade() else { return };
            for id in ids {
                on_exit(&o, &id);
            }
        }
        let ready = {
            let mut fds = [
                PollFd::new(shared.inotify.as_fd(), PollFlags::POLLIN),
                PollFd::new(stop.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, PollTimeout::from(SWEEP.as_millis() as u16)) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    tracing::error!(error = %e, "exit watcher: poll failed; exits are learned on queries");
                    return;
                }
            }
            // The write end closed: the watcher was dropped.
            if fds[1].revents().is_some_and(|r| !r.is_empty()) {
                return;
            }
            fds[0].revents().is_some_and(|r| !r.is_empty())
        };
        if !ready {
            continue;
        }
        let events = match shared.inotify.read_events() {
            Ok(ev) => ev,
            Err(nix::errno::Errno::EAGAIN) => continue,
            Err(e) => {
                tracing::error!(error = %e, fd = shared.inotify.as_fd().as_raw_fd(), "exit watcher: read failed; exits are learned on queries");
                return;
            }
        };
        let mut exited = Vec::new();
        {
            let mut ws = lock(&shared.watches);
            for ev in events {
                if ev.mask.contains(AddWatchFlags::IN_IGNORED) {
                    // The dir was removed (or the watch was): forget it.
                    if let Some(id) = ws.by_wd.remove(&ev.wd) {
                        ws.by_id.remove(&id);
                    }
                    continue;
                }
                if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    tracing::warn!(
                        "exit watcher: inotify queue overflowed; checking every watched container"
                    );
                    exited.extend(ws.by_id.keys().cloned());
                    continue;
                }
                if ev.name.as_deref() == Some(std::ffi::OsStr::new(EXIT_FILE)) {
                    if let Some(id) = ws.by_wd.get(&ev.wd) {
                        exited.push(id.clone());
                    }
                }
            }
        }
        exited.sort();
        exited.dedup();
        let Some(o) = owner.upgrade() else { return };
        for id in exited {
            on_exit(&o, &id);
        }
    }
}
