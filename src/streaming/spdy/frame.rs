//! SPDY/3 framing: control and data frames, the zlib header-block codec with the SPDY/3
//! dictionary (one compression context per direction per connection, a sync flush per
//! header block), and frame readers with a size cap.

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::DICTIONARY;

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

pub(super) fn parse_nv(b: &[u8]) -> Result<Vec<(String, String)>, String> {
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

pub(super) fn be32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_be_bytes)
        .unwrap_or(0)
}
