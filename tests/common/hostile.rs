//! The hostile-input suite's image and container (tests/hostile*.rs).

use sandboxd::{ContainerConfig, Runtime};

use super::{busybox, Env};

pub const IMAGE: &str = "sandboxd.test/busybox:hostile";

/// A runtime with the suite's busybox image imported.
pub fn setup(env: &Env) -> Runtime {
    let rt = env.runtime();
    rt.images()
        .import(&busybox::oci_layout(&env.base, IMAGE), None)
        .unwrap();
    rt
}

/// A busybox container running `sh -c script`.
pub fn ctr(name: &str, script: &str) -> ContainerConfig {
    ContainerConfig {
        metadata: sandboxd::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        },
        image: IMAGE.into(),
        command: vec!["sh".into(), "-c".into(), script.into()],
        ..Default::default()
    }
}
