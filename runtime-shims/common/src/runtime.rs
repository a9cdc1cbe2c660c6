//! What the daemon and the monitor both read from an OCI runtime (runc, crun, runsc: its
//! JSON log, `state`, `wait`) and how both run it.

use std::path::Path;
use std::process::Command;

use serde::Deserialize;

/// `runtime state` output, the fields we use.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct RuntimeState {
    pub status: String,
    #[serde(default)]
    pub pid: i32,
    /// The container's bundle dir (OCI state's `bundle`).
    #[serde(default)]
    pub bundle: String,
}

/// `runtime wait` output (runsc): `{"id":…,"exitStatus":N}`, N being 128+signal for a
/// killed process. `None` when it printed no such answer.
pub fn parse_wait(out: &[u8]) -> Option<i32> {
    #[derive(Deserialize)]
    struct Wait {
        #[serde(rename = "exitStatus")]
        exit_status: i32,
    }
    serde_json::from_slice::<Wait>(out)
        .ok()
        .map(|w| w.exit_status)
}

/// The `msg` of the last error-level (`error` or `fatal`) line of a runtime's JSON log
/// (`--log-format json`); `None` without one (or when that line has no `msg`).
pub fn last_log_error(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    last_error(&text).flatten()
}

/// What the runtime said last, to explain a failure: [`last_log_error`] if the log has an
/// error-level line, else the last line's `msg`, or that line as it is when it has none.
pub fn last_log_message(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    if let Some(msg) = last_error(&text) {
        return msg;
    }
    let line = text.lines().rev().find(|l| !l.trim().is_empty())?;
    Some(
        parse(line)
            .and_then(|v| message(&v))
            .unwrap_or_else(|| line.to_string()),
    )
}

/// `Some(its msg)` for the last error-level line; `None` when there is none.
fn last_error(text: &str) -> Option<Option<String>> {
    text.lines()
        .rev()
        .filter_map(parse)
        .find(|v| {
            matches!(
                v.get("level").and_then(|l| l.as_str()),
                Some("error" | "fatal")
            )
        })
        .map(|v| message(&v))
}

fn parse(line: &str) -> Option<serde_json::Value> {
    serde_json::from_str(line).ok()
}

fn message(v: &serde_json::Value) -> Option<String> {
    v.get("msg").and_then(|m| m.as_str()).map(str::to_string)
}

/// `RUNTIME [runtime args] --root DIR`, the start of every runtime call: the handler's own
/// flags come before `--root` and the subcommand. Its child inherits the spawning thread's
/// signal mask: the daemon spawns runtime calls from a thread that blocks none (so std can
/// `posix_spawn` them instead of forking the daemon); the monitor, which blocks signals, uses
/// [`command_unblocked`].
pub fn command(runtime: &Path, runtime_args: &[String], root: &Path) -> Command {
    let mut c = Command::new(runtime);
    c.args(runtime_args).arg("--root").arg(root);
    c
}

/// [`command`] whose child starts with no signal blocked whatever its parent blocks (a
/// `pre_exec`, so the spawn forks: cheap in a process as small as the monitor).
pub fn command_unblocked(runtime: &Path, runtime_args: &[String], root: &Path) -> Command {
    let mut c = command(runtime, runtime_args, root);
    unblock_signals(&mut c);
    c
}

/// Makes `cmd` start with no signal blocked. The monitor blocks the signals it reads from a
/// signalfd (SIGCHLD, SIGUSR1, SIGTERM, …), a mask that a child inherits across exec; the
/// Go runtime of runc then unblocks only the signals it handles itself, so a container's
/// process would start with SIGUSR1 blocked: a stop signal, log-reopen or reload signal it
/// could never receive.
pub fn unblock_signals(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: sigemptyset and sigprocmask are async-signal-safe; the set is a local of the
    // child's stack.
    unsafe {
        cmd.pre_exec(|| {
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            if libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Makes `cmd` create its files root's alone (umask 077): the runtime's pid files, logs and
/// state under our state root. (`runtime create`'s umask is left alone: the container's
/// cgroup directories it makes must stay readable inside.)
pub fn private_umask(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: umask is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0o077);
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_log(text: &str, f: impl FnOnce(&Path)) {
        let p = std::env::temp_dir().join(format!(
            "shim-common-log-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::write(&p, text).unwrap();
        f(&p);
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn log_errors() {
        let log = concat!(
            r#"{"level":"error","msg":"first","time":"t"}"#,
            "\n",
            r#"{"level":"error","msg":"a \"quoted\" thing\nline2 \u00e9","time":"t"}"#,
            "\n",
            r#"{"level":"info","msg":"later","time":"t"}"#,
            "\n\n"
        );
        with_log(log, |p| {
            assert_eq!(last_log_error(p).unwrap(), "a \"quoted\" thing\nline2 é");
            assert_eq!(last_log_message(p), last_log_error(p));
        });
        // crun writes its JSON with spaces.
        with_log(r#"{"msg": "spaced", "level": "error", "time": "t"}"#, |p| {
            assert_eq!(last_log_error(p).unwrap(), "spaced");
        });
        with_log(r#"{"level":"fatal","time":"t"}"#, |p| {
            assert_eq!(last_log_error(p), None);
            assert_eq!(last_log_message(p), None);
        });
        with_log("{\"level\":\"warning\",\"msg\":\"w\"}\nnot json\n", |p| {
            assert_eq!(last_log_error(p), None);
            assert_eq!(last_log_message(p).unwrap(), "not json");
        });
        with_log("{\"level\":\"warning\",\"msg\":\"w\"}\n", |p| {
            assert_eq!(last_log_message(p).unwrap(), "w");
        });
        with_log("", |p| assert_eq!(last_log_message(p), None));
        assert_eq!(last_log_error(Path::new("/nonexistent/log")), None);
    }

    #[test]
    fn runtime_command() {
        let c = command(
            Path::new("/bin/runsc"),
            &["--platform=ptrace".into()],
            Path::new("/run/r"),
        );
        assert_eq!(c.get_program(), "/bin/runsc");
        let args: Vec<_> = c.get_args().collect();
        assert_eq!(args, ["--platform=ptrace", "--root", "/run/r"]);
    }

    #[test]
    fn runtime_answers() {
        assert_eq!(
            parse_wait(b"{\"id\":\"x\",\"exitStatus\":137}\n"),
            Some(137)
        );
        assert_eq!(parse_wait(b"{\"id\":\"x\"}"), None);
        assert_eq!(parse_wait(b""), None);
        let s: RuntimeState = serde_json::from_str(
            "{\n  \"id\": \"x\",\n  \"pid\": 5,\n  \"status\": \"created\"\n}",
        )
        .unwrap();
        assert_eq!(s.status, "created");
        assert_eq!(s.pid, 5);
    }
}
