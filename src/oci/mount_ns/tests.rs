use super::*;
use std::process::Command;

/// A scratch dir with mounts of its own, all lazily unmounted and removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let d = std::env::temp_dir().join(format!("sandboxd-mntns-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Scratch(std::fs::canonicalize(&d).unwrap())
    }

    /// A tmpfs at `rel` holding `file` with `text`.
    fn tmpfs(&self, rel: &str, file: &str, text: &str) -> PathBuf {
        let p = self.0.join(rel);
        std::fs::create_dir_all(&p).unwrap();
        mount(
            Some("tmpfs"),
            &p,
            Some("tmpfs"),
            MsFlags::empty(),
            Some("size=64k"),
        )
        .unwrap();
        std::fs::write(p.join(file), text).unwrap();
        p
    }

    /// The lines of `mounts` that name a path in the scratch dir.
    fn ours(&self, mountinfo: &str) -> Vec<PathBuf> {
        crate::mounts::parse_mountinfo(mountinfo)
            .into_iter()
            .map(|m| m.mount_point)
            .filter(|p| p.starts_with(&self.0))
            .collect()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = crate::mounts::remove_tree(&self.0);
    }
}

fn host_mountinfo() -> String {
    std::fs::read_to_string("/proc/self/mountinfo").unwrap()
}

fn in_ns(ns: Arc<OwnedFd>) -> crate::process::Within {
    crate::process::Within {
        umask: None,
        mount_ns: Some(ns),
    }
}

/// `script`'s output, spawned as the runtime's calls are (by the daemon's spawner thread).
fn sh_within(script: &str, within: &crate::process::Within) -> String {
    let mut c = Command::new("/bin/sh");
    c.arg("-c")
        .arg(script)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = crate::process::spawn(c, within)
        .unwrap()
        .wait_with_output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_runtime_sees_no_other_pods_mounts_and_create_gets_its_bundles_paths() {
    let s = Scratch::new("carry");
    let root = s.0.join("root");
    let pins = s.0.join("pins");
    crate::mounts::make_shared_dir(&pins).unwrap();
    for i in 0..20 {
        s.tmpfs(
            &format!("root/containers/c{i}/rootfs"),
            "marker",
            &format!("rootfs {i}"),
        );
    }
    let pin = pins.join("net-a");
    crate::netns::create_empty_file(&pin).unwrap();
    mount(
        Some("/proc/self/ns/net"),
        &pin,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .unwrap();
    let before = s.ours(&host_mountinfo()).len();
    let ns = RuntimeMountNs::new(&root, &[&pins]).unwrap();
    assert!(ns.wait_ready(Duration::from_secs(10)));

    // Calls on existing containers: none of the state root's or pin dir's mounts.
    let within = crate::process::Within {
        umask: None,
        mount_ns: ns.current(),
    };
    assert!(within.mount_ns.is_some());
    let seen = s.ours(&sh_within("cat /proc/self/mountinfo", &within));
    assert_eq!(seen, Vec::<PathBuf>::new());
    // Nothing done there reached the host.
    assert_eq!(s.ours(&host_mountinfo()).len(), before);

    // A volume the host mounts after the template was made, and a plain file.
    let vol = s.tmpfs("vol", "v", "volume data");
    std::fs::create_dir_all(root.join("sandboxes/p")).unwrap();
    std::fs::write(root.join("sandboxes/p/hosts"), "hosts file").unwrap();
    let bundle = root.join("containers/c3");
    let spec = serde_json::json!({
        "root": {"path": "rootfs"},
        "linux": {"namespaces": [{"type": "network", "path": pin}, {"type": "pid"}]},
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/v", "type": "bind", "source": vol, "options": ["rbind"]},
            {"destination": "/etc/hosts", "type": "bind",
             "source": root.join("sandboxes/p/hosts"), "options": ["rbind", "ro"]},
        ],
    });
    std::fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
    let fd = ns
        .for_create("c3", &bundle)
        .expect("a namespace for create");
    let script = format!(
        "cat /proc/self/mountinfo; cat {0}/rootfs/marker {1}/v {2}; echo; \
         stat -f -c %T {3}",
        bundle.display(),
        vol.display(),
        root.join("sandboxes/p/hosts").display(),
        pin.display()
    );
    let out = sh_within(&script, &in_ns(Arc::new(fd)));
    let mut seen = s.ours(&out);
    seen.sort();
    let mut want = vec![
        bundle.join("rootfs"),
        pin.clone(),
        vol.clone(),
        root.join("sandboxes/p/hosts"),
    ];
    want.sort();
    assert_eq!(seen, want, "{out}");
    assert!(out.contains("rootfs 3volume datahosts file"), "{out}");
    assert!(
        out.trim_end().ends_with("nsfs"),
        "the pin is the namespace file: {out}"
    );
    assert_eq!(s.ours(&host_mountinfo()).len(), before + 1); // + the volume, nothing else
}

#[test]
fn a_path_the_runtime_could_not_see_keeps_create_in_the_hosts_namespace() {
    let s = Scratch::new("fallback");
    let root = s.0.join("root");
    // Inside a pod's mount, which the template leaves out (whatever the host's
    // propagation), and not itself a mount: nowhere to carry it to.
    let vol = s.tmpfs("root/containers/c/vol", "f", "x");
    std::fs::create_dir_all(vol.join("sub")).unwrap();
    let ns = RuntimeMountNs::new(&root, &[]).unwrap();
    assert!(ns.wait_ready(Duration::from_secs(10)));
    let spec = serde_json::json!({
        "mounts": [{"destination": "/v", "type": "bind", "source": vol.join("sub")}],
    });
    std::fs::write(root.join("containers/c/config.json"), spec.to_string()).unwrap();
    assert!(ns.for_create("c", &root.join("containers/c")).is_none());
    // The whole root cannot be carried either.
    let spec = serde_json::json!({"root": {"path": "/"}});
    std::fs::write(root.join("containers/c/config.json"), spec.to_string()).unwrap();
    assert!(ns.for_create("c", &root.join("containers/c")).is_none());
    // An infra process's namespaces (/proc paths) need no carrying.
    let spec = serde_json::json!({
        "linux": {"namespaces": [{"type": "ipc", "path": "/proc/1/ns/ipc"}]},
    });
    std::fs::write(root.join("containers/c/config.json"), spec.to_string()).unwrap();
    assert!(ns.for_create("c", &root.join("containers/c")).is_some());
}

#[test]
fn an_old_template_is_renewed_so_it_holds_no_host_mount_for_long() {
    let s = Scratch::new("renew");
    let root = s.0.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let gone = s.tmpfs("gone", "f", "x");
    // Private: no unmount reaches a copy, whatever the host's propagation.
    mount(
        None::<&str>,
        &gone,
        None::<&str>,
        MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .unwrap();
    let ns = RuntimeMountNs::with_max_age(&root, &[], Duration::ZERO).unwrap();
    assert!(ns.wait_ready(Duration::from_secs(10)));
    let first = ns.template().unwrap();
    assert!(!s
        .ours(&sh_within(
            "cat /proc/self/mountinfo",
            &in_ns(first.ns.clone())
        ))
        .is_empty());
    umount2(&gone, MntFlags::MNT_DETACH).unwrap();
    let unmounted = Instant::now();
    // The first template copied it; one made later, once the first is too old, does not.
    let deadline = Instant::now() + Duration::from_secs(10);
    let renewed = loop {
        match ns.template() {
            Some(t) if t.made > unmounted => break t,
            _ => assert!(Instant::now() < deadline, "never renewed"),
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let seen = s.ours(&sh_within(
        "cat /proc/self/mountinfo",
        &in_ns(renewed.ns.clone()),
    ));
    assert_eq!(seen, Vec::<PathBuf>::new());
    drop(first);
}

#[test]
fn an_idle_template_is_dropped_and_made_anew_at_the_next_call() {
    let s = Scratch::new("idle");
    let root = s.0.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let ns = RuntimeMountNs::with_max_age(&root, &[], Duration::ZERO).unwrap();
    assert!(ns.wait_ready(Duration::from_secs(10)));
    let deadline = Instant::now() + Duration::from_secs(10);
    while ns.lock().current.is_some() {
        assert!(
            Instant::now() < deadline,
            "an idle template was never dropped"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The next call goes on in the host's namespace and starts a new one.
    assert!(ns.template().is_none());
    assert!(ns.wait_ready(Duration::from_secs(10)));
}
