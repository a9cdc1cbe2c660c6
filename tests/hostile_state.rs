//! Hostile input against the state root: another local user can reach nothing under it,
//! and a record that cannot be read is quarantined, not collected. (The suite: hostile*.rs.)

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::hostile::{ctr, setup};
use common::*;

/// Every path below `dir` (not following symlinks, not descending into `skip`).
fn walk(dir: &Path, skip: &dyn Fn(&Path) -> bool, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        out.push(p.clone());
        if skip(&p) {
            continue;
        }
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(&p, skip, out);
        }
    }
}

/// The paths of `paths` that uid/gid 65534 can `stat` (reach) at all.
fn reachable_by_nobody(paths: &[PathBuf]) -> Vec<String> {
    let list: String = paths
        .iter()
        .map(|p| format!("'{}' ", p.display()))
        .collect();
    let (_, out) = sh_ok(&format!(
        "setpriv --reuid=65534 --regid=65534 --clear-groups -- sh -c \
         'for p in \"$@\"; do if stat \"$p\" >/dev/null 2>&1; then echo \"$p\"; fi; done' sh {list}"
    ));
    out.lines().map(str::to_string).collect()
}

/// Nothing under the state root is reachable by another user, and everything sandboxd makes
/// there is root's alone from the start: records, bundles (with Secret-sourced env vars),
/// sockets, the CNI cache, image layers (with setuid binaries), upper dirs, rootfs. (Issue
/// item: the state tree.)
#[test]
fn the_state_tree_is_root_only() {
    let env = Env::new("hostile-perms");
    let rt = setup(&env);
    let mut pod = env.pod("perms", true);
    pod.log_directory = env.base.join("logs").to_string_lossy().into();
    let sb = rt.run_pod_sandbox(&pod).unwrap();
    let mut c = ctr("perms", "exec sleep 1000");
    c.envs = vec![("SECRET".into(), "hunter2".into())];
    c.log_path = "perms/0.log".into();
    c.security.run_as_user = Some(1234);
    let id = rt.create_container(&sb, &c).unwrap();
    rt.start_container(&id).unwrap();
    let root = &env.cfg.root;

    // Every kind of path a local user went after.
    let layer = sandboxd_layer(root);
    let kinds: Vec<PathBuf> = vec![
        root.join("containers"),
        root.join(format!("containers/{id}/config.json")),
        root.join(format!("containers/{id}/state.json")),
        root.join(format!("containers/{id}/rootfs/bin/busybox")),
        root.join(format!("containers/{id}/upper")),
        root.join(format!("sandboxes/{sb}/state.json")),
        root.join(format!("sandboxes/{sb}/shm")),
        root.join(format!("sandboxes/{sb}/hosts")),
        root.join(format!("sandboxes/{sb}/infra/config.json")),
        root.join("images/images.json"),
        layer.join("bin/busybox"),
        root.join("runtime/runc"),
        root.join("attach"),
        root.join("cni/networks"),
    ];
    for k in &kinds {
        assert!(
            std::fs::symlink_metadata(k).is_ok(),
            "{} does not exist",
            k.display()
        );
    }
    let reached = reachable_by_nobody(&kinds);
    assert!(reached.is_empty(), "uid 65534 reaches {reached:?}");
    // Not even the root's listing.
    assert_eq!(std::fs::metadata(root).unwrap().mode() & 0o777, 0o700);

    // Modes: every dir 0700, every file 0600 (sockets too), but for what a container reads
    // through a bind mount. Image content, container filesystems, the shm, the runtime's and
    // the IPAM plugin's own trees are content, not ours to mode.
    let content = |p: &Path| {
        let s = p.to_string_lossy();
        s.contains("/images/layers/")
            || s.ends_with("/rootfs")
            || s.ends_with("/upper")
            || s.ends_with("/work")
            || s.ends_with("/shm")
            || s.ends_with("/infra-rootfs")
            || s.contains("/runtime/")
            || s.contains("/cni/networks/")
    };
    let mut all = Vec::new();
    walk(root, &content, &mut all);
    assert!(all.len() > 30, "walked only {all:?}");
    let mut bad = Vec::new();
    for p in &all {
        let m = std::fs::symlink_metadata(p).unwrap();
        let name = p.file_name().unwrap().to_string_lossy();
        let shared = matches!(name.as_ref(), "hosts" | "resolv.conf" | "hostname")
            && p.to_string_lossy().contains("/sandboxes/");
        let lenient = content(p) && p.parent().is_some_and(|d| !content(d));
        if shared || (lenient && m.is_dir()) {
            continue;
        }
        if m.mode() & 0o077 != 0 {
            bad.push(format!("{} {:o}", p.display(), m.mode() & 0o7777));
        }
    }
    assert!(bad.is_empty(), "open to others: {bad:#?}");

    // The container itself still reads what it needs as a non-root user.
    let r = rt
        .exec_sync(
            &id,
            &[
                "sh".into(),
                "-c".into(),
                "cat /etc/resolv.conf /etc/hosts >/dev/null && ls / >/dev/null && echo ok".into(),
            ],
            Duration::from_secs(10),
        )
        .unwrap();
    assert_eq!(r.stdout, b"ok\n", "{}", String::from_utf8_lossy(&r.stderr));
    rt.remove_pod_sandbox(&sb).unwrap();
    env.assert_no_leaks();
}

/// The unpacked dir of the (one) layer of the test image.
fn sandboxd_layer(root: &Path) -> PathBuf {
    let layers = root.join("images/layers");
    let name = list_names(&layers).into_iter().next().expect("a layer");
    layers.join(name)
}

/// A record that cannot be read at start-up is quarantined: nothing it may own is collected
/// (the old code removed its netns, infra, containers and veth but ran no CNI DEL, leaking its
/// address and shm), Status says so, the pod is listed NotReady with what is known (so
/// kubelet's garbage collector removes it), and removing it by id finishes its teardown with
/// DEL from the attachment kept on its own. (Issue items: corrupt records; a quarantined pod
/// hidden from kubelet.)
#[test]
fn corrupt_records_are_quarantined_and_finished_by_id() {
    use sandboxd::api::v1::runtime_service_server::RuntimeService;
    let env = Env::new("hostile-quarantine");
    let rt = setup(&env);
    let a = rt.run_pod_sandbox(&env.pod("qa", false)).unwrap();
    let b = rt.run_pod_sandbox(&env.pod("qb", false)).unwrap();
    let run = |sb: &str, name: &str| {
        let id = rt
            .create_container(sb, &ctr(name, "exec sleep 1000"))
            .unwrap();
        rt.start_container(&id).unwrap();
        id
    };
    let a1 = run(&a, "a1");
    let b1 = run(&b, "b1");
    let b2 = run(&b, "b2");
    let rec_a = rt.sandbox_record(&a).unwrap();
    drop(rt);
    let root = &env.cfg.root;
    std::fs::write(
        root.join(format!("sandboxes/{a}/state.json")),
        b"{\"id\": tru",
    )
    .unwrap();
    std::fs::write(
        root.join(format!("containers/{b2}/state.json")),
        b"\x00\x01",
    )
    .unwrap();

    let rt = std::sync::Arc::new(env.runtime());
    // A is listed NotReady with what is known (the pod's names from its CNI attachment), so
    // kubelet's garbage collector removes it; B as it is.
    let listed: Vec<(String, sandboxd::SandboxState, String)> = rt
        .list_pod_sandboxes(&Default::default())
        .into_iter()
        .map(|s| (s.id, s.state, s.metadata.uid))
        .collect();
    assert!(
        listed.contains(&(
            b.clone(),
            sandboxd::SandboxState::Ready,
            rt.sandbox_record(&b).unwrap().config.metadata.uid
        )) && listed.contains(&(
            a.clone(),
            sandboxd::SandboxState::NotReady,
            rec_a.config.metadata.uid.clone()
        )) && listed.len() == 2,
        "{listed:?}"
    );
    let st = rt.pod_sandbox_status(&a[..12]).unwrap();
    assert_eq!(st.state, sandboxd::SandboxState::NotReady);
    assert_eq!(st.metadata.name, "qa");
    assert!(
        st.annotations["io.sandboxd.quarantined"].contains("unreadable"),
        "{st:?}"
    );
    let ready = sandboxd::SandboxFilter {
        state: Some(sandboxd::SandboxState::Ready),
        ..Default::default()
    };
    assert_eq!(rt.list_pod_sandboxes(&ready).len(), 1);
    let q = rt.quarantined();
    assert!(
        q.len() == 2 && q.iter().any(|l| l.contains(&a)) && q.iter().any(|l| l.contains(&b2)),
        "{q:?}"
    );
    // Nothing of A was collected: its netns, address, shm, container are all still there.
    let netns = rec_a.netns.clone().unwrap();
    assert_eq!(mountinfo_fs(&netns).as_deref(), Some("nsfs"));
    assert_eq!(env.ipam_reservations().len(), 2, "an address was released");
    assert!(
        mountinfo_fs(&rec_a.shm.clone().unwrap()).is_some(),
        "shm unmounted"
    );
    for c in [&a1, &b2] {
        let (ok, out) = sh_ok(&format!(
            "runc --root {} state {c}",
            env.runtime_root("runc").display()
        ));
        assert!(ok && out.contains("running"), "{c}: {out}");
    }
    // Status reports it.
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let svc = sandboxd::cri::CriService::new(rt.clone());
    let st = tokio
        .block_on(
            svc.status(tonic::Request::new(sandboxd::api::v1::StatusRequest {
                verbose: false,
            })),
        )
        .unwrap()
        .into_inner();
    let cond = st
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.r#type == "RecordsReadable")
        .expect("a quarantine condition");
    assert!(!cond.status && cond.message.contains(&a), "{cond:?}");
    // Removing them by id finishes the job: DEL ran (no address left), nothing leaks.
    rt.remove_pod_sandbox(&a).unwrap();
    rt.remove_container(&b2[..12]).unwrap();
    assert!(rt.quarantined().is_empty());
    assert_eq!(rt.list_pod_sandboxes(&Default::default()).len(), 1);
    assert_eq!(env.ipam_reservations().len(), 1);
    assert_eq!(
        rt.container_status(&b1).unwrap().state,
        sandboxd::ContainerState::Running
    );
    rt.remove_pod_sandbox(&b).unwrap();
    env.assert_no_leaks();
}
