//! The streaming server: CRI `Exec`, `Attach` and `PortForward` return a one-time URL on it
//! (a random token in the path, valid for one use within [`TOKEN_TTL`]); the client (kubelet,
//! crictl, sandboxctl) upgrades that request to SPDY/3.1 (`spdy.rs`) or WebSocket (`ws.rs`)
//! and the session runs the exec'd process or the port forward (`exec.rs`).

#[doc(hidden)]
pub mod client;
#[doc(hidden)]
pub mod exec;
mod listener;
#[doc(hidden)]
pub mod spdy;
#[doc(hidden)]
pub mod ws;

pub use listener::fd_limit;
use listener::{tls_acceptor, ConnLimits};

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};

use crate::error::{Error, Result};
use crate::model::container::ContainerState;
use crate::runtime::Runtime;
use crate::state::lock;

pub use crate::config::{StreamingConfig, TOKEN_TTL};

/// What an issued URL is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// CRI `Exec`: run `cmd` in a running container.
    Exec {
        /// The container's id or unique prefix (the full id once the URL is issued).
        container_id: String,
        /// The command's argv (not empty), run with the runtime's `exec`.
        cmd: Vec<String>,
        /// Run it on a terminal (then `stderr` must be false: the terminal merges it).
        tty: bool,
        /// Stream the client's input to its stdin.
        stdin: bool,
        /// Stream its stdout to the client.
        stdout: bool,
        /// Stream its stderr to the client (at least one of the three streams is needed).
        stderr: bool,
    },
    /// Attach to the container's own stdio (through its monitor).
    Attach {
        /// The container's id or unique prefix (the full id once the URL is issued).
        container_id: String,
        /// Must match whether the container has a terminal.
        tty: bool,
        /// Write to its stdin (it must have been created with `stdin`).
        stdin: bool,
        /// Stream its stdout to the client.
        stdout: bool,
        /// Stream its stderr to the client (not with `tty`; one of the three streams is needed).
        stderr: bool,
    },
    /// CRI `PortForward`: TCP connections to ports in a ready pod's network namespace.
    PortForward {
        /// The pod sandbox's id or unique prefix (the full id once the URL is issued).
        sandbox_id: String,
        /// Ports from the CRI request (WebSocket clients get exactly these).
        ports: Vec<u16>,
    },
}

/// What an exec or attach session runs, as both protocols need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Process {
    pub container_id: String,
    /// Empty for attach.
    pub cmd: Vec<String>,
    pub attach: bool,
    pub tty: bool,
    pub stdin: bool,
    pub stdout: bool,
    /// A terminal merges stderr into stdout.
    pub stderr: bool,
}

impl Target {
    /// The first path segment of its URL.
    fn kind(&self) -> &'static str {
        match self {
            Target::Exec { .. } => "exec",
            Target::Attach { .. } => "attach",
            Target::PortForward { .. } => "portforward",
        }
    }

    /// The container and the stdio flags `[tty, stdin, stdout, stderr]` of an exec or attach
    /// target; `None` for port forwarding.
    fn stdio(&self) -> Option<(&str, [bool; 4])> {
        match self {
            Target::Exec {
                container_id,
                tty,
                stdin,
                stdout,
                stderr,
                ..
            }
            | Target::Attach {
                container_id,
                tty,
                stdin,
                stdout,
                stderr,
            } => Some((container_id, [*tty, *stdin, *stdout, *stderr])),
            Target::PortForward { .. } => None,
        }
    }

    /// The process side of an exec or attach target; `None` for port forwarding.
    pub(crate) fn process(&self) -> Option<Process> {
        let (container_id, [tty, stdin, stdout, stderr]) = self.stdio()?;
        let (cmd, attach) = match self {
            Target::Exec { cmd, .. } => (cmd.clone(), false),
            _ => (Vec::new(), true),
        };
        Some(Process {
            container_id: container_id.to_string(),
            cmd,
            attach,
            tty,
            stdin,
            stdout,
            stderr: stderr && !tty,
        })
    }

    fn protocols(&self, spdy: bool) -> &'static [&'static str] {
        match (self, spdy) {
            (Target::PortForward { .. }, true) => spdy::PORTFORWARD_PROTOCOLS,
            (Target::PortForward { .. }, false) => ws::PORTFORWARD_PROTOCOLS,
            (_, true) => spdy::EXEC_PROTOCOLS,
            (_, false) => ws::EXEC_PROTOCOLS,
        }
    }
}

/// One write of a session's writer, within `limit`: false if it failed or stalled past the
/// limit (a client that stopped reading), which ends the session.
pub(crate) async fn write_within<E>(
    limit: Duration,
    write: impl std::future::Future<Output = std::result::Result<(), E>>,
) -> bool {
    match tokio::time::timeout(limit, write).await {
        Ok(r) => r.is_ok(),
        Err(_) => {
            tracing::info!("streaming client stopped reading for {limit:?}; closing the session");
            false
        }
    }
}

/// An attach must match how the container was made: stdin only if it has one, a terminal
/// exactly when it has one, and a monitor with an attach socket.
fn check_attach(
    r: &crate::model::container::ContainerRecord,
    tty: bool,
    stdin: bool,
) -> Result<()> {
    if stdin && !r.config.stdin {
        return Err(Error::InvalidArgument(format!(
            "stdin: container {} was not created with stdin",
            r.id
        )));
    }
    if r.config.tty != tty {
        return Err(Error::InvalidArgument(format!(
            "tty: container {} was created {} a terminal",
            r.id,
            if r.config.tty { "with" } else { "without" }
        )));
    }
    if r.attach_socket.is_none() {
        return Err(Error::FailedPrecondition(format!(
            "container {} has no attach socket (created by an older sandboxd)",
            r.id
        )));
    }
    Ok(())
}

/// Runs the exec'd command or the attach for a session whose streams are wired up.
pub(crate) async fn run_process(
    server: &StreamingServer,
    p: &Process,
    streams: exec::Streams,
) -> exec::Outcome {
    if p.attach {
        match server.attach_socket(&p.container_id) {
            Ok(sock) => exec::attach(&sock, streams).await,
            Err(e) => exec::Outcome::Failed(e.to_string()),
        }
    } else {
        match server.exec_parts(&p.container_id) {
            Ok((runtime, dir, id)) => {
                exec::exec(
                    &runtime,
                    &id,
                    &dir,
                    &server.sock_dir(),
                    &p.cmd,
                    p.tty,
                    streams,
                )
                .await
            }
            Err(e) => exec::Outcome::Failed(e.to_string()),
        }
    }
}

/// The error stream's final message: a `Status` for v4 and later, plain text on failure
/// before (nothing on success).
pub(crate) fn final_status(v4: bool, outcome: &exec::Outcome) -> Vec<u8> {
    if v4 {
        return exec::status_json(outcome);
    }
    match outcome {
        exec::Outcome::Exited(0) => Vec::new(),
        exec::Outcome::Exited(c) => format!("command terminated with exit code {c}").into_bytes(),
        exec::Outcome::Failed(m) => m.clone().into_bytes(),
    }
}

struct Pending {
    target: Target,
    expires: Instant,
}

/// The running server.
pub struct StreamingServer {
    rt: Arc<Runtime>,
    cfg: StreamingConfig,
    /// The address it listens on (with the port chosen when `address` asked for port 0).
    pub addr: SocketAddr,
    scheme: &'static str,
    tokens: Mutex<HashMap<String, Pending>>,
    sessions: Arc<tokio::sync::Semaphore>,
}

impl StreamingServer {
    /// Binds the listener and serves in the background (needs a tokio runtime).
    pub async fn start(rt: Arc<Runtime>, cfg: StreamingConfig) -> Result<Arc<Self>> {
        let tls = tls_acceptor(&cfg)?;
        let listener = tokio::net::TcpListener::bind(&cfg.address)
            .await
            .map_err(|e| {
                Error::Config(format!(
                    "streaming server: cannot listen on {}: {e}",
                    cfg.address
                ))
            })?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::Config(format!("streaming server address: {e}")))?;
        let server = Arc::new(StreamingServer {
            rt,
            sessions: Arc::new(tokio::sync::Semaphore::new(cfg.max_sessions.max(1))),
            cfg,
            addr,
            scheme: if tls.is_some() { "https" } else { "http" },
            tokens: Mutex::new(HashMap::new()),
        });
        let s = server.clone();
        let limits = ConnLimits::new(&s.cfg);
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(5);
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(c) => {
                        backoff = Duration::from_millis(5);
                        c
                    }
                    Err(e) => {
                        // Out of fds or similar: back off (up to a second) instead of spinning.
                        tracing::warn!(error = %e, "streaming server cannot accept");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(1));
                        continue;
                    }
                };
                let Some(slot) = limits.admit_evicting(peer.ip()) else {
                    tracing::debug!(%peer, "streaming connection over the cap; closed");
                    drop(tcp);
                    continue;
                };
                let slot = Arc::new(slot);
                let (s, tls) = (s.clone(), tls.clone());
                let header_timeout = s_header_timeout(&s);
                let conn_slot = slot.clone();
                let task = tokio::spawn(async move {
                    let slot = conn_slot;
                    let active = slot.clone();
                    let svc = hyper::service::service_fn(move |req| {
                        active.active();
                        let s = s.clone();
                        async move { Ok::<_, std::convert::Infallible>(s.handle(req).await) }
                    });
                    let mut http = hyper::server::conn::http1::Builder::new();
                    // Every request header (the first, and any later one on a kept-alive
                    // connection) must arrive within the timeout: a slow or idle client cannot
                    // hold a connection.
                    http.timer(hyper_util::rt::TokioTimer::new())
                        .header_read_timeout(header_timeout)
                        .max_buf_size(64 * 1024);
                    let r = match tls {
                        Some(acceptor) => {
                            match tokio::time::timeout(header_timeout, acceptor.accept(tcp)).await {
                                Ok(Ok(stream)) => {
                                    http.serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                                        .with_upgrades()
                                        .await
                                }
                                _ => {
                                    tracing::debug!(%peer, "TLS handshake failed");
                                    return;
                                }
                            }
                        }
                        None => {
                            http.serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                                .with_upgrades()
                                .await
                        }
                    };
                    if let Err(e) = r {
                        tracing::debug!(%peer, error = %e, "streaming connection ended");
                    }
                    drop(slot);
                });
                slot.track(task.abort_handle());
            }
        });
        tracing::info!(address = %addr, "streaming server listening");
        Ok(server)
    }

    /// Checks an exec request and issues its URL (for the full id the prefix resolved to).
    pub fn exec_url(&self, mut target: Target) -> Result<String> {
        let resolved = match (&target, target.stdio()) {
            (Target::PortForward { sandbox_id, .. }, _) => self.ready_sandbox(sandbox_id)?.id,
            (t, Some((id, [tty, stdin, stdout, stderr]))) => {
                if matches!(t, Target::Exec { cmd, .. } if cmd.is_empty()) {
                    return Err(Error::InvalidArgument("cmd must not be empty".into()));
                }
                check_stdio(tty, stdin, stdout, stderr)?;
                let r = self.running_container(id)?;
                if matches!(t, Target::Attach { .. }) {
                    check_attach(&r, tty, stdin)?;
                }
                r.id
            }
            (_, None) => unreachable!("exec and attach targets have stdio"),
        };
        match &mut target {
            Target::Exec { container_id, .. } | Target::Attach { container_id, .. } => {
                *container_id = resolved
            }
            Target::PortForward { sandbox_id, .. } => *sandbox_id = resolved,
        }
        Ok(self.issue(target))
    }

    /// The container's record, if it is running (checked when a URL is issued and again when
    /// its session starts).
    fn running_container(&self, id: &str) -> Result<crate::model::container::ContainerRecord> {
        let r = self.rt.container_status(id)?;
        if r.state != ContainerState::Running {
            return Err(Error::FailedPrecondition(format!(
                "container {} is not running ({:?})",
                r.id, r.state
            )));
        }
        Ok(r)
    }

    fn ready_sandbox(&self, id: &str) -> Result<crate::model::sandbox::SandboxRecord> {
        let r = self.rt.sandbox_record(id)?;
        if r.state != crate::model::sandbox::SandboxState::Ready {
            return Err(Error::FailedPrecondition(format!(
                "sandbox {} is not ready",
                r.id
            )));
        }
        Ok(r)
    }

    fn issue(&self, target: Target) -> String {
        let kind = target.kind();
        let token = crate::validate::random_hex(16);
        let now = Instant::now();
        let mut tokens = lock(&self.tokens);
        tokens.retain(|_, p| p.expires > now);
        tokens.insert(
            token.clone(),
            Pending {
                target,
                expires: now + Duration::from_secs(self.cfg.token_ttl_secs.max(1)),
            },
        );
        format!("{}://{}/{kind}/{token}", self.scheme, self.addr)
    }

    /// Takes a token: valid once, before it expires.
    fn take(&self, kind: &str, token: &str) -> Option<Target> {
        let p = lock(&self.tokens).remove(token)?;
        let ok = p.expires > Instant::now() && p.target.kind() == kind;
        ok.then_some(p.target)
    }

    /// How long a session may pass with no traffic (`idle_timeout_secs`, at least 1 s).
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_secs(self.cfg.idle_timeout_secs.max(1))
    }

    /// How long a client may stop reading (`write_timeout_secs`, at least 1 s).
    pub fn write_timeout(&self) -> Duration {
        Duration::from_secs(self.cfg.write_timeout_secs.max(1))
    }

    async fn handle(self: Arc<Self>, req: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
        let path = req.uri().path().to_string();
        let mut parts = path.trim_start_matches('/').splitn(2, '/');
        let (kind, token) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let Some(target) = self.take(kind, token) else {
            return text(StatusCode::NOT_FOUND, "unknown or expired streaming URL");
        };
        let Ok(permit) = self.sessions.clone().try_acquire_owned() else {
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                "too many streaming sessions",
            );
        };
        let upgrade = header(&req, "upgrade").to_ascii_lowercase();
        if upgrade.contains("websocket") {
            ws::accept(self.clone(), req, target, permit)
        } else if upgrade.contains("spdy/3.1") {
            spdy::accept(self.clone(), req, target, permit)
        } else {
            text(
                StatusCode::BAD_REQUEST,
                "streaming needs an Upgrade to SPDY/3.1 or websocket",
            )
        }
    }

    /// The container's runtime, its dir (for pid files and console sockets) and full id.
    pub(crate) fn exec_parts(
        &self,
        container_id: &str,
    ) -> Result<(crate::oci::OciRuntime, PathBuf, String)> {
        let r = self.running_container(container_id)?;
        let runtime = self.rt.handler(&r.runtime_handler)?.clone();
        Ok((runtime, r.dir.clone(), r.id))
    }

    /// Where console sockets of exec sessions live (short paths: sun_path is 108 bytes).
    pub(crate) fn sock_dir(&self) -> PathBuf {
        self.rt.config().root.join("exec") // made (0700) by Runtime::new
    }

    /// The attach socket of a running container.
    pub(crate) fn attach_socket(&self, container_id: &str) -> Result<PathBuf> {
        let r = self.running_container(container_id)?;
        r.attach_socket.ok_or_else(|| {
            Error::FailedPrecondition(format!("container {} has no attach socket", r.id))
        })
    }

    /// The netns of a ready sandbox (`None` for host network).
    pub(crate) fn pod_netns(&self, sandbox_id: &str) -> Result<Option<PathBuf>> {
        Ok(self.ready_sandbox(sandbox_id)?.netns)
    }
}

fn s_header_timeout(s: &StreamingServer) -> Duration {
    Duration::from_secs(s.cfg.header_timeout_secs.max(1))
}

/// Which streams a session may ask for: at least one, and no stderr beside a terminal.
fn check_stdio(tty: bool, stdin: bool, stdout: bool, stderr: bool) -> Result<()> {
    if !(stdin || stdout || stderr) {
        return Err(Error::InvalidArgument(
            "one of stdin, stdout and stderr must be set".into(),
        ));
    }
    if tty && stderr {
        return Err(Error::InvalidArgument(
            "tty and stderr cannot both be set (a terminal merges them)".into(),
        ));
    }
    Ok(())
}

fn header(req: &Request<hyper::body::Incoming>, name: &str) -> String {
    req.headers()
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join(",")
}

/// Every value of a (possibly repeated, comma-separated) header.
pub(crate) fn header_values(req: &Request<hyper::body::Incoming>, name: &str) -> Vec<String> {
    header(req, name)
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

pub(crate) fn text(code: StatusCode, msg: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(msg.to_string())));
    *r.status_mut() = code;
    r
}
