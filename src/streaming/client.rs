//! A SPDY/3.1 streaming client (blocking, threaded) for `sandboxctl exec -i/-t` and
//! `sandboxctl port-forward`: it speaks to any Kubernetes streaming server (ours,
//! containerd's, CRI-O's). One reader thread dispatches frames to the streams; writes go
//! through one lock, so several streams can be used from several threads.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::spdy::{
    control, data, read_frame_blocking, HeaderCodec, FLAG_FIN, GOAWAY, PING, RST_STREAM, SYN_REPLY,
    SYN_STREAM,
};
use crate::state::lock;

/// The connection's write side: every frame (the reader's ping replies too) is written whole
/// under this lock, with the header compressor, whose context spans the connection.
type Writer = Arc<Mutex<(TcpStream, HeaderCodec)>>;

/// What a stream delivers.
#[derive(Debug)]
pub enum Event {
    Data(Vec<u8>),
    /// FIN or reset from the server, or the connection closed.
    End,
}

struct Shared {
    streams: HashMap<u32, Sender<Event>>,
    replies: HashMap<u32, Sender<bool>>,
}

pub struct Session {
    writer: Writer,
    shared: Arc<Mutex<Shared>>,
    next_id: AtomicU32,
    /// The negotiated protocol (`X-Stream-Protocol-Version` of the response).
    pub protocol: String,
}

impl Session {
    /// Upgrades `url` (http://host:port/path) to SPDY/3.1, offering `protocols` in order.
    pub fn connect(url: &str, protocols: &[&str]) -> Result<Session, String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("{url}: only http:// streaming URLs are supported"))?;
        let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
        let mut tcp = TcpStream::connect(host).map_err(|e| format!("connect {host}: {e}"))?;
        let mut req = format!(
            "POST /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
        );
        for p in protocols {
            req += &format!("X-Stream-Protocol-Version: {p}\r\n");
        }
        req += "Content-Length: 0\r\n\r\n";
        tcp.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if tcp.read(&mut b).map_err(|e| e.to_string())? == 0 || head.len() > 64 * 1024 {
                break;
            }
            head.push(b[0]);
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        if !head.starts_with("HTTP/1.1 101") {
            let mut body = String::new();
            let _ = tcp.set_read_timeout(Some(Duration::from_millis(500)));
            let _ = tcp.read_to_string(&mut body);
            return Err(format!(
                "the streaming server refused the upgrade: {} {}",
                head.lines().next().unwrap_or(""),
                body.trim()
            ));
        }
        let protocol = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("x-stream-protocol-version")
                    .then(|| v.trim().to_string())
            })
            .unwrap_or_else(|| "channel.k8s.io".into());
        let shared = Arc::new(Mutex::new(Shared {
            streams: HashMap::new(),
            replies: HashMap::new(),
        }));
        let mut rd = tcp.try_clone().map_err(|e| e.to_string())?;
        let writer: Writer = Arc::new(Mutex::new((tcp, HeaderCodec::new())));
        let (sh, w) = (shared.clone(), writer.clone());
        std::thread::spawn(move || reader(&mut rd, &sh, &w));
        Ok(Session {
            writer,
            shared,
            next_id: AtomicU32::new(1),
            protocol,
        })
    }

    /// Opens a stream with these headers and waits for the server's reply. Returns its id
    /// and its events.
    pub fn open(&self, headers: &[(&str, &str)]) -> Result<(u32, Receiver<Event>), String> {
        let id = self.next_id.fetch_add(2, Ordering::Relaxed);
        let (tx, rx) = channel();
        let (rtx, rrx) = channel();
        {
            let mut s = lock(&self.shared);
            s.streams.insert(id, tx);
            s.replies.insert(id, rtx);
        }
        {
            let mut w = lock(&self.writer);
            let block = w.1.encode(headers);
            let mut body = id.to_be_bytes().to_vec();
            body.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
            body.extend_from_slice(&block);
            w.0.write_all(&control(SYN_STREAM, 0, &body))
                .map_err(|e| e.to_string())?;
        }
        match rrx.recv_timeout(Duration::from_secs(30)) {
            Ok(true) => Ok((id, rx)),
            Ok(false) => Err(format!("the server refused stream {headers:?}")),
            Err(_) => Err(format!("no reply to stream {headers:?}")),
        }
    }

    pub fn send(&self, stream: u32, payload: &[u8]) -> std::io::Result<()> {
        let mut w = lock(&self.writer);
        for chunk in payload.chunks(32 * 1024) {
            w.0.write_all(&data(stream, 0, chunk))?;
        }
        Ok(())
    }

    /// Half-closes a stream (FIN): the server sees end of input.
    pub fn close(&self, stream: u32) -> std::io::Result<()> {
        lock(&self.writer).0.write_all(&data(stream, FLAG_FIN, &[]))
    }

    /// Closes the connection.
    pub fn shutdown(&self) {
        let _ = lock(&self.writer).0.shutdown(std::net::Shutdown::Both);
    }
}

fn reader(rd: &mut TcpStream, shared: &Mutex<Shared>, writer: &Writer) {
    // The server's header blocks share one decompression context: decode each to keep it.
    let mut codec = HeaderCodec::new();
    while let Ok((ctrl, typ, flags, stream, body)) = read_frame_blocking(rd) {
        if !ctrl {
            let mut s = lock(shared);
            if let Some(tx) = s.streams.get(&stream) {
                if !body.is_empty() {
                    let _ = tx.send(Event::Data(body));
                }
                if flags & FLAG_FIN != 0 {
                    let _ = tx.send(Event::End);
                    s.streams.remove(&stream); // the server sends nothing more on it
                }
            }
            continue;
        }
        let id = body
            .get(..4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) & 0x7fff_ffff)
            .unwrap_or(0);
        match typ {
            SYN_REPLY => {
                let _ = codec.decode(&body[4.min(body.len())..]);
                if let Some(r) = lock(shared).replies.remove(&id) {
                    let _ = r.send(true);
                }
            }
            RST_STREAM => {
                let mut s = lock(shared);
                if let Some(r) = s.replies.remove(&id) {
                    let _ = r.send(false);
                }
                if let Some(tx) = s.streams.remove(&id) {
                    let _ = tx.send(Event::End);
                }
            }
            // Answer the server's pings (even ids).
            PING if body.len() == 4 && id.is_multiple_of(2) => {
                let _ = lock(writer).0.write_all(&control(PING, 0, &body));
            }
            GOAWAY => break,
            _ => {}
        }
    }
    let mut s = lock(shared);
    for (_, tx) in s.streams.drain() {
        let _ = tx.send(Event::End);
    }
    for (_, r) in s.replies.drain() {
        let _ = r.send(false);
    }
}
