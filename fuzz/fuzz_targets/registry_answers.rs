//! What a registry answers that we parse: WWW-Authenticate challenges, and seccomp profiles
//! (Docker's format) as Localhost profiles carry them.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = sandboxd::image::registry::parse_challenge(s);
    }
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
        let host = sandboxd::container::spec::seccomp_host();
        let _ = sandboxd::container::spec::convert_seccomp(&v, &Default::default(), &host);
    }
});
