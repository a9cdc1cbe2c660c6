//! The files the monitor leaves for the daemon in a container's dir, and how both write
//! files atomically.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::RawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What an atomic write guarantees beyond "old content or new, never torn".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// tmp + rename only: a reader (a daemon that restarts) sees the old content or the new,
    /// but a crash of the host may lose the write. For what means nothing after a reboot
    /// (the monitor's pid, a container's exit: the container is gone either way), where a
    /// fsync would sit on every stop's path.
    Rename,
    /// tmp + fsync + rename + fsync of the dir: the new content survives a crash once the
    /// call returned.
    Fsync,
}

/// Which step of [`write_atomic`] failed, on which path.
#[derive(Debug)]
pub struct WriteError {
    /// `create`, `write`, `fsync` (the tmp file), `rename into` (the target) or `fsync dir`.
    pub op: &'static str,
    pub path: PathBuf,
    pub source: std::io::Error,
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.op, self.path.display(), self.source)
    }
}

impl std::error::Error for WriteError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

fn err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> WriteError + 'a {
    move |source| WriteError {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `data` to `path` atomically, mode 0600, through `path` with the extension `tmp`
/// (opened without following a symlink). Returns the time spent in fsync.
pub fn write_atomic(
    path: &Path,
    data: &[u8],
    durability: Durability,
) -> Result<Duration, WriteError> {
    let durable = durability == Durability::Fsync;
    let mut synced = Duration::ZERO;
    let tmp = path.with_extension("tmp");
    {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
            .map_err(err("create", &tmp))?;
        f.write_all(data).map_err(err("write", &tmp))?;
        if durable {
            let t = Instant::now();
            f.sync_data().map_err(err("fsync", &tmp))?;
            synced += t.elapsed();
        }
    }
    // The rename is durable only once the directory is, a replacement as much as a new
    // name: the old content is a state the caller has since answered past (a pod whose
    // RunPodSandbox had answered came back from a power cut as `creating` and was rolled
    // back: the day-two lane's power cuts, with the replacing rename left to ext4's next
    // commit).
    std::fs::rename(&tmp, path).map_err(err("rename into", path))?;
    if !durable {
        return Ok(synced);
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let t = Instant::now();
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(err("fsync dir", dir))?;
    Ok(synced + t.elapsed())
}

/// The pid in a pid file (decimal, surrounding whitespace ignored), if there is one. The file
/// is read with a size bound and without following a symlink.
pub fn read_pid(pid_file: &Path) -> Option<i32> {
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(pid_file)
        .ok()?;
    let mut buf = [0u8; 32];
    let n = f.read(&mut buf).ok()?;
    std::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok()
}

/// Records `pid` in `pid_file` (as [`read_pid`] reads it), atomically, not fsynced.
pub fn write_pid(pid_file: &Path, pid: i32) -> std::io::Result<()> {
    write_atomic(pid_file, format!("{pid}\n").as_bytes(), Durability::Rename)
        .map(drop)
        .map_err(|e| e.source)
}

/// The name, in the bundle, of the (empty) file the monitor writes once it watches the
/// container's OOM kills, or knows it never will (no cgroup v2 memory controller, the
/// container gone). StartContainer waits for it briefly: under the systemd driver the runtime
/// may return from `create` before the container is in its scope, and a container started
/// before the monitor watches that scope could be OOM-killed, its scope removed, unseen.
pub const OOM_WATCH: &str = "oom-watch";

/// The name, in the bundle, of the file where the monitor of a container whose stdio the
/// runtime takes at `start` (runsc's containers inside a sandbox) publishes its ends of the
/// container's pipes; the daemon opens them as `/proc/<monitor>/fd/N`.
pub const STDIO_FDS: &str = "stdio-fds";

/// The `stdio-fds` line: the monitor's fds for the container's stdin (read end), stdout and
/// stderr (write ends); -1 for none.
pub fn format_stdio_fds(fds: [RawFd; 3]) -> String {
    format!("{} {} {}\n", fds[0], fds[1], fds[2])
}

/// Reads a `stdio-fds` line.
pub fn parse_stdio_fds(text: &str) -> Option<[RawFd; 3]> {
    let fds: Vec<RawFd> = text
        .split_whitespace()
        .filter_map(|n| n.parse().ok())
        .collect();
    fds.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    struct TestDir(PathBuf);

    impl Drop for TestDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn test_dir(name: &str) -> TestDir {
        let d = std::env::temp_dir().join(format!("shim-common-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        TestDir(d)
    }

    #[test]
    fn atomic_writes_and_pids() {
        use std::os::unix::fs::PermissionsExt;
        let d = test_dir("files");
        for durability in [Durability::Rename, Durability::Fsync] {
            let p = d.0.join("f.json");
            write_atomic(&p, b"one", durability).unwrap();
            write_atomic(&p, b"two", durability).unwrap();
            assert_eq!(std::fs::read(&p).unwrap(), b"two");
            let mode = std::fs::metadata(&p).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
            assert!(!d.0.join("f.tmp").exists());
            std::fs::remove_file(&p).unwrap();
        }
        let e = write_atomic(&d.0.join("none/x"), b"", Durability::Fsync).unwrap_err();
        assert_eq!(e.op, "create");
        assert!(e.path.ends_with("none/x.tmp"), "{e}");

        let pid = d.0.join("pid");
        assert_eq!(read_pid(&pid), None);
        write_pid(&pid, 4242).unwrap();
        assert_eq!(std::fs::read_to_string(&pid).unwrap(), "4242\n");
        assert_eq!(read_pid(&pid), Some(4242));
        std::fs::write(&pid, "  17").unwrap();
        assert_eq!(read_pid(&pid), Some(17));
        let link = d.0.join("link");
        std::os::unix::fs::symlink(&pid, &link).unwrap();
        assert_eq!(
            read_pid(&link),
            None,
            "a pid file behind a symlink is not read"
        );
    }

    #[test]
    fn stdio_fds() {
        let line = format_stdio_fds([-1, 7, 9]);
        assert_eq!(line, "-1 7 9\n");
        assert_eq!(parse_stdio_fds(&line), Some([-1, 7, 9]));
        assert_eq!(parse_stdio_fds("1 2"), None);
        assert_eq!(parse_stdio_fds(""), None);
    }
}

/// The name, in the bundle, of the file by which the daemon asks the monitor to reopen the
/// CRI log (ReopenContainerLog): the daemon writes a token there, then sends SIGUSR1.
pub const LOG_REOPEN_REQUEST: &str = "log-reopen";

/// The name, in the bundle, of the monitor's answer to [`LOG_REOPEN_REQUEST`], written
/// atomically once the log was reopened (or could not be): `TOKEN ok` or `TOKEN error: WHY`.
/// The daemon returns only when it reads its own token there.
pub const LOG_REOPEN_DONE: &str = "log-reopen.done";

/// The monitor's answer line for `token`: `Ok` when the log was reopened (and created).
pub fn format_log_reopen(token: &str, result: &Result<(), String>) -> String {
    match result {
        Ok(()) => format!("{token} ok\n"),
        Err(e) => format!("{token} error: {}\n", e.replace('\n', " ")),
    }
}

/// Reads an answer line: `Some(result)` when it answers `token`, `None` for another token
/// (an earlier request) or no answer.
pub fn parse_log_reopen(text: &str, token: &str) -> Option<Result<(), String>> {
    let line = text.lines().next()?;
    let (t, rest) = line.split_once(' ')?;
    if t != token || token.is_empty() {
        return None;
    }
    Some(match rest.strip_prefix("error: ") {
        None if rest == "ok" => Ok(()),
        None => Err(format!("unreadable answer {rest:?}")),
        Some(why) => Err(why.to_string()),
    })
}

#[cfg(test)]
mod log_reopen_tests {
    use super::*;

    #[test]
    fn answers_round_trip_and_match_only_their_token() {
        let ok = format_log_reopen("a1", &Ok(()));
        assert_eq!(parse_log_reopen(&ok, "a1"), Some(Ok(())));
        assert_eq!(parse_log_reopen(&ok, "b2"), None);
        let err = format_log_reopen("a1", &Err("open /x: No such\nfile".into()));
        assert_eq!(
            parse_log_reopen(&err, "a1"),
            Some(Err("open /x: No such file".into()))
        );
        assert_eq!(parse_log_reopen("", "a1"), None);
        assert_eq!(parse_log_reopen("a1 ok\n", ""), None);
    }
}
