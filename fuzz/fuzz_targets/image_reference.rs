//! Image references as kubelet and clients send them.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(r) = sandboxd::image::reference::Reference::parse(s) {
            // A normalized reference parses to itself.
            let again = sandboxd::image::reference::Reference::parse(&r.full()).unwrap();
            assert_eq!(again.full(), r.full());
        }
    }
});
