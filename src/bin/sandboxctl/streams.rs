//! Interactive commands over the CRI streaming protocols (SPDY/3.1, which every Kubernetes
//! streaming server speaks): `exec -i/-t`, `attach` and `port-forward`. The CRI call hands out
//! a streaming URL; the session on it runs on a blocking thread.

use std::io::{IsTerminal, Read, Write};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Duration;

use sandboxd::api::v1 as cri;
use sandboxd::streaming::client::{Event, Session};
use sandboxd::streaming::exec::terminal_size;

use crate::{grpc_err, ids, Runtime};

/// Remotecommand protocols offered, best first (v5 is WebSocket-only for most servers).
const PROTOCOLS: &[&str] = &[
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
];

/// Restores the terminal's mode when dropped.
struct RawMode(Option<nix::sys::termios::Termios>);

impl RawMode {
    fn enable() -> RawMode {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return RawMode(None);
        }
        let Ok(orig) = nix::sys::termios::tcgetattr(&stdin) else {
            return RawMode(None);
        };
        let mut raw = orig.clone();
        nix::sys::termios::cfmakeraw(&mut raw);
        let _ = nix::sys::termios::tcsetattr(&stdin, nix::sys::termios::SetArg::TCSANOW, &raw);
        RawMode(Some(orig))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(orig) = &self.0 {
            let _ = nix::sys::termios::tcsetattr(
                std::io::stdin(),
                nix::sys::termios::SetArg::TCSANOW,
                orig,
            );
        }
    }
}

fn copy_out(
    rx: Receiver<Event>,
    mut w: impl Write + Send + 'static,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while let Ok(Event::Data(d)) = rx.recv() {
            if w.write_all(&d).and_then(|_| w.flush()).is_err() {
                break;
            }
        }
    })
}

/// `exec -i/-t`: an interactive exec session; exits with the command's non-zero code.
pub async fn exec(
    c: &mut Runtime,
    id: &str,
    cmd: Vec<String>,
    interactive: bool,
    tty: bool,
) -> Result<(), String> {
    let id = ids::container(c, id).await?;
    let url = c
        .exec(cri::ExecRequest {
            container_id: id,
            cmd,
            tty,
            stdin: interactive,
            stdout: true,
            stderr: !tty,
            ..Default::default()
        })
        .await
        .map_err(|s| grpc_err("Exec", s))?
        .into_inner()
        .url;
    run_session(url, interactive, tty).await
}

/// `attach`: the container's own stdio until it exits (or ^C).
pub async fn attach(c: &mut Runtime, id: &str, interactive: bool, tty: bool) -> Result<(), String> {
    let id = ids::container(c, id).await?;
    let url = c
        .attach(cri::AttachRequest {
            container_id: id,
            stdin: interactive,
            tty,
            stdout: true,
            stderr: !tty,
            ..Default::default()
        })
        .await
        .map_err(|s| grpc_err("Attach", s))?
        .into_inner()
        .url;
    run_session(url, interactive, tty).await
}

/// `port-forward POD [ADDR:]LOCAL:REMOTE…`: runs until interrupted.
pub async fn port_forward(c: &mut Runtime, pod: &str, ports: &[String]) -> Result<(), String> {
    let pod = ids::pod(c, pod).await?;
    let mut pairs = Vec::new();
    for p in ports {
        let (local, remote) = p
            .rsplit_once(':')
            .ok_or_else(|| format!("{p:?}: expected [ADDR:]LOCAL:REMOTE"))?;
        let remote: u16 = remote
            .parse()
            .map_err(|_| format!("{p:?}: bad remote port"))?;
        let local = if local.contains(':') {
            local.to_string()
        } else {
            format!("127.0.0.1:{local}")
        };
        pairs.push((local, remote));
    }
    let url = c
        .port_forward(cri::PortForwardRequest {
            pod_sandbox_id: pod,
            port: pairs.iter().map(|(_, r)| i32::from(*r)).collect(),
        })
        .await
        .map_err(|s| grpc_err("PortForward", s))?
        .into_inner()
        .url;
    tokio::task::spawn_blocking(move || forward(&url, &pairs))
        .await
        .map_err(|e| e.to_string())?
}

/// Runs an exec or attach session on its streaming URL; exits with the command's non-zero code.
async fn run_session(url: String, stdin: bool, tty: bool) -> Result<(), String> {
    let code = tokio::task::spawn_blocking(move || session(&url, stdin, tty))
        .await
        .map_err(|e| e.to_string())??;
    if code != 0 {
        std::process::exit(code);
    }
    Ok(())
}

/// Runs an exec (or attach) session on `url`; returns the remote command's exit code.
fn session(url: &str, stdin: bool, tty: bool) -> Result<i32, String> {
    let s = Arc::new(Session::connect(url, PROTOCOLS)?);
    let (_, err) = s.open(&[("streamtype", "error")])?;
    let input = if stdin {
        Some(s.open(&[("streamtype", "stdin")])?.0)
    } else {
        None
    };
    let (_, out) = s.open(&[("streamtype", "stdout")])?;
    let errout = if tty {
        None
    } else {
        Some(s.open(&[("streamtype", "stderr")])?.1)
    };
    let resize = if tty && sandboxd::streaming::spdy::has_resize(&s.protocol) {
        Some(s.open(&[("streamtype", "resize")])?.0)
    } else {
        None
    };
    let _raw = tty.then(RawMode::enable);
    if let Some(id) = resize {
        // Forward the terminal's size now and whenever it changes.
        let s = s.clone();
        std::thread::spawn(move || {
            let mut last = None;
            loop {
                let size = terminal_size(&std::io::stdout());
                if size.is_some() && size != last {
                    let msg = format!("{}\n", serde_json::to_string(&size).unwrap_or_default());
                    if s.send(id, msg.as_bytes()).is_err() {
                        return;
                    }
                    last = size;
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        });
    }
    if let Some(id) = input {
        let s = s.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            let mut stdin = std::io::stdin();
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) | Err(_) => {
                        let _ = s.close(id);
                        return;
                    }
                    Ok(n) => {
                        if s.send(id, &buf[..n]).is_err() {
                            return;
                        }
                    }
                }
            }
        });
    }
    let t1 = copy_out(out, std::io::stdout());
    let t2 = errout.map(|e| copy_out(e, std::io::stderr()));
    let _ = t1.join();
    if let Some(t) = t2 {
        let _ = t.join();
    }
    let mut status = Vec::new();
    while let Ok(Event::Data(d)) = err.recv_timeout(Duration::from_secs(30)) {
        status.extend_from_slice(&d);
    }
    s.shutdown();
    drop(_raw);
    if status.is_empty() {
        return Ok(0);
    }
    let text = String::from_utf8_lossy(&status);
    match serde_json::from_slice::<serde_json::Value>(&status) {
        Ok(v) if v["status"] == "Success" => Ok(0),
        Ok(v) if v["reason"] == "NonZeroExitCode" => Ok(v["details"]["causes"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["reason"] == "ExitCode"))
            .and_then(|c| c["message"].as_str())
            .and_then(|m| m.parse().ok())
            .unwrap_or(1)),
        Ok(v) => Err(v["message"].as_str().unwrap_or(&text).to_string()),
        Err(_) => Err(text.into_owned()),
    }
}

/// Forwards local TCP ports to ports of the pod until interrupted. `pairs` are
/// `(local address, remote port)`.
fn forward(url: &str, pairs: &[(String, u16)]) -> Result<(), String> {
    let s = Arc::new(Session::connect(url, &["portforward.k8s.io"])?);
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut threads = Vec::new();
    for (local, remote) in pairs {
        let listener =
            std::net::TcpListener::bind(local).map_err(|e| format!("listen on {local}: {e}"))?;
        println!(
            "Forwarding from {} -> {remote}",
            listener.local_addr().map_err(|e| e.to_string())?
        );
        let (s, next, remote) = (s.clone(), next.clone(), *remote);
        threads.push(std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (s, next) = (s.clone(), next.clone());
                std::thread::spawn(move || {
                    if let Err(e) = forward_one(&s, &next, conn, remote) {
                        eprintln!("port-forward {remote}: {e}");
                    }
                });
            }
        }));
    }
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}

fn forward_one(
    s: &Session,
    next: &std::sync::atomic::AtomicU64,
    conn: std::net::TcpStream,
    remote: u16,
) -> Result<(), String> {
    let req = next
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        .to_string();
    let port = remote.to_string();
    let (err_id, err) = s.open(&[
        ("streamtype", "error"),
        ("port", &port),
        ("requestid", &req),
    ])?;
    let _ = s.close(err_id); // the client never writes on it
    let (data_id, data) =
        s.open(&[("streamtype", "data"), ("port", &port), ("requestid", &req)])?;
    let mut up = conn.try_clone().map_err(|e| e.to_string())?;
    let mut down = conn;
    let reporter = std::thread::spawn(move || {
        let mut msg = Vec::new();
        while let Ok(Event::Data(d)) = err.recv() {
            msg.extend_from_slice(&d);
        }
        if !msg.is_empty() {
            eprintln!("{}", String::from_utf8_lossy(&msg).trim());
        }
    });
    let writer = std::thread::spawn(move || {
        while let Ok(Event::Data(d)) = data.recv() {
            if down.write_all(&d).is_err() {
                break;
            }
        }
        let _ = down.shutdown(std::net::Shutdown::Write);
    });
    let mut buf = [0u8; 32 * 1024];
    loop {
        match up.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if s.send(data_id, &buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = s.close(data_id);
    let _ = writer.join();
    let _ = reporter.join();
    Ok(())
}
