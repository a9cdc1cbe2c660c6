//! Layer tars (plain, gzip, zstd; whiteouts, links, hostile names) unpacked into a fresh temp
//! dir with small limits: nothing may be created outside it, nothing may panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sandboxd::image::unpack::{apply_layer, Limits};

fuzz_target!(|data: &[u8]| {
    let base = std::env::temp_dir().join(format!("sandboxd-fuzz-unpack-{}", std::process::id()));
    let root = base.join("layer");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&root).unwrap();
    let limits = Limits {
        max_bytes: 8 << 20,
        max_entries: 2000,
        min_free_bytes: 0,
    };
    let _ = apply_layer(Box::new(data), &root, &limits);
    // The property: nothing beside the layer dir appeared in its parent.
    let beside: Vec<_> = std::fs::read_dir(&base)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    assert_eq!(beside, vec![std::ffi::OsString::from("layer")], "escaped the layer dir");
    let _ = std::fs::remove_dir_all(&base);
});
