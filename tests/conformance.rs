//! The CRI contract as kubelet and the CRI validation suite expect it, through the daemon's
//! gRPC socket: ids of any shape, ExecSync timeouts, mount propagation, recursively read-only
//! mounts, the supplemental groups policy, pulls with deadlines and shared layers, sysctls.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::cri::*;
use common::*;
use k8s_cri::v1 as cri;
use tonic::Code;

/// Stop/Remove of an id that matches nothing succeed whatever its shape (kubelet's garbage
/// collector retries them forever otherwise); Status of one is NotFound; only ids that could
/// name a path (or are empty) are refused; an ambiguous prefix stays an error.
#[test]
fn unknown_ids_of_any_shape() {
    let env = Env::new("conf-ids");
    let (_d, rt, mut c) = daemon(&env);
    for id in [
        "5c3c1a38-7a5f-4d4b-9e3e-2b7a3c0e0f11",
        "not-an-id",
        "ABCDEF12",
        "x".repeat(300).as_str(),
    ] {
        let id = id.to_string();
        rt.block_on(c.stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: id.clone(),
        }))
        .unwrap();
        rt.block_on(c.remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.clone(),
        }))
        .unwrap();
        rt.block_on(c.stop_container(cri::StopContainerRequest {
            container_id: id.clone(),
            timeout: 0,
        }))
        .unwrap();
        rt.block_on(c.remove_container(cri::RemoveContainerRequest {
            container_id: id.clone(),
        }))
        .unwrap();
        let e = rt
            .block_on(c.pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: id.clone(),
                verbose: false,
            }))
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{id}: {e:?}");
        let e = rt
            .block_on(c.container_status(cri::ContainerStatusRequest {
                container_id: id.clone(),
                verbose: false,
            }))
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{id}: {e:?}");
    }
    for bad in ["../x", "a/b", ""] {
        let e = rt
            .block_on(c.remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: bad.into(),
            }))
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{bad:?}: {e:?}");
    }
    // 17 pods: two share a first hex digit, so that one-character prefix is ambiguous.
    let ids: Vec<String> = (0..17)
        .map(|i| run_pod(&rt, &mut c, &pod(&format!("ids{i}"), serde_json::json!({}))))
        .collect();
    let first = |id: &String| id[..1].to_string();
    let dup = ids
        .iter()
        .find(|a| ids.iter().filter(|b| first(b) == first(a)).count() > 1)
        .map(first)
        .unwrap();
    let e = rt
        .block_on(c.stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: dup,
        }))
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    for id in ids {
        remove_pod(&rt, &mut c, &id);
    }
    env.assert_no_leaks();
}

/// ExecSync past its timeout: DeadlineExceeded, and the command with everything it started is
/// killed and reaped before the answer (ps right after shows none of them).
#[test]
fn exec_sync_timeout_kills_and_reaps() {
    let env = Env::new("conf-exectimeout");
    let (_d, rt, mut c) = daemon(&env);
    let p = pod(
        "exectimeout",
        serde_json::json!({"linux": {"security_context": {"namespace_options": {"pid": "POD"}}}}),
    );
    let sb = run_pod(&rt, &mut c, &p);
    let id = create(
        &rt,
        &mut c,
        &sb,
        &p,
        ctr("idle", &["sleep", "1000"], serde_json::json!({})),
    )
    .unwrap();
    start(&rt, &mut c, &id);
    let t = Instant::now();
    let e = rt
        .block_on(c.exec_sync(cri::ExecSyncRequest {
            container_id: id.clone(),
            cmd: vec![
                "sh".into(),
                "-c".into(),
                "sleep 71 & (sleep 72 &); sleep 73".into(),
            ],
            timeout: 1,
        }))
        .unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e:?}");
    assert!(t.elapsed() < Duration::from_secs(10));
    let ps = exec(&rt, &mut c, &id, "ps -o stat,args");
    for s in ["sleep 71", "sleep 72", "sleep 73"] {
        assert!(!ps.contains(s), "{s} left:\n{ps}");
    }
    assert!(
        !ps.lines().any(|l| l.trim_start().starts_with('Z')),
        "zombies:\n{ps}"
    );
    remove_pod(&rt, &mut c, &sb);
    env.assert_no_leaks();
}

/// Makes `dir` a mount point of its own with the given propagation (`shared`, `private`).
fn own_mount(dir: &Path, propagation: &str) {
    std::fs::create_dir_all(dir).unwrap();
    sh(&format!(
        "mount --bind {d} {d} && mount --make-{propagation} {d}",
        d = dir.display()
    ));
}

fn host_mounts_under(dir: &Path) -> Vec<String> {
    let d = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|m| m.starts_with(&d) && m.len() > d.len())
        .collect()
}

/// Bidirectional propagation both ways, host-to-container one way, private none; a source
/// that is not on a shared mount is refused naming it.
#[test]
fn mount_propagation_both_ways_one_way_none() {
    let env = Env::new("conf-prop");
    let (_d, rt, mut c) = daemon(&env);
    let (bi, slave, private, plain) = (
        env.base.join("prop-bi"),
        env.base.join("prop-slave"),
        env.base.join("prop-private"),
        env.base.join("prop-plain"),
    );
    own_mount(&bi, "shared");
    own_mount(&slave, "shared");
    own_mount(&private, "private");
    own_mount(&plain, "private");
    let p = pod("prop", serde_json::json!({}));
    let sb = run_pod(&rt, &mut c, &p);
    let mounts = serde_json::json!({
        "mounts": [
            {"container_path": "/bi", "host_path": bi, "propagation": "PROPAGATION_BIDIRECTIONAL"},
            {"container_path": "/slave", "host_path": slave, "propagation": "PROPAGATION_HOST_TO_CONTAINER"},
            {"container_path": "/private", "host_path": private, "propagation": "PROPAGATION_PRIVATE"},
        ],
        "linux": {"security_context": {"privileged": true}},
    });
    let id = create(
        &rt,
        &mut c,
        &sb,
        &p,
        ctr("prop", &["sleep", "1000"], mounts),
    )
    .unwrap();
    start(&rt, &mut c, &id);
    // Container → host: only through the bidirectional mount.
    for d in ["bi", "slave", "private"] {
        let out = exec(
            &rt,
            &mut c,
            &id,
            &format!("mkdir -p /{d}/in && mount -t tmpfs none /{d}/in && echo ok"),
        );
        assert!(out.contains("ok"), "{d}: {out}");
    }
    assert_eq!(
        host_mounts_under(&bi).len(),
        1,
        "{:?}",
        host_mounts_under(&bi)
    );
    assert!(
        host_mounts_under(&slave).is_empty(),
        "rslave propagated out"
    );
    assert!(
        host_mounts_under(&private).is_empty(),
        "private propagated out"
    );
    // Host → container: through bidirectional and host-to-container, not private.
    for d in [&bi, &slave, &private] {
        std::fs::create_dir_all(d.join("fromhost")).unwrap();
        sh(&format!(
            "mount -t tmpfs none {}",
            d.join("fromhost").display()
        ));
    }
    let inside = exec(&rt, &mut c, &id, "cut -d' ' -f5 /proc/self/mountinfo");
    assert!(inside.contains("/bi/fromhost"), "{inside}");
    assert!(inside.contains("/slave/fromhost"), "{inside}");
    assert!(!inside.contains("/private/fromhost"), "{inside}");
    // A source on a private mount cannot propagate: refused, naming it.
    let bad = serde_json::json!({"mounts": [{"container_path": "/x", "host_path": plain, "propagation": "PROPAGATION_BIDIRECTIONAL"}]});
    let e = create(&rt, &mut c, &sb, &p, ctr("bad", &["true"], bad)).unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains(&plain.display().to_string()), "{e:?}");
    remove_pod(&rt, &mut c, &sb);
    for m in host_mounts_under(&env.base.join(""))
        .iter()
        .filter(|m| m.contains("/prop-"))
        .rev()
    {
        let _ = sh_ok(&format!("umount -l {m}"));
    }
    env.assert_no_leaks();
}

/// recursive_read_only makes every submount read-only (a plain read-only bind leaves them
/// writable); it needs readonly and private propagation; Status advertises it.
#[test]
fn recursively_read_only_mounts() {
    let env = Env::new("conf-rro");
    let (_d, rt, mut c) = daemon(&env);
    let st = rt
        .block_on(c.status(cri::StatusRequest { verbose: false }))
        .unwrap()
        .into_inner();
    let rro = st.runtime_handlers.iter().all(|h| {
        h.features
            .as_ref()
            .is_some_and(|f| f.recursive_read_only_mounts)
    });
    assert!(rro, "{:?}", st.runtime_handlers);
    assert!(st.features.is_some_and(|f| f.supplemental_groups_policy));
    let src = env.base.join("rro-src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    sh(&format!(
        "mount -t tmpfs none {}",
        src.join("sub").display()
    ));
    let p = pod("rro", serde_json::json!({}));
    let sb = run_pod(&rt, &mut c, &p);
    let mounts = serde_json::json!({"mounts": [
        {"container_path": "/rro", "host_path": src, "readonly": true, "recursive_read_only": true},
        {"container_path": "/ro", "host_path": src, "readonly": true},
    ]});
    let id = create(&rt, &mut c, &sb, &p, ctr("rro", &["sleep", "1000"], mounts)).unwrap();
    start(&rt, &mut c, &id);
    let out = exec(
        &rt,
        &mut c,
        &id,
        "touch /rro/sub/x 2>&1; touch /ro/sub/y && echo plain-ro-sub-writable",
    );
    assert!(out.contains("Read-only"), "{out}");
    assert!(out.contains("plain-ro-sub-writable"), "{out}");
    let bad = serde_json::json!({"mounts": [{"container_path": "/x", "host_path": src, "readonly": false, "recursive_read_only": true}]});
    let e = create(&rt, &mut c, &sb, &p, ctr("bad", &["true"], bad)).unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    remove_pod(&rt, &mut c, &sb);
    sh(&format!("umount {}", src.join("sub").display()));
    env.assert_no_leaks();
}

/// SupplementalGroupsPolicy: Merge adds the user's groups from the image's /etc/group to the
/// requested ones, Strict gives only the requested ones; ContainerStatus reports the user.
#[test]
fn supplemental_groups_policy() {
    let env = Env::new("conf-groups");
    let (_d, rt, mut c) = daemon(&env);
    let p = pod("groups", serde_json::json!({}));
    let sb = run_pod(&rt, &mut c, &p);
    for (policy, want) in [("Merge", "1234 4321 5555"), ("Strict", "1234 5555")] {
        let sec = serde_json::json!({"linux": {"security_context": {
            "run_as_user": {"value": 1234}, "supplemental_groups": [5555],
            "supplemental_groups_policy": policy}}});
        let id = create(
            &rt,
            &mut c,
            &sb,
            &p,
            ctr(&format!("g{policy}"), &["sleep", "1000"], sec),
        )
        .unwrap();
        start(&rt, &mut c, &id);
        assert_eq!(exec(&rt, &mut c, &id, "id -G").trim(), want, "{policy}");
        let st = rt
            .block_on(c.container_status(cri::ContainerStatusRequest {
                container_id: id.clone(),
                verbose: false,
            }))
            .unwrap()
            .into_inner()
            .status
            .unwrap();
        let u = st.user.and_then(|u| u.linux).expect("ContainerStatus.user");
        let groups: Vec<String> = u
            .supplemental_groups
            .iter()
            .map(|g| g.to_string())
            .collect();
        assert_eq!(u.uid, 1234);
        assert_eq!(format!("{} {}", u.gid, groups.join(" ")), want, "{policy}");
    }
    remove_pod(&rt, &mut c, &sb);
    env.assert_no_leaks();
}

/// Pod sysctls through the CRI take effect in the pod's containers.
#[test]
fn sysctls_through_the_cri() {
    let env = Env::new("conf-sysctl");
    let (_d, rt, mut c) = daemon(&env);
    let p = pod(
        "sysctl",
        serde_json::json!({"linux": {"sysctls": {"net.ipv4.ip_unprivileged_port_start": "0", "kernel.shm_rmid_forced": "1"}}}),
    );
    let sb = run_pod(&rt, &mut c, &p);
    let id = create(
        &rt,
        &mut c,
        &sb,
        &p,
        ctr("s", &["sleep", "1000"], serde_json::json!({})),
    )
    .unwrap();
    start(&rt, &mut c, &id);
    let out = exec(
        &rt,
        &mut c,
        &id,
        "cat /proc/sys/net/ipv4/ip_unprivileged_port_start /proc/sys/kernel/shm_rmid_forced",
    );
    assert_eq!(out, "0\n1\n");
    remove_pod(&rt, &mut c, &sb);
    let bad = pod(
        "sysctl-bad",
        serde_json::json!({"linux": {"sysctls": {"kernel.panic": "1"}}}),
    );
    let e = rt
        .block_on(c.run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(bad),
            runtime_handler: String::new(),
        }))
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    env.assert_no_leaks();
}

/// Pulls: a client deadline answers DeadlineExceeded; an image whose layers are unpacked
/// already (another tag, an earlier pull of a removed image, concurrent pulls) reuses them;
/// RemoveImage of one tag removes the image with all its tags.
#[test]
fn pulls_deadlines_and_shared_layers() {
    use common::fake_registry::{Answer, FakeRegistry};
    use k8s_cri::v1::image_service_client::ImageServiceClient;
    let env = Env::new("conf-pull");
    let reg = common::registry::Registry::start(&env.base.join("registry"), None);
    reg.push_busybox("a/busybox", "1", None);
    reg.push_busybox("a/busybox", "2", None);
    reg.push_busybox("b/other", "1", None);
    let (d, rt, _c) = daemon(&env);
    let mut images = rt.block_on(async {
        ImageServiceClient::new(
            common::daemon::connect(&d.socket.to_string_lossy(), Duration::from_secs(30))
                .await
                .unwrap(),
        )
    });
    let pull = |images: &mut ImageServiceClient<tonic::transport::Channel>, name: &str| {
        rt.block_on(images.pull_image(cri::PullImageRequest {
            image: Some(cri::ImageSpec {
                image: name.into(),
                ..Default::default()
            }),
            auth: None,
            sandbox_config: None,
        }))
        .map(|r| r.into_inner().image_ref)
    };
    let t1 = format!("{}/a/busybox:1", reg.addr);
    let t2 = format!("{}/a/busybox:2", reg.addr);
    let other = format!("{}/b/other:1", reg.addr);
    let id = pull(&mut images, &t1).unwrap();
    assert_eq!(pull(&mut images, &t2).unwrap(), id);
    // Removing one tag removes the image (both tags).
    rt.block_on(images.remove_image(cri::RemoveImageRequest {
        image: Some(cri::ImageSpec {
            image: t1.clone(),
            ..Default::default()
        }),
    }))
    .unwrap();
    let listed = rt
        .block_on(images.list_images(cri::ListImagesRequest { filter: None }))
        .unwrap()
        .into_inner()
        .images;
    assert!(listed.iter().all(|i| i.id != id), "{listed:?}");
    // Pulled again, and concurrently under two names: the layers are reused.
    let (mut a, mut b) = (images.clone(), images.clone());
    let (ta, tb) = (t1.clone(), other.clone());
    let (ra, rb) = rt.block_on(async move {
        let fa = a.pull_image(cri::PullImageRequest {
            image: Some(cri::ImageSpec {
                image: ta,
                ..Default::default()
            }),
            auth: None,
            sandbox_config: None,
        });
        let fb = b.pull_image(cri::PullImageRequest {
            image: Some(cri::ImageSpec {
                image: tb,
                ..Default::default()
            }),
            auth: None,
            sandbox_config: None,
        });
        tokio::join!(fa, fb)
    });
    assert_eq!(ra.unwrap().into_inner().image_ref, id);
    assert_eq!(rb.unwrap().into_inner().image_ref, id);
    // A registry that never answers in time: the client's deadline is DeadlineExceeded.
    let slow = FakeRegistry::start(|_| {
        std::thread::sleep(Duration::from_secs(5));
        None::<Answer>
    });
    let mut req = tonic::Request::new(cri::PullImageRequest {
        image: Some(cri::ImageSpec {
            image: format!("{}/x/slow:1", slow.addr),
            ..Default::default()
        }),
        auth: None,
        sandbox_config: None,
    });
    req.set_timeout(Duration::from_millis(800));
    let e = rt.block_on(images.pull_image(req)).unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e:?}");
    drop(d);
    env.assert_no_leaks();
}

/// CheckpointContainer: where `criu check` fails on this host, `Unimplemented` with CRIU's
/// own reason and no archive; where it works, an archive laid out as CRI-O's (CRIU images,
/// config.dump, spec.dump, rootfs-diff.tar) while the container keeps running.
#[test]
fn checkpoint_with_criu_or_its_reason() {
    let env = Env::new("conf-ckpt");
    let (_d, rt, mut c) = daemon(&env);
    let p = pod("ckpt", serde_json::json!({}));
    let sb = run_pod(&rt, &mut c, &p);
    let id = create(
        &rt,
        &mut c,
        &sb,
        &p,
        ctr("c", &["sleep", "1000"], serde_json::json!({})),
    )
    .unwrap();
    start(&rt, &mut c, &id);
    exec(&rt, &mut c, &id, "echo kept > /written");
    let location = env.base.join("ckpt.tar");
    let r = rt.block_on(c.checkpoint_container(cri::CheckpointContainerRequest {
        container_id: id.clone(),
        location: location.to_string_lossy().into_owned(),
        timeout: 60,
    }));
    let installed = sh_ok("command -v criu").0;
    let (works, said) = sh_ok("criu check 2>&1");
    if installed && works {
        r.unwrap();
        let listing = sh(&format!("tar -tf {}", location.display()));
        for want in [
            "./checkpoint/",
            "./config.dump",
            "./spec.dump",
            "./rootfs-diff.tar",
        ] {
            assert!(
                listing.lines().any(|l| l == want),
                "{want} not in\n{listing}"
            );
        }
        let s = rt
            .block_on(c.container_status(cri::ContainerStatusRequest {
                container_id: id.clone(),
                verbose: false,
            }))
            .unwrap()
            .into_inner()
            .status
            .unwrap();
        assert_eq!(s.state, cri::ContainerState::ContainerRunning as i32);
    } else {
        let e = r.unwrap_err();
        assert_eq!(e.code(), Code::Unimplemented, "{e:?}");
        let reason = if installed {
            said.lines()
                .find(|l| l.starts_with("Error"))
                .unwrap_or_else(|| said.lines().next().unwrap())
                .trim()
                .to_string()
        } else {
            "criu is not installed".to_string()
        };
        assert!(
            e.message().contains(&reason),
            "{:?} lacks {reason:?}",
            e.message()
        );
        assert!(!location.exists());
    }
    remove_pod(&rt, &mut c, &sb);
}

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
    let id = create(
        &rt,
        &mut c,
        &sb,
        &p,
        ctr("u", &["sleep", "1000"], serde_json::json!({})),
    )
    .unwrap();
    start(&rt, &mut c, &id);
    let out = exec(&rt, &mut c, &id, "cat /proc/1/uid_map; cat /proc/1/cmdline");
    assert!(
        out.contains(&HOST.to_string()) && out.contains("/pause"),
        "{out}"
    );
    remove_pod(&rt, &mut c, &sb);

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
        (
            "hostnet",
            serde_json::json!({"network": "NODE", "userns_options": userns}),
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
