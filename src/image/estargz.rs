//! eStargz layers: a gzip blob in which every file's content (and every chunk of a large file)
//! starts a gzip member of its own, with a table of contents (TOC) as the last tar entry and
//! a 51-byte footer that says where the TOC begins. Read as one gzip stream it is an ordinary
//! layer tar, so any runtime can unpack it whole; read by offset, each file chunk can be
//! fetched and checked alone (each TOC chunk carries the sha256 of its uncompressed bytes,
//! and the TOC itself is named by digest in the manifest's layer annotation).
//!
//! Here: the footer, the TOC read into a tree (`Tree`) with every hostile-input bound the
//! full unpack has (entries, bytes, names, no `..`, links that name what exists) and those of
//! its own (chunks inside the blob, before the TOC, covering each file exactly, each with a
//! digest), and a writer (`write`) that converts a layer tar: the tests, the cold-start
//! benchmark and `sandboxctl images estargz` make their images with it.

use std::collections::BTreeMap;
use std::io::{Read, Write};

use serde::de::{DeserializeSeed, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use sha2::Digest;

/// The manifest annotation of a layer's TOC digest (sha256 of the uncompressed TOC JSON).
pub const TOC_DIGEST_ANNOTATION: &str = "containerd.io/snapshot/stargz/toc.digest";
/// The manifest annotation of a layer's uncompressed size.
pub const UNCOMPRESSED_SIZE_ANNOTATION: &str = "io.containers.estargz.uncompressed-size";
/// The TOC's tar entry.
pub const TOC_NAME: &str = "stargz.index.json";
/// The entries before this one are what the image's entrypoint reads first.
pub const PREFETCH_LANDMARK: &str = ".prefetch.landmark";
/// This image names no files to prefetch.
pub const NO_PREFETCH_LANDMARK: &str = ".no.prefetch.landmark";
/// Names at a layer's root that are the format's, not the image's: neither the lazy view
/// nor a layer unpacked from a completed lazy one shows them.
pub const META_NAMES: [&str; 3] = [TOC_NAME, PREFETCH_LANDMARK, NO_PREFETCH_LANDMARK];
/// The footer's size.
pub const FOOTER_SIZE: u64 = 51;
/// Largest TOC accepted, compressed and as JSON.
pub const MAX_TOC_BYTES: u64 = 64 << 20;
/// Largest chunk (bytes of one file decompressed and checked at once).
pub const MAX_CHUNK: u64 = 64 << 20;
/// Longest name component and path.
const MAX_NAME: usize = 255;
const MAX_PATH: usize = 4096;

/// Which format a layer's TOC comes in: both describe the layer with the same JSON (CRFS's
/// table of contents) and compress each file's chunks as a unit of their own; they differ in
/// the compression, in where the TOC is (`zstd_chunked.rs`) and in the names of their own
/// that an eStargz layer's tar carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// gzip members; the TOC a tar entry of the layer, found by the footer.
    #[default]
    Estargz,
    /// zstd frames; the TOC a skippable frame, found by the manifest's annotations.
    ZstdChunked,
}

impl Format {
    /// Its name as the peers spell it (logs, errors).
    pub fn name(self) -> &'static str {
        match self {
            Format::Estargz => "estargz",
            Format::ZstdChunked => "zstd:chunked",
        }
    }

    /// Names at the layer's root that are the format's, not the image's.
    pub fn meta_names(self) -> &'static [&'static str] {
        match self {
            Format::Estargz => &META_NAMES,
            Format::ZstdChunked => &[],
        }
    }
}

/// Where the TOC begins, from the footer (the blob's last [`FOOTER_SIZE`] bytes): an empty
/// gzip member whose extra field holds `%016x` of the offset and `STARGZ`.
pub fn parse_footer(b: &[u8]) -> Result<u64, String> {
    if b.len() as u64 != FOOTER_SIZE {
        return Err(format!(
            "the footer is {} bytes, not {FOOTER_SIZE}",
            b.len()
        ));
    }
    // gzip magic, deflate, FEXTRA; XLEN 26; subfield 'S','G' of 22 bytes.
    if b[..4] != [0x1f, 0x8b, 8, 4] || b[10..12] != [26, 0] || b[12..16] != [b'S', b'G', 22, 0] {
        return Err("no eStargz footer (not an eStargz layer)".into());
    }
    let payload = &b[16..38];
    if &payload[16..] != b"STARGZ" {
        return Err("no eStargz footer (not an eStargz layer)".into());
    }
    let hex = std::str::from_utf8(&payload[..16]).map_err(|_| "footer offset is no hex")?;
    u64::from_str_radix(hex, 16).map_err(|_| format!("footer offset {hex:?} is no hex"))
}

/// The footer for a TOC at `toc_offset`.
pub fn footer(toc_offset: u64) -> Vec<u8> {
    let mut b = vec![
        0x1f, 0x8b, 8, 4, 0, 0, 0, 0, 0, 0xff, 26, 0, b'S', b'G', 22, 0,
    ];
    b.extend_from_slice(format!("{toc_offset:016x}STARGZ").as_bytes());
    // An empty final stored block, CRC32 and size of nothing.
    b.extend_from_slice(&[1, 0, 0, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0]);
    b
}

/// One TOC entry as the JSON has it (only the fields this reader uses).
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct RawEntry {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(skip_serializing_if = "is_zero")]
    pub size: u64,
    #[serde(rename = "modtime", skip_serializing_if = "String::is_empty")]
    pub mod_time: String,
    #[serde(rename = "linkName", skip_serializing_if = "String::is_empty")]
    pub link_name: String,
    #[serde(skip_serializing_if = "is_zero")]
    pub mode: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub uid: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub gid: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub offset: u64,
    /// zstd:chunked: where a regular file's last frame ends.
    #[serde(rename = "endOffset", skip_serializing_if = "is_zero")]
    pub end_offset: u64,
    #[serde(rename = "chunkOffset", skip_serializing_if = "is_zero")]
    pub chunk_offset: u64,
    #[serde(rename = "chunkSize", skip_serializing_if = "is_zero")]
    pub chunk_size: u64,
    #[serde(rename = "chunkDigest", skip_serializing_if = "String::is_empty")]
    pub chunk_digest: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub digest: String,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// The TOC document, its entry list read with a bound on its length.
struct TocSeed {
    max_entries: u64,
}

impl<'de> DeserializeSeed<'de> for TocSeed {
    type Value = Vec<RawEntry>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        struct Doc(u64);
        impl<'de> Visitor<'de> for Doc {
            type Value = Vec<RawEntry>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an eStargz TOC")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<Self::Value, A::Error> {
                let mut entries = None;
                while let Some(k) = m.next_key::<String>()? {
                    match k.as_str() {
                        "entries" => entries = Some(m.next_value_seed(Entries(self.0))?),
                        "version" => {
                            let v: u64 = m.next_value()?;
                            if v != 1 {
                                return Err(serde::de::Error::custom(format!(
                                    "TOC version {v} (this reader knows 1)"
                                )));
                            }
                        }
                        _ => {
                            m.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                Ok(entries.unwrap_or_default())
            }
        }
        struct Entries(u64);
        impl<'de> DeserializeSeed<'de> for Entries {
            type Value = Vec<RawEntry>;
            fn deserialize<D: serde::Deserializer<'de>>(
                self,
                d: D,
            ) -> Result<Self::Value, D::Error> {
                d.deserialize_seq(self)
            }
        }
        impl<'de> Visitor<'de> for Entries {
            type Value = Vec<RawEntry>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of TOC entries")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Self::Value, A::Error> {
                let mut v = Vec::new();
                while let Some(e) = s.next_element::<RawEntry>()? {
                    if v.len() as u64 >= self.0 {
                        return Err(serde::de::Error::custom(format!(
                            "the TOC has more than {} entries",
                            self.0
                        )));
                    }
                    v.push(e);
                }
                Ok(v)
            }
        }
        d.deserialize_map(Doc(self.max_entries))
    }
}

/// What a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    Reg,
    Symlink,
    /// A whiteout (overlay's 0:0 character device).
    Whiteout,
    Fifo,
}

/// A piece of a regular file: `len` bytes at `file_off`, the gzip member (zstd frame) at `blob_off`
/// (at most `max_compressed` bytes of the blob are read for it), whose uncompressed bytes
/// hash to `digest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub file_off: u64,
    pub len: u64,
    pub blob_off: u64,
    pub max_compressed: u64,
    pub digest: [u8; 32],
}

/// One file, dir or link of the layer.
#[derive(Debug, Clone)]
pub struct Node {
    pub parent: u32,
    /// Its name in its parent (a hard link's first).
    pub name: Vec<u8>,
    pub kind: Kind,
    /// Permission bits with setuid/setgid/sticky.
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub mtime: i64,
    /// Links to it (a dir's: 2 and one per subdir).
    pub nlink: u32,
    pub target: Vec<u8>,
    pub opaque: bool,
    pub children: BTreeMap<Vec<u8>, u32>,
    pub chunks: Vec<Chunk>,
}

impl Node {
    fn new(parent: u32, kind: Kind, perm: u32) -> Node {
        Node {
            parent,
            name: Vec::new(),
            kind,
            perm,
            uid: 0,
            gid: 0,
            size: 0,
            mtime: 0,
            nlink: 1,
            target: Vec::new(),
            opaque: false,
            children: BTreeMap::new(),
            chunks: Vec::new(),
        }
    }
}

/// The layer as its TOC describes it: `nodes[0]` is the root.
#[derive(Debug, Clone)]
pub struct Tree {
    pub format: Format,
    pub nodes: Vec<Node>,
    /// Where the TOC begins (no chunk reaches past it).
    pub toc_offset: u64,
    /// Where the prefetch landmark is: the blob before it is fetched first.
    pub prefetch_end: Option<u64>,
    /// Bytes of file content.
    pub bytes: u64,
}

/// Bounds on a TOC (the store's layer limits).
#[derive(Debug, Clone, Copy)]
pub struct TocLimits {
    pub max_entries: u64,
    pub max_bytes: u64,
}

/// Reads the TOC member (the blob from the TOC's offset up to the footer): one gzip member
/// holding a tar whose one entry is [`TOC_NAME`]. Returns the JSON bytes.
pub fn toc_json(member: &[u8]) -> Result<Vec<u8>, String> {
    let d = flate2::read::GzDecoder::new(member);
    let mut a = tar::Archive::new(d.take(MAX_TOC_BYTES + 4096));
    let mut entries = a.entries().map_err(|e| format!("TOC tar: {e}"))?;
    let mut e = entries
        .next()
        .ok_or("the TOC member holds no tar entry")?
        .map_err(|e| format!("TOC tar: {e}"))?;
    let name = e.path_bytes().into_owned();
    if name != TOC_NAME.as_bytes() {
        return Err(format!(
            "the TOC member holds {:?}, not {TOC_NAME}",
            String::from_utf8_lossy(&name)
        ));
    }
    let size = e.header().size().map_err(|e| format!("TOC tar: {e}"))?;
    if size > MAX_TOC_BYTES {
        return Err(format!(
            "the TOC is {size} bytes, more than the {MAX_TOC_BYTES} accepted"
        ));
    }
    let mut json = Vec::with_capacity(size as usize);
    (&mut e)
        .take(size)
        .read_to_end(&mut json)
        .map_err(|e| format!("TOC: {e}"))?;
    if json.len() as u64 != size {
        return Err(format!("the TOC ends after {} of {size} bytes", json.len()));
    }
    Ok(json)
}

fn hostile(name: &str, why: impl std::fmt::Display) -> String {
    format!("TOC entry {name:?}: {why}")
}

/// The components of an entry name, `./` and `/` at either end dropped; `..` refused.
fn components<'a>(name: &'a str, shown: &str) -> Result<Vec<&'a [u8]>, String> {
    if name.len() > MAX_PATH {
        return Err(hostile(shown, format!("longer than {MAX_PATH} bytes")));
    }
    if name.contains('\0') {
        return Err(hostile(shown, "a NUL in the name"));
    }
    let mut out = Vec::new();
    for c in name.split('/') {
        match c {
            "" | "." => {}
            ".." => return Err(hostile(shown, "\"..\" in the name")),
            c if c.len() > MAX_NAME => {
                return Err(hostile(
                    shown,
                    format!("a name longer than {MAX_NAME} bytes"),
                ))
            }
            c => out.push(c.as_bytes()),
        }
    }
    Ok(out)
}

fn sha256_bytes(d: &str, shown: &str) -> Result<[u8; 32], String> {
    let h = d
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| hostile(shown, format!("digest {d:?} is no sha256 digest")))?;
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&h[2 * i..2 * i + 2], 16).unwrap_or(0);
    }
    Ok(out)
}

/// Seconds since the epoch of an RFC 3339 time (`2024-01-02T03:04:05Z`, fractions and
/// offsets allowed); 0 when it is not one.
pub fn parse_time(s: &str) -> i64 {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> { s.get(r)?.parse::<i64>().ok() };
    let parse = || -> Option<i64> {
        if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || (b[10] != b'T' && b[10] != b't') {
            return None;
        }
        let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
        let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
        let mut i = 19;
        if b.get(i) == Some(&b'.') {
            i += 1;
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
        }
        let off = match b.get(i)? {
            b'Z' | b'z' => 0,
            c @ (b'+' | b'-') => {
                let v = num(i + 1..i + 3)? * 3600 + num(i + 4..i + 6)? * 60;
                if *c == b'+' {
                    v
                } else {
                    -v
                }
            }
            _ => return None,
        };
        // Days from civil (Howard Hinnant's algorithm).
        let y = if mo <= 2 { y - 1 } else { y };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let mp = (mo + 9) % 12;
        let doy = (153 * mp + 2) / 5 + d - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        let days = era * 146_097 + doe - 719_468;
        Some(days * 86_400 + h * 3600 + mi * 60 + sec - off)
    };
    parse().unwrap_or(0)
}

/// RFC 3339 (UTC) of seconds since the epoch.
pub(crate) fn format_time(t: i64) -> String {
    let days = t.div_euclid(86_400);
    let secs = t.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

impl Tree {
    /// The tree of the eStargz TOC `json` of a blob whose TOC begins at `toc_offset`.
    pub fn parse(json: &[u8], toc_offset: u64, limits: TocLimits) -> Result<Tree, String> {
        Self::parse_as(Format::Estargz, json, toc_offset, limits)
    }

    /// The tree of the TOC `json`, of `format`, of a blob whose TOC (for zstd:chunked, the
    /// skippable frame that holds it) begins at `toc_offset`: no chunk reaches past it.
    pub fn parse_as(
        format: Format,
        json: &[u8],
        toc_offset: u64,
        limits: TocLimits,
    ) -> Result<Tree, String> {
        if json.len() as u64 > MAX_TOC_BYTES {
            return Err(format!("the TOC is larger than {MAX_TOC_BYTES} bytes"));
        }
        let mut de = serde_json::Deserializer::from_slice(json);
        let raw = TocSeed {
            max_entries: limits.max_entries,
        }
        .deserialize(&mut de)
        .map_err(|e| format!("TOC: {e}"))?;
        de.end().map_err(|e| format!("TOC: {e}"))?;
        Self::build(format, &raw, toc_offset, limits)
    }

    fn lookup(&self, path: &[&[u8]]) -> Option<u32> {
        let mut at = 0u32;
        for c in path {
            at = *self.nodes[at as usize].children.get(*c)?;
        }
        Some(at)
    }

    /// The dir at `path`, made (0755, root's) where missing; a non-dir in the way is
    /// replaced, as a later tar entry replaces an earlier one.
    fn dir_at(&mut self, path: &[&[u8]]) -> u32 {
        let mut at = 0u32;
        for c in path {
            let next = self.nodes[at as usize].children.get(*c).copied();
            at = match next {
                Some(n) if self.nodes[n as usize].kind == Kind::Dir => n,
                _ => self.add(at, c, Node::new(at, Kind::Dir, 0o755)),
            };
        }
        at
    }

    fn add(&mut self, parent: u32, name: &[u8], mut node: Node) -> u32 {
        node.parent = parent;
        node.name = name.to_vec();
        let id = self.nodes.len() as u32;
        self.nodes.push(node);
        self.nodes[parent as usize]
            .children
            .insert(name.to_vec(), id);
        id
    }

    fn build(
        format: Format,
        raw: &[RawEntry],
        toc_offset: u64,
        limits: TocLimits,
    ) -> Result<Tree, String> {
        let mut t = Tree {
            format,
            nodes: vec![Node::new(0, Kind::Dir, 0o755)],
            toc_offset,
            prefetch_end: None,
            bytes: 0,
        };
        // Where each member (frame) begins: a chunk's compressed bytes end by the next one's
        // (or where zstd:chunked says a file's last frame ends).
        let mut starts: Vec<u64> = raw
            .iter()
            .filter(|e| e.kind == "reg" || e.kind == "chunk")
            .flat_map(|e| [e.offset, e.end_offset])
            .filter(|o| *o > 0)
            .chain([toc_offset])
            .collect();
        starts.sort_unstable();
        starts.dedup();
        // The regular file the next "chunk" entries continue, and where it is so far.
        let mut current: Option<(u32, String, u64)> = None;
        for e in raw {
            let shown = e.name.as_str();
            let path = components(&e.name, shown)?;
            if e.kind != "chunk" {
                t.covered(current.take())?;
            }
            if path.len() == 1 && format.meta_names().iter().any(|m| m.as_bytes() == path[0]) {
                if path[0] == PREFETCH_LANDMARK.as_bytes() {
                    t.prefetch_end = Some(e.offset.min(toc_offset));
                }
                continue;
            }
            let chunk = |file_off: u64, len: u64, digest: &str| -> Result<Chunk, String> {
                if len > MAX_CHUNK {
                    return Err(hostile(
                        shown,
                        format!("a chunk of {len} bytes (at most {MAX_CHUNK})"),
                    ));
                }
                if e.offset >= toc_offset {
                    return Err(hostile(
                        shown,
                        format!(
                            "content at blob offset {} is not before the TOC ({toc_offset})",
                            e.offset
                        ),
                    ));
                }
                let i = starts.partition_point(|s| *s <= e.offset);
                let next = starts.get(i).copied().unwrap_or(toc_offset);
                Ok(Chunk {
                    file_off,
                    len,
                    blob_off: e.offset,
                    max_compressed: next - e.offset,
                    digest: sha256_bytes(digest, shown)?,
                })
            };
            if e.kind == "chunk" {
                let Some((id, name, end)) = current.as_mut() else {
                    return Err(hostile(shown, "a chunk that follows no regular file"));
                };
                if name != &e.name {
                    return Err(hostile(
                        shown,
                        format!("a chunk of {name:?} named otherwise"),
                    ));
                }
                if e.chunk_offset != *end {
                    return Err(hostile(
                        shown,
                        format!("a chunk at {} where {end} comes next", e.chunk_offset),
                    ));
                }
                let size = t.nodes[*id as usize].size;
                let len = match e.chunk_size {
                    0 => size - *end,
                    n => n.min(size - *end),
                };
                if len == 0 {
                    return Err(hostile(shown, "a chunk past the file's end"));
                }
                let c = chunk(*end, len, &e.chunk_digest)?;
                *end += len;
                t.nodes[*id as usize].chunks.push(c);
                continue;
            }
            if t.nodes.len() as u64 >= limits.max_entries {
                return Err(format!(
                    "the layer has more than {} entries",
                    limits.max_entries
                ));
            }
            let Some((last, parents)) = path.split_last() else {
                // The root itself: its attributes.
                if e.kind == "dir" {
                    let r = &mut t.nodes[0];
                    r.perm = (e.mode & 0o7777) as u32;
                    r.uid = e.uid as u32;
                    r.gid = e.gid as u32;
                    r.mtime = parse_time(&e.mod_time);
                    continue;
                }
                return Err(hostile(shown, "the layer's root as a non-directory"));
            };
            let parent = t.dir_at(parents);
            if *last == b".wh..wh..opq" {
                t.nodes[parent as usize].opaque = true;
                continue;
            }
            let mut node = Node::new(parent, Kind::Reg, (e.mode & 0o7777) as u32);
            node.uid = u32::try_from(e.uid).map_err(|_| hostile(shown, "uid out of range"))?;
            node.gid = u32::try_from(e.gid).map_err(|_| hostile(shown, "gid out of range"))?;
            node.mtime = parse_time(&e.mod_time);
            let (name, kind): (&[u8], Kind) = match (last.strip_prefix(b".wh."), e.kind.as_str()) {
                (Some(h), _) if h.is_empty() || h == b"." || h == b".." => {
                    return Err(hostile(shown, "a whiteout of no name"))
                }
                (Some(h), _) => (h, Kind::Whiteout),
                (None, "dir") => (last, Kind::Dir),
                (None, "reg") => (last, Kind::Reg),
                (None, "symlink") => (last, Kind::Symlink),
                (None, "fifo") => (last, Kind::Fifo),
                (None, "hardlink") => {
                    let to = components(&e.link_name, shown)?;
                    let target = t
                        .lookup(&to)
                        .filter(|n| t.nodes[*n as usize].kind == Kind::Reg)
                        .ok_or_else(|| {
                            hostile(
                                shown,
                                format!(
                                    "a hard link to {:?}, no regular file before it",
                                    e.link_name
                                ),
                            )
                        })?;
                    t.nodes[target as usize].nlink += 1;
                    t.nodes[parent as usize]
                        .children
                        .insert(last.to_vec(), target);
                    continue;
                }
                // Devices are skipped, as the full unpack skips them.
                (None, "char" | "block") => continue,
                (None, k) => return Err(hostile(shown, format!("unknown type {k:?}"))),
            };
            node.kind = kind;
            match kind {
                Kind::Whiteout => node.perm = 0,
                Kind::Symlink => {
                    if e.link_name.is_empty() || e.link_name.len() > MAX_PATH {
                        return Err(hostile(shown, "a symlink target empty or too long"));
                    }
                    node.target = e.link_name.as_bytes().to_vec();
                    node.size = node.target.len() as u64;
                    node.perm = 0o777;
                }
                Kind::Reg => {
                    node.size = e.size;
                    t.bytes = t.bytes.saturating_add(e.size);
                    if t.bytes > limits.max_bytes {
                        return Err(format!(
                            "the layer's files hold more than {} bytes",
                            limits.max_bytes
                        ));
                    }
                }
                _ => {}
            }
            // A dir entry for a dir already there keeps its children.
            if kind == Kind::Dir {
                if let Some(&n) = t.nodes[parent as usize].children.get(name) {
                    if t.nodes[n as usize].kind == Kind::Dir {
                        let d = &mut t.nodes[n as usize];
                        (d.perm, d.uid, d.gid, d.mtime) =
                            (node.perm, node.uid, node.gid, node.mtime);
                        continue;
                    }
                }
            }
            let size = node.size;
            let id = t.add(parent, name, node);
            if kind == Kind::Reg && size > 0 {
                let len = match e.chunk_size {
                    0 => size,
                    n => n.min(size),
                };
                let digest = match e.chunk_digest.as_str() {
                    "" if len == size => e.digest.as_str(),
                    d => d,
                };
                let c = chunk(0, len, digest)?;
                t.nodes[id as usize].chunks.push(c);
                current = Some((id, e.name.clone(), len));
            }
        }
        t.covered(current)?;
        // A dir's link count: itself, its parent's entry, each subdir's `..`.
        let subdirs: Vec<u32> = t
            .nodes
            .iter()
            .map(|n| {
                n.children
                    .values()
                    .filter(|c| t.nodes[**c as usize].kind == Kind::Dir)
                    .count() as u32
            })
            .collect();
        for (n, k) in t.nodes.iter_mut().zip(subdirs) {
            if n.kind == Kind::Dir {
                n.nlink = 2 + k;
            }
        }
        Ok(t)
    }

    /// The file whose chunks were being read (`(node, name, bytes covered)`) is covered whole.
    fn covered(&self, current: Option<(u32, String, u64)>) -> Result<(), String> {
        let Some((id, name, end)) = current else {
            return Ok(());
        };
        let size = self.nodes[id as usize].size;
        if end != size {
            return Err(hostile(
                &name,
                format!("its chunks cover {end} of its {size} bytes"),
            ));
        }
        Ok(())
    }
}

/// How [`write`] lays out a layer.
#[derive(Debug, Clone)]
pub struct WriteOptions {
    /// Bytes per chunk of a regular file.
    pub chunk_size: u64,
    /// Files (tar names, `./` and `/` ignored) written first, before the prefetch landmark.
    pub prefetch: Vec<String>,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            chunk_size: 4 << 20,
            prefetch: Vec::new(),
        }
    }
}

/// What [`write`] wrote.
#[derive(Debug, Clone)]
pub struct Written {
    /// `sha256:` of the blob.
    pub digest: String,
    pub size: u64,
    /// `sha256:` of the uncompressed tar (the config's diff id).
    pub diff_id: String,
    pub uncompressed_size: u64,
    /// `sha256:` of the TOC JSON (the manifest annotation).
    pub toc_digest: String,
}

/// Counts and hashes what passes to the blob (the zstd:chunked writer's too).
pub(crate) struct Out<W> {
    pub w: W,
    pub n: u64,
    pub hash: sha2::Sha256,
}

impl<W> Out<W> {
    pub(crate) fn new(w: W) -> Self {
        Out {
            w,
            n: 0,
            hash: sha2::Sha256::new(),
        }
    }
}

/// A tar entry's type as a TOC names it (both formats).
pub(crate) fn toc_kind(t: tar::EntryType) -> &'static str {
    match t {
        tar::EntryType::Directory => "dir",
        tar::EntryType::Regular | tar::EntryType::Continuous => "reg",
        tar::EntryType::Symlink => "symlink",
        tar::EntryType::Link => "hardlink",
        tar::EntryType::Char => "char",
        tar::EntryType::Block => "block",
        tar::EntryType::Fifo => "fifo",
        _ => "reg",
    }
}

impl<W: Write> Write for Out<W> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let n = self.w.write(b)?;
        self.n += n as u64;
        self.hash.update(&b[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.w.flush()
    }
}

use super::store::sha256_of;
use super::unpack::hex;

/// Converts the layer tar `tar` (uncompressed) into an eStargz blob written to `out`.
pub fn write(tar: &[u8], out: impl Write, opts: &WriteOptions) -> std::io::Result<Written> {
    use flate2::write::GzEncoder;
    let bad = |e: std::io::Error| std::io::Error::other(format!("layer tar: {e}"));
    // Each entry: (its headers' bytes, where its content is, its header).
    struct Ent {
        head: std::ops::Range<usize>,
        content: std::ops::Range<usize>,
        name: String,
        header: tar::Header,
        link: String,
    }
    let mut ents = Vec::new();
    let mut prev_end = 0usize;
    let mut a = tar::Archive::new(tar);
    for e in a.entries().map_err(bad)? {
        let e = e.map_err(bad)?;
        let start = e.raw_file_position() as usize;
        let size = e.size() as usize;
        let name = String::from_utf8_lossy(&e.path_bytes()).into_owned();
        let link = e
            .link_name_bytes()
            .map(|l| String::from_utf8_lossy(&l).into_owned())
            .unwrap_or_default();
        ents.push(Ent {
            head: prev_end..start,
            content: start..start + size,
            name,
            header: e.header().clone(),
            link,
        });
        prev_end = start + size.div_ceil(512) * 512;
    }
    let norm = |n: &str| n.trim_start_matches("./").trim_matches('/').to_string();
    let wanted: Vec<String> = opts.prefetch.iter().map(|p| norm(p)).collect();
    let (mut order, rest): (Vec<usize>, Vec<usize>) =
        (0..ents.len()).partition(|i| wanted.contains(&norm(&ents[*i].name)));
    // The landmark: after the prefetched files, or first when there are none.
    let landmark = if order.is_empty() {
        NO_PREFETCH_LANDMARK
    } else {
        PREFETCH_LANDMARK
    };
    let mut uncompressed = sha2::Sha256::new();
    let mut usize_total = 0u64;
    let mut o = Out::new(out);
    let mut toc = Vec::new();
    // One gzip member of `data`.
    let mut member = |o: &mut Out<_>, data: &[u8]| -> std::io::Result<()> {
        uncompressed.update(data);
        usize_total += data.len() as u64;
        let mut g = GzEncoder::new(&mut *o, flate2::Compression::fast());
        g.write_all(data)?;
        g.finish()?;
        Ok(())
    };
    let landmark_tar = {
        let mut h = tar::Header::new_ustar();
        h.set_path(landmark)?;
        h.set_size(1);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        let mut b = h.as_bytes().to_vec();
        b.push(0xf);
        b.resize(1024, 0);
        b
    };
    let emit_landmark = |o: &mut Out<_>,
                         toc: &mut Vec<RawEntry>,
                         member: &mut dyn FnMut(&mut Out<_>, &[u8]) -> std::io::Result<()>|
     -> std::io::Result<()> {
        member(o, &landmark_tar[..512])?;
        let offset = o.n;
        member(o, &landmark_tar[512..])?;
        toc.push(RawEntry {
            name: landmark.into(),
            kind: "reg".into(),
            size: 1,
            mode: 0o644,
            offset,
            digest: sha256_of(&[0xf]),
            chunk_digest: sha256_of(&[0xf]),
            ..Default::default()
        });
        Ok(())
    };
    if order.is_empty() {
        emit_landmark(&mut o, &mut toc, &mut member)?;
    }
    let prefetched = order.len();
    order.extend(rest);
    for (k, &i) in order.iter().enumerate() {
        if k == prefetched && prefetched > 0 {
            emit_landmark(&mut o, &mut toc, &mut member)?;
        }
        let e = &ents[i];
        let h = &e.header;
        let kind = toc_kind(h.entry_type());
        let mut te = RawEntry {
            name: norm(&e.name),
            kind: kind.into(),
            mode: h.mode().unwrap_or(0o644) as u64,
            uid: h.uid().unwrap_or(0),
            gid: h.gid().unwrap_or(0),
            mod_time: format_time(h.mtime().unwrap_or(0) as i64),
            link_name: if kind == "hardlink" {
                norm(&e.link)
            } else {
                e.link.clone()
            },
            ..Default::default()
        };
        member(&mut o, &tar[e.head.clone()])?;
        let content = &tar[e.content.clone()];
        let padded_end = (e.content.start + content.len().div_ceil(512) * 512).min(tar.len());
        let padding = &tar[e.content.end..padded_end];
        if kind != "reg" || content.is_empty() {
            if !padding.is_empty() {
                member(&mut o, padding)?;
            }
            te.size = content.len() as u64;
            toc.push(te);
            continue;
        }
        te.size = content.len() as u64;
        te.digest = sha256_of(content);
        let cs = opts.chunk_size.max(1) as usize;
        let n = content.len().div_ceil(cs);
        for c in 0..n {
            let piece = &content[c * cs..((c + 1) * cs).min(content.len())];
            let offset = o.n;
            let mut data = piece.to_vec();
            if c + 1 == n {
                data.extend_from_slice(padding);
            }
            member(&mut o, &data)?;
            let d = sha256_of(piece);
            if c == 0 {
                te.offset = offset;
                te.chunk_digest = d;
                if n > 1 {
                    te.chunk_size = piece.len() as u64;
                }
                toc.push(te.clone());
            } else {
                toc.push(RawEntry {
                    name: te.name.clone(),
                    kind: "chunk".into(),
                    offset,
                    chunk_offset: (c * cs) as u64,
                    chunk_size: piece.len() as u64,
                    chunk_digest: d,
                    ..Default::default()
                });
            }
        }
    }
    // The TOC: a tar entry of its own, the archive's end after it, in one member.
    let json = serde_json::to_vec(&serde_json::json!({"version": 1, "entries": toc}))
        .map_err(std::io::Error::other)?;
    let toc_digest = sha256_of(&json);
    let toc_offset = o.n;
    let mut h = tar::Header::new_ustar();
    h.set_path(TOC_NAME)?;
    h.set_size(json.len() as u64);
    h.set_mode(0o444);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    let mut t = h.as_bytes().to_vec();
    t.extend_from_slice(&json);
    t.resize(t.len().div_ceil(512) * 512 + 1024, 0);
    member(&mut o, &t)?;
    o.write_all(&footer(toc_offset))?;
    o.flush()?;
    Ok(Written {
        digest: format!("sha256:{}", hex(&o.hash.finalize())),
        size: o.n,
        diff_id: format!("sha256:{}", hex(&uncompressed.finalize())),
        uncompressed_size: usize_total,
        toc_digest,
    })
}

/// A layer tar for the TOC tests (`zstd_chunked.rs`'s too): each entry uid 7, 0755 for dirs
/// and 0640 otherwise, built with `add(name, kind, data, link)`.
#[cfg(test)]
pub(crate) fn test_tar(
    f: impl FnOnce(&mut dyn FnMut(&str, tar::EntryType, &[u8], Option<&str>)),
) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    f(
        &mut |name: &str, kind: tar::EntryType, data: &[u8], link: Option<&str>| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_mode(if kind == tar::EntryType::Directory {
                0o755
            } else {
                0o640
            });
            h.set_uid(7);
            h.set_size(data.len() as u64);
            h.set_mtime(1_700_000_000);
            if let Some(l) = link {
                h.set_link_name(l).unwrap();
            }
            b.append_data(&mut h, name, data).unwrap();
        },
    );
    b.into_inner().unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer() -> Vec<u8> {
        test_tar(|add| {
            add("bin/", tar::EntryType::Directory, b"", None);
            add("bin/big", tar::EntryType::Regular, &vec![7u8; 10_000], None);
            add("bin/small", tar::EntryType::Regular, b"hello\n", None);
            add("bin/link", tar::EntryType::Symlink, b"", Some("small"));
            add("bin/hard", tar::EntryType::Link, b"", Some("bin/small"));
            add("etc/.wh.gone", tar::EntryType::Regular, b"", None);
            add("opt/.wh..wh..opq", tar::EntryType::Regular, b"", None);
            add("empty", tar::EntryType::Regular, b"", None);
        })
    }

    fn written(opts: &WriteOptions) -> (Vec<u8>, Written) {
        let tar = layer();
        let mut blob = Vec::new();
        let w = write(&tar, &mut blob, opts).unwrap();
        (blob, w)
    }

    fn limits() -> TocLimits {
        TocLimits {
            max_entries: 1000,
            max_bytes: 1 << 30,
        }
    }

    fn tree_of(blob: &[u8]) -> Tree {
        let off = parse_footer(&blob[blob.len() - 51..]).unwrap();
        let json = toc_json(&blob[off as usize..blob.len() - 51]).unwrap();
        Tree::parse(&json, off, limits()).unwrap()
    }

    /// The blob is an ordinary gzip layer: decompressed whole it is a tar whose digest is the
    /// diff id `write` reports, with every entry of the input.
    #[test]
    fn blob_reads_as_plain_gzip_tar() {
        let (blob, w) = written(&WriteOptions::default());
        assert_eq!(w.size, blob.len() as u64);
        let mut plain = Vec::new();
        flate2::read::MultiGzDecoder::new(&blob[..])
            .read_to_end(&mut plain)
            .unwrap();
        assert_eq!(crate::image::store::sha256_of(&plain), w.diff_id);
        let mut a = tar::Archive::new(&plain[..]);
        let names: Vec<String> = a
            .entries()
            .unwrap()
            .map(|e| String::from_utf8_lossy(&e.unwrap().path_bytes()).into_owned())
            .collect();
        for n in [
            "bin/big",
            "bin/small",
            "etc/.wh.gone",
            TOC_NAME,
            NO_PREFETCH_LANDMARK,
        ] {
            assert!(names.iter().any(|x| x == n), "{n} missing from {names:?}");
        }
    }

    /// Each chunk decompresses alone from its offset to bytes hashing to its digest.
    #[test]
    fn chunks_decompress_alone_and_verify() {
        let (blob, w) = written(&WriteOptions {
            chunk_size: 4096,
            prefetch: vec!["./bin/small".into()],
        });
        let t = tree_of(&blob);
        let off = parse_footer(&blob[blob.len() - 51..]).unwrap();
        let json = toc_json(&blob[off as usize..blob.len() - 51]).unwrap();
        assert_eq!(crate::image::store::sha256_of(&json), w.toc_digest);
        let bin = t.nodes[0].children[&b"bin".to_vec()];
        let big = &t.nodes[t.nodes[bin as usize].children[&b"big".to_vec()] as usize];
        assert_eq!(big.chunks.len(), 3);
        assert_eq!(big.size, 10_000);
        for c in &big.chunks {
            let start = c.blob_off as usize;
            let end = start + c.max_compressed as usize;
            let mut out = vec![0u8; c.len as usize];
            flate2::read::GzDecoder::new(&blob[start..end])
                .read_exact(&mut out)
                .unwrap();
            assert_eq!(sha2::Sha256::digest(&out).as_slice(), c.digest);
        }
        let small = t.nodes[bin as usize].children[&b"small".to_vec()];
        assert_eq!(t.nodes[small as usize].nlink, 2);
        // A dir links itself, its parent's entry and each subdir's `..`: `bin` has none.
        assert_eq!(t.nodes[bin as usize].nlink, 2);
        assert_eq!(t.nodes[0].nlink, 2 + 3, "root: bin, etc, opt");
        assert_eq!(t.nodes[bin as usize].children[&b"hard".to_vec()], small);
        // The prefetched file comes before the landmark, the rest after.
        let pe = t.prefetch_end.unwrap();
        assert!(t.nodes[small as usize].chunks[0].blob_off < pe);
        assert!(big.chunks[0].blob_off > pe);
        let etc = t.nodes[0].children[&b"etc".to_vec()];
        let gone = t.nodes[etc as usize].children[&b"gone".to_vec()];
        assert_eq!(t.nodes[gone as usize].kind, Kind::Whiteout);
        let opt = t.nodes[0].children[&b"opt".to_vec()];
        assert!(t.nodes[opt as usize].opaque);
        assert!(!t.nodes[0].children.contains_key(TOC_NAME.as_bytes()));
    }

    fn toc_with(entries: serde_json::Value) -> Result<Tree, String> {
        let json =
            serde_json::to_vec(&serde_json::json!({"version": 1, "entries": entries})).unwrap();
        Tree::parse(&json, 1000, limits())
    }

    const D: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

    /// What a hostile TOC can say is refused, each with the entry named.
    #[test]
    fn hostile_tocs_are_refused() {
        let cases = [
            (
                serde_json::json!([{"name": "../x", "type": "dir"}]),
                "\"..\"",
            ),
            (
                serde_json::json!([{"name": "f", "type": "reg", "size": 10, "offset": 5000, "chunkDigest": D}]),
                "not before the TOC",
            ),
            (
                serde_json::json!([{"name": "f", "type": "reg", "size": 10, "offset": 10}]),
                "no sha256 digest",
            ),
            (
                serde_json::json!([{"name": "f", "type": "reg", "size": 10, "offset": 10, "chunkSize": 4, "chunkDigest": D}]),
                "cover 4 of its 10",
            ),
            (
                serde_json::json!([{"name": "f", "type": "reg", "size": 10, "offset": 10, "chunkSize": 4, "chunkDigest": D},
                                   {"name": "f", "type": "chunk", "offset": 20, "chunkOffset": 5, "chunkSize": 6, "chunkDigest": D}]),
                "where 4 comes next",
            ),
            (
                serde_json::json!([{"name": "h", "type": "hardlink", "linkName": "nothing"}]),
                "hard link",
            ),
            (
                serde_json::json!([{"name": "x", "type": "chunk", "offset": 1}]),
                "follows no regular file",
            ),
            (
                serde_json::json!([{"name": "s", "type": "symlink"}]),
                "symlink target",
            ),
            (
                serde_json::json!([{"name": "d/.wh..", "type": "reg"}]),
                "whiteout of no name",
            ),
            (
                serde_json::json!([{"name": "f", "type": "socket"}]),
                "unknown type",
            ),
            (
                serde_json::json!([{"name": "f", "type": "reg", "size": 100_000_000, "offset": 10, "chunkDigest": D}]),
                "a chunk of",
            ),
        ];
        for (entries, want) in cases {
            let e = toc_with(entries.clone()).unwrap_err();
            assert!(e.contains(want), "{entries}: {e}");
        }
        let many: Vec<_> = (0..1001)
            .map(|i| serde_json::json!({"name": format!("d{i}"), "type": "dir"}))
            .collect();
        assert!(toc_with(serde_json::Value::Array(many))
            .unwrap_err()
            .contains("more than 1000"));
        let json = br#"{"version": 2, "entries": []}"#;
        assert!(Tree::parse(json, 10, limits())
            .unwrap_err()
            .contains("version 2"));
    }

    #[test]
    fn footer_round_trip_and_refusals() {
        assert_eq!(parse_footer(&footer(0x1234_5678)).unwrap(), 0x1234_5678);
        assert_eq!(footer(1).len() as u64, FOOTER_SIZE);
        let mut f = footer(9);
        f[33] = b'X';
        assert!(parse_footer(&f).is_err());
        assert!(parse_footer(&[0u8; 51])
            .unwrap_err()
            .contains("not an eStargz"));
        // The footer decompresses to nothing (a plain gzip reader accepts the blob's end).
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&footer(5)[..])
            .read_to_end(&mut out)
            .unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn times() {
        assert_eq!(parse_time("1970-01-01T00:00:00Z"), 0);
        assert_eq!(parse_time("2023-11-14T22:13:20Z"), 1_700_000_000);
        assert_eq!(parse_time("2023-11-14T23:13:20.5+01:00"), 1_700_000_000);
        assert_eq!(parse_time("garbage"), 0);
        assert_eq!(format_time(1_700_000_000), "2023-11-14T22:13:20Z");
    }
}
