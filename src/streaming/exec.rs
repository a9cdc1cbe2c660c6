//! The protocol-neutral side of a streaming session: an exec'd process (runtime `exec`, with
//! pipes or a pseudo-terminal from the runtime's console socket) wired to channels, and a
//! connection opened inside a pod's network namespace for port forwarding.
#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use bytes::Bytes;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, Semaphore};

use sandboxd_shim_common::attach::{self as frames, CLOSE_STDIN, RESIZE, STDERR, STDIN, STDOUT};
use sandboxd_shim_common::fd::set_winsize;

use crate::oci::OciRuntime;

/// Terminal size, as the resize stream carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct TermSize {
    #[serde(rename = "Width")]
    pub width: u16,
    #[serde(rename = "Height")]
    pub height: u16,
}

/// Data a client sends on one stream, queued for its consumer (a process's stdin, a
/// forwarded connection). What is queued counts against the session's inbound byte budget
/// until the consumer takes it, so a client that writes faster than the consumer reads is
/// held back (its frames stop being read) instead of growing our memory.
pub struct Inbound {
    rx: mpsc::Receiver<Bytes>,
    budget: Arc<Semaphore>,
}

/// The sending side of an [`Inbound`].
#[derive(Clone)]
pub struct InboundTx {
    tx: mpsc::Sender<Bytes>,
    budget: Arc<Semaphore>,
}

/// A stream's inbound queue drawing on `budget` (bytes). Chunks must not exceed the budget.
pub fn inbound(budget: &Arc<Semaphore>) -> (InboundTx, Inbound) {
    let (tx, rx) = mpsc::channel(16);
    (
        InboundTx {
            tx,
            budget: budget.clone(),
        },
        Inbound {
            rx,
            budget: budget.clone(),
        },
    )
}

impl Inbound {
    /// The next chunk; `None` once the client closed the stream.
    pub async fn recv(&mut self) -> Option<Bytes> {
        let b = self.rx.recv().await?;
        self.budget.add_permits(b.len());
        Some(b)
    }
}

impl InboundTx {
    /// Queues `b`, waiting for room in the session's budget; false if the consumer is gone.
    pub async fn send(&self, b: Bytes) -> bool {
        let n = b.len().min(Semaphore::MAX_PERMITS) as u32;
        let Ok(p) = self.budget.acquire_many(n).await else {
            return false;
        };
        p.forget();
        let len = b.len();
        if self.tx.send(b).await.is_err() {
            self.budget.add_permits(len);
            return false;
        }
        true
    }
}

/// The client's side of a session, as channels. `None` = the client did not ask for it.
pub struct Streams {
    /// Data the client sends to the process; the channel closing is stdin's EOF.
    pub stdin: Option<Inbound>,
    pub stdout: Option<mpsc::Sender<Bytes>>,
    pub stderr: Option<mpsc::Sender<Bytes>>,
    pub resize: Option<mpsc::Receiver<TermSize>>,
    /// Fires when the client has gone away: the process is then killed.
    pub gone: Option<tokio::sync::oneshot::Receiver<()>>,
}

/// How a process ended: its exit code, or why it could not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Exited(i32),
    Failed(String),
}

/// The Kubernetes `Status` the error stream carries at the end of an exec or attach (v4+).
pub fn status_json(o: &Outcome) -> Vec<u8> {
    let v = match o {
        Outcome::Exited(0) => serde_json::json!({"metadata": {}, "status": "Success"}),
        Outcome::Exited(code) => serde_json::json!({
            "metadata": {},
            "status": "Failure",
            "message": format!("command terminated with non-zero exit code: error executing command, exit status {code}"),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
        }),
        Outcome::Failed(msg) => serde_json::json!({
            "metadata": {},
            "status": "Failure",
            "message": msg,
            "reason": "InternalError",
        }),
    };
    serde_json::to_vec(&v).unwrap_or_default()
}

/// Receives the pty master the runtime sends over its console socket (SCM_RIGHTS,
/// close-on-exec: it must not leak into the processes we spawn later).
fn recv_fd(stream: &std::os::unix::net::UnixStream) -> std::io::Result<OwnedFd> {
    sandboxd_shim_common::fd::recv_fd(stream)?
        .ok_or_else(|| std::io::Error::other("the runtime sent no terminal fd"))
}

/// How much of the runtime's stderr is kept for the log when the client has no stderr stream.
const OWN_STDERR_CAP: usize = 64 * 1024;
/// How long output is drained after the process exits.
const DRAIN: std::time::Duration = std::time::Duration::from_secs(2);

/// Runs `cmd` in container `id` with the runtime's `exec`, wired to `streams`, and returns
/// how it ended. The process is reaped; if the client goes away first it is killed.
pub async fn exec(
    runtime: &OciRuntime,
    id: &str,
    dir: &Path,
    sock_dir: &Path,
    cmd: &[String],
    tty: bool,
    mut streams: Streams,
) -> Outcome {
    let tag = &crate::validate::new_id()[..12];
    let pid_file = dir.join(format!("exec-{tag}.pid"));
    // Socket paths must fit in sun_path (108 bytes): they live in a short dir of the root.
    let console: Option<PathBuf> = tty.then(|| sock_dir.join(format!("{tag}.sock")));
    let listener = match &console {
        Some(p) => match std::os::unix::net::UnixListener::bind(p) {
            Ok(l) => Some(l),
            Err(e) => return Outcome::Failed(format!("console socket {}: {e}", p.display())),
        },
        None => None,
    };
    // Open-ended: in the daemon's mount namespace, spawned as it is.
    let (c, _) = runtime.exec_command(id, dir, &pid_file, console.as_deref(), cmd, false);
    let mut c = tokio::process::Command::from(c);
    c.stdin(if streams.stdin.is_some() && !tty {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    c.stdout(if tty { Stdio::null() } else { Stdio::piped() });
    c.stderr(Stdio::piped());
    c.kill_on_drop(true);
    let cleanup = || {
        let _ = std::fs::remove_file(&pid_file);
        let _ = std::fs::remove_file(pid_file.with_extension("process.json"));
        if let Some(p) = &console {
            let _ = std::fs::remove_file(p);
        }
    };
    let mut child = match c.spawn() {
        Ok(ch) => ch,
        Err(e) => {
            cleanup();
            return Outcome::Failed(format!("spawn {}: {e}", runtime.path.display()));
        }
    };
    let runtime_err = child.stderr.take();

    // Output tasks end at EOF and are waited for; input tasks are stopped at the exit.
    let mut tasks = Vec::new();
    let mut inputs = Vec::new();
    if let Some(listener) = listener {
        // The runtime connects once the process exists and hands us the pty master; if the
        // exec fails first, the helper exits without connecting.
        let accepted = async {
            listener.set_nonblocking(true)?;
            let l = tokio::net::UnixListener::from_std(listener)?;
            let (s, _) = l.accept().await?;
            let s = s.into_std()?;
            s.set_nonblocking(false)?;
            s.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
            recv_fd(&s)
        };
        let master = tokio::select! {
            r = accepted => match r {
                Ok(fd) => fd,
                Err(e) => {
                    let _ = child.kill().await;
                    cleanup();
                    return Outcome::Failed(format!("terminal: {e}"));
                }
            },
            st = child.wait() => {
                let mut msg = Vec::new();
                if let Some(mut e) = runtime_err {
                    let _ = e.read_to_end(&mut msg).await;
                }
                cleanup();
                return Outcome::Failed(format!(
                    "exec ended before its terminal was set up ({}): {}",
                    st.map(|s| s.to_string()).unwrap_or_default(),
                    String::from_utf8_lossy(&msg).trim()
                ));
            }
        };
        let master = std::sync::Arc::new(master);
        if let Some(mut rx) = streams.resize.take() {
            let m = master.clone();
            inputs.push(tokio::spawn(async move {
                while let Some(s) = rx.recv().await {
                    let _ = set_winsize(&*m, s.width, s.height);
                }
            }));
        }
        let dup = |m: &OwnedFd| m.try_clone().map(std::fs::File::from);
        let (Ok(rf), Ok(wf)) = (dup(&master), dup(&master)) else {
            let _ = child.kill().await;
            cleanup();
            return Outcome::Failed("terminal: cannot duplicate the pty fd".into());
        };
        if let Some(out) = streams.stdout.take() {
            let mut r = tokio::fs::File::from_std(rf);
            tasks.push(tokio::spawn(async move {
                let mut buf = vec![0u8; 32 * 1024];
                // EIO once the terminal's last process exits: that is the end of output.
                while let Ok(n) = r.read(&mut buf).await {
                    if n == 0 || out.send(Bytes::copy_from_slice(&buf[..n])).await.is_err() {
                        break;
                    }
                }
            }));
        }
        if let Some(mut rx) = streams.stdin.take() {
            let mut w = tokio::fs::File::from_std(wf);
            inputs.push(tokio::spawn(async move {
                while let Some(b) = rx.recv().await {
                    if w.write_all(&b).await.is_err() {
                        break;
                    }
                }
                // End of input on a terminal: ^D.
                let _ = w.write_all(&[4]).await;
            }));
        }
    } else {
        if let (Some(mut rx), Some(mut w)) = (streams.stdin.take(), child.stdin.take()) {
            inputs.push(tokio::spawn(async move {
                while let Some(b) = rx.recv().await {
                    if w.write_all(&b).await.is_err() {
                        break;
                    }
                }
                drop(w); // EOF
            }));
        }
        if let (Some(tx), Some(mut r)) = (streams.stdout.take(), child.stdout.take()) {
            tasks.push(tokio::spawn(async move {
                let mut buf = vec![0u8; 32 * 1024];
                while let Ok(n) = r.read(&mut buf).await {
                    if n == 0 || tx.send(Bytes::copy_from_slice(&buf[..n])).await.is_err() {
                        break;
                    }
                }
            }));
        }
    }
    // The runtime's stderr carries the process's stderr (no tty) and the runtime's own errors.
    let err_tx = streams.stderr.take();
    let err_task = tokio::spawn(async move {
        let mut own = Vec::new();
        if let Some(mut r) = runtime_err {
            let mut buf = vec![0u8; 32 * 1024];
            while let Ok(n) = r.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                match &err_tx {
                    Some(tx) => {
                        let _ = tx.send(Bytes::copy_from_slice(&buf[..n])).await;
                    }
                    // Without a stderr stream the process's stderr comes here too: keep only
                    // the start (for the log), drain and drop the rest.
                    None => {
                        let room = OWN_STDERR_CAP.saturating_sub(own.len());
                        own.extend_from_slice(&buf[..n.min(room)]);
                    }
                }
            }
        }
        own
    });

    let status = match streams.gone.take() {
        Some(gone) => {
            tokio::select! {
                s = child.wait() => s,
                Ok(()) = gone => {
                    // Kill the process itself: killing the runtime alone would orphan it.
                    crate::process::kill_pid_file(&pid_file);
                    child.wait().await
                }
            }
        }
        None => child.wait().await,
    };
    for t in inputs {
        t.abort();
    }
    for t in tasks {
        // EOF comes once the process and anything it left holding the output are gone. A
        // task still forwarding then goes on detached: it ends at EOF or once the session is
        // over (its sends fail), and holds at most its fixed buffers meanwhile.
        let _ = tokio::time::timeout(DRAIN, t).await;
    }
    let own_err = tokio::time::timeout(DRAIN, err_task)
        .await
        .ok()
        .and_then(|r| r.ok())
        .unwrap_or_default();
    cleanup();
    match status {
        Ok(s) => {
            let code = crate::process::exit_code(&s);
            if code != 0 && !own_err.is_empty() && !tty {
                tracing::debug!(container_id = %id, stderr = %String::from_utf8_lossy(&own_err), "exec stderr");
            }
            Outcome::Exited(code)
        }
        Err(e) => Outcome::Failed(format!("wait for {}: {e}", runtime.path.display())),
    }
}

/// Attaches `streams` to a container's own stdio through its monitor's attach socket until
/// the container exits (the monitor closes the socket) or the client goes away (detaching
/// never stops the container).
pub async fn attach(socket: &Path, mut streams: Streams) -> Outcome {
    let sock = match tokio::net::UnixStream::connect(socket).await {
        Ok(s) => s,
        Err(e) => return Outcome::Failed(format!("attach socket {}: {e}", socket.display())),
    };
    let (mut r, mut w) = sock.into_split();
    // Frames to the monitor: stdin data, end of stdin, terminal size.
    let (ftx, mut frx) = mpsc::channel::<Vec<u8>>(16);
    let writer = tokio::spawn(async move {
        while let Some(f) = frx.recv().await {
            if w.write_all(&f).await.is_err() {
                return;
            }
        }
        // Keep the write half open: closing it would read as a detach.
        std::future::pending::<()>().await;
    });
    let mut tasks = vec![writer];
    if let Some(mut rx) = streams.stdin.take() {
        let tx = ftx.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(b) = rx.recv().await {
                if tx.send(frames::frame(STDIN, &b)).await.is_err() {
                    return;
                }
            }
            let _ = tx.send(frames::frame(CLOSE_STDIN, &[])).await;
        }));
    }
    if let Some(mut rx) = streams.resize.take() {
        let tx = ftx.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(s) = rx.recv().await {
                let d = frames::resize_payload(s.width, s.height);
                if tx.send(frames::frame(RESIZE, &d)).await.is_err() {
                    return;
                }
            }
        }));
    }
    drop(ftx);
    let (stdout, stderr) = (streams.stdout.take(), streams.stderr.take());
    let output = async {
        let mut head = [0u8; frames::HEADER_LEN];
        loop {
            if r.read_exact(&mut head).await.is_err() {
                return; // the container exited and the monitor closed the socket
            }
            let (kind, len) = frames::parse_header(head);
            let mut data = vec![0u8; len];
            if r.read_exact(&mut data).await.is_err() {
                return;
            }
            let tx = match kind {
                STDOUT => stdout.as_ref(),
                STDERR => stderr.as_ref(),
                _ => None,
            };
            if let Some(tx) = tx {
                if tx.send(Bytes::from(data)).await.is_err() {
                    return;
                }
            }
        }
    };
    let gone = async {
        match streams.gone.take() {
            Some(g) => {
                let _ = g.await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = output => {}
        _ = gone => {}
    }
    for t in tasks {
        t.abort();
    }
    Outcome::Exited(0)
}

/// The size of the terminal on `fd`, if it is one (for clients forwarding their size).
pub fn terminal_size(fd: &impl AsRawFd) -> Option<TermSize> {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize struct into the local we pass.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) };
    (r == 0 && ws.ws_col > 0).then_some(TermSize {
        width: ws.ws_col,
        height: ws.ws_row,
    })
}

/// Copies between a forwarded TCP connection and a client stream until both directions end:
/// `inbound` is what the client sends, `send` delivers what the pod answers (false = gone).
pub async fn pump<F, Fut>(tcp: tokio::net::TcpStream, mut inbound: Inbound, mut send: F)
where
    F: FnMut(Bytes) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let (mut r, mut w) = tcp.into_split();
    let up = async move {
        while let Some(b) = inbound.recv().await {
            if w.write_all(&b).await.is_err() {
                break;
            }
        }
        let _ = w.shutdown().await;
    };
    let down = async {
        let mut buf = vec![0u8; 32 * 1024];
        while let Ok(n) = r.read(&mut buf).await {
            if n == 0 || !send(Bytes::copy_from_slice(&buf[..n])).await {
                break;
            }
        }
    };
    tokio::join!(up, down);
}

/// Connects to `127.0.0.1:port` inside the network namespace at `netns` (`None` = the host's):
/// a dedicated thread enters the namespace and creates the socket there, so it keeps talking
/// inside the pod after the thread is gone.
pub async fn connect_in_netns(
    netns: Option<PathBuf>,
    port: u16,
) -> std::io::Result<tokio::net::TcpStream> {
    let std_stream =
        tokio::task::spawn_blocking(move || -> std::io::Result<std::net::TcpStream> {
            let handle = std::thread::spawn(move || -> std::io::Result<std::net::TcpStream> {
                if let Some(ns) = &netns {
                    let f = std::fs::File::open(ns)?;
                    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
                        .map_err(std::io::Error::from)?;
                }
                std::net::TcpStream::connect_timeout(
                    &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
                    std::time::Duration::from_secs(10),
                )
            });
            handle
                .join()
                .map_err(|_| std::io::Error::other("netns thread panicked"))?
        })
        .await
        .map_err(std::io::Error::other)??;
    std_stream.set_nonblocking(true)?;
    tokio::net::TcpStream::from_std(std_stream)
}
