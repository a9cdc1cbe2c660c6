//! SPDY/3.1 as Kubernetes streaming clients speak it (moby/spdystream on the client side):
//! framing, zlib header compression with the SPDY/3 dictionary (one compression context per
//! direction per connection, a sync flush per header block), SYN_REPLY for every stream the
//! client opens before any data on it, PING echo, GOAWAY at the end. Received data is
//! acknowledged with WINDOW_UPDATE (stream and session); the send window is not enforced,
//! since Go's spdystream, which kubelet and kubectl use, never sends WINDOW_UPDATE.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use super::exec::{self, Streams, TermSize};
use super::{header_values, text, StreamingServer, Target};

#[path = "spdy_dict.rs"]
mod dict;
pub use dict::DICTIONARY;

pub const SYN_STREAM: u16 = 1;
pub const SYN_REPLY: u16 = 2;
pub const RST_STREAM: u16 = 3;
pub const SETTINGS: u16 = 4;
pub const PING: u16 = 6;
pub const GOAWAY: u16 = 7;
pub const HEADERS: u16 = 8;
pub const WINDOW_UPDATE: u16 = 9;
pub const FLAG_FIN: u8 = 0x01;
/// Largest frame payload accepted (the 24-bit length field's maximum).
const MAX_FRAME: usize = (1 << 24) - 1;
/// How long the client has to open all streams an exec needs.
const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);

/// Protocols this server speaks over SPDY, best first.
pub const EXEC_PROTOCOLS: &[&str] = &[
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
];
pub const PORTFORWARD_PROTOCOLS: &[&str] = &["portforward.k8s.io"];

/// Does remotecommand `proto` carry terminal resizes (a resize stream, v3 and later)?
pub fn has_resize(proto: &str) -> bool {
    proto != "channel.k8s.io" && proto != "v2.channel.k8s.io"
}

/// A control frame: `1 | version 3 | type | flags | length | body`.
pub fn control(typ: u16, flags: u8, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + body.len());
    v.extend_from_slice(&(0x8000u16 | 3).to_be_bytes());
    v.extend_from_slice(&typ.to_be_bytes());
    v.push(flags);
    v.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    v.extend_from_slice(body);
    v
}

/// A data frame: `0 | stream id | flags | length | payload`.
pub fn data(stream: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + payload.len());
    v.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    v.push(flags);
    v.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    v.extend_from_slice(payload);
    v
}

/// One direction's header compression context.
pub struct HeaderCodec {
    deflate: Compress,
    inflate: Decompress,
}

impl Default for HeaderCodec {
    fn default() -> Self {
        Self::new()
    }
}

impl HeaderCodec {
    pub fn new() -> Self {
        let mut deflate = Compress::new(Compression::default(), true);
        let _ = deflate.set_dictionary(DICTIONARY);
        HeaderCodec {
            deflate,
            inflate: Decompress::new(true),
        }
    }

    /// Encodes and compresses a name/value block (32-bit counts and lengths, SPDY/3).
    pub fn encode(&mut self, headers: &[(&str, &str)]) -> Vec<u8> {
        let mut nv = Vec::new();
        nv.extend_from_slice(&(headers.len() as u32).to_be_bytes());
        for (k, v) in headers {
            let k = k.to_ascii_lowercase();
            nv.extend_from_slice(&(k.len() as u32).to_be_bytes());
            nv.extend_from_slice(k.as_bytes());
            nv.extend_from_slice(&(v.len() as u32).to_be_bytes());
            nv.extend_from_slice(v.as_bytes());
        }
        let mut out = Vec::with_capacity(nv.len() + 64);
        let start = self.deflate.total_in();
        loop {
            let consumed = (self.deflate.total_in() - start) as usize;
            if out.capacity() - out.len() < 64 {
                out.reserve(256);
            }
            let before = out.len();
            let _ = self
                .deflate
                .compress_vec(&nv[consumed..], &mut out, FlushCompress::Sync);
            let done = (self.deflate.total_in() - start) as usize == nv.len();
            // A sync flush is complete when the output did not fill the buffer.
            if done && out.len() < out.capacity() && out.len() > before {
                break;
            }
            if done && out.len() == before {
                break;
            }
        }
        out
    }

    /// Decompresses and parses a name/value block. Names are lowercased.
    pub fn decode(&mut self, block: &[u8]) -> Result<Vec<(String, String)>, String> {
        let mut out = Vec::with_capacity(block.len() * 4 + 64);
        let start = self.inflate.total_in();
        loop {
            let consumed = (self.inflate.total_in() - start) as usize;
            if out.capacity() - out.len() < 256 {
                out.reserve(1024);
            }
            let before = out.len();
            match self
                .inflate
                .decompress_vec(&block[consumed..], &mut out, FlushDecompress::Sync)
            {
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.inflate
                        .set_dictionary(DICTIONARY)
                        .map_err(|e| format!("header dictionary: {e}"))?;
                    continue;
                }
                Err(e) => return Err(format!("header block: {e}")),
            }
            let consumed = (self.inflate.total_in() - start) as usize;
            if consumed == block.len() && out.len() < out.capacity() {
                break;
            }
            if out.len() == before && consumed == block.len() {
                break;
            }
            if out.len() > 1 << 20 {
                return Err("header block too large".into());
            }
        }
        parse_nv(&out)
    }
}

fn parse_nv(b: &[u8]) -> Result<Vec<(String, String)>, String> {
    struct Cursor<'a> {
        b: &'a [u8],
        pos: usize,
    }
    impl Cursor<'_> {
        fn take(&mut self, n: usize) -> Result<&[u8], String> {
            let s = self
                .b
                .get(self.pos..self.pos + n)
                .ok_or("truncated header block")?;
            self.pos += n;
            Ok(s)
        }
        fn u32(&mut self) -> Result<usize, String> {
            let s = self.take(4)?;
            Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]]) as usize)
        }
    }
    let mut c = Cursor { b, pos: 0 };
    let n = c.u32()?;
    let mut out = Vec::new();
    for _ in 0..n.min(1024) {
        let kl = c.u32()?;
        let k = String::from_utf8_lossy(c.take(kl)?).to_ascii_lowercase();
        let vl = c.u32()?;
        let v = String::from_utf8_lossy(c.take(vl)?).into_owned();
        // Several values of one name are NUL-separated.
        for val in v.split('\0') {
            out.push((k.clone(), val.to_string()));
        }
    }
    Ok(out)
}

/// One frame as read from the wire.
#[derive(Debug)]
pub enum Frame {
    Control {
        typ: u16,
        flags: u8,
        body: Vec<u8>,
    },
    Data {
        stream: u32,
        flags: u8,
        payload: Vec<u8>,
    },
}

pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<Frame> {
    let mut h = [0u8; 8];
    r.read_exact(&mut h).await?;
    let len = u32::from_be_bytes([0, h[5], h[6], h[7]]) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::other("frame too large"));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    Ok(if h[0] & 0x80 != 0 {
        Frame::Control {
            typ: u16::from_be_bytes([h[2], h[3]]),
            flags: h[4],
            body,
        }
    } else {
        Frame::Data {
            stream: u32::from_be_bytes([h[0], h[1], h[2], h[3]]) & 0x7fff_ffff,
            flags: h[4],
            payload: body,
        }
    })
}

/// Blocking read of one frame: `(is control, control type, flags, data stream id, body)`.
pub fn read_frame_blocking<R: std::io::Read>(
    r: &mut R,
) -> std::io::Result<(bool, u16, u8, u32, Vec<u8>)> {
    let mut h = [0u8; 8];
    r.read_exact(&mut h)?;
    let len = u32::from_be_bytes([0, h[5], h[6], h[7]]) as usize;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    let ctrl = h[0] & 0x80 != 0;
    Ok((
        ctrl,
        u16::from_be_bytes([h[2], h[3]]),
        h[4],
        u32::from_be_bytes([h[0], h[1], h[2], h[3]]) & 0x7fff_ffff,
        body,
    ))
}

fn be32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_be_bytes)
        .unwrap_or(0)
}

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

/// A stream the client opened: its headers, and its inbound data (closed on FIN or reset).
struct Opened {
    id: u32,
    headers: HashMap<String, String>,
    inbound: mpsc::Receiver<Bytes>,
}

/// Outbound side shared by tasks: frames go through one writer task in order.
#[derive(Clone)]
struct Out {
    tx: mpsc::UnboundedSender<Vec<u8>>,
    activity: Arc<AtomicU64>,
}

impl Out {
    fn send(&self, frame: Vec<u8>) -> bool {
        self.activity.fetch_add(1, Ordering::Relaxed);
        self.tx.send(frame).is_ok()
    }
    fn data(&self, stream: u32, payload: &[u8]) -> bool {
        payload
            .chunks(64 * 1024)
            .all(|c| self.send(data(stream, 0, c)))
    }
    fn fin(&self, stream: u32) -> bool {
        self.send(data(stream, FLAG_FIN, &[]))
    }
}

async fn session<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    server: Arc<StreamingServer>,
    io: IO,
    target: Target,
    proto: String,
) {
    let (mut rd, mut wr) = tokio::io::split(io);
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let activity = Arc::new(AtomicU64::new(0));
    let out = Out {
        tx,
        activity: activity.clone(),
    };
    let writer = tokio::spawn(async move {
        while let Some(f) = rx.recv().await {
            if wr.write_all(&f).await.is_err() {
                break;
            }
        }
        let _ = wr.shutdown().await;
    });
    let (opened_tx, opened_rx) = mpsc::unbounded_channel::<Opened>();
    let (gone_tx, gone_rx) = oneshot::channel::<()>();
    let idle = server.idle_timeout();
    let reader_out = out.clone();
    let reader = tokio::spawn(async move {
        // Frames are read by a task of their own: a timed-out wait for the next one must not
        // abandon a frame half-read (read_frame is not cancel-safe; a channel receive is).
        let (frame_tx, mut frames) = mpsc::channel::<std::io::Result<Frame>>(1);
        let frame_reader = tokio::spawn(async move {
            loop {
                let f = read_frame(&mut rd).await;
                let end = f.is_err();
                if frame_tx.send(f).await.is_err() || end {
                    return;
                }
            }
        });
        let _stop_reading = AbortOnDrop(frame_reader);
        let mut codec = HeaderCodec::new();
        let mut inbound: HashMap<u32, mpsc::Sender<Bytes>> = HashMap::new();
        let mut last_id = 0u32;
        loop {
            let seen = activity.load(Ordering::Relaxed);
            let frame = match tokio::time::timeout(idle, frames.recv()).await {
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
                            reader_out.send(control(
                                RST_STREAM,
                                0,
                                &[id.to_be_bytes(), 1u32.to_be_bytes()].concat(),
                            ));
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
                        let (itx, irx) = mpsc::channel(64);
                        if flags & FLAG_FIN == 0 {
                            inbound.insert(id, itx);
                        }
                        // Reply before anything else is sent on it (the client drops data
                        // that arrives before the reply).
                        let nv = codec.encode(&[]);
                        reader_out.send(control(
                            SYN_REPLY,
                            0,
                            &[&id.to_be_bytes()[..], &nv].concat(),
                        ));
                        let _ = opened_tx.send(Opened {
                            id,
                            headers,
                            inbound: irx,
                        });
                    }
                    RST_STREAM => {
                        inbound.remove(&(be32(&body, 0) & 0x7fff_ffff));
                    }
                    // Echo the client's (odd) pings.
                    PING if !be32(&body, 0).is_multiple_of(2) => {
                        reader_out.send(control(PING, 0, &body));
                    }
                    GOAWAY => break,
                    _ => {} // SYN_REPLY, SETTINGS, WINDOW_UPDATE, HEADERS: nothing to do
                },
                Frame::Data {
                    stream,
                    flags,
                    payload,
                } => {
                    if !payload.is_empty() {
                        let n = (payload.len() as u32).to_be_bytes();
                        if let Some(tx) = inbound.get(&stream) {
                            if tx.send(Bytes::from(payload)).await.is_err() {
                                inbound.remove(&stream);
                            }
                        }
                        // The data is consumed: open the stream's and the session's windows
                        // again (SPDY/3.1), for peers that do flow control.
                        for id in [stream, 0] {
                            reader_out.send(control(
                                WINDOW_UPDATE,
                                0,
                                &[id.to_be_bytes(), n].concat(),
                            ));
                        }
                    }
                    if flags & FLAG_FIN != 0 {
                        inbound.remove(&stream);
                    }
                }
            }
        }
        let _ = gone_tx.send(());
        last_id
    });

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
    out.send(control(
        GOAWAY,
        0,
        &[last.to_be_bytes(), 0u32.to_be_bytes()].concat(),
    ));
    drop(out);
    let _ = writer.await;
}

/// Aborts a task when dropped (also when the task holding it is aborted).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Newline-separated (or concatenated) JSON terminal sizes.
fn resize_stream(mut inbound: mpsc::Receiver<Bytes>) -> mpsc::Receiver<TermSize> {
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
        }
    });
    rx
}

/// Forwards a channel of output to a stream's data frames.
fn forward(out: &Out, stream: u32) -> (mpsc::Sender<Bytes>, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::channel::<Bytes>(16);
    let out = out.clone();
    let t = tokio::spawn(async move {
        while let Some(b) = rx.recv().await {
            if !out.data(stream, &b) {
                break;
            }
        }
    });
    (tx, t)
}

async fn run_exec(
    server: &StreamingServer,
    out: &Out,
    mut opened: mpsc::UnboundedReceiver<Opened>,
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
                ) {
                    streams.insert(t, o);
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
    if let Some(e) = err_id {
        let msg = super::final_status(v4, &outcome);
        if !msg.is_empty() {
            out.data(e, &msg);
        }
        out.fin(e);
    }
    for id in ids {
        out.fin(id);
    }
}

async fn run_portforward(
    server: &StreamingServer,
    out: &Out,
    mut opened: mpsc::UnboundedReceiver<Opened>,
    sandbox_id: &str,
) {
    let netns = match server.pod_netns(sandbox_id) {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(sandbox_id, error = %e, "port forward refused");
            return;
        }
    };
    // Pairs of (error, data) streams by request id.
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
            out.send(control(
                RST_STREAM,
                0,
                &[o.id.to_be_bytes(), 1u32.to_be_bytes()].concat(),
            ));
            continue;
        }
        let entry = pending.entry(req.clone()).or_default();
        if typ == "error" {
            entry.0 = Some(o);
        } else {
            entry.1 = Some(o);
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
            tasks.push(tokio::spawn(async move {
                let Some(port) = port else {
                    out.data(err.id, b"invalid or missing port header");
                    out.fin(err.id);
                    out.fin(data.id);
                    return;
                };
                match exec::connect_in_netns(netns, port).await {
                    Ok(tcp) => {
                        let id = data.id;
                        exec::pump(tcp, data.inbound, |b| {
                            let ok = out.data(id, &b);
                            async move { ok }
                        })
                        .await
                    }
                    Err(e) => {
                        let msg = serde_json::json!({
                            "closeConnection": true,
                            "message": format!("error forwarding port {port} to pod {sandbox_id}: {e}"),
                        });
                        out.data(err.id, format!("{msg}\n").as_bytes());
                    }
                }
                out.fin(err.id);
                out.fin(data.id);
            }));
        }
    }
    for t in tasks {
        t.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dictionary_is_the_spdy3_one() {
        assert_eq!(DICTIONARY.len(), 1423);
        // adler32, the zlib DICTID of the dictionary.
        let (mut a, mut b) = (1u32, 0u32);
        for &x in DICTIONARY {
            a = (a + x as u32) % 65521;
            b = (b + a) % 65521;
        }
        assert_eq!((b << 16) | a, 0xe3c6_a7c2);
        assert!(DICTIONARY.ends_with(b",enq=0."));
    }

    #[test]
    fn decodes_a_go_client_header_block() {
        // The first SYN_STREAM header block a Go spdystream client sends for
        // `streamtype: error` (zlib with FDICT and the dictionary's id).
        let block: Vec<u8> = (0..30)
            .map(|i| {
                u8::from_str_radix(
                    &"78f9e3c6a7c202a62346703a2b294a4dcc851625aca9a08006000000ffff"
                        [i * 2..i * 2 + 2],
                    16,
                )
                .unwrap()
            })
            .collect();
        let mut c = HeaderCodec::new();
        assert_eq!(
            c.decode(&block).unwrap(),
            vec![("streamtype".to_string(), "error".to_string())]
        );
    }

    #[test]
    fn header_blocks_round_trip_across_frames() {
        let mut a = HeaderCodec::new();
        let mut b = HeaderCodec::new();
        for i in 0..5 {
            let v = format!("value-{i}");
            let block = a.encode(&[("streamType", "data"), ("port", &v)]);
            assert!(block.ends_with(&[0, 0, 0xff, 0xff]), "not sync-flushed");
            assert_eq!(
                b.decode(&block).unwrap(),
                vec![
                    ("streamtype".to_string(), "data".to_string()),
                    ("port".to_string(), v)
                ]
            );
        }
    }
}
