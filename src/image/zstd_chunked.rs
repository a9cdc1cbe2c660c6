//! zstd:chunked layers (containers/storage's format, what podman and buildah push with
//! `--compression-format zstd:chunked`): a zstd-compressed layer tar in which every regular
//! file's content (and every chunk of a large one) is a zstd frame of its own, the tar
//! headers in frames between them; after the tar, three skippable frames that a plain zstd
//! decoder passes over: the table of contents (the same JSON as eStargz's, zstd-compressed),
//! the tar-split data (for rebuilding the tar stream; not read here) and a 64-byte footer.
//! Read as one zstd stream it is an ordinary layer tar, so any runtime unpacks it whole.
//!
//! As containers/storage does, the TOC is found by the manifest's layer annotations, not by
//! the footer: `…manifest-position` says where its compressed bytes are and how long it is
//! uncompressed, `…manifest-checksum` names the sha256 of those compressed bytes (the manifest
//! itself is checked against its digest). Here: those annotations, the TOC's bounded
//! decompression (the tree is `estargz::Tree`, built with `Format::ZstdChunked`), and a
//! writer (`write`) that converts a layer tar for the tests and `sandboxctl images estargz
//! --zstd-chunked`.

use std::io::{Read, Write};

use sha2::Digest;

use super::estargz::{Out, RawEntry, MAX_CHUNK, MAX_TOC_BYTES};
use super::store::sha256_of;
use super::unpack::hex;

/// The manifest annotation naming the sha256 of the compressed TOC.
pub const MANIFEST_CHECKSUM_ANNOTATION: &str =
    "io.github.containers.zstd-chunked.manifest-checksum";
/// The manifest annotation `offset:length:uncompressed length:type` of the compressed TOC.
pub const MANIFEST_POSITION_ANNOTATION: &str =
    "io.github.containers.zstd-chunked.manifest-position";
/// The manifest annotation `offset:length:uncompressed length` of the tar-split data.
pub const TARSPLIT_POSITION_ANNOTATION: &str =
    "io.github.containers.zstd-chunked.tarsplit-position";
/// The TOC type the position names: CRFS's JSON (the only one there is).
const MANIFEST_TYPE_CRFS: u64 = 1;
/// A skippable frame's magic (the first of the 16 such magics) and its header's size.
const SKIPPABLE_MAGIC: [u8; 4] = [0x50, 0x2a, 0x4d, 0x18];
const SKIPPABLE_HEADER: u64 = 8;
/// The footer's data: seven little-endian u64 and this magic.
const FOOTER_MAGIC: &[u8; 8] = b"GNUlInUx";
const FOOTER_DATA: usize = 64;
/// The largest zstd window a TOC or chunk may ask for (as for whole layers).
const WINDOW_LOG_MAX: u32 = 27;

/// Where a layer's TOC is, from its `…manifest-position` annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// Where the compressed TOC begins in the blob (just after its skippable frame's header).
    pub offset: u64,
    /// Its compressed length.
    pub length: u64,
    /// Its length as JSON.
    pub uncompressed: u64,
}

impl Position {
    /// The annotation's value, `offset:length:uncompressed:type`, checked against a blob of
    /// `size` bytes: inside it, after a skippable frame's header, within the TOC bounds.
    pub fn parse(v: &str, size: u64) -> Result<Position, String> {
        let n: Vec<u64> = v
            .split(':')
            .map(|p| p.parse::<u64>())
            .collect::<Result<_, _>>()
            .map_err(|_| format!("manifest position {v:?} is not four numbers"))?;
        let [offset, length, uncompressed, kind] = n[..] else {
            return Err(format!("manifest position {v:?} is not four numbers"));
        };
        if kind != MANIFEST_TYPE_CRFS {
            return Err(format!(
                "manifest position {v:?}: TOC type {kind} (this reader knows 1)"
            ));
        }
        if offset < SKIPPABLE_HEADER || offset.checked_add(length).is_none_or(|e| e > size) {
            return Err(format!(
                "manifest position {v:?} puts the TOC outside the blob's {size} bytes"
            ));
        }
        if length == 0 || length > MAX_TOC_BYTES || uncompressed > MAX_TOC_BYTES {
            return Err(format!(
                "manifest position {v:?}: a TOC empty or over {MAX_TOC_BYTES} bytes"
            ));
        }
        Ok(Position {
            offset,
            length,
            uncompressed,
        })
    }

    /// Where the TOC's skippable frame begins: no file chunk reaches it.
    pub fn frame_start(&self) -> u64 {
        self.offset - SKIPPABLE_HEADER
    }
}

/// The TOC's JSON from its compressed bytes `z` (the position's range of the blob, already
/// checked against the checksum annotation): one zstd frame of exactly `uncompressed` bytes.
pub fn toc_json(z: &[u8], uncompressed: u64) -> Result<Vec<u8>, String> {
    let mut d = zstd::stream::read::Decoder::with_buffer(z)
        .map_err(|e| format!("TOC: {e}"))?
        .single_frame();
    d.window_log_max(WINDOW_LOG_MAX)
        .map_err(|e| format!("TOC: {e}"))?;
    let mut json = Vec::new();
    d.take(uncompressed.min(MAX_TOC_BYTES) + 1)
        .read_to_end(&mut json)
        .map_err(|e| format!("the TOC does not decompress: {e}"))?;
    if json.len() as u64 != uncompressed {
        return Err(format!(
            "the TOC decompresses to {} bytes, its position says {uncompressed}",
            json.len()
        ));
    }
    Ok(json)
}

/// One chunk's uncompressed bytes (`len` of them) from `r`, which starts at its frame: one
/// frame, the window bounded.
pub fn read_chunk(r: impl Read, len: u64) -> std::io::Result<Vec<u8>> {
    if len > MAX_CHUNK {
        return Err(std::io::Error::other(format!("a chunk of {len} bytes")));
    }
    let mut d = zstd::stream::read::Decoder::new(r)?.single_frame();
    d.window_log_max(WINDOW_LOG_MAX)?;
    let mut out = vec![0u8; len as usize];
    d.read_exact(&mut out)?;
    Ok(out)
}

/// What [`write`] wrote.
#[derive(Debug, Clone)]
pub struct Written {
    /// `sha256:` of the blob.
    pub digest: String,
    pub size: u64,
    /// `sha256:` of the uncompressed tar (the config's diff id): the input tar, unchanged.
    pub diff_id: String,
    /// The three annotations of the layer's manifest entry (name, value).
    pub annotations: Vec<(&'static str, String)>,
}

/// A skippable frame holding `data`.
fn skippable(data: &[u8]) -> Vec<u8> {
    let mut f = SKIPPABLE_MAGIC.to_vec();
    f.extend_from_slice(&(data.len() as u32).to_le_bytes());
    f.extend_from_slice(data);
    f
}

/// Converts the layer tar `tar` (uncompressed) into a zstd:chunked blob written to `out`,
/// regular files cut in chunks of `chunk_size` bytes (each a frame with its own digest). The
/// blob decompresses to `tar` exactly. The tar-split frame is written empty (this reader and
/// the full unpack never read it).
pub fn write(tar: &[u8], out: impl Write, chunk_size: u64) -> std::io::Result<Written> {
    let bad = |e: std::io::Error| std::io::Error::other(format!("layer tar: {e}"));
    let norm = |n: &str| n.trim_start_matches("./").trim_matches('/').to_string();
    let mut o = Out::new(out);
    let frame = |o: &mut Out<_>, data: &[u8]| -> std::io::Result<()> {
        o.write_all(&zstd::bulk::compress(data, 3)?)
    };
    let mut toc: Vec<RawEntry> = Vec::new();
    // What comes before the next file's content: the padding of the last and the headers.
    let mut pending = 0usize;
    let mut a = tar::Archive::new(tar);
    for e in a.entries().map_err(bad)? {
        let e = e.map_err(bad)?;
        let start = e.raw_file_position() as usize;
        let size = e.size() as usize;
        let h = e.header();
        let kind = super::estargz::toc_kind(h.entry_type());
        let name = norm(&String::from_utf8_lossy(&e.path_bytes()));
        let link = e
            .link_name_bytes()
            .map(|l| String::from_utf8_lossy(&l).into_owned())
            .unwrap_or_default();
        let mut te = RawEntry {
            name: name.clone(),
            kind: kind.into(),
            size: size as u64,
            mode: h.mode().unwrap_or(0o644) as u64,
            uid: h.uid().unwrap_or(0),
            gid: h.gid().unwrap_or(0),
            mod_time: super::estargz::format_time(h.mtime().unwrap_or(0) as i64),
            link_name: if kind == "hardlink" {
                norm(&link)
            } else {
                link
            },
            ..Default::default()
        };
        if kind != "reg" || size == 0 {
            toc.push(te);
            continue;
        }
        frame(&mut o, &tar[pending..start])?;
        let content = &tar[start..start + size];
        te.digest = sha256_of(content);
        let cs = chunk_size.clamp(1, MAX_CHUNK) as usize;
        let n = size.div_ceil(cs);
        let first = toc.len();
        for c in 0..n {
            let piece = &content[c * cs..((c + 1) * cs).min(size)];
            let offset = o.n;
            frame(&mut o, piece)?;
            if c == 0 {
                te.offset = offset;
                if n > 1 {
                    te.chunk_size = piece.len() as u64;
                    te.chunk_digest = sha256_of(piece);
                }
                toc.push(te.clone());
            } else {
                toc.push(RawEntry {
                    name: name.clone(),
                    kind: "chunk".into(),
                    offset,
                    chunk_offset: (c * cs) as u64,
                    chunk_size: piece.len() as u64,
                    chunk_digest: sha256_of(piece),
                    ..Default::default()
                });
            }
        }
        toc[first].end_offset = o.n;
        pending = start + size;
    }
    // The last file's padding, the headers after it and the archive's end.
    frame(&mut o, &tar[pending..])?;
    let json = serde_json::to_vec(&serde_json::json!({"version": 1, "entries": toc}))
        .map_err(std::io::Error::other)?;
    let z = zstd::bulk::compress(&json, 3)?;
    let manifest_offset = o.n + SKIPPABLE_HEADER;
    o.write_all(&skippable(&z))?;
    let split = zstd::bulk::compress(b"", 3)?;
    let split_offset = o.n + SKIPPABLE_HEADER;
    o.write_all(&skippable(&split))?;
    let mut foot = Vec::with_capacity(FOOTER_DATA);
    for v in [
        manifest_offset,
        z.len() as u64,
        json.len() as u64,
        MANIFEST_TYPE_CRFS,
        split_offset,
        split.len() as u64,
        0,
    ] {
        foot.extend_from_slice(&v.to_le_bytes());
    }
    foot.extend_from_slice(FOOTER_MAGIC);
    o.write_all(&skippable(&foot))?;
    o.flush()?;
    Ok(Written {
        digest: format!("sha256:{}", hex(&o.hash.finalize())),
        size: o.n,
        diff_id: sha256_of(tar),
        annotations: vec![
            (MANIFEST_CHECKSUM_ANNOTATION, sha256_of(&z)),
            (
                MANIFEST_POSITION_ANNOTATION,
                format!(
                    "{manifest_offset}:{}:{}:{MANIFEST_TYPE_CRFS}",
                    z.len(),
                    json.len()
                ),
            ),
            (
                TARSPLIT_POSITION_ANNOTATION,
                format!("{split_offset}:{}:0", split.len()),
            ),
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::estargz::{Format, Kind, TocLimits, Tree};

    fn layer() -> Vec<u8> {
        crate::image::estargz::test_tar(|add| {
            add("bin/", tar::EntryType::Directory, b"", None);
            let big: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
            add("bin/big", tar::EntryType::Regular, &big, None);
            add("bin/small", tar::EntryType::Regular, b"hello\n", None);
            add("bin/link", tar::EntryType::Symlink, b"", Some("small"));
            add("bin/hard", tar::EntryType::Link, b"", Some("bin/small"));
            add("etc/.wh.gone", tar::EntryType::Regular, b"", None);
            add("opt/.wh..wh..opq", tar::EntryType::Regular, b"", None);
            // A name eStargz keeps for itself is an ordinary file here.
            add("stargz.index.json", tar::EntryType::Regular, b"{}", None);
            add("empty", tar::EntryType::Regular, b"", None);
        })
    }

    fn limits() -> TocLimits {
        TocLimits {
            max_entries: 1000,
            max_bytes: 1 << 30,
        }
    }

    fn annotation(w: &Written, name: &str) -> String {
        w.annotations
            .iter()
            .find(|(k, _)| *k == name)
            .unwrap()
            .1
            .clone()
    }

    fn tree_of(blob: &[u8], w: &Written) -> Tree {
        let pos = Position::parse(
            &annotation(w, MANIFEST_POSITION_ANNOTATION),
            blob.len() as u64,
        )
        .unwrap();
        let z = &blob[pos.offset as usize..(pos.offset + pos.length) as usize];
        assert_eq!(sha256_of(z), annotation(w, MANIFEST_CHECKSUM_ANNOTATION));
        let json = toc_json(z, pos.uncompressed).unwrap();
        Tree::parse_as(Format::ZstdChunked, &json, pos.frame_start(), limits()).unwrap()
    }

    /// The blob is an ordinary zstd layer: decompressed whole (skippable frames passed over)
    /// it is the input tar, whose digest is the diff id; the footer says what the
    /// annotations say.
    #[test]
    fn blob_reads_as_the_input_tar() {
        let tar = layer();
        let mut blob = Vec::new();
        let w = write(&tar, &mut blob, 4096).unwrap();
        assert_eq!(w.size, blob.len() as u64);
        assert_eq!(w.digest, sha256_of(&blob));
        let mut plain = Vec::new();
        zstd::stream::read::Decoder::new(&blob[..])
            .unwrap()
            .read_to_end(&mut plain)
            .unwrap();
        assert_eq!(plain, tar);
        assert_eq!(w.diff_id, sha256_of(&tar));
        let foot = &blob[blob.len() - 72..];
        assert_eq!(foot[..4], SKIPPABLE_MAGIC);
        assert_eq!(&foot[64..], FOOTER_MAGIC);
        let le = |i: usize| u64::from_le_bytes(foot[8 + 8 * i..16 + 8 * i].try_into().unwrap());
        let pos = annotation(&w, MANIFEST_POSITION_ANNOTATION);
        assert_eq!(pos, format!("{}:{}:{}:{}", le(0), le(1), le(2), le(3)));
    }

    /// Each chunk decompresses alone from its frame to bytes of its digest, the chunks cover
    /// each file, and the tree is the tar's (a name eStargz keeps for itself included).
    #[test]
    fn chunks_decompress_alone_and_verify() {
        let tar = layer();
        let mut blob = Vec::new();
        let w = write(&tar, &mut blob, 4096).unwrap();
        let t = tree_of(&blob, &w);
        assert_eq!(t.format, Format::ZstdChunked);
        let big = t.nodes.iter().find(|n| n.name == b"big").unwrap();
        assert_eq!(big.chunks.len(), 3);
        let mut whole = Vec::new();
        for c in &big.chunks {
            let start = c.blob_off as usize;
            let end = start + c.max_compressed as usize;
            let out = read_chunk(&blob[start..end], c.len).unwrap();
            assert_eq!(sha2::Sha256::digest(&out).as_slice(), c.digest);
            whole.extend_from_slice(&out);
        }
        let want: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        assert_eq!(whole, want);
        let root = &t.nodes[0];
        assert!(root.children.contains_key(&b"stargz.index.json"[..]));
        let bin = &t.nodes[root.children[&b"bin"[..]] as usize];
        assert_eq!(bin.children[&b"small"[..]], bin.children[&b"hard"[..]]);
        let link = bin.children[&b"link"[..]];
        assert_eq!(t.nodes[link as usize].kind, Kind::Symlink);
        let etc = root.children[&b"etc"[..]];
        assert_eq!(
            t.nodes[t.nodes[etc as usize].children[&b"gone"[..]] as usize].kind,
            Kind::Whiteout
        );
        assert!(t.nodes[root.children[&b"opt"[..]] as usize].opaque);
    }

    /// Positions outside the blob, of another type, or no numbers are refused; a TOC that
    /// decompresses to another length than its position says is refused.
    #[test]
    fn hostile_positions_and_tocs_refused() {
        for (v, why) in [
            ("1:2:3", "not four numbers"),
            ("a:2:3:1", "not four numbers"),
            ("100:10:5:2", "TOC type 2"),
            ("4:10:5:1", "outside the blob"),
            ("995:10:5:1", "outside the blob"),
            ("18446744073709551615:10:5:1", "outside the blob"),
            ("100:0:5:1", "empty or over"),
            ("100:10:99999999999:1", "empty or over"),
        ] {
            let e = Position::parse(v, 1000).unwrap_err();
            assert!(e.contains(why), "{v}: {e}");
        }
        let z = zstd::bulk::compress(br#"{"version":1,"entries":[]}"#, 3).unwrap();
        assert!(toc_json(&z, 26).is_ok());
        assert!(toc_json(&z, 25).unwrap_err().contains("decompresses to"));
        assert!(toc_json(&z, 27).unwrap_err().contains("decompresses to"));
        assert!(toc_json(b"not zstd at all", 10).is_err());
        // A chunk longer than its frame does not read as the frame and what follows.
        let two = [
            zstd::bulk::compress(b"abc", 3).unwrap(),
            zstd::bulk::compress(b"def", 3).unwrap(),
        ]
        .concat();
        assert_eq!(read_chunk(&two[..], 3).unwrap(), b"abc");
        assert!(read_chunk(&two[..], 6).is_err());
    }
}
