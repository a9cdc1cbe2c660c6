//! CPU and memory use of one cgroup as CRI stats report them, and the open files those
//! reads keep between calls.
//!
//! A stats call reads six short files per container (CPU usage, memory usage and stat, three
//! PSI files). At 1,000 containers, opening and closing them was about half of
//! ListContainerStats' time (`perf`: path walks, kernfs opens and releases), against a
//! `pread` at offset 0 of a file kept open, which makes the kernel generate the file anew.
//! [`UsageCache`] keeps those files open per cgroup, within a budget of descriptors taken
//! from the daemon's own file limit; a file of a removed cgroup reads `ENODEV`, and its
//! entry is then opened again from the path (or dropped when the cgroup is gone).

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use super::{extra, hierarchies, join, key_value, Pressure};

/// CPU and memory use of one cgroup, as CRI stats report them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    pub cpu_nanos: Option<u64>,
    pub memory_bytes: Option<u64>,
    /// Memory use minus inactive file cache (what kubelet evicts on).
    pub working_set_bytes: Option<u64>,
    /// Pressure stall information of CPU, memory and I/O, where the kernel keeps it.
    pub psi: Psi,
}

/// Pressure stall information of a cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Psi {
    pub cpu: Option<Pressure>,
    pub memory: Option<Pressure>,
    pub io: Option<Pressure>,
}

/// Reads the usage of `cgroup` now, from whichever hierarchies hold cpu accounting and
/// memory, keeping nothing open.
pub fn usage(cgroup: &str) -> Usage {
    UsageFiles::open(cgroup).read().unwrap_or_default()
}

/// A cgroup directory opened once (`O_PATH`): its files are then opened relative to it, one
/// path component each, rather than by walking the whole cgroup path for every file.
struct CgDir(std::os::fd::OwnedFd);

impl CgDir {
    fn open(path: &Path) -> Option<CgDir> {
        use nix::fcntl::OFlag;
        nix::fcntl::open(
            path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .ok()
        .map(CgDir)
    }

    fn file(&self, name: &str) -> Option<File> {
        use nix::fcntl::OFlag;
        nix::fcntl::openat(
            &self.0,
            name,
            OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
            nix::sys::stat::Mode::empty(),
        )
        .ok()
        .map(File::from)
    }
}

/// What `parse` makes of the whole text of a cgroup file from its start (at most 64 KiB:
/// cgroup files are short), read into `buf` (one buffer for all of a cgroup's files) without
/// the size probes (`fstat`, `lseek`, a 32-byte first read) of `std::fs::read_to_string`,
/// for which kernfs has no useful answer. A read at offset 0 makes kernfs generate the file
/// anew, so a kept file reads today's figures; the text comes from one read (one generation,
/// however many calls read the same kept file at once): a file larger than the buffer is
/// read again from its start into a larger one, never continued at an offset, which would
/// join the end of another read's generation. `Ok(None)` for a missing or unreadable file;
/// `Err` when the file's cgroup was removed (kernfs answers `ENODEV`).
fn parse_file<T>(
    f: &Option<File>,
    buf: &mut Vec<u8>,
    parse: impl FnOnce(&str) -> Option<T>,
) -> Result<Option<T>, Gone> {
    const FIRST: usize = 16 << 10;
    const MOST: usize = 64 << 10;
    let Some(f) = f else { return Ok(None) };
    let mut size = FIRST;
    let n = loop {
        // (Grown only: what an earlier read left in it is never read, so it is not zeroed
        // again for every file.)
        if buf.len() < size {
            buf.resize(size, 0);
        }
        // The files read here (usage, memory.stat, cpu.stat, PSI) are one seq_file record
        // each, generated whole by the read at offset 0 and handed over as far as the
        // buffer goes: a read that did not fill it has it all.
        match f.read_at(&mut buf[..size], 0) {
            Ok(k) if k < size || size >= MOST => break k,
            Ok(_) => size *= 4,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => return Err(Gone),
            Err(_) => return Ok(None),
        }
    };
    Ok(std::str::from_utf8(&buf[..n]).ok().and_then(parse))
}

/// A kept file's cgroup was removed: open it again from its path.
struct Gone;

fn number(t: &str) -> Option<u64> {
    t.trim().parse().ok()
}

/// Where a cgroup's memory figures come from.
enum Memory {
    /// v1: `memory.usage_in_bytes` and `memory.stat`'s `total_inactive_file`.
    V1 {
        usage: Option<File>,
        stat: Option<File>,
    },
    /// v2: `memory.current` and `memory.stat`'s `inactive_file`.
    V2 {
        current: Option<File>,
        stat: Option<File>,
    },
    None,
}

/// The files [`usage`] reads of one cgroup, open.
struct UsageFiles {
    /// v1 `cpuacct.usage` (ns), else the unified hierarchy's `cpu.stat` (`usage_usec`).
    cpuacct: Option<File>,
    cpu_stat: Option<File>,
    memory: Memory,
    /// `cpu.pressure`, `memory.pressure`, `io.pressure` of the unified hierarchy.
    psi: [Option<File>; 3],
    /// When this entry was last read ([`UsageCache`]'s clock, seconds).
    last_used: AtomicU64,
}

impl UsageFiles {
    fn open(cgroup: &str) -> UsageFiles {
        let hs = hierarchies();
        let v1 = |controller: &str| {
            hs.iter()
                .find(|h| {
                    h.controllers
                        .as_ref()
                        .is_some_and(|c| c.iter().any(|c| c == controller))
                })
                .and_then(|h| CgDir::open(&join(&h.mount_point, cgroup)))
        };
        // The unified hierarchy (v2's, or a hybrid host's): PSI; on v2 every controller's
        // files (a file whose controller is not enabled there does not exist).
        let unified = hs
            .iter()
            .filter(|h| h.controllers.is_none())
            .find_map(|h| CgDir::open(&join(&h.mount_point, cgroup)));
        let in_unified = |name: &str| unified.as_ref().and_then(|d| d.file(name));
        let cpuacct = v1("cpuacct").and_then(|d| d.file("cpuacct.usage"));
        let cpu_stat = match cpuacct {
            Some(_) => None,
            None => in_unified("cpu.stat"),
        };
        let memory = match v1("memory") {
            Some(d) => Memory::V1 {
                usage: d.file("memory.usage_in_bytes"),
                stat: d.file("memory.stat"),
            },
            None if unified.is_some() => Memory::V2 {
                current: in_unified("memory.current"),
                stat: in_unified("memory.stat"),
            },
            None => Memory::None,
        };
        UsageFiles {
            cpuacct,
            cpu_stat,
            memory,
            psi: [
                in_unified("cpu.pressure"),
                in_unified("memory.pressure"),
                in_unified("io.pressure"),
            ],
            last_used: AtomicU64::new(0),
        }
    }

    /// How many descriptors this holds.
    fn fds(&self) -> usize {
        let (a, b) = match &self.memory {
            Memory::V1 { usage, stat } => (usage, stat),
            Memory::V2 { current, stat } => (current, stat),
            Memory::None => (&None, &None),
        };
        [&self.cpuacct, &self.cpu_stat, a, b]
            .into_iter()
            .chain(self.psi.iter())
            .filter(|f| f.is_some())
            .count()
    }

    /// The figures now; `None` once any file says its cgroup was removed.
    fn read(&self) -> Option<Usage> {
        self.try_read().ok()
    }

    fn try_read(&self) -> Result<Usage, Gone> {
        let mut buf = Vec::new();
        let b = &mut buf;
        let psi = Psi {
            cpu: parse_file(&self.psi[0], b, extra::parse_pressure)?,
            memory: parse_file(&self.psi[1], b, extra::parse_pressure)?,
            io: parse_file(&self.psi[2], b, extra::parse_pressure)?,
        };
        let cpu_nanos = match &self.cpuacct {
            Some(_) => parse_file(&self.cpuacct, b, number)?,
            None => {
                parse_file(&self.cpu_stat, b, |t| key_value(t, "usage_usec"))?.map(|us| us * 1000)
            }
        };
        let (usage, inactive) = match &self.memory {
            Memory::V1 { usage, stat } => (
                parse_file(usage, b, number)?,
                parse_file(stat, b, |t| key_value(t, "total_inactive_file"))?,
            ),
            Memory::V2 { current, stat } => (
                parse_file(current, b, number)?,
                parse_file(stat, b, |t| key_value(t, "inactive_file"))?,
            ),
            Memory::None => (None, None),
        };
        Ok(Usage {
            cpu_nanos,
            memory_bytes: usage,
            working_set_bytes: usage.map(|m| m.saturating_sub(inactive.unwrap_or(0))),
            psi,
        })
    }
}

/// Entries unread this long are closed (a container that stopped, or that is not asked
/// about any more): seconds.
const IDLE_SECS: u64 = 120;
/// How often the idle entries are looked for: seconds.
const SWEEP_SECS: u64 = 30;

/// The usage files of the cgroups stats calls read, kept open between calls within a
/// budget of descriptors; beyond it, files are opened for the call and closed after, as
/// [`usage`] does.
pub struct UsageCache {
    kept: Mutex<Kept>,
    /// Descriptors `kept` may hold (unset until first use: from the file limit).
    budget: OnceLock<usize>,
    clock: Instant,
    last_sweep: AtomicU64,
    /// Entries opened, for the tests: a kept entry is read without opening anything.
    opened: AtomicUsize,
}

/// The kept entries, and the descriptors they hold together.
#[derive(Default)]
struct Kept {
    files: HashMap<String, Arc<UsageFiles>>,
    fds: usize,
}

impl Kept {
    fn remove(&mut self, cgroup: &str) {
        if let Some(e) = self.files.remove(cgroup) {
            self.fds -= e.fds();
        }
    }
}

impl Default for UsageCache {
    fn default() -> Self {
        UsageCache {
            kept: Mutex::new(Kept::default()),
            budget: OnceLock::new(),
            clock: Instant::now(),
            last_sweep: AtomicU64::new(0),
            opened: AtomicUsize::new(0),
        }
    }
}

/// The descriptors the cache may keep: half of what the soft file limit leaves after 4,096
/// for everything else (7,952 under a limit of 20,000: about 1,300 cgroups of six files),
/// at most 65,536; none under a limit of 4,096 or less.
fn default_budget() -> usize {
    let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(0, |(soft, _)| soft);
    (soft.saturating_sub(4096) / 2).min(65_536) as usize
}

impl UsageCache {
    /// A cache that keeps at most `fds` descriptors.
    #[cfg(test)]
    fn with_budget(fds: usize) -> UsageCache {
        let c = UsageCache::default();
        let _ = c.budget.set(fds);
        c
    }

    fn now(&self) -> u64 {
        self.clock.elapsed().as_secs()
    }

    /// The usage of `cgroup` now, from its kept files where they are kept.
    pub fn usage(&self, cgroup: &str) -> Usage {
        let now = self.now();
        self.sweep(now);
        let kept = crate::state::lock(&self.kept).files.get(cgroup).cloned();
        if let Some(files) = kept {
            files.last_used.store(now, Ordering::Relaxed);
            if let Some(u) = files.read() {
                return u;
            }
            // Removed (and perhaps made again): open it anew below.
            self.forget(cgroup);
        }
        let files = self.open_files(cgroup);
        let Some(u) = files.read() else {
            return Usage::default();
        };
        self.keep(cgroup, files, now);
        u
    }

    /// Opens and keeps `cgroup`'s files (a container just started), unless kept already.
    pub fn open(&self, cgroup: &str) {
        if !crate::state::lock(&self.kept).files.contains_key(cgroup) {
            let files = self.open_files(cgroup);
            self.keep(cgroup, files, self.now());
        }
    }

    fn open_files(&self, cgroup: &str) -> UsageFiles {
        self.opened.fetch_add(1, Ordering::Relaxed);
        UsageFiles::open(cgroup)
    }

    fn keep(&self, cgroup: &str, files: UsageFiles, now: u64) {
        let n = files.fds();
        if n == 0 {
            return;
        }
        let budget = *self.budget.get_or_init(default_budget);
        files.last_used.store(now, Ordering::Relaxed);
        let mut kept = crate::state::lock(&self.kept);
        if kept.files.contains_key(cgroup) || kept.fds + n > budget {
            return;
        }
        kept.fds += n;
        kept.files.insert(cgroup.to_string(), Arc::new(files));
    }

    /// Closes the files kept for `cgroup` (its container is gone).
    pub fn forget(&self, cgroup: &str) {
        crate::state::lock(&self.kept).remove(cgroup);
    }

    /// Every [`SWEEP_SECS`], closes the entries unread for [`IDLE_SECS`].
    fn sweep(&self, now: u64) {
        let last = self.last_sweep.load(Ordering::Relaxed);
        if now < last + SWEEP_SECS
            || self
                .last_sweep
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let mut kept = crate::state::lock(&self.kept);
        let idle: Vec<String> = kept
            .files
            .iter()
            .filter(|(_, e)| now.saturating_sub(e.last_used.load(Ordering::Relaxed)) >= IDLE_SECS)
            .map(|(c, _)| c.clone())
            .collect();
        for c in idle {
            kept.remove(&c);
        }
    }

    /// Cgroups kept, and the descriptors they hold.
    #[cfg(test)]
    fn kept(&self) -> (usize, usize) {
        let kept = crate::state::lock(&self.kept);
        (kept.files.len(), kept.fds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A file longer than the first buffer is read again from its start, whole, in one read;
    /// one over the cap is cut at it; the buffer left larger by one does not leak its bytes
    /// into the next, shorter file's text.
    #[test]
    fn a_long_file_is_read_whole_from_its_start() {
        let d = tempfile::tempdir().unwrap();
        let write = |name: &str, len: usize, b: u8| {
            let p = d.path().join(name);
            std::fs::write(&p, vec![b; len]).unwrap();
            Some(File::open(p).unwrap())
        };
        let mut buf = Vec::new();
        let len = |f: &Option<File>, buf: &mut Vec<u8>| {
            parse_file(f, buf, |t| Some(t.to_string()))
                .ok()
                .flatten()
                .unwrap()
        };
        let long = write("long", 40 << 10, b'a');
        assert_eq!(len(&long, &mut buf), "a".repeat(40 << 10));
        let over = write("over", 100 << 10, b'b');
        assert_eq!(len(&over, &mut buf).len(), 64 << 10);
        let short = write("short", 3, b'c');
        assert_eq!(len(&short, &mut buf), "ccc");
    }

    /// A cgroup of this test in every hierarchy, removed on drop (with its process killed).
    struct TestCgroup {
        name: String,
        child: Option<std::process::Child>,
    }

    impl TestCgroup {
        fn make(name: &str) -> TestCgroup {
            let cg = TestCgroup {
                name: name.to_string(),
                child: None,
            };
            for d in cg.dirs() {
                std::fs::create_dir_all(&d).unwrap();
            }
            cg
        }

        /// Its dirs in the hierarchies [`usage`] reads: the unified one, cpuacct's and
        /// memory's (not cpuset's, say, whose new dirs take no process until set up).
        fn dirs(&self) -> Vec<PathBuf> {
            hierarchies()
                .iter()
                .filter(|h| {
                    h.controllers
                        .as_ref()
                        .is_none_or(|c| c.iter().any(|c| c == "cpuacct" || c == "memory"))
                })
                .map(|h| join(&h.mount_point, &self.name))
                .collect()
        }

        /// A process that spins, in this cgroup in each of those hierarchies.
        fn spin(&mut self) {
            let child = std::process::Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            let pid = child.id();
            // Kept before the moves, so that a failed one still kills it (on drop).
            self.child = Some(child);
            for d in self.dirs() {
                std::fs::write(d.join("cgroup.procs"), pid.to_string())
                    .unwrap_or_else(|e| panic!("moving {pid} into {}: {e}", d.display()));
            }
        }

        fn remove(&mut self) {
            if let Some(mut c) = self.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
            for d in self.dirs() {
                for _ in 0..100 {
                    match std::fs::remove_dir(&d) {
                        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                            std::thread::sleep(std::time::Duration::from_millis(10))
                        }
                        _ => break,
                    }
                }
            }
        }
    }

    impl Drop for TestCgroup {
        fn drop(&mut self) {
            self.remove();
        }
    }

    /// A cgroup of this test named for `tag` (with a spinning process in it when `spin`),
    /// or `None`, said, where cgroups cannot be made (not root).
    fn test_cgroup(tag: &str, spin: bool) -> Option<(String, TestCgroup)> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: making cgroups needs root");
            return None;
        }
        let name = format!("sandboxd-test-usage-{tag}-{}", std::process::id());
        let mut cg = TestCgroup::make(&name);
        if spin {
            cg.spin();
        }
        Some((name, cg))
    }

    #[test]
    fn a_kept_cgroup_reads_fresh_figures_and_a_removed_one_is_let_go() {
        let Some((name, mut cg)) = test_cgroup("kept", true) else {
            return;
        };
        let cache = UsageCache::with_budget(64);
        let first = cache.usage(&name);
        let (entries, fds) = cache.kept();
        assert_eq!(entries, 1, "the cgroup's files are kept");
        assert!(fds >= 3, "at least CPU and memory files are kept: {fds}");
        assert!(first.cpu_nanos.is_some() && first.memory_bytes.is_some());
        std::thread::sleep(std::time::Duration::from_millis(300));
        let second = cache.usage(&name);
        assert_eq!(
            cache.opened.load(Ordering::Relaxed),
            1,
            "read from kept files"
        );
        // At least 100 ms of the 300 the spinner had.
        assert!(
            second.cpu_nanos.unwrap() >= first.cpu_nanos.unwrap() + 100_000_000,
            "a kept file reads today's figure: {first:?} then {second:?}"
        );
        assert!(second.memory_bytes.is_some() && second.working_set_bytes.is_some());

        // Removed: no figures, nothing kept.
        cg.remove();
        let gone = cache.usage(&name);
        assert_eq!(gone, Usage::default());
        assert_eq!(cache.kept(), (0, 0));
        // Made again under the same path: the new cgroup's figures (nothing ran in it).
        let again = TestCgroup::make(&name);
        let fresh = cache.usage(&name);
        assert!(fresh.cpu_nanos.unwrap_or(0) < second.cpu_nanos.unwrap());
        assert_eq!(cache.kept().0, 1);
        cache.forget(&name);
        assert_eq!(cache.kept(), (0, 0));
        drop(again);
    }

    #[test]
    fn past_its_budget_the_cache_reads_without_keeping() {
        let Some((name, _cg)) = test_cgroup("budget", true) else {
            return;
        };
        let cache = UsageCache::with_budget(2);
        let u = cache.usage(&name);
        assert!(u.cpu_nanos.is_some() && u.memory_bytes.is_some(), "{u:?}");
        assert_eq!(cache.kept(), (0, 0));
        let _ = cache.usage(&name);
        assert_eq!(cache.opened.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn idle_entries_are_closed() {
        let Some((name, _cg)) = test_cgroup("idle", false) else {
            return;
        };
        let cache = UsageCache::with_budget(64);
        let _ = cache.usage(&name);
        assert_eq!(cache.kept().0, 1);
        // As if IDLE_SECS had passed since it was read.
        cache.sweep(IDLE_SECS + SWEEP_SECS);
        assert_eq!(cache.kept(), (0, 0));
        // Opened again as StartContainer does, without a read.
        cache.open(&name);
        assert_eq!(cache.kept().0, 1);
    }
}
