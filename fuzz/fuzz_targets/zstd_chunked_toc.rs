//! A zstd:chunked layer's TOC from a registry: its position annotation (checked against a
//! blob's size), its compressed bytes (one zstd frame, decompressed within the length the
//! position says), the JSON read into a tree, and a chunk's frame decompressed; an error or a
//! result, never a panic, and a tree keeps the bounds it promises (entries, bytes, every chunk
//! before the TOC's frame and within the chunk cap, each file covered by its chunks).
#![no_main]
use libfuzzer_sys::fuzz_target;
use sandboxd::image::estargz::{Format, TocLimits, Tree};
use sandboxd::image::zstd_chunked::{read_chunk, toc_json, Position};

#[path = "common/tree_bounds.rs"]
mod tree_bounds;

fuzz_target!(|data: &[u8]| {
    let limits = TocLimits {
        max_entries: 512,
        max_bytes: 1 << 30,
    };
    // The first line as the position annotation; the rest as the TOC's compressed bytes, as
    // a chunk's frame, and as the JSON itself.
    let (line, rest) = match data.iter().position(|b| *b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&data[..0], data),
    };
    if let Ok(p) = Position::parse(&String::from_utf8_lossy(line), 1 << 20) {
        assert!(p.offset >= 8 && p.offset + p.length <= 1 << 20);
        if let Ok(json) = toc_json(rest, p.uncompressed) {
            assert_eq!(json.len() as u64, p.uncompressed);
        }
    }
    let _ = read_chunk(rest, 4096);
    let toc_offset = 1 << 20;
    if let Ok(t) = Tree::parse_as(Format::ZstdChunked, rest, toc_offset, limits) {
        tree_bounds::check(&t, toc_offset, limits);
    }
});
