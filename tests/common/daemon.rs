//! The daemon as a process: started from the built binary with a test's config, its socket,
//! log and lifecycle (kill -9, SIGTERM), and a tonic client for its socket.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sandboxd::api::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

use super::{sh, Env};

pub struct Daemon {
    child: Option<Child>,
    pub socket: PathBuf,
    pub config: PathBuf,
    pub log: PathBuf,
    /// `<state root>/probe`: the start-up probe's trial containers while they are made.
    probe: PathBuf,
}

impl Daemon {
    pub fn config_file(env: &Env) -> PathBuf {
        Self::config_file_with(env, &env.cfg)
    }

    /// A config file for `cfg` with the test's socket.
    pub fn config_file_with(env: &Env, cfg: &sandboxd::Config) -> PathBuf {
        Self::config_file_at(&env.base, cfg, "")
    }

    /// [`config_file_with`](Self::config_file_with) with `extra` daemon keys (TOML lines).
    #[allow(dead_code)]
    pub fn config_file_extra(env: &Env, cfg: &sandboxd::Config, extra: &str) -> PathBuf {
        Self::config_file_at(&env.base, cfg, extra)
    }

    fn config_file_at(base: &Path, cfg: &sandboxd::Config, extra: &str) -> PathBuf {
        let path = base.join("sandboxd.toml");
        let mut toml = format!(
            "socket = \"{}\"\nlog_level = \"debug\"\n{extra}",
            base.join("run/sandboxd.sock").display()
        );
        let core = toml::to_string(cfg).unwrap();
        toml.push_str(&core);
        std::fs::write(&path, toml).unwrap();
        path
    }

    pub fn start(env: &Env) -> Daemon {
        Self::start_with(env, &env.cfg)
    }

    /// Starts a daemon with `cfg` (the test's own, changed).
    pub fn start_with(env: &Env, cfg: &sandboxd::Config) -> Daemon {
        Self::start_at(&env.base, cfg)
    }

    /// Starts a daemon for a test whose base dir is `base` (from another thread, say).
    pub fn start_at(base: &Path, cfg: &sandboxd::Config) -> Daemon {
        Self::start_full(base, cfg, "", &[], true)
    }

    /// Starts a daemon whose config file has `extra` daemon keys (TOML lines) too.
    pub fn start_extra(env: &Env, cfg: &sandboxd::Config, extra: &str) -> Daemon {
        Self::start_full(&env.base, cfg, extra, &[], true)
    }

    /// Starts a daemon with `vars` added to its environment, and returns at once (its socket
    /// may not serve yet).
    pub fn spawn_with_env(
        env: &Env,
        cfg: &sandboxd::Config,
        vars: &[(&str, &std::ffi::OsStr)],
    ) -> Daemon {
        Self::start_full(&env.base, cfg, "", vars, false)
    }

    fn start_full(
        base: &Path,
        cfg: &sandboxd::Config,
        extra: &str,
        vars: &[(&str, &std::ffi::OsStr)],
        wait: bool,
    ) -> Daemon {
        let config = Self::config_file_at(base, cfg, extra);
        let socket = base.join("run/sandboxd.sock");
        let log = base.join(format!(
            "daemon-{}.log",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let child = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
            .arg("--config")
            .arg(&config)
            .stderr(std::fs::File::create(&log).unwrap())
            .stdout(Stdio::null())
            .envs(vars.iter().copied())
            .spawn()
            .unwrap();
        let d = Daemon {
            child: Some(child),
            socket,
            config,
            log,
            probe: cfg.root.join("probe"),
        };
        if wait {
            d.wait_ready();
        }
        d
    }

    pub fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(&self.socket).is_err() {
            assert!(
                Instant::now() < deadline,
                "daemon did not come up: {}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    pub fn sigterm(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().unwrap();
        sh(&format!("kill -TERM {}", c.id()));
        c.wait().unwrap()
    }
}

impl Drop for Daemon {
    /// The end of a test: kill -9 once the start-up probe's trials are done (a daemon killed
    /// in one leaves it half-made until its next start, which a test ending here never has;
    /// `tests/daemon_kill9.rs` kills one mid-trial on purpose).
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.is_some() && self.probe.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill9();
    }
}

impl Daemon {
    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// A `/proc/<pid>/status` field in KiB (VmRSS, VmHWM…).
    pub fn status_kib(&self, field: &str) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }

    /// `unix://<socket>`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }
}

/// sandboxctl's connector: `unix:///path` (or a bare path), with a per-request timeout. The
/// library has no CRI client, so the tests compile sandboxctl's (one definition).
#[path = "../../src/bin/sandboxctl/client.rs"]
mod sandboxctl_client;
pub use sandboxctl_client::connect;

pub async fn channel(socket: &Path) -> Channel {
    connect(&socket.to_string_lossy(), Duration::from_secs(60))
        .await
        .unwrap()
}

pub async fn client(socket: &Path) -> RuntimeServiceClient<Channel> {
    RuntimeServiceClient::new(channel(socket).await)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20)
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
}
