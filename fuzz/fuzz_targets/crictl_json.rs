//! crictl-style pod and container config files, as sandboxctl reads them.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = sandboxd::cri::crictl_json::pod_config(data);
    let _ = sandboxd::cri::crictl_json::container_config(data);
});
