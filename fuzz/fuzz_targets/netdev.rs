//! `/proc/net/dev` as read inside a pod's netns (interface names are the pod's to choose).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let v = sandboxd::netdev::parse(&text);
    assert!(v.len() <= sandboxd::netdev::MAX_INTERFACES);
    assert!(v.iter().all(|i| !i.name.is_empty() && i.name != "lo" && i.name.len() <= 15));
});
