//! Shared harness of the privileged integration tests: each test gets its own temp base dir
//! (state root, netns/ipcns/utsns dirs, CNI conf and IPAM dirs), a unique bridge and /24
//! subnet leased through lock files, and an iptables guard dropping traffic from its subnet to
//! anywhere outside it. Everything is cleaned up on drop, even when the test fails.
#![allow(dead_code)]

pub mod busybox;
pub mod chaos;
pub mod cri;
pub mod daemon;
pub mod fake_registry;
pub mod hostile;
pub mod nri_plugin;
pub mod pods;
pub mod registry;
pub mod sandboxctl;
pub mod spdy;
pub mod streaming;

use std::path::{Path, PathBuf};
use std::process::Command;

use sandboxd::{Config, PodSandboxConfig, Runtime, SandboxFilter};

const LEASE_DIR: &str = "/tmp/sandboxd-test-leases";

/// Runs a command, returning its stdout; panics with its stderr on failure.
pub fn sh(cmd: &str) -> String {
    let out = Command::new("sh").arg("-c").arg(cmd).output().unwrap();
    assert!(
        out.status.success(),
        "`{cmd}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `127.0.0.1:PORT` of a loopback port nothing listens on (bound, then closed): a registry or
/// collector that is not there, or a free port for one the test starts.
pub fn free_loopback_addr() -> String {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string()
}

/// Runs a command, ignoring failure.
pub fn sh_ok(cmd: &str) -> (bool, String) {
    let out = Command::new("sh").arg("-c").arg(cmd).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

pub fn shim(name: &str) -> PathBuf {
    let var = match name {
        "sandboxd-monitor" => "SANDBOXD_MONITOR",
        "sandboxd-pause" => "SANDBOXD_PAUSE",
        _ => "",
    };
    if let Some(p) = std::env::var_os(var).filter(|_| !var.is_empty()) {
        return PathBuf::from(p);
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/shims")
        .join(name);
    assert!(
        p.is_file(),
        "{} missing: run scripts/build-shims (or scripts/test)",
        p.display()
    );
    p
}

/// A lease on one network slot n: bridge `sbt<n>`, subnet 10.(100 + n/250).(n%250).0/24.
struct Lease {
    n: u32,
    file: PathBuf,
}

impl Lease {
    fn take() -> Lease {
        std::fs::create_dir_all(LEASE_DIR).unwrap();
        for n in 0..2000u32 {
            let file = Path::new(LEASE_DIR).join(n.to_string());
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&file)
            {
                Ok(_) => {
                    std::fs::write(&file, std::process::id().to_string()).unwrap();
                    return Lease { n, file };
                }
                Err(_) => {
                    // Reclaim a lease whose process is gone.
                    let holder: i32 = std::fs::read_to_string(&file)
                        .ok()
                        .and_then(|s| s.trim().parse().ok())
                        .unwrap_or(0);
                    if holder > 0 && !Path::new(&format!("/proc/{holder}")).exists() {
                        let _ = std::fs::remove_file(&file);
                    }
                }
            }
        }
        panic!("no free test network slot in {LEASE_DIR}");
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

pub struct Env {
    pub base: PathBuf,
    pub cfg: Config,
    pub bridge: String,
    pub subnet: String,
    /// `10.x.y.` — every pod address of this test starts with it.
    pub subnet_prefix: String,
    pub net_name: String,
    lease: Lease,
}

impl Env {
    pub fn new(test: &str) -> Env {
        let lease = Lease::take();
        let n = lease.n;
        let base = PathBuf::from(format!("/tmp/sandboxd-test-{n}-{test}"));
        if base.exists() {
            cleanup_base(&base);
        }
        std::fs::create_dir_all(&base).unwrap();
        let subnet_prefix = format!("10.{}.{}.", 100 + n / 250, n % 250);
        let subnet = format!("{subnet_prefix}0/24");
        let bridge = format!("sbt{n}");
        let net_name = format!("sbt-net-{n}");
        let mut cfg = Config::rooted_at(&base);
        cfg.default_network.name = net_name.clone();
        cfg.default_network.bridge = bridge.clone();
        cfg.default_network.subnet = subnet.clone();
        cfg.default_network.ip_masq = false;
        cfg.monitor_path = Some(shim("sandboxd-monitor"));
        cfg.pause_path = Some(shim("sandboxd-pause"));
        // Each test's pods under their own top-level parent, so the leak check can see its
        // cgroups and the parent goes with the test (a shared parent would be left behind, or
        // removed under a test that is creating below it).
        // With the systemd driver (the VM lane) the parent is a slice: the pods' own slices
        // are `sandboxd_test_t<n>-pod<id>.slice` below it.
        cfg.cgroup_parent = if sandboxd::cgroups::systemd::booted() {
            format!("sandboxd_test_t{n}.slice")
        } else {
            format!("/sandboxd-test-t{n}")
        };
        cfg.stop_grace = std::time::Duration::from_secs(2);
        cfg.cni_bin_dirs = vec![base.join("bin"), PathBuf::from("/usr/lib/cni")];
        std::fs::create_dir_all(base.join("bin")).unwrap();
        std::fs::create_dir_all(&cfg.cni_conf_dir).unwrap();
        // The network rule: nothing from the pod subnet leaves it.
        sh(&format!(
            "iptables -w -I FORWARD -s {subnet} ! -d {subnet} -j DROP"
        ));
        Env {
            base,
            cfg,
            bridge,
            subnet,
            subnet_prefix,
            net_name,
            lease,
        }
    }

    /// Gives the test's pods a bigger subnet than its /24 (for benchmarks of more than 250
    /// pods), moving the network rule's DROP with it. `second_octet` picks `10.X.0.0/20`
    /// outside the leases' `10.100-1xx` range; the caller keeps it unique.
    #[allow(dead_code)]
    pub fn widen_subnet(&mut self, second_octet: u8) {
        let wide = format!("10.{second_octet}.0.0/20");
        sh(&format!(
            "iptables -w -I FORWARD -s {wide} ! -d {wide} -j DROP && iptables -w -D FORWARD -s {old} ! -d {old} -j DROP",
            old = self.subnet
        ));
        self.cfg.default_network.subnet = wide.clone();
        self.subnet = wide;
        self.subnet_prefix = format!("10.{second_octet}.");
    }

    pub fn runtime(&self) -> Runtime {
        Runtime::new(self.cfg.clone()).expect("runtime opens")
    }

    /// Where host-local keeps this test's reservations (embedded default network).
    pub fn ipam_dir(&self) -> PathBuf {
        self.cfg.root.join("cni/networks").join(&self.net_name)
    }

    /// IP reservation files currently held.
    pub fn ipam_reservations(&self) -> Vec<String> {
        list_names(&self.ipam_dir())
            .into_iter()
            .filter(|n| n.starts_with("10."))
            .collect()
    }

    /// A pod config with a unique uid. `infra` = share the PID namespace (needs the pause process).
    pub fn pod(&self, name: &str, infra: bool) -> PodSandboxConfig {
        PodSandboxConfig::new(name, "test", &format!("uid-{}-{name}", self.lease.n), infra)
    }

    /// Writes an executable script into the test's CNI bin dir (first in the search path).
    pub fn write_plugin(&self, name: &str, script: &str) {
        let p = self.base.join("bin").join(name);
        std::fs::write(&p, script).unwrap();
        sh(&format!("chmod 755 {}", p.display()));
    }

    /// Writes a conflist into the test's conf dir, with host-local data under the base.
    pub fn write_conflist(&self, file: &str, plugins: &str) {
        let doc = format!(
            r#"{{"cniVersion":"1.0.0","name":"{net}","plugins":[{{"type":"bridge","bridge":"{br}","isGateway":true,"ipam":{{"type":"host-local","ranges":[[{{"subnet":"{sub}"}}]],"dataDir":"{dd}"}}}}{plugins}]}}"#,
            net = self.net_name,
            br = self.bridge,
            sub = self.subnet,
            dd = self.cfg.root.join("cni/networks").display(),
        );
        std::fs::write(self.cfg.cni_conf_dir.join(file), doc).unwrap();
    }

    /// The runtime root of a handler.
    pub fn runtime_root(&self, handler: &str) -> PathBuf {
        self.cfg.root.join("runtime").join(handler)
    }

    /// Asserts that nothing of this test is left on the host.
    /// No pod is listed and nothing is left on the host.
    pub fn assert_nothing_created(&self, rt: &sandboxd::Runtime) {
        assert!(rt
            .list_pod_sandboxes(&sandboxd::SandboxFilter::default())
            .is_empty());
        self.assert_no_leaks();
    }

    pub fn assert_no_leaks(&self) {
        let d = &self.cfg.netns_dir;
        assert!(
            list_names(d).is_empty(),
            "namespace files left in {}: {:?}",
            d.display(),
            list_names(d)
        );
        self.assert_no_leaks_except_netns_dir();
    }

    /// The leak check for a test whose netns dir is shared with the host (`/var/run/netns`);
    /// the test checks its own entry there itself.
    pub fn assert_no_leaks_except_netns_dir(&self) {
        // A daemon started moments ago may still be making the start-up probe's trial
        // containers (a second or two); they are gone with their dir.
        let probe = self.cfg.root.join("probe");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while probe.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert!(
            !probe.exists(),
            "the probe's trials never ended: {}",
            sh(&format!("ls -R {}", probe.display()))
        );
        for d in [
            &self.cfg.ipcns_dir,
            &self.cfg.utsns_dir,
            &self.cfg.userns_dir,
        ] {
            assert!(
                list_names(d).is_empty(),
                "namespace files left in {}: {:?}",
                d.display(),
                list_names(d)
            );
        }
        let base = self.base.to_string_lossy().into_owned();
        let mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
            .filter(|m| m.starts_with(&base))
            .filter(|m| {
                ![
                    &self.cfg.netns_dir,
                    &self.cfg.ipcns_dir,
                    &self.cfg.utsns_dir,
                    &self.cfg.userns_dir,
                ]
                .iter()
                .any(|d| Path::new(m) == d.as_path())
            })
            .collect();
        assert!(mounts.is_empty(), "mounts left: {mounts:?}");
        assert!(
            self.ipam_reservations().is_empty(),
            "IPAM reservations left: {:?}",
            self.ipam_reservations()
        );
        // A netns whose last holder just died is torn down asynchronously by the kernel,
        // taking its veth peer with it: allow that a few seconds.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let (_, veths) = sh_ok(&format!("ip -o link show master {}", self.bridge));
            if !veths.contains("veth") {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "veths left on {}: {veths}",
                self.bridge
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        for h in ["runc", "crun", "runsc"] {
            let root = self.runtime_root(h);
            // runc/crun: a dir per container; runsc: `<sandbox>_sandbox:<container>.state`.
            let left: Vec<_> = list_names(&root)
                .into_iter()
                .filter(|n| n.len() == 64 || n.ends_with(".state"))
                .collect();
            assert!(left.is_empty(), "{h} containers left: {left:?}");
        }
        for d in ["attach", "exec"] {
            let left = list_names(&self.cfg.root.join(d));
            assert!(left.is_empty(), "{d} sockets left: {left:?}");
        }
        let userns = list_names(&self.cfg.root.join("userns"));
        assert!(
            userns.is_empty(),
            "user-namespace mount dirs left: {userns:?}"
        );
        let containers = list_names(&self.cfg.root.join("containers"));
        assert!(containers.is_empty(), "container dirs left: {containers:?}");
        let cgroups = cgroups_under(&self.cfg.cgroup_parent);
        assert!(cgroups.is_empty(), "cgroups left: {cgroups:?}");
        let sandboxes = list_names(&self.cfg.root.join("sandboxes"));
        assert!(sandboxes.is_empty(), "sandbox dirs left: {sandboxes:?}");
        let cache = list_names(&self.cfg.root.join("cni/cache"));
        assert!(cache.is_empty(), "CNI cache left: {cache:?}");
    }

    pub fn remove_all(&self, rt: &Runtime) {
        for s in rt.list_pod_sandboxes(&SandboxFilter::default()) {
            rt.remove_pod_sandbox(&s.id).unwrap();
        }
    }
}

pub fn list_names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Is `path` an nsfs mount, according to /proc/self/mountinfo?
pub fn mountinfo_fs(path: &Path) -> Option<String> {
    let p = path.to_string_lossy();
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    table
        .lines()
        .rev()
        .filter(|l| l.split(' ').nth(4) == Some(&*p))
        .find_map(|l| {
            l.split(" - ")
                .nth(1)
                .and_then(|s| s.split(' ').next())
                .map(str::to_string)
        })
}

/// The IPv4 addresses on `ifname` inside the namespace pinned at `ns`.
pub fn addrs_in(ns: &Path, ifname: &str) -> String {
    sh_ok(&format!(
        "nsenter --net={} ip -4 -o addr show {ifname}",
        ns.display()
    ))
    .1
}

fn cleanup_base(base: &Path) {
    // Containers of any runtime under this base (runsc's are gone with their processes:
    // its state files go with the base).
    // (and the start-up probe's trial containers, should a test end while one is made); any
    // other handler a test added is runc-compatible.
    let probes = list_names(&base.join("root/probe"))
        .into_iter()
        .map(|h| (h.clone(), base.join("root/probe").join(h).join("state")));
    let roots: Vec<(String, PathBuf)> = list_names(&base.join("root/runtime"))
        .into_iter()
        .map(|h| (h.clone(), base.join("root/runtime").join(h)))
        .chain(probes)
        .filter(|(h, _)| h != "runsc")
        .map(|(h, r)| (if h == "crun" { h } else { "runc".into() }, r))
        .collect();
    for (h, root) in roots {
        for id in list_names(&root) {
            let _ = Command::new(&h)
                .arg("--root")
                .arg(&root)
                .args(["delete", "--force", &id])
                .output();
        }
    }
    // Every mount under the base, deepest first.
    let b = base.to_string_lossy().into_owned();
    let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|m| m.starts_with(&b))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in mounts {
        let _ = Command::new("umount").args(["-l", &m]).output();
    }
    let _ = std::fs::remove_dir_all(base);
}

impl Drop for Env {
    fn drop(&mut self) {
        // Kill monitors of this base that a failed test may have left (their containers are
        // deleted below); then everything else.
        // (`--` ends pkill's options: the patterns start with dashes.) runsc's sandbox and
        // gofer processes name their root as `--root=<dir>`.
        for pattern in [
            format!("--runtime-root {}", self.base.display()),
            format!("--root={}", self.base.display()),
        ] {
            let _ = Command::new("pkill")
                .args(["-KILL", "-f", "--", &pattern])
                .output();
        }
        cleanup_base(&self.base);
        let mut left = cgroups_under(&self.cfg.cgroup_parent);
        left.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
        for d in left {
            let _ = std::fs::remove_dir(d);
        }
        let _ = sandboxd::cgroups::remove(&self.cfg.cgroup_parent);
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .output();
        let _ = Command::new("iptables")
            .args([
                "-w",
                "-D",
                "FORWARD",
                "-s",
                &self.subnet,
                "!",
                "-d",
                &self.subnet,
                "-j",
                "DROP",
            ])
            .output();
        let _ = &self.lease;
    }
}

/// Every cgroup directory below `parent`, in every hierarchy.
pub fn cgroups_under(parent: &str) -> Vec<PathBuf> {
    fn walk(d: &Path, out: &mut Vec<PathBuf>) {
        if let Ok(rd) = std::fs::read_dir(d) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    out.push(e.path());
                    walk(&e.path(), out);
                }
            }
        }
    }
    let mut out = Vec::new();
    for h in sandboxd::cgroups::hierarchies() {
        walk(
            &h.mount_point
                .join(sandboxd::cgroups::systemd::fs_path(parent).trim_start_matches('/')),
            &mut out,
        );
    }
    out
}

/// Command lines of every process (but this one) whose argv mentions `needle`.
pub fn processes_mentioning(needle: &str) -> Vec<String> {
    let me = std::process::id().to_string();
    list_names(Path::new("/proc"))
        .into_iter()
        .filter(|p| p.bytes().all(|b| b.is_ascii_digit()) && *p != me)
        .filter_map(|p| std::fs::read(format!("/proc/{p}/cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(needle))
        .collect()
}
