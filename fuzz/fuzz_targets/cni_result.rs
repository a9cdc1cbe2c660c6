//! What CNI plugins print (results) and what the conf dir holds (network configs).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
        let _ = sandboxd::cni::result_ips(&v);
    }
    let _ = sandboxd::cni::NetworkList::parse("fuzz.conflist", data, false);
    let _ = sandboxd::cni::NetworkList::parse("fuzz.conf", data, true);
});
