//! The CRI contract as kubelet and the CRI validation suite expect it, through the daemon's
//! gRPC socket: ids of any shape, ExecSync timeouts, mount propagation, recursively read-only
//! mounts, the supplemental groups policy, sysctls (images: conformance_images.rs; user
//! namespaces: userns.rs).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::cri::*;
use common::*;
use sandboxd::api::v1 as cri;
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
    let id = sleeper(&rt, &mut c, &sb, &p, "idle");
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
/// A bind mount of `dir` onto itself with the given propagation, in a peer group of its own:
/// where `/` is shared (systemd makes it so) a plain bind would join `/`'s group, and every
/// mount under it would show twice, once on the bind and once on `/` beneath it.
fn own_mount(dir: &Path, propagation: &str) {
    std::fs::create_dir_all(dir).unwrap();
    sh(&format!(
        "mount --bind {d} {d} && mount --make-private {d} && mount --make-{propagation} {d}",
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
    // Bidirectional propagation needs a privileged container, and so a privileged pod.
    let p = pod(
        "prop",
        serde_json::json!({"linux": {"security_context": {"privileged": true}}}),
    );
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
/// requested ones, Strict gives only the requested ones; ContainerStatus reports the user with
/// every group the process has.
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
        // The groups the process has, its primary gid included (what `id -G` prints and the
        // CRI validation suite expects).
        assert_eq!(groups.join(" "), want, "{policy}");
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
    let id = sleeper(&rt, &mut c, &sb, &p, "s");
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
