//! Kubernetes WebSocket channel messages (binary and base64 text forms).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((&mode, rest)) = data.split_first() {
        let _ = sandboxd::streaming::ws::decode_frame(mode & 1 == 1, mode & 2 == 2, rest);
    }
});
