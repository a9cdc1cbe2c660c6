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
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch, Notify, Semaphore};

use super::exec::{self, Inbound, InboundTx, Streams, TermSize};
use super::{header_values, text, StreamingServer, Target};
use crate::lock;

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
        let mut dictionary_set = false;
        loop {
            let consumed = (self.inflate.total_in() - start) as usize;
            let consumed_before = consumed;
            if out.capacity() - out.len() < 256 {
                out.reserve(1024);
            }
            let before = out.len();
            match self
                .inflate
                .decompress_vec(&block[consumed..], &mut out, FlushDecompress::Sync)
            {
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() && !dictionary_set => {
                    self.inflate
                        .set_dictionary(DICTIONARY)
                        .map_err(|e| format!("header dictionary: {e}"))?;
                    dictionary_set = true;
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
            // No progress with input left (bytes after the end of the zlib stream, say): a
            // client's garbage must not spin us.
            if out.len() == before && consumed == consumed_before {
                return Err("header block: data the decompressor does not take".into());
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
    read_frame_max(r, MAX_FRAME).await
}

/// Reads one frame of at most `max` payload bytes (a longer one is an error: the frame is
/// never buffered).
pub async fn read_frame_max<R: AsyncRead + Unpin>(r: &mut R, max: usize) -> std::io::Result<Frame> {
    let mut h = [0u8; 8];
    r.read_exact(&mut h).await?;
    let len = u32::from_be_bytes([0, h[5], h[6], h[7]]) as usize;
    if len > max.min(MAX_FRAME) {
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
    inbound: Inbound,
}

/// Send-side flow control. Our sends are always counted against the peer's windows (64 KiB
/// per stream and per session to start with, SPDY/3.1); they are held to them only once the
/// peer has shown it does flow control by sending a WINDOW_UPDATE (Go's spdystream, which
/// kubelet and kubectl use, never does; for such peers the session's byte budget is the bound).
struct Flow {
    active: bool,
    initial: i64,
    session: i64,
    streams: HashMap<u32, i64>,
}

struct OutShared {
    tx: mpsc::Sender<(Vec<u8>, u32)>,
    /// Bytes of frames queued for the writer: every sender waits for room.
    budget: Arc<Semaphore>,
    flow: std::sync::Mutex<Flow>,
    flow_changed: Notify,
    /// Set when the session is over (the writer failed or stalled, or the reader ended).
    dead: Arc<watch::Sender<bool>>,
    /// Streams the client opened that are not closed yet (capped).
    live: std::sync::Mutex<HashMap<u32, (bool, bool)>>,
}

/// Outbound side shared by tasks: frames go through one writer task in order.
#[derive(Clone)]
struct Out(Arc<OutShared>);

impl Out {
    /// Queues a frame; waits for room in the session's budget. False once the session is over.
    async fn send(&self, frame: Vec<u8>) -> bool {
        let n = frame.len().min(OUT_BUDGET) as u32;
        let mut dead = self.0.dead.subscribe();
        let permit = tokio::select! {
            p = self.0.budget.acquire_many(n) => p,
            _ = dead.wait_for(|d| *d) => return false,
        };
        let Ok(p) = permit else { return false };
        p.forget();
        if self.0.tx.send((frame, n)).await.is_err() {
            self.0.budget.add_permits(n as usize);
            return false;
        }
        true
    }

    /// Sends `payload` on `stream` in frames of at most [`DATA_CHUNK`] bytes, within the
    /// peer's windows when it does flow control.
    async fn data(&self, stream: u32, payload: &[u8]) -> bool {
        let mut rest = payload;
        while !rest.is_empty() {
            let Some(n) = self.window(stream, rest.len().min(DATA_CHUNK)).await else {
                return false;
            };
            if !self.send(data(stream, 0, &rest[..n])).await {
                return false;
            }
            rest = &rest[n..];
        }
        true
    }

    /// Takes up to `want` bytes of send window for `stream` (waiting while it is closed and
    /// the peer does flow control); `None` once the session is over.
    async fn window(&self, stream: u32, want: usize) -> Option<usize> {
        let mut dead = self.0.dead.subscribe();
        loop {
            let changed = self.0.flow_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut f = lock(&self.0.flow);
                let initial = f.initial;
                let w = *f.streams.entry(stream).or_insert(initial);
                let open = w.min(f.session);
                if !f.active || open > 0 {
                    let take = if f.active {
                        (open as usize).min(want)
                    } else {
                        want
                    };
                    *f.streams.entry(stream).or_insert(initial) -= take as i64;
                    f.session -= take as i64;
                    return Some(take);
                }
            }
            tokio::select! {
                _ = &mut changed => {}
                _ = dead.wait_for(|d| *d) => return None,
            }
        }
    }

    /// The peer opened `delta` more bytes of window on `stream` (0 = the session).
    fn window_update(&self, stream: u32, delta: u32) {
        let mut f = lock(&self.0.flow);
        f.active = true;
        let delta = i64::from(delta & 0x7fff_ffff);
        if stream == 0 {
            f.session = (f.session + delta).min(i64::from(i32::MAX));
        } else {
            let initial = f.initial;
            let w = f.streams.entry(stream).or_insert(initial);
            *w = (*w + delta).min(i64::from(i32::MAX));
        }
        drop(f);
        self.0.flow_changed.notify_waiters();
    }

    /// SETTINGS: a new initial window size applies to every stream's window (SPDY/3.1 §2.6.8).
    fn settings(&self, body: &[u8]) {
        let n = be32(body, 0) as usize;
        let mut f = lock(&self.0.flow);
        for i in 0..n.min(16) {
            let at = 4 + i * 8;
            let id = be32(body, at) & 0x00ff_ffff;
            if id == 7 {
                let v = i64::from(be32(body, at + 4) & 0x7fff_ffff);
                let diff = v - f.initial;
                f.initial = v;
                for w in f.streams.values_mut() {
                    *w += diff;
                }
            }
        }
        drop(f);
        self.0.flow_changed.notify_waiters();
    }

    async fn fin(&self, stream: u32) -> bool {
        self.closed(stream, false, true);
        self.send(data(stream, FLAG_FIN, &[])).await
    }

    async fn rst(&self, stream: u32, status: u32) -> bool {
        self.closed(stream, true, true);
        self.send(control(
            RST_STREAM,
            0,
            &[stream.to_be_bytes(), status.to_be_bytes()].concat(),
        ))
        .await
    }

    /// Records a half-close (`by_client`) or full close of a live stream; a stream closed
    /// both ways no longer counts against the cap.
    fn closed(&self, stream: u32, by_client: bool, by_us: bool) {
        let mut live = lock(&self.0.live);
        if let Some(e) = live.get_mut(&stream) {
            e.0 |= by_client;
            e.1 |= by_us;
            if e.0 && e.1 {
                live.remove(&stream);
                lock(&self.0.flow).streams.remove(&stream);
            }
        }
    }

    fn is_dead(&self) -> bool {
        *self.0.dead.borrow()
    }
}

/// Most bytes of frames queued for one session's writer.
const OUT_BUDGET: usize = 512 * 1024;
/// Most bytes of client data queued for one session's consumers.
const IN_BUDGET: usize = 1 << 20;
/// Largest frame accepted from a client (Go clients send at most 32 KiB of data per frame).
const MAX_FRAME_IN: usize = 1 << 20;
/// Largest data frame we send.
const DATA_CHUNK: usize = 32 * 1024;
/// Streams a client may have open at once in one session (an exec needs five).
const MAX_STREAMS: usize = 64;

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
        while let Some((f, n)) = rx.recv().await {
            // A client that stops reading stalls this write: past the write timeout the
            // session is over (everything queued behind it is bounded by the budget).
            match tokio::time::timeout(write_timeout, wr.write_all(&f)).await {
                Ok(Ok(())) => {
                    writer_activity.fetch_add(1, Ordering::Relaxed);
                    budget.add_permits(n as usize);
                }
                Ok(Err(_)) => break,
                Err(_) => {
                    tracing::info!("streaming client stopped reading for {write_timeout:?}; closing the session");
                    break;
                }
            }
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
    fn garbage_after_the_stream_does_not_spin() {
        // Found by the fuzzer: a finished zlib stream followed by more bytes made the decoder
        // loop forever without progress.
        let mut c = Compress::new(Compression::default(), true);
        c.set_dictionary(DICTIONARY).unwrap();
        let mut block = Vec::with_capacity(256);
        c.compress_vec(&[0, 0, 0, 0], &mut block, FlushCompress::Finish)
            .unwrap();
        block.extend_from_slice(b"trailing garbage");
        let t = std::time::Instant::now();
        let r = HeaderCodec::new().decode(&block);
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        assert!(r.is_err(), "{r:?}");
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
