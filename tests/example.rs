//! The embedder's example (`examples/run_pod.rs`, built by `cargo test`) runs as documented:
//! a pod with a container through the library, a command inside, and a full teardown.

mod common;

use common::*;

#[test]
fn the_run_pod_example_runs_a_pod_and_leaves_nothing() {
    let env = Env::new("example");
    // cargo builds examples next to the test binaries' dir: target/<profile>/examples/.
    let exe = std::env::current_exe().unwrap();
    let example = exe
        .parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .join("examples/run_pod");
    assert!(
        example.is_file(),
        "{} not built (cargo test --workspace builds it; alone: cargo build --examples)",
        example.display()
    );
    let layout = busybox::oci_layout(&env.base, "example/busybox:1");
    let base = env.base.join("example-root");
    const SUBNET: &str = "10.247.0.0/24";
    sh(&format!(
        "iptables -w -I FORWARD -s {SUBNET} ! -d {SUBNET} -j DROP"
    ));
    let out = std::process::Command::new(&example)
        .arg(&layout)
        .arg(&base)
        .output()
        .unwrap();
    let _ = sh_ok("ip link del sbexample0");
    let _ = sh_ok(&format!(
        "iptables -w -D FORWARD -s {SUBNET} ! -d {SUBNET} -j DROP"
    ));
    let _ = sandboxd::cgroups::remove("/sandboxd-example");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("ready: ip [\"10.247.0."), "{text}");
    assert!(text.contains("says \"example\" (exit 0)"), "{text}");
    assert!(
        list_names(&base.join("root/images/layers")).is_empty(),
        "image left"
    );
    assert!(text.contains("pod and container removed"), "{text}");
    // Nothing of the example's left: no mounts under its base but its (shared) namespace
    // dirs, no namespace files, no container dirs.
    let ns_dirs: Vec<String> = ["netns", "ipcns", "utsns", "userns"]
        .iter()
        .map(|d| base.join(d).display().to_string())
        .collect();
    let left: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|m| m.starts_with(&base.display().to_string()) && !ns_dirs.contains(m))
        .collect();
    assert!(left.is_empty(), "mounts left: {left:?}");
    assert!(list_names(&base.join("netns")).is_empty());
    for d in &ns_dirs {
        sh(&format!("umount -l {d}"));
    }
    assert!(list_names(&base.join("root/containers")).is_empty());
    env.assert_no_leaks();
}
