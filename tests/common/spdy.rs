//! A minimal blocking SPDY/3.1 client, as Kubernetes clients (moby/spdystream) behave: HTTP
//! upgrade with `X-Stream-Protocol-Version` lines, client streams on odd ids, each opened with
//! a SYN_STREAM whose zlib header block (SPDY/3 dictionary, sync flush) carries `streamtype`
//! and friends, waiting for the SYN_REPLY before the next one. Written from the protocol
//! description, independently of the server's codec.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};

pub struct Client {
    tcp: TcpStream,
    deflate: Compress,
    inflate: Decompress,
    next_id: u32,
    pub protocol: String,
    /// Data received per stream, and which streams ended (FIN or reset).
    pub data: HashMap<u32, Vec<u8>>,
    pub ended: Vec<u32>,
    pub goaway: bool,
    /// (stream, delta) of every WINDOW_UPDATE received.
    pub window_updates: Vec<(u32, u32)>,
}

fn nv(headers: &[(&str, &str)]) -> Vec<u8> {
    let mut v = (headers.len() as u32).to_be_bytes().to_vec();
    for (k, val) in headers {
        v.extend_from_slice(&(k.len() as u32).to_be_bytes());
        v.extend_from_slice(k.as_bytes());
        v.extend_from_slice(&(val.len() as u32).to_be_bytes());
        v.extend_from_slice(val.as_bytes());
    }
    v
}

impl Client {
    /// Upgrades `url` (`http://host:port/path`), offering `protocols` in order. Returns the
    /// HTTP status line and headers instead if the server did not switch protocols.
    pub fn connect(url: &str, protocols: &[&str]) -> Result<Client, String> {
        let rest = url.strip_prefix("http://").expect("http URL");
        let (host, path) = rest.split_once('/').unwrap();
        let tcp = TcpStream::connect(host).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut req = format!(
            "POST /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
        );
        for p in protocols {
            req += &format!("X-Stream-Protocol-Version: {p}\r\n");
        }
        req += "Content-Length: 0\r\n\r\n";
        (&tcp).write_all(req.as_bytes()).unwrap();
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if (&tcp).read(&mut b).unwrap() == 0 {
                break;
            }
            head.push(b[0]);
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        if !head.starts_with("HTTP/1.1 101") {
            let mut body = String::new();
            let _ = tcp.set_read_timeout(Some(Duration::from_millis(300)));
            let _ = (&tcp).read_to_string(&mut body);
            return Err(format!("{head}{body}"));
        }
        let protocol = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("x-stream-protocol-version")
                    .then(|| v.trim().to_string())
            })
            .unwrap_or_default();
        let mut deflate = Compress::new(Compression::best(), true);
        deflate
            .set_dictionary(sandboxd::streaming::spdy::DICTIONARY)
            .unwrap();
        Ok(Client {
            tcp,
            deflate,
            inflate: Decompress::new(true),
            next_id: 1,
            protocol,
            data: HashMap::new(),
            ended: Vec::new(),
            goaway: false,
            window_updates: Vec::new(),
        })
    }

    fn compress(&mut self, raw: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(raw.len() + 2048);
        let before = self.deflate.total_in();
        self.deflate
            .compress_vec(raw, &mut out, FlushCompress::Sync)
            .unwrap();
        assert_eq!((self.deflate.total_in() - before) as usize, raw.len());
        out
    }

    fn write(&mut self, frame: &[u8]) {
        self.tcp.write_all(frame).unwrap();
    }

    fn control(typ: u16, flags: u8, body: &[u8]) -> Vec<u8> {
        let mut f = vec![0x80, 0x03];
        f.extend_from_slice(&typ.to_be_bytes());
        f.push(flags);
        f.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        f.extend_from_slice(body);
        f
    }

    /// Opens a stream and waits for its SYN_REPLY (other frames meanwhile are recorded).
    pub fn open(&mut self, headers: &[(&str, &str)]) -> u32 {
        let id = self.next_id;
        self.next_id += 2;
        let block = self.compress(&nv(headers));
        let mut body = id.to_be_bytes().to_vec();
        body.extend_from_slice(&0u32.to_be_bytes()); // associated stream
        body.extend_from_slice(&[0, 0]); // priority, slot
        body.extend_from_slice(&block);
        let f = Self::control(1, 0, &body);
        self.write(&f);
        loop {
            match self
                .read_frame()
                .expect("connection closed before SYN_REPLY")
            {
                (Some(2), body) if u32::from_be_bytes(body[..4].try_into().unwrap()) == id => {
                    // The reply's header block must decode in our inflate context.
                    self.inflate_block(&body[4..]);
                    return id;
                }
                (Some(3), body) if u32::from_be_bytes(body[..4].try_into().unwrap()) == id => {
                    panic!("stream {id} refused with RST_STREAM");
                }
                _ => {}
            }
        }
    }

    fn inflate_block(&mut self, block: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(4096);
        let start = self.inflate.total_in();
        loop {
            let done = (self.inflate.total_in() - start) as usize;
            match self
                .inflate
                .decompress_vec(&block[done..], &mut out, FlushDecompress::Sync)
            {
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.inflate
                        .set_dictionary(sandboxd::streaming::spdy::DICTIONARY)
                        .unwrap();
                    continue;
                }
                Err(e) => panic!("server header block: {e}"),
            }
            if (self.inflate.total_in() - start) as usize == block.len() {
                return out;
            }
            out.reserve(4096);
        }
    }

    pub fn send(&mut self, stream: u32, payload: &[u8], fin: bool) {
        let mut f = (stream & 0x7fff_ffff).to_be_bytes().to_vec();
        f.push(if fin { 1 } else { 0 });
        f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
        f.extend_from_slice(payload);
        self.write(&f);
    }

    /// Opens `delta` more bytes of our receive window on `stream` (0 = the session).
    pub fn window_update(&mut self, stream: u32, delta: u32) {
        let mut body = stream.to_be_bytes().to_vec();
        body.extend_from_slice(&delta.to_be_bytes());
        let f = Self::control(9, 0, &body);
        self.write(&f);
    }

    /// Sets how long a read may block (`None`: forever).
    pub fn read_timeout(&self, t: Option<Duration>) {
        self.tcp.set_read_timeout(t).unwrap();
    }

    /// Reads frames until one takes longer than the read timeout to come (or the connection
    /// closed): what the server had to send right now.
    pub fn read_available(&mut self, wait: Duration) {
        self.read_timeout(Some(wait));
        while self.read_frame().is_some() {}
        self.read_timeout(Some(Duration::from_secs(30)));
    }

    pub fn ping(&mut self, id: u32) {
        let f = Self::control(6, 0, &id.to_be_bytes());
        self.write(&f);
    }

    /// Reads one frame: `(Some(control type), body)` or `(None, payload)` for data (recorded).
    pub fn read_frame(&mut self) -> Option<(Option<u16>, Vec<u8>)> {
        let mut h = [0u8; 8];
        self.tcp.read_exact(&mut h).ok()?;
        let len = u32::from_be_bytes([0, h[5], h[6], h[7]]) as usize;
        let mut body = vec![0u8; len];
        self.tcp.read_exact(&mut body).ok()?;
        if h[0] & 0x80 != 0 {
            assert_eq!(u16::from_be_bytes([h[0] & 0x7f, h[1]]), 3, "SPDY version");
            let typ = u16::from_be_bytes([h[2], h[3]]);
            match typ {
                3 => self
                    .ended
                    .push(u32::from_be_bytes(body[..4].try_into().unwrap())),
                7 => self.goaway = true,
                9 => self.window_updates.push((
                    u32::from_be_bytes(body[..4].try_into().unwrap()) & 0x7fff_ffff,
                    u32::from_be_bytes(body[4..8].try_into().unwrap()),
                )),
                _ => {}
            }
            Some((Some(typ), body))
        } else {
            let id = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) & 0x7fff_ffff;
            self.data.entry(id).or_default().extend_from_slice(&body);
            if h[4] & 1 != 0 {
                self.ended.push(id);
            }
            Some((None, body))
        }
    }

    /// Reads until every stream in `ids` ended (or the connection closed).
    pub fn wait_ended(&mut self, ids: &[u32]) {
        while !ids.iter().all(|i| self.ended.contains(i)) {
            if self.read_frame().is_none() {
                return;
            }
        }
    }

    /// Reads until the server's data on `stream` contains `needle`.
    pub fn wait_for(&mut self, stream: u32, needle: &str) {
        while !String::from_utf8_lossy(self.data.get(&stream).map_or(&[][..], |v| v))
            .contains(needle)
        {
            assert!(
                self.read_frame().is_some(),
                "connection closed waiting for {needle:?}; got {:?}",
                String::from_utf8_lossy(self.data.get(&stream).map_or(&[][..], |v| v))
            );
        }
    }

    pub fn text(&self, stream: u32) -> String {
        String::from_utf8_lossy(self.data.get(&stream).map_or(&[][..], |v| v)).into_owned()
    }
}
