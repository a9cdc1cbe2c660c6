//! docker-archive and oci-archive tars (manifest.json, index.json, member links) imported into
//! a fresh store with small limits.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sandboxd::image::{ImageStore, StoreConfig};

fuzz_target!(|data: &[u8]| {
    let base = std::env::temp_dir().join(format!("sandboxd-fuzz-import-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let file = base.join("in.tar");
    std::fs::write(&file, data).unwrap();
    let cfg = StoreConfig {
        max_layer_bytes: 8 << 20,
        max_layer_entries: 2000,
        min_free_bytes: 0,
        ..Default::default()
    };
    let store = ImageStore::with_config(base.join("store"), cfg).unwrap();
    let _ = store.import(&file, Some("fuzz.test/x:1"));
    let _ = std::fs::remove_dir_all(&base);
});
