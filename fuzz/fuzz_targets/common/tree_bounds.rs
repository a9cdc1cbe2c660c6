//! What a TOC's tree promises, asserted by the eStargz and zstd:chunked targets alike: its
//! entries and bytes within the limits, every chunk before the TOC and within the chunk cap,
//! each file covered exactly by its chunks, every child a node.
use sandboxd::image::estargz::{Kind, TocLimits, Tree, MAX_CHUNK};

pub fn check(t: &Tree, toc_offset: u64, limits: TocLimits) {
    assert!(t.nodes.len() as u64 <= limits.max_entries + 1);
    assert!(t.bytes <= limits.max_bytes);
    for n in &t.nodes {
        let mut end = 0;
        for c in &n.chunks {
            assert!(c.blob_off < toc_offset && c.blob_off + c.max_compressed <= toc_offset);
            assert!(c.len <= MAX_CHUNK && c.file_off == end);
            end += c.len;
        }
        if n.kind == Kind::Reg && !n.chunks.is_empty() {
            assert_eq!(end, n.size);
        }
        for c in n.children.values() {
            assert!((*c as usize) < t.nodes.len());
        }
    }
}
