//! The registry files operators keep for the peers (containerd's hosts.toml, CRI-O's
//! registries.conf and a drop-in, a docker config.json), split from one input at 0xff bytes,
//! resolved for a few references (short names by the aliases and search registries): an
//! error or a plan, never a panic; every endpoint a URL.
#![no_main]
use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use sandboxd::image::{plan_pull, Auth, RegistryFilesConfig};

fuzz_target!(|data: &[u8]| {
    let base = std::env::temp_dir().join(format!("sandboxd-fuzz-regfiles-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(base.join("certs.d/example.com")).unwrap();
    std::fs::create_dir_all(base.join("certs.d/_default")).unwrap();
    std::fs::create_dir_all(base.join("registries.conf.d")).unwrap();
    let mut parts = data.split(|b| *b == 0xff);
    for f in [
        "certs.d/example.com/hosts.toml",
        "registries.conf",
        "registries.conf.d/50.conf",
        "config.json",
        "certs.d/_default/hosts.toml",
    ] {
        if let Some(p) = parts.next() {
            std::fs::write(base.join(f), p).unwrap();
        }
    }
    let files = RegistryFilesConfig {
        hosts_dirs: vec![base.join("certs.d")],
        registries_conf: Some(base.join("registries.conf")),
        registries_conf_d: Some(base.join("registries.conf.d")),
        global_auth_file: Some(base.join("config.json")),
        signature_policy: None,
    };
    let digest = format!("example.org/a/b@sha256:{}", "c".repeat(64));
    for image in [
        "example.com/app:1",
        "example.org/team/app",
        "busybox",
        "team/app:1",
        digest.as_str(),
        "127.0.0.1:5000/x",
    ] {
        if let Ok(plan) = plan_pull(image, &BTreeMap::new(), &files, &Auth::default()) {
            for (url, _) in plan {
                assert!(
                    url.starts_with("https://") || url.starts_with("http://"),
                    "{url}"
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&base);
});
