//! containers-policy.json as an operator (or whoever edits it) writes it: parsing and the
//! scope lookup for a few references never panic, whatever the text.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        sandboxd::image::policy::fuzz_policy(text);
    }
});
