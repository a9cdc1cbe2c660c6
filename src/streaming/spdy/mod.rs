//! SPDY/3.1 as Kubernetes streaming clients speak it (moby/spdystream on the client side):
//! framing, zlib header compression with the SPDY/3 dictionary (one compression context per
//! direction per connection, a sync flush per header block), SYN_REPLY for every stream the
//! client opens before any data on it, PING echo, GOAWAY at the end. Received data is
//! acknowledged with WINDOW_UPDATE (stream and session). Our sends honour the peer's window
//! once it sends a WINDOW_UPDATE (it does flow control); Go's spdystream, which kubelet and
//! kubectl use, never does, so for it a fixed per-session send budget bounds what we queue.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch, Notify, Semaphore};

use super::exec::{self, Inbound, InboundTx, Streams, TermSize};
use super::{header_values, text, StreamingServer, Target};
use crate::state::lock;

mod dict;
mod frame;
mod out;
#[cfg(test)]
mod tests;

pub use dict::DICTIONARY;
use frame::be32;
pub use frame::*;
use out::*;

/// How long the client has to open all streams an exec needs.
const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);

/// Negotiates the protocol (first client offer the server speaks) and upgrades.
pub fn accept(
    server: Arc<StreamingServer>,
    req: Request<hyper::body::Incoming>,
    target: Target,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> Response<Full<Bytes>> {
    let offered = header_values(&req, "x-stream-protocol-version");
    let supported = target.protocols(true);
    if offered.is_empty() {
        return text(
            StatusCode::BAD_REQUEST,
            "unable to upgrade: X-Stream-Protocol-Version is required",
        );
    }
    let Some(proto) = offered
        .iter()
        .find(|o| supported.contains(&o.as_str()))
        .cloned()
    else {
        let mut r = text(
            StatusCode::FORBIDDEN,
            &format!(
                "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server accepts {supported:?}"
            ),
        );
        for s in supported {
            if let Ok(v) = s.parse() {
                r.headers_mut()
                    .append("x-accepted-stream-protocol-versions", v);
            }
        }
        return r;
    };
    let mut resp = Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert("connection", "Upgrade".parse().expect("static header"));
    h.insert("upgrade", "SPDY/3.1".parse().expect("static header"));
    if let Ok(v) = proto.parse() {
        h.insert("x-stream-protocol-version", v);
    }
    tokio::spawn(async move {
        let _permit = permit;
        match hyper::upgrade::on(req).await {
            Ok(up) => {
                let io = hyper_util::rt::TokioIo::new(up);
                session(server, io, target, proto).await;
            }
            Err(e) => tracing::warn!(error = %e, "SPDY upgrade failed"),
        }
    });
    resp
}

async fn session<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    server: Arc<StreamingServer>,
    io: IO,
    target: Target,
    proto: String,
) {
    let (mut rd, mut wr) = tokio::io::split(io);
    let (tx, mut rx) = mpsc::channel::<(Vec<u8>, u32)>(1024);
    let activity = Arc::new(AtomicU64::new(0));
    let dead = Arc::new(watch::channel(false).0);
    let budget = Arc::new(Semaphore::new(OUT_BUDGET));
    let out = Out(Arc::new(OutShared {
        tx,
        budget: budget.clone(),
        flow: std::sync::Mutex::new(Flow {
            active: false,
            initial: 64 * 1024,
            session: 64 * 1024,
            streams: HashMap::new(),
        }),
        flow_changed: Notify::new(),
        dead: dead.clone(),
        live: std::sync::Mutex::new(HashMap::new()),
    }));
    let write_timeout = server.write_timeout();
    let writer_activity = activity.clone();
    let writer = tokio::spawn(async move {
        // Everything queued behind a stalled write is bounded by the budget.
        while let Some((f, n)) = rx.recv().await {
            if !super::write_within(write_timeout, wr.write_all(&f)).await {
                break;
            }
            writer_activity.fetch_add(1, Ordering::Relaxed);
            budget.add_permits(n as usize);
        }
        let _ = dead.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(1), wr.shutdown()).await;
    });
    let (opened_tx, opened_rx) = mpsc::channel::<Opened>(MAX_STREAMS);
    let (gone_tx, gone_rx) = oneshot::channel::<()>();
    let idle = server.idle_timeout();
    let reader_out = out.clone();
    let in_budget = Arc::new(Semaphore::new(IN_BUDGET));
    let reader = tokio::spawn(async move {
        let out = reader_out;
        // Frames are read by a task of their own: a timed-out wait for the next one must not
        // abandon a frame half-read (read_frame is not cancel-safe; a channel receive is).
        let (frame_tx, mut frames) = mpsc::channel::<std::io::Result<Frame>>(1);
        let frame_reader = tokio::spawn(async move {
            loop {
                let f = read_frame_max(&mut rd, MAX_FRAME_IN).await;
                let end = f.is_err();
                if frame_tx.send(f).await.is_err() || end {
                    return;
                }
            }
        });
        let _stop_reading = AbortOnDrop(frame_reader);
        let mut dead = out.0.dead.subscribe();
        let mut codec = HeaderCodec::new();
        let mut inbound: HashMap<u32, InboundTx> = HashMap::new();
        let mut last_id = 0u32;
        loop {
            let seen = activity.load(Ordering::Relaxed);
            let frame = tokio::select! {
                f = tokio::time::timeout(idle, frames.recv()) => f,
                _ = dead.wait_for(|d| *d) => break,
            };
            let frame = match frame {
                Ok(Some(Ok(f))) => f,
                Ok(_) => break,
                Err(_) if activity.load(Ordering::Relaxed) != seen => continue,
                Err(_) => {
                    tracing::info!("streaming session idle past {idle:?}; closing");
                    break;
                }
            };
            activity.fetch_add(1, Ordering::Relaxed);
            match frame {
                Frame::Control { typ, flags, body } => match typ {
                    SYN_STREAM => {
                        let id = be32(&body, 0) & 0x7fff_ffff;
                        if id <= last_id || id.is_multiple_of(2) {
                            out.rst(id, 1).await; // PROTOCOL_ERROR
                            continue;
                        }
                        last_id = id;
                        let headers = match codec.decode(body.get(10..).unwrap_or(&[])) {
                            Ok(h) => h.into_iter().collect::<HashMap<_, _>>(),
                            Err(e) => {
                                tracing::warn!(error = %e, "bad SPDY header block; closing");
                                break;
                            }
                        };
                        if lock(&out.0.live).len() >= MAX_STREAMS {
                            out.rst(id, 3).await; // REFUSED_STREAM
                            continue;
                        }
                        lock(&out.0.live).insert(id, (flags & FLAG_FIN != 0, false));
                        let (itx, irx) = exec::inbound(&in_budget);
                        if flags & FLAG_FIN == 0 {
                            inbound.insert(id, itx);
                        }
                        // Reply before anything else is sent on it (the client drops data
                        // that arrives before the reply).
                        let nv = codec.encode(&[]);
                        out.send(control(
                            SYN_REPLY,
                            0,
                            &[&id.to_be_bytes()[..], &nv].concat(),
                        ))
                        .await;
                        let o = Opened {
                            id,
                            headers,
                            inbound: irx,
                        };
                        if opened_tx.try_send(o).is_err() {
                            inbound.remove(&id);
                            out.rst(id, 3).await;
                        }
                    }
                    RST_STREAM => {
                        let id = be32(&body, 0) & 0x7fff_ffff;
                        inbound.remove(&id);
                        out.closed(id, true, true);
                    }
                    // Echo the client's (odd) pings.
                    PING if !be32(&body, 0).is_multiple_of(2) => {
                        out.send(control(PING, 0, &body)).await;
                    }
                    WINDOW_UPDATE => {
                        out.window_update(be32(&body, 0) & 0x7fff_ffff, be32(&body, 4))
                    }
                    SETTINGS => out.settings(&body),
                    GOAWAY => break,
                    _ => {} // SYN_REPLY, HEADERS: nothing to do
                },
                Frame::Data {
                    stream,
                    flags,
                    payload,
                } => {
                    if !payload.is_empty() {
                        let n = (payload.len() as u32).to_be_bytes();
                        if let Some(tx) = inbound.get(&stream) {
                            // Waits while the session's inbound budget is used up: a client
                            // that writes faster than the process reads is held back here.
                            let sent = tokio::select! {
                                ok = tx.send(Bytes::from(payload)) => ok,
                                _ = dead.wait_for(|d| *d) => break,
                            };
                            if !sent {
                                inbound.remove(&stream);
                            }
                        }
                        // The data is consumed: open the stream's and the session's windows
                        // again (SPDY/3.1), for peers that do flow control.
                        for id in [stream, 0] {
                            out.send(control(WINDOW_UPDATE, 0, &[id.to_be_bytes(), n].concat()))
                                .await;
                        }
                    }
                    if flags & FLAG_FIN != 0 {
                        inbound.remove(&stream);
                        out.closed(stream, true, false);
                    }
                }
            }
        }
        let _ = gone_tx.send(());
        last_id
    });

    // When the writer gives up on the client, the reader ends too: that is the exec'd
    // process's `gone` (it is killed) and every stream's end.
    match target.process() {
        Some(p) => run_exec(&server, &out, opened_rx, gone_rx, &proto, &p).await,
        None => {
            if let Target::PortForward { sandbox_id, .. } = &target {
                run_portforward(&server, &out, opened_rx, sandbox_id).await;
            }
        }
    }
    reader.abort();
    let last = reader.await.unwrap_or(0);
    if !out.is_dead() {
        let goaway = control(
            GOAWAY,
            0,
            &[last.to_be_bytes(), 0u32.to_be_bytes()].concat(),
        );
        let _ = tokio::time::timeout(Duration::from_secs(1), out.send(goaway)).await;
    }
    drop(out);
    if tokio::time::timeout(Duration::from_secs(2), writer)
        .await
        .is_err()
    {
        tracing::debug!("streaming writer did not finish; dropped");
    }
}

/// Aborts a task when dropped (also when the task holding it is aborted).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Newline-separated (or concatenated) JSON terminal sizes.
fn resize_stream(mut inbound: Inbound) -> mpsc::Receiver<TermSize> {
    let (tx, rx) = mpsc::channel(8);
    tokio::spawn(async move {
        let mut buf = Vec::new();
        while let Some(b) = inbound.recv().await {
            buf.extend_from_slice(&b);
            let mut de = serde_json::Deserializer::from_slice(&buf).into_iter::<TermSize>();
            let mut used = 0;
            while let Some(Ok(s)) = de.next() {
                used = de.byte_offset();
                if tx.send(s).await.is_err() {
                    return;
                }
            }
            buf.drain(..used);
            if buf.len() > 4096 {
                return; // not terminal sizes
            }
        }
    });
    rx
}

/// Forwards a channel of output to a stream's data frames.
fn forward(out: &Out, stream: u32) -> (mpsc::Sender<Bytes>, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::channel::<Bytes>(2);
    let out = out.clone();
    let t = tokio::spawn(async move {
        while let Some(b) = rx.recv().await {
            if !out.data(stream, &b).await {
                break;
            }
        }
    });
    (tx, t)
}

async fn run_exec(
    server: &StreamingServer,
    out: &Out,
    mut opened: mpsc::Receiver<Opened>,
    gone: oneshot::Receiver<()>,
    proto: &str,
    p: &super::Process,
) {
    let (container_id, tty, want_in, want_out, want_err) =
        (p.container_id.as_str(), p.tty, p.stdin, p.stdout, p.stderr);
    let v4 = proto.starts_with("v4.") || proto.starts_with("v5.");
    let resize_expected = tty && has_resize(proto);
    let expected =
        1 + want_in as usize + want_out as usize + want_err as usize + resize_expected as usize;
    let mut streams: HashMap<String, Opened> = HashMap::new();
    let deadline = tokio::time::Instant::now() + STREAM_CREATION_TIMEOUT;
    while streams.len() < expected {
        match tokio::time::timeout_at(deadline, opened.recv()).await {
            Ok(Some(o)) => {
                let t = o.headers.get("streamtype").cloned().unwrap_or_default();
                if matches!(
                    t.as_str(),
                    "error" | "stdin" | "stdout" | "stderr" | "resize"
                ) && !streams.contains_key(&t)
                {
                    streams.insert(t, o);
                } else {
                    out.rst(o.id, 3).await;
                }
            }
            _ => {
                tracing::warn!(
                    container_id,
                    "timed out waiting for the client to create streams"
                );
                return;
            }
        }
    }
    // Streams opened after the ones the session needs are refused.
    let refuse_out = out.clone();
    let refuser = AbortOnDrop(tokio::spawn(async move {
        while let Some(o) = opened.recv().await {
            refuse_out.rst(o.id, 3).await;
        }
    }));
    let err_id = streams.get("error").map(|o| o.id);
    let mut forwards = Vec::new();
    let mut ids = Vec::new();
    let mut wire = |name: &str| {
        streams.get(name).map(|o| {
            ids.push(o.id);
            let (tx, t) = forward(out, o.id);
            forwards.push(t);
            tx
        })
    };
    let stdout = wire("stdout");
    let stderr = wire("stderr");
    let s = Streams {
        stdin: streams.remove("stdin").map(|o| o.inbound),
        stdout,
        stderr,
        resize: streams.remove("resize").map(|o| resize_stream(o.inbound)),
        gone: Some(gone),
    };
    let outcome = super::run_process(server, p, s).await;
    for t in forwards {
        let _ = t.await;
    }
    drop(refuser);
    if let Some(e) = err_id {
        let msg = super::final_status(v4, &outcome);
        if !msg.is_empty() {
            out.data(e, &msg).await;
        }
        out.fin(e).await;
    }
    for id in ids {
        out.fin(id).await;
    }
}

async fn run_portforward(
    server: &StreamingServer,
    out: &Out,
    mut opened: mpsc::Receiver<Opened>,
    sandbox_id: &str,
) {
    let netns = match server.pod_netns(sandbox_id) {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(sandbox_id, error = %e, "port forward refused");
            return;
        }
    };
    // Pairs of (error, data) streams by request id; unpaired ones are bounded by the
    // session's stream cap.
    let mut pending: HashMap<String, (Option<Opened>, Option<Opened>)> = HashMap::new();
    let mut tasks = Vec::new();
    while let Some(o) = opened.recv().await {
        let req = o
            .headers
            .get("requestid")
            .cloned()
            .unwrap_or_else(|| o.id.to_string());
        let typ = o.headers.get("streamtype").cloned().unwrap_or_default();
        if typ != "error" && typ != "data" {
            out.rst(o.id, 1).await;
            continue;
        }
        let entry = pending.entry(req.clone()).or_default();
        let slot = if typ == "error" {
            &mut entry.0
        } else {
            &mut entry.1
        };
        if let Some(dup) = slot.replace(o) {
            out.rst(dup.id, 1).await;
        }
        if let (Some(_), Some(_)) = (&entry.0, &entry.1) {
            let Some((Some(err), Some(data))) = pending.remove(&req) else {
                continue; // (both were just seen)
            };
            let port = data
                .headers
                .get("port")
                .and_then(|p| p.parse::<u16>().ok())
                .filter(|p| *p > 0);
            let (out, netns, sandbox_id) = (out.clone(), netns.clone(), sandbox_id.to_string());
            tasks.retain(|t: &tokio::task::JoinHandle<()>| !t.is_finished());
            tasks.push(tokio::spawn(async move {
                let Some(port) = port else {
                    out.data(err.id, b"invalid or missing port header").await;
                    out.fin(err.id).await;
                    out.fin(data.id).await;
                    return;
                };
                match exec::connect_in_netns(netns, port).await {
                    Ok(tcp) => {
                        let id = data.id;
                        let o = out.clone();
                        exec::pump(tcp, data.inbound, move |b| {
                            let o = o.clone();
                            async move { o.data(id, &b).await }
                        })
                        .await
                    }
                    Err(e) => {
                        let msg = serde_json::json!({
                            "closeConnection": true,
                            "message": format!("error forwarding port {port} to pod {sandbox_id}: {e}"),
                        });
                        out.data(err.id, format!("{msg}\n").as_bytes()).await;
                    }
                }
                out.fin(err.id).await;
                out.fin(data.id).await;
            }));
        }
    }
    for t in tasks {
        t.abort();
    }
}
