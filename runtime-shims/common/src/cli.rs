//! The monitor's command line: what the daemon passes ([`MonitorArgs::to_args`],
//! [`ExecArgs::to_args`]) and what the monitor accepts ([`MonitorArgs::parse`],
//! [`ExecArgs::parse`]), from one list of option names.
//!
//! ```text
//! sandboxd-monitor --runtime PATH --runtime-root DIR --id ID --bundle DIR
//!   --pid-file FILE --exit-file FILE --runtime-log FILE --monitor-pid-file FILE
//!   [--log-path FILE] [--attach-socket SOCK] [--stdin none|open|once]
//!   [--console-socket SOCK] [--runtime-mount-ns PATH] [--runtime-arg FLAG]...
//! sandboxd-monitor exec --runtime PATH --runtime-root DIR [--runtime-arg FLAG]...
//!   --id ID --pid-file FILE [--console-socket SOCK] [--process FILE]
//!   [--internal-pid-file FILE] -- CMD...
//! ```

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::PathBuf;

const RUNTIME: &str = "--runtime";
const RUNTIME_ARG: &str = "--runtime-arg";
const RUNTIME_ROOT: &str = "--runtime-root";
const ID: &str = "--id";
const BUNDLE: &str = "--bundle";
const PID_FILE: &str = "--pid-file";
const EXIT_FILE: &str = "--exit-file";
const RUNTIME_LOG: &str = "--runtime-log";
const MONITOR_PID_FILE: &str = "--monitor-pid-file";
const LOG_PATH: &str = "--log-path";
const ATTACH_SOCKET: &str = "--attach-socket";
const STDIN: &str = "--stdin";
const CONSOLE_SOCKET: &str = "--console-socket";
const PROCESS: &str = "--process";
const INTERNAL_PID_FILE: &str = "--internal-pid-file";
const RUNTIME_MOUNT_NS: &str = "--runtime-mount-ns";
const VERSION: &str = "--version";
/// The first argument of the exec mode.
pub const EXEC: &str = "exec";

/// What the container's stdin is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StdinMode {
    /// `/dev/null`.
    #[default]
    None,
    /// A pipe kept open for attach clients.
    Open,
    /// A pipe closed when the first attach client that wrote to it goes away or closes it.
    Once,
}

impl StdinMode {
    pub fn as_str(self) -> &'static str {
        match self {
            StdinMode::None => "none",
            StdinMode::Open => "open",
            StdinMode::Once => "once",
        }
    }

    fn parse(v: Option<&str>) -> Result<StdinMode, String> {
        match v {
            None | Some("none") => Ok(StdinMode::None),
            Some("open") => Ok(StdinMode::Open),
            Some("once") => Ok(StdinMode::Once),
            Some(m) => Err(format!("{STDIN} {m}: expected none, open or once")),
        }
    }
}

/// The monitor of one container: `runtime create` under it, then its stdio, its exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonitorArgs {
    pub runtime: PathBuf,
    /// Flags for the runtime before its subcommand (`--runtime-arg`, repeatable).
    pub runtime_args: Vec<String>,
    pub runtime_root: PathBuf,
    pub id: String,
    pub bundle: PathBuf,
    /// Where the runtime writes the container's pid.
    pub pid_file: PathBuf,
    /// Where the monitor records the exit ([`crate::exit::ExitInfo`]).
    pub exit_file: PathBuf,
    /// The runtime's JSON log.
    pub runtime_log: PathBuf,
    /// Where the monitor's launcher records the monitor's pid.
    pub monitor_pid_file: PathBuf,
    /// The CRI log of the container's stdout and stderr.
    pub log_path: Option<PathBuf>,
    /// Unix socket where attach clients get the output and may write stdin.
    pub attach_socket: Option<PathBuf>,
    pub stdin: StdinMode,
    /// The container has a terminal: the runtime hands its master to this socket, and the
    /// monitor reads output from it and writes attach clients' input to it.
    pub console_socket: Option<PathBuf>,
    /// The mount namespace `runtime create` runs in (the daemon's small one for this
    /// container, as `/proc/<daemon>/fd/<n>` while the daemon holds it); without it, the
    /// monitor's own.
    pub runtime_mount_ns: Option<PathBuf>,
}

/// What the monitor's command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// `--version`: print the version and exit.
    Version,
    Monitor(Box<MonitorArgs>),
}

impl MonitorArgs {
    /// The monitor's arguments (without the program name).
    pub fn to_args(&self) -> Vec<OsString> {
        let mut a = Args::default();
        a.opt(RUNTIME, &self.runtime)
            .opt(RUNTIME_ROOT, &self.runtime_root);
        for r in &self.runtime_args {
            a.opt(RUNTIME_ARG, r);
        }
        a.opt(ID, &self.id)
            .opt(BUNDLE, &self.bundle)
            .opt(PID_FILE, &self.pid_file)
            .opt(EXIT_FILE, &self.exit_file)
            .opt(RUNTIME_LOG, &self.runtime_log)
            .opt(MONITOR_PID_FILE, &self.monitor_pid_file);
        if let Some(l) = &self.log_path {
            a.opt(LOG_PATH, l);
        }
        if let Some(s) = &self.attach_socket {
            a.opt(ATTACH_SOCKET, s);
        }
        if self.stdin != StdinMode::None {
            a.opt(STDIN, self.stdin.as_str());
        }
        if let Some(s) = &self.console_socket {
            a.opt(CONSOLE_SOCKET, s);
        }
        if let Some(p) = &self.runtime_mount_ns {
            a.opt(RUNTIME_MOUNT_NS, p);
        }
        a.0
    }

    /// Reads the arguments (without the program name). Options may come in any order; a
    /// repeated one counts last.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Parsed, String> {
        const KNOWN: [&str; 13] = [
            RUNTIME_MOUNT_NS,
            RUNTIME,
            RUNTIME_ROOT,
            ID,
            BUNDLE,
            PID_FILE,
            EXIT_FILE,
            RUNTIME_LOG,
            MONITOR_PID_FILE,
            LOG_PATH,
            ATTACH_SOCKET,
            STDIN,
            CONSOLE_SOCKET,
        ];
        let mut v: HashMap<String, String> = HashMap::new();
        let mut runtime_args = Vec::new();
        let mut it = args.into_iter();
        while let Some(k) = it.next() {
            if k == VERSION {
                return Ok(Parsed::Version);
            }
            if k == RUNTIME_ARG {
                runtime_args.push(value(&mut it, &k)?);
                continue;
            }
            if !KNOWN.contains(&k.as_str()) {
                return Err(format!("unknown option {k}"));
            }
            let val = value(&mut it, &k)?;
            v.insert(k, val);
        }
        let mut req = |k: &str| v.remove(k).ok_or_else(|| format!("{k} is required"));
        Ok(Parsed::Monitor(Box::new(MonitorArgs {
            runtime: req(RUNTIME)?.into(),
            runtime_args,
            runtime_root: req(RUNTIME_ROOT)?.into(),
            id: req(ID)?,
            bundle: req(BUNDLE)?.into(),
            pid_file: req(PID_FILE)?.into(),
            exit_file: req(EXIT_FILE)?.into(),
            runtime_log: req(RUNTIME_LOG)?.into(),
            monitor_pid_file: req(MONITOR_PID_FILE)?.into(),
            log_path: v.remove(LOG_PATH).map(PathBuf::from),
            attach_socket: v.remove(ATTACH_SOCKET).map(PathBuf::from),
            console_socket: v.remove(CONSOLE_SOCKET).map(PathBuf::from),
            stdin: StdinMode::parse(v.remove(STDIN).as_deref())?,
            runtime_mount_ns: v.remove(RUNTIME_MOUNT_NS).map(PathBuf::from),
        })))
    }
}

/// `sandboxd-monitor exec …`: one process run in a running container with `runtime exec
/// --detach`, reaped by the monitor, whose exit status the monitor exits with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecArgs {
    pub runtime: PathBuf,
    pub runtime_args: Vec<String>,
    pub runtime_root: PathBuf,
    pub id: String,
    /// Where the runtime writes the exec'd process's pid.
    pub pid_file: PathBuf,
    /// The process gets a terminal, handed to this socket.
    pub console_socket: Option<PathBuf>,
    /// The whole OCI process to run (`runtime exec --process`): the container's user,
    /// groups, capabilities, env, cwd and no_new_privs with `cmd` as its args. The monitor
    /// removes it once the runtime has read it.
    pub process_file: Option<PathBuf>,
    /// Where a sandboxed runtime (runsc) writes the process's pid inside its sandbox: the
    /// host pid in `pid_file` is only runsc's own, and the process is signalled by this one.
    pub internal_pid_file: Option<PathBuf>,
    /// The command and its arguments.
    pub cmd: Vec<String>,
}

impl ExecArgs {
    /// The monitor's arguments, starting with `exec` (without the program name).
    pub fn to_args(&self) -> Vec<OsString> {
        let mut a = Args::default();
        a.word(EXEC)
            .opt(RUNTIME, &self.runtime)
            .opt(RUNTIME_ROOT, &self.runtime_root);
        for r in &self.runtime_args {
            a.opt(RUNTIME_ARG, r);
        }
        a.opt(ID, &self.id).opt(PID_FILE, &self.pid_file);
        if let Some(s) = &self.console_socket {
            a.opt(CONSOLE_SOCKET, s);
        }
        if let Some(p) = &self.process_file {
            a.opt(PROCESS, p);
        }
        if let Some(p) = &self.internal_pid_file {
            a.opt(INTERNAL_PID_FILE, p);
        }
        a.word("--");
        for c in &self.cmd {
            a.word(c);
        }
        a.0
    }

    /// Reads the arguments that follow `exec`.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<ExecArgs, String> {
        let mut opts: HashMap<String, String> = HashMap::new();
        let mut runtime_args = Vec::new();
        let mut it = args.into_iter();
        let mut cmd = Vec::new();
        while let Some(k) = it.next() {
            if k == "--" {
                cmd = it.collect();
                break;
            }
            match k.as_str() {
                RUNTIME_ARG => runtime_args.push(value(&mut it, &k)?),
                RUNTIME | RUNTIME_ROOT | ID | PID_FILE | CONSOLE_SOCKET | PROCESS
                | INTERNAL_PID_FILE => {
                    let v = value(&mut it, &k)?;
                    opts.insert(k, v);
                }
                _ => return Err(format!("exec: unknown option {k}")),
            }
        }
        if cmd.is_empty() {
            return Err("exec: no command after --".into());
        }
        let mut req = |k: &str| {
            opts.remove(k)
                .ok_or_else(|| format!("exec: {k} is required"))
        };
        let pid_file = req(PID_FILE)?.into();
        Ok(ExecArgs {
            runtime: req(RUNTIME)?.into(),
            runtime_args,
            runtime_root: req(RUNTIME_ROOT)?.into(),
            id: req(ID)?,
            pid_file,
            console_socket: opts.remove(CONSOLE_SOCKET).map(PathBuf::from),
            process_file: opts.remove(PROCESS).map(PathBuf::from),
            internal_pid_file: opts.remove(INTERNAL_PID_FILE).map(PathBuf::from),
            cmd,
        })
    }
}

fn value(it: &mut impl Iterator<Item = String>, k: &str) -> Result<String, String> {
    it.next().ok_or_else(|| format!("{k} needs a value"))
}

/// An argument list being built.
#[derive(Default)]
struct Args(Vec<OsString>);

impl Args {
    fn word(&mut self, w: impl Into<OsString>) -> &mut Self {
        self.0.push(w.into());
        self
    }

    fn opt(&mut self, name: &str, v: impl Into<OsString>) -> &mut Self {
        self.word(name).word(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(a: Vec<OsString>) -> Vec<String> {
        a.into_iter().map(|s| s.into_string().unwrap()).collect()
    }

    fn monitor_args() -> MonitorArgs {
        MonitorArgs {
            runtime: "/usr/bin/runc".into(),
            runtime_args: vec!["--systemd-cgroup".into(), "--debug".into()],
            runtime_root: "/run/r".into(),
            id: "abc".into(),
            bundle: "/c/abc".into(),
            pid_file: "/c/abc/pid".into(),
            exit_file: "/c/abc/exit".into(),
            runtime_log: "/c/abc/runtime.log".into(),
            monitor_pid_file: "/c/abc/monitor.pid".into(),
            log_path: Some("/logs/0.log".into()),
            attach_socket: Some("/s/a.sock".into()),
            stdin: StdinMode::Once,
            console_socket: None,
            runtime_mount_ns: None,
        }
    }

    #[test]
    fn monitor_args_round_trip() {
        let a = monitor_args();
        let argv = strings(a.to_args());
        assert_eq!(
            argv.join(" "),
            "--runtime /usr/bin/runc --runtime-root /run/r --runtime-arg --systemd-cgroup \
             --runtime-arg --debug --id abc --bundle /c/abc --pid-file /c/abc/pid \
             --exit-file /c/abc/exit --runtime-log /c/abc/runtime.log \
             --monitor-pid-file /c/abc/monitor.pid --log-path /logs/0.log \
             --attach-socket /s/a.sock --stdin once"
        );
        assert_eq!(MonitorArgs::parse(argv), Ok(Parsed::Monitor(Box::new(a))));
        let minimal = MonitorArgs {
            runtime_args: Vec::new(),
            log_path: None,
            attach_socket: None,
            stdin: StdinMode::None,
            console_socket: Some("/s/c.sock".into()),
            runtime_mount_ns: Some("/proc/1/fd/7".into()),
            ..monitor_args()
        };
        let argv = strings(minimal.to_args());
        assert!(!argv.iter().any(|a| a == STDIN), "{argv:?}");
        assert!(argv.ends_with(&["--runtime-mount-ns".into(), "/proc/1/fd/7".into()]));
        assert_eq!(
            MonitorArgs::parse(argv),
            Ok(Parsed::Monitor(Box::new(minimal)))
        );
    }

    #[test]
    fn monitor_args_errors() {
        let parse = |s: &str| MonitorArgs::parse(s.split_whitespace().map(String::from));
        assert_eq!(parse("--version --bogus"), Ok(Parsed::Version));
        assert_eq!(parse("--bogus x"), Err("unknown option --bogus".into()));
        assert_eq!(parse("--id"), Err("--id needs a value".into()));
        assert_eq!(
            parse("--runtime-arg"),
            Err("--runtime-arg needs a value".into())
        );
        assert_eq!(parse("--id x"), Err("--runtime is required".into()));
        let mut argv = strings(monitor_args().to_args());
        argv.extend(["--stdin".into(), "maybe".into()]);
        assert_eq!(
            MonitorArgs::parse(argv),
            Err("--stdin maybe: expected none, open or once".into())
        );
    }

    #[test]
    fn exec_args_round_trip() {
        let e = ExecArgs {
            runtime: "/usr/bin/crun".into(),
            runtime_args: vec!["--cgroup-manager=cgroupfs".into()],
            runtime_root: "/run/r".into(),
            id: "abc".into(),
            pid_file: "/c/abc/exec-1.pid".into(),
            console_socket: Some("/s/1.sock".into()),
            process_file: Some("/c/abc/exec-1.process.json".into()),
            internal_pid_file: Some("/c/abc/exec-1.ipid".into()),
            cmd: vec!["sh".into(), "-c".into(), "echo --id".into()],
        };
        let argv = strings(e.to_args());
        assert_eq!(
            argv,
            [
                "exec",
                "--runtime",
                "/usr/bin/crun",
                "--runtime-root",
                "/run/r",
                "--runtime-arg",
                "--cgroup-manager=cgroupfs",
                "--id",
                "abc",
                "--pid-file",
                "/c/abc/exec-1.pid",
                "--console-socket",
                "/s/1.sock",
                "--process",
                "/c/abc/exec-1.process.json",
                "--internal-pid-file",
                "/c/abc/exec-1.ipid",
                "--",
                "sh",
                "-c",
                "echo --id"
            ]
        );
        assert_eq!(argv[0], EXEC);
        assert_eq!(ExecArgs::parse(argv.into_iter().skip(1)), Ok(e));
    }

    #[test]
    fn exec_args_errors() {
        let parse = |s: &str| ExecArgs::parse(s.split_whitespace().map(String::from));
        assert_eq!(parse("--id x"), Err("exec: no command after --".into()));
        assert_eq!(
            parse("--bundle x -- true"),
            Err("exec: unknown option --bundle".into())
        );
        assert_eq!(
            parse("--id x -- true"),
            Err("exec: --pid-file is required".into())
        );
        assert_eq!(parse("--pid-file"), Err("--pid-file needs a value".into()));
    }
}
