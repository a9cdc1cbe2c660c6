//! A lazy layer's TOC from a registry: the footer and the TOC member (gzip of a tar of the
//! JSON) parsed and read into a tree within small limits; an error or a tree, never a panic,
//! and a tree keeps the bounds it promises (entries, bytes, every chunk before the TOC and
//! within the chunk cap, each file covered by its chunks).
#![no_main]
use libfuzzer_sys::fuzz_target;
use sandboxd::image::estargz::{self, TocLimits, Tree};

#[path = "common/tree_bounds.rs"]
mod tree_bounds;

fuzz_target!(|data: &[u8]| {
    let limits = TocLimits {
        max_entries: 512,
        max_bytes: 1 << 30,
    };
    if data.len() >= 51 {
        let _ = estargz::parse_footer(&data[data.len() - 51..]);
    }
    let _ = estargz::toc_json(data);
    // The input as the JSON itself, the TOC placed 1 MiB in.
    let toc_offset = 1 << 20;
    if let Ok(t) = Tree::parse(data, toc_offset, limits) {
        tree_bounds::check(&t, toc_offset, limits);
    }
});
