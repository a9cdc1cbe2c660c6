//! The Kubernetes WebSocket channel protocols (`tokio-tungstenite`): every message is a channel
//! byte and a payload (binary), or an ASCII channel digit and base64 (`*base64.channel.k8s.io`,
//! text frames). Exec: 0 stdin, 1 stdout, 2 stderr, 3 error, 4 resize, and in v5 255 = close a
//! channel. Port forward: port i on channels 2i (data) and 2i+1 (error), each opened by the
//! port as two little-endian bytes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tokio_tungstenite::tungstenite::protocol::{Message, Role};
use tokio_tungstenite::WebSocketStream;

use super::exec::{self, Streams, TermSize};
use super::{header_values, text, StreamingServer, Target};

/// Exec protocols, best first; "" is the plain binary protocol of clients that offer none.
pub const EXEC_PROTOCOLS: &[&str] = &[
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "channel.k8s.io",
    "base64.channel.k8s.io",
];
pub const PORTFORWARD_PROTOCOLS: &[&str] = &[
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "portforward.k8s.io",
];

pub fn accept(
    server: Arc<StreamingServer>,
    req: Request<hyper::body::Incoming>,
    target: Target,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> Response<Full<Bytes>> {
    let Some(key) = req
        .headers()
        .get("sec-websocket-key")
        .and_then(|k| k.to_str().ok())
        .map(str::to_string)
    else {
        return text(StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key");
    };
    let offered = header_values(&req, "sec-websocket-protocol");
    let supported = target.protocols(false);
    let proto = if offered.is_empty() {
        String::new()
    } else {
        match offered.iter().find(|o| supported.contains(&o.as_str())) {
            Some(p) => p.clone(),
            None => {
                return text(
                    StatusCode::BAD_REQUEST,
                    &format!(
                        "no supported subprotocol in {offered:?}; server accepts {supported:?}"
                    ),
                )
            }
        }
    };
    let mut resp = Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert("connection", "Upgrade".parse().expect("static header"));
    h.insert("upgrade", "websocket".parse().expect("static header"));
    let accept_key = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    if let Ok(v) = accept_key.parse() {
        h.insert("sec-websocket-accept", v);
    }
    if !proto.is_empty() {
        if let Ok(v) = proto.parse() {
            h.insert("sec-websocket-protocol", v);
        }
    }
    let query_ports: Vec<u16> = req
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| *k == "port" || *k == "ports")
        .flat_map(|(_, v)| v.split(',').map(str::to_string).collect::<Vec<_>>())
        .filter_map(|p| p.parse::<u16>().ok())
        .collect();
    tokio::spawn(async move {
        let _permit = permit;
        match hyper::upgrade::on(req).await {
            Ok(up) => {
                let io = hyper_util::rt::TokioIo::new(up);
                let ws =
                    WebSocketStream::from_raw_socket(io, Role::Server, Some(ws_config())).await;
                match (target.process(), target) {
                    (Some(p), _) => run_exec(&server, ws, &proto, &p).await,
                    (None, Target::PortForward { sandbox_id, ports }) => {
                        let ports = if ports.is_empty() { query_ports } else { ports };
                        run_portforward(&server, ws, &proto, &sandbox_id, &ports).await
                    }
                    (None, _) => {}
                }
            }
            Err(e) => tracing::warn!(error = %e, "websocket upgrade failed"),
        }
    });
    resp
}

/// Bounds on what one client message may cost us (Kubernetes clients send stdin and port data
/// in chunks of at most 32 KiB).
fn ws_config() -> tokio_tungstenite::tungstenite::protocol::WebSocketConfig {
    tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE))
        .max_write_buffer_size(4 * MAX_MESSAGE)
}

/// Largest message accepted from a client.
const MAX_MESSAGE: usize = 1 << 20;
/// Most bytes of client data queued for one session's consumers.
const IN_BUDGET: usize = 1 << 20;

fn encode(b64: bool, channel: u8, payload: &[u8]) -> Message {
    if b64 {
        let mut s = String::with_capacity(1 + payload.len() * 4 / 3 + 4);
        s.push((b'0' + channel) as char);
        s.push_str(&base64::engine::general_purpose::STANDARD.encode(payload));
        Message::text(s)
    } else {
        let mut v = Vec::with_capacity(1 + payload.len());
        v.push(channel);
        v.extend_from_slice(payload);
        Message::binary(v)
    }
}

/// `(channel, payload)` of a client message given as raw bytes (`text` for a text frame):
/// what the fuzzer drives.
pub fn decode_frame(b64: bool, text: bool, data: &[u8]) -> Option<(u8, Vec<u8>)> {
    let m = if text {
        Message::text(String::from_utf8_lossy(data).into_owned())
    } else {
        Message::binary(data.to_vec())
    };
    decode(b64, m)
}

/// `(channel, payload)` of an incoming message; `None` for control or malformed ones.
fn decode(b64: bool, m: Message) -> Option<(u8, Vec<u8>)> {
    match m {
        Message::Binary(b) if !b64 && !b.is_empty() => Some((b[0], b[1..].to_vec())),
        Message::Text(t) if b64 && !t.is_empty() => {
            let bytes = t.as_bytes();
            let ch = bytes[0].checked_sub(b'0')?;
            let data = base64::engine::general_purpose::STANDARD
                .decode(&bytes[1..])
                .ok()?;
            Some((ch, data))
        }
        _ => None,
    }
}

type Ws = WebSocketStream<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>;

/// The writer task: sends what arrives on the returned channel in order, counting each message
/// as activity for the idle timeout (traffic either way keeps a session alive, as in SPDY), and
/// closes the socket when the channel ends. A send that stalls past `write_timeout` (the
/// client stopped reading) ends the session: `dead` is set.
fn spawn_writer(
    mut sink: SplitSink<Ws, Message>,
    cap: usize,
    activity: Arc<AtomicU64>,
    write_timeout: Duration,
    dead: Arc<watch::Sender<bool>>,
) -> (mpsc::Sender<Message>, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::channel::<Message>(cap);
    let task = tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            if !super::write_within(write_timeout, sink.send(m)).await {
                break;
            }
            activity.fetch_add(1, Ordering::Relaxed);
        }
        let _ = dead.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(1), sink.close()).await;
    });
    (tx, task)
}

/// The client's next channel message; `None` once it closes or fails, after `idle` without
/// traffic in either direction, or once the writer gave up (`dead`).
async fn next_msg(
    stream: &mut SplitStream<Ws>,
    idle: Duration,
    activity: &AtomicU64,
    b64: bool,
    dead: &mut watch::Receiver<bool>,
) -> Option<(u8, Vec<u8>)> {
    loop {
        let seen = activity.load(Ordering::Relaxed);
        let next = tokio::select! {
            n = tokio::time::timeout(idle, stream.next()) => n,
            _ = dead.wait_for(|d| *d) => return None,
        };
        match next {
            Ok(Some(Ok(m))) => {
                activity.fetch_add(1, Ordering::Relaxed);
                if m.is_close() {
                    return None;
                }
                if let Some(msg) = decode(b64, m) {
                    return Some(msg);
                }
            }
            Ok(_) => return None,
            Err(_) if activity.load(Ordering::Relaxed) != seen => {}
            Err(_) => {
                tracing::info!("streaming session idle past {idle:?}; closing");
                return None;
            }
        }
    }
}

async fn run_exec(server: &StreamingServer, ws: Ws, proto: &str, p: &super::Process) {
    let (tty, want_in, want_out, want_err) = (p.tty, p.stdin, p.stdout, p.stderr);
    let b64 = proto.contains("base64");
    let v5 = proto == "v5.channel.k8s.io";
    let v4 = v5 || proto.starts_with("v4.");
    let (sink, mut stream) = ws.split();
    let activity = Arc::new(AtomicU64::new(0));
    let dead = Arc::new(watch::channel(false).0);
    let (out_tx, writer) = spawn_writer(
        sink,
        8,
        activity.clone(),
        server.write_timeout(),
        dead.clone(),
    );
    // Opened: one empty message on the lowest channel the server writes.
    let first = if want_out {
        1
    } else if want_err {
        2
    } else {
        3
    };
    let _ = out_tx.send(encode(b64, first, &[])).await;

    let (stdin_tx, stdin_rx) = exec::inbound(&Arc::new(Semaphore::new(IN_BUDGET)));
    let (resize_tx, resize_rx) = mpsc::channel::<TermSize>(8);
    let (gone_tx, gone_rx) = oneshot::channel::<()>();
    let idle = server.idle_timeout();
    let mut dead_rx = dead.subscribe();
    let reader = tokio::spawn(async move {
        let mut stdin_tx = Some(stdin_tx);
        while let Some((ch, data)) = next_msg(&mut stream, idle, &activity, b64, &mut dead_rx).await
        {
            match ch {
                0 => {
                    if let Some(tx) = &stdin_tx {
                        if !tx.send(Bytes::from(data)).await {
                            stdin_tx = None;
                        }
                    }
                }
                4 => {
                    if let Ok(s) = serde_json::from_slice::<TermSize>(&data) {
                        let _ = resize_tx.send(s).await;
                    }
                }
                255 if v5 => {
                    // v5 CLOSE: [255, channel]; closing stdin is its EOF.
                    match data.as_slice() {
                        [0] => stdin_tx = None,
                        [_] => {}
                        _ => break,
                    }
                }
                _ => {}
            }
        }
        let _ = gone_tx.send(());
    });
    let fwd = |ch: u8| {
        let (tx, mut rx) = mpsc::channel::<Bytes>(2);
        let out = out_tx.clone();
        let t = tokio::spawn(async move {
            while let Some(b) = rx.recv().await {
                if out.send(encode(b64, ch, &b)).await.is_err() {
                    break;
                }
            }
        });
        (tx, t)
    };
    let mut tasks = Vec::new();
    let stdout = want_out.then(|| {
        let (tx, t) = fwd(1);
        tasks.push(t);
        tx
    });
    let stderr = want_err.then(|| {
        let (tx, t) = fwd(2);
        tasks.push(t);
        tx
    });
    let s = Streams {
        stdin: want_in.then_some(stdin_rx),
        stdout,
        stderr,
        resize: tty.then_some(resize_rx),
        gone: Some(gone_rx),
    };
    let outcome = super::run_process(server, p, s).await;
    for t in tasks {
        let _ = t.await;
    }
    let msg = super::final_status(v4, &outcome);
    if !msg.is_empty() {
        let _ = out_tx.send(encode(b64, 3, &msg)).await;
    }
    drop(out_tx);
    let _ = writer.await;
    reader.abort();
}

async fn run_portforward(
    server: &StreamingServer,
    ws: Ws,
    proto: &str,
    sandbox_id: &str,
    ports: &[u16],
) {
    let b64 = proto.contains("base64");
    let (mut sink, mut stream) = ws.split();
    let netns = match server.pod_netns(sandbox_id) {
        Ok(n) => n,
        Err(e) => {
            let _ = sink.send(encode(b64, 1, e.to_string().as_bytes())).await;
            let _ = sink.close().await;
            return;
        }
    };
    if ports.is_empty() || ports.len() > 64 {
        let _ = sink
            .send(encode(b64, 1, b"port forwarding needs 1 to 64 ports"))
            .await;
        let _ = sink.close().await;
        return;
    }
    let activity = Arc::new(AtomicU64::new(0));
    let dead = Arc::new(watch::channel(false).0);
    let (out_tx, writer) = spawn_writer(
        sink,
        16,
        activity.clone(),
        server.write_timeout(),
        dead.clone(),
    );
    let budget = Arc::new(Semaphore::new(IN_BUDGET));
    let mut inbound = Vec::new();
    let mut tasks = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let (data_ch, err_ch) = ((2 * i) as u8, (2 * i + 1) as u8);
        for ch in [data_ch, err_ch] {
            let _ = out_tx.send(encode(b64, ch, &port.to_le_bytes())).await;
        }
        let (tx, rx) = exec::inbound(&budget);
        inbound.push(tx);
        let (out, netns, port, sandbox_id) =
            (out_tx.clone(), netns.clone(), *port, sandbox_id.to_string());
        tasks.push(tokio::spawn(async move {
            match exec::connect_in_netns(netns, port).await {
                Ok(tcp) => {
                    exec::pump(tcp, rx, |b| {
                        let out = out.clone();
                        async move { out.send(encode(b64, data_ch, &b)).await.is_ok() }
                    })
                    .await
                }
                Err(e) => {
                    let msg = format!("error forwarding port {port} to pod {sandbox_id}: {e}");
                    let _ = out.send(encode(b64, err_ch, msg.as_bytes())).await;
                }
            }
        }));
    }
    let idle = server.idle_timeout();
    let mut dead_rx = dead.subscribe();
    let reader = tokio::spawn(async move {
        let mut inbound: Vec<Option<exec::InboundTx>> = inbound.into_iter().map(Some).collect();
        while let Some((ch, data)) = next_msg(&mut stream, idle, &activity, b64, &mut dead_rx).await
        {
            let i = (ch / 2) as usize;
            if ch % 2 == 0 {
                if let Some(Some(tx)) = inbound.get(i) {
                    if !tx.send(Bytes::from(data)).await {
                        inbound[i] = None;
                    }
                }
            }
        }
    });
    for t in tasks {
        let _ = t.await;
    }
    reader.abort();
    drop(out_tx);
    let _ = writer.await;
}
