//! Pod and container config files in crictl's JSON shape (parsed by the library's
//! `cri::crictl_json`, which the tests and the fuzzer share).

use std::path::Path;

use sandboxd::api::v1 as cri;

/// Largest config file read.
const MAX_CONFIG_FILE: u64 = 1 << 20;

fn read_config(path: &Path) -> Result<Vec<u8>, String> {
    sandboxd::untrusted_fs::read_file(path, MAX_CONFIG_FILE).map_err(|e| e.to_string())
}

pub fn load_pod_config(path: &Path) -> Result<cri::PodSandboxConfig, String> {
    sandboxd::cri::crictl_json::pod_config(&read_config(path)?)
        .map_err(|e| format!("{}: {e}", path.display()))
}

pub fn load_container_config(path: &Path) -> Result<cri::ContainerConfig, String> {
    sandboxd::cri::crictl_json::container_config(&read_config(path)?)
        .map_err(|e| format!("{}: {e}", path.display()))
}
