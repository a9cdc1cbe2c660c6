//! An embedder's first program: the whole pod lifecycle through the library, no daemon.
//!
//! ```sh
//! # as root, with runc, the CNI plugins and sandboxd's monitor and pause built (scripts/setup,
//! # scripts/build-shims), and any image as a docker-archive, oci-archive or OCI layout:
//! SANDBOXD_MONITOR=target/shims/sandboxd-monitor SANDBOXD_PAUSE=target/shims/sandboxd-pause \
//!     cargo run --example run_pod -- busybox.tar /tmp/run-pod
//! ```
//!
//! It keeps every host path under the base dir (state root, namespace dirs) and runs its pods
//! on a bridge and subnet of its own, imports the image, runs a pod with one container, runs a
//! command in it, then stops and removes everything. Errors name the step and the object.

use std::path::PathBuf;
use std::time::Duration;

use sandboxd::config::DefaultNetwork;
use sandboxd::{Config, ContainerConfig, ContainerMetadata, PodSandboxConfig, Runtime};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(image), base) = (args.next(), args.next()) else {
        eprintln!("usage: run_pod IMAGE-ARCHIVE [BASE-DIR]");
        std::process::exit(2);
    };
    let base = PathBuf::from(base.unwrap_or_else(|| "/tmp/sandboxd-example".into()));

    // Everything under `base`; a network and a cgroup parent of our own (the embedded
    // default CNI config is used when the conf dir holds no config file).
    let mut cfg = Config::rooted_at(&base);
    cfg.default_network = DefaultNetwork {
        name: "run-pod-example".into(),
        bridge: "sbexample0".into(),
        subnet: "10.247.0.0/24".into(),
        ip_masq: false,
    };
    cfg.cgroup_parent = "/sandboxd-example".into();
    let rt = Runtime::new(cfg)?;

    let imported = rt
        .images()
        .import(image.as_ref(), Some("example/image:latest"))?;
    let image_ref = imported
        .first()
        .and_then(|i| i.repo_tags.first().cloned())
        .ok_or("the archive holds no image")?;
    println!("imported {image_ref}");

    // A pod (kubelet's defaults: pod network, no shared PID namespace, so no infra process).
    let pod = PodSandboxConfig::new("example", "default", "example-uid-1", false);
    let pod_id = rt.run_pod_sandbox(&pod)?;
    let status = rt.pod_sandbox_status(&pod_id)?;
    println!(
        "pod {} ready: ip {:?}, netns {:?}",
        &pod_id[..12],
        status.ips,
        status.netns_path
    );

    let container = ContainerConfig {
        metadata: ContainerMetadata {
            name: "main".into(),
            attempt: 0,
        },
        image: image_ref,
        command: vec!["sleep".into(), "3600".into()],
        ..Default::default()
    };
    let ctr_id = rt.create_container(&pod_id, &container)?;
    rt.start_container(&ctr_id)?;
    let out = rt.exec_sync(
        &ctr_id,
        &["cat".into(), "/etc/hostname".into()],
        Duration::from_secs(10),
    )?;
    println!(
        "container {} runs; its /etc/hostname says {:?} (exit {})",
        &ctr_id[..12],
        String::from_utf8_lossy(&out.stdout).trim(),
        out.exit_code
    );

    // Teardown: stop and remove the container, then the pod (its namespaces, CNI attachment,
    // shm and cgroup go with it), then the image.
    rt.stop_container(&ctr_id, Duration::from_secs(5))?;
    rt.remove_container(&ctr_id)?;
    rt.stop_pod_sandbox(&pod_id)?;
    rt.remove_pod_sandbox(&pod_id)?;
    rt.remove_image(&container.image)?;
    println!("pod and container removed");
    Ok(())
}
