//! Pods with their own user namespace (CRI `userns_options` in POD mode), through the
//! daemon's gRPC socket.
mod common;

use std::path::Path;

use common::cri::*;
use common::*;
use sandboxd::api::v1 as cri;
use tonic::Code;

/// The inode of a namespace file (a pinned one, or `/proc/PID/ns/<kind>`).
fn ns_inode(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .ino()
}

/// The inode of the user namespace that owns the namespace at `p` (NS_GET_USERNS).
fn owner_userns_inode(p: &Path) -> u64 {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::fs::MetadataExt;
    let f = std::fs::File::open(p).unwrap();
    // SAFETY: NS_GET_USERNS (_IO(0xb7, 0x1)) on a namespace fd returns a new fd or -1.
    let fd = unsafe { libc::ioctl(f.as_raw_fd(), 0xb701) };
    assert!(
        fd >= 0,
        "NS_GET_USERNS {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
    // SAFETY: a fresh fd, owned here.
    let owner = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    owner.metadata().unwrap().ino()
}

/// `namespace_options.userns_options` in POD mode: the pod gets its own user namespace with
/// kubelet's maps, owning its network (and IPC, UTS) namespace; the image's files appear
/// root-owned inside; a plain volume written by the pod's root shows the mapped host uid, an
/// idmapped one (the mount's uid/gid mappings) the in-pod uid; the pod keeps its CNI address;
/// a pod with a shared PID namespace runs its infra process in it too. Bad maps and modes are
/// refused; Status advertises the feature for the default handler.
#[test]
fn user_namespaces_in_pods() {
    use std::os::unix::fs::MetadataExt;
    let env = Env::new("conf-userns");
    let (_d, rt, mut c) = daemon(&env);
    let st = rt
        .block_on(c.status(cri::StatusRequest { verbose: false }))
        .unwrap()
        .into_inner();
    let feature = |name: &str| {
        st.runtime_handlers
            .iter()
            .find(|h| h.name == name)
            .and_then(|h| h.features.as_ref())
            .map(|f| f.user_namespaces)
    };
    assert_eq!(feature(""), Some(true), "{:?}", st.runtime_handlers);
    assert_eq!(feature("runc"), Some(true), "{:?}", st.runtime_handlers);
    if std::path::Path::new("/usr/bin/runsc").exists() {
        assert_eq!(feature("runsc"), Some(false), "{:?}", st.runtime_handlers);
    }

    const HOST: u32 = 65536 * 211;
    let map = serde_json::json!([{"host_id": HOST, "container_id": 0, "length": 65536}]);
    let userns = serde_json::json!({"mode": "POD", "uids": map, "gids": map});
    let p = pod(
        "userns",
        serde_json::json!({"linux": {"security_context": {"namespace_options": {"userns_options": userns}}}}),
    );
    let sb = run_pod(&rt, &mut c, &p);
    let status = rt
        .block_on(c.pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: sb.clone(),
            verbose: false,
        }))
        .unwrap()
        .into_inner()
        .status
        .unwrap();
    let ip = status.network.unwrap().ip;
    assert!(!ip.is_empty(), "no pod IP");
    let reported = status
        .linux
        .and_then(|l| l.namespaces)
        .and_then(|n| n.options)
        .and_then(|o| o.userns_options)
        .unwrap();
    assert_eq!(reported.mode, cri::NamespaceMode::Pod as i32);
    assert_eq!(reported.uids[0].host_id, HOST);

    // The pod's network namespace is owned by its user namespace.
    let pin = |dir: &Path| {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.to_string_lossy().contains(&sb[..16]))
            .unwrap()
    };
    let (userns_pin, netns_pin) = (pin(&env.cfg.userns_dir), pin(&env.cfg.netns_dir));
    assert_eq!(owner_userns_inode(&netns_pin), ns_inode(&userns_pin));
    assert_ne!(
        ns_inode(&userns_pin),
        ns_inode(Path::new("/proc/self/ns/user"))
    );

    let plain = env.base.join("vol-plain");
    let mapped = env.base.join("vol-mapped");
    for d in [&plain, &mapped] {
        std::fs::create_dir_all(d).unwrap();
    }
    // Like kubelet's emptyDir: open to every uid (the pod's root is not the node's).
    sh(&format!("chmod 0777 {}", plain.display()));
    let mounts = serde_json::json!({"mounts": [
        {"container_path": "/plain", "host_path": plain},
        {"container_path": "/mapped", "host_path": mapped, "uid_mappings": map, "gid_mappings": map},
    ], "linux": {"security_context": {"namespace_options": {"userns_options": userns}}}});
    let id = create(&rt, &mut c, &sb, &p, ctr("u", &["sleep", "1000"], mounts)).unwrap();
    start(&rt, &mut c, &id);
    // A volume's id-maps are the pod's own: others, or any in a pod without a user namespace
    // (they would let a container write the volume as another node uid), are refused.
    let other = serde_json::json!([{"host_id": HOST + 65536, "container_id": 0, "length": 65536}]);
    let e = create(
        &rt,
        &mut c,
        &sb,
        &p,
        ctr(
            "other-maps",
            &["true"],
            serde_json::json!({"mounts": [{"container_path": "/m", "host_path": mapped,
                "uid_mappings": other, "gid_mappings": other}],
                "linux": {"security_context": {"namespace_options": {"userns_options": userns}}}}),
        ),
    )
    .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("pod's user namespace maps"), "{e:?}");
    let plain_pod = pod("no-userns", serde_json::json!({}));
    let psb = run_pod(&rt, &mut c, &plain_pod);
    let e = create(
        &rt,
        &mut c,
        &psb,
        &plain_pod,
        ctr(
            "mapped-no-userns",
            &["true"],
            serde_json::json!({"mounts": [{"container_path": "/m", "host_path": mapped,
                "uid_mappings": map, "gid_mappings": map}]}),
        ),
    )
    .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("has none"), "{e:?}");
    remove_pod(&rt, &mut c, &psb);
    let out = exec(
        &rt,
        &mut c,
        &id,
        "cat /proc/self/uid_map /proc/self/gid_map",
    );
    let fields: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(
        fields,
        [
            "0",
            &HOST.to_string(),
            "65536",
            "0",
            &HOST.to_string(),
            "65536"
        ],
        "{out}"
    );
    let out = exec(
        &rt,
        &mut c,
        &id,
        "id -u; stat -c '%u %g' /bin/busybox /etc/passwd",
    );
    assert_eq!(
        out, "0\n0 0\n0 0\n",
        "the image's files must appear root-owned"
    );
    let out = exec(
        &rt,
        &mut c,
        &id,
        "echo x > /plain/f; echo x > /mapped/f; echo x > /tmp/f",
    );
    assert_eq!(out, "", "writes failed");
    let owner = |p: &Path| {
        let m = std::fs::metadata(p).unwrap();
        (m.uid(), m.gid())
    };
    assert_eq!(owner(&plain.join("f")), (HOST, HOST), "plain volume");
    assert_eq!(owner(&mapped.join("f")), (0, 0), "idmapped volume");
    // The writable layer keeps in-pod ids, like the image's layers.
    let ctr_dir = env.cfg.root.join("containers").join(&id);
    assert_eq!(owner(&ctr_dir.join("ovl/upper/tmp/f")), (0, 0));
    // On the node the pod's root is an unprivileged uid.
    let pid: u32 = sh(&format!(
        "cat {}/runc/{id}/state.json",
        env.cfg.root.join("runtime").display()
    ))
    .split("\"init_process_pid\":")
    .nth(1)
    .and_then(|s| s.split(',').next())
    .and_then(|s| s.trim().parse().ok())
    .expect("runc state pid");
    let uid_line = sh(&format!("grep '^Uid:' /proc/{pid}/status"));
    assert!(uid_line.contains(&HOST.to_string()), "{uid_line}");
    assert_eq!(
        ns_inode(Path::new(&format!("/proc/{pid}/ns/user"))),
        ns_inode(&userns_pin)
    );
    // The pod still has its CNI address.
    let addrs = exec(&rt, &mut c, &id, "ip -o -4 addr show eth0");
    assert!(addrs.contains(&ip), "{addrs}");
    // Another user cannot reach the state root's contents; the pod's mount dir is its own.
    let (ok, _) = sh_ok(&format!(
        "setpriv --reuid=65534 --regid=65534 --clear-groups ls {}",
        env.cfg.root.join("containers").display()
    ));
    assert!(!ok, "uid 65534 listed the containers dir");
    let mdir = env.cfg.root.join("userns").join(&id);
    assert_eq!(owner(&mdir), (HOST, HOST));
    assert_eq!(std::fs::metadata(&mdir).unwrap().mode() & 0o777, 0o700);
    remove_pod(&rt, &mut c, &sb);

    // A shared PID namespace: the infra process runs in the pod's user namespace too.
    let p = pod(
        "userns-pid",
        serde_json::json!({"linux": {"security_context": {"namespace_options": {"pid": "POD", "userns_options": userns}}}}),
    );
    let sb = run_pod(&rt, &mut c, &p);
    let id = sleeper(&rt, &mut c, &sb, &p, "u");
    let out = exec(&rt, &mut c, &id, "cat /proc/1/uid_map; cat /proc/1/cmdline");
    assert!(
        out.contains(&HOST.to_string()) && out.contains("/pause"),
        "{out}"
    );
    // The state root is traversable (not listable) while a pod in a user namespace has its
    // dirs under it, and root's alone again once the last one is gone — not at a restart.
    let root_mode = || std::fs::metadata(&env.cfg.root).unwrap().mode() & 0o777;
    assert_eq!(root_mode(), 0o711);
    remove_pod(&rt, &mut c, &sb);
    assert_eq!(root_mode(), 0o700);

    // Refused: modes a user namespace cannot have, several ranges, container id 0 unmapped,
    // the host's root mapped in, host namespaces.
    let two = serde_json::json!([
        {"host_id": HOST, "container_id": 0, "length": 1000},
        {"host_id": HOST + 1000, "container_id": 1000, "length": 1000}
    ]);
    let no_root = serde_json::json!([{"host_id": HOST, "container_id": 1, "length": 65536}]);
    let host_root = serde_json::json!([{"host_id": 0, "container_id": 0, "length": 65536}]);
    for (name, ns) in [
        (
            "mode-container",
            serde_json::json!({"userns_options": {"mode": "CONTAINER", "uids": map, "gids": map}}),
        ),
        (
            "two",
            serde_json::json!({"userns_options": {"mode": "POD", "uids": two, "gids": map}}),
        ),
        (
            "noroot",
            serde_json::json!({"userns_options": {"mode": "POD", "uids": no_root, "gids": map}}),
        ),
        (
            "hostroot",
            serde_json::json!({"userns_options": {"mode": "POD", "uids": host_root, "gids": host_root}}),
        ),
        // The node's network is allowed (tests/cri_v136.rs); its IPC and PID are not.
        (
            "hostipc",
            serde_json::json!({"ipc": "NODE", "userns_options": userns}),
        ),
        (
            "hostpid",
            serde_json::json!({"pid": "NODE", "userns_options": userns}),
        ),
    ] {
        let bad = pod(
            name,
            serde_json::json!({"linux": {"security_context": {"namespace_options": ns}}}),
        );
        let e = rt
            .block_on(c.run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(bad),
                runtime_handler: String::new(),
            }))
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{name}: {e:?}");
    }
    env.assert_no_leaks();
}
