//! A hypervisor runtime on the netns sandboxd makes, for real — what sandboxd exists for.
//! `tests/vmm/sandboxd-test-vmm`, registered as a handler with a sandbox process, boots a QEMU
//! guest per pod the way Kata does: a tap in the pod's netns (which already holds the CNI
//! interface `eth0` when the runtime starts), tc `mirred` redirects between tap and eth0 both
//! ways, the guest on eth0's MAC and address. The host reaches the guest's HTTP server at the
//! pod IP; StopPodSandbox ends the VM and RemovePodSandbox leaves nothing.
//!
//! The guest is the VM lane's kernel with a busybox initramfs: `scripts/vm-test tiny-guest`
//! builds it and prints the variables this test reads (scripts/test exports them). Without
//! them the test is skipped, saying so.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use sandboxd::config::RuntimeHandler;

struct Guest {
    kernel: String,
    initrd: String,
    accel: String,
}

fn guest() -> Result<Guest, String> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| Path::new(v).is_file());
    let (Some(kernel), Some(initrd)) = (
        var("SANDBOXD_TEST_VMM_KERNEL"),
        var("SANDBOXD_TEST_VMM_INITRD"),
    ) else {
        return Err("no guest for the test hypervisor runtime: run `eval \"$(scripts/vm-test tiny-guest)\"` first (scripts/test does)".into());
    };
    if !sh_ok("command -v qemu-system-x86_64").0 {
        return Err("qemu-system-x86_64 is not installed (scripts/vm-test installs it)".into());
    }
    let accel = std::env::var("SANDBOXD_TEST_VMM_ACCEL").unwrap_or_else(|_| "tcg".into());
    Ok(Guest {
        kernel,
        initrd,
        accel,
    })
}

/// `GET /` at `ip:80`, or why not.
fn http_get(ip: &str) -> Result<String, String> {
    let addr: SocketAddr = format!("{ip}:80").parse().unwrap();
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET / HTTP/1.0\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut body = String::new();
    s.take(64 << 10)
        .read_to_string(&mut body)
        .map_err(|e| e.to_string())?;
    Ok(body)
}

fn qemu_of(sandbox: &str) -> Vec<i32> {
    let name = format!("sandboxd-vmm-{sandbox}");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == name.as_bytes()))
        })
        .collect()
}

#[test]
fn a_vm_per_pod_answers_http_at_the_pod_ip_and_goes_with_the_pod() {
    let g = match guest() {
        Ok(g) => g,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let mut env = Env::new("vmm");
    env.cfg.runtimes.insert(
        "vmm".into(),
        RuntimeHandler {
            path: Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vmm/sandboxd-test-vmm"),
            root: None,
            family: None,
            needs_sandbox_process: true,
            runtime_args: vec![
                format!("--kernel={}", g.kernel),
                format!("--initrd={}", g.initrd),
                format!("--accel={}", g.accel),
            ],
        },
    );
    let rt = env.runtime();
    let mut pod = env.pod("vm", false);
    pod.runtime_handler = "vmm".into();
    let sb = rt.run_pod_sandbox(&pod).unwrap();
    let st = rt.pod_sandbox_status(&sb).unwrap();
    let ip = st.ips[0].to_string();
    let netns = st.netns_path.clone().unwrap();
    let pid = st.infra_pid.unwrap();

    // QEMU is the sandbox's process, in the pod's netns.
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    assert!(comm.starts_with("qemu-system-x86"), "{comm}");
    assert_eq!(
        std::fs::metadata(format!("/proc/{pid}/ns/net"))
            .unwrap()
            .ino(),
        std::fs::metadata(&netns).unwrap().ino()
    );
    assert_eq!(qemu_of(&sb), vec![pid]);
    let in_ns = |cmd: &str| sh(&format!("nsenter --net={} {cmd}", netns.display()));
    assert!(in_ns("ip -o link show").contains("tap0"));
    for (from, to) in [("eth0", "tap0"), ("tap0", "eth0")] {
        let f = in_ns(&format!("tc filter show dev {from} ingress"));
        assert!(
            f.contains(&format!("Redirect to device {to}")),
            "{from}: {f}"
        );
    }

    // The host reaches the guest at the pod IP (through the bridge, the veth, eth0's
    // redirect and the tap): the answer carries the guest's kernel, not the host's.
    let deadline = Instant::now() + Duration::from_secs(240);
    let body = loop {
        match http_get(&ip) {
            Ok(b) if b.contains("sandboxd-test-vmm guest") => break b,
            r => {
                let console =
                    std::fs::read_to_string(env.runtime_root("vmm").join(&sb).join("console.log"))
                        .unwrap_or_default();
                assert!(
                    Instant::now() < deadline,
                    "no HTTP from the guest at {ip}: {r:?}; console:\n{console}"
                );
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    };
    eprintln!("guest answered: {}", body.lines().last().unwrap_or(""));
    assert!(body.starts_with("HTTP/1."), "{body}");
    assert!(body.contains(&format!("pod vm at {ip}/")), "{body}");
    let host_kernel = sh("uname -r").trim().to_string();
    assert!(!body.contains(&host_kernel), "{body}");

    // StopPodSandbox ends the VM; nothing answers any more.
    rt.stop_pod_sandbox(&sb).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !qemu_of(&sb).is_empty() {
        assert!(Instant::now() < deadline, "qemu still there after stop");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(http_get(&ip).is_err());
    rt.remove_pod_sandbox(&sb).unwrap();
    assert!(!env.runtime_root("vmm").join(&sb).exists());
    assert!(!netns.exists());
    env.assert_no_leaks();
}
