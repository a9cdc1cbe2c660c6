//! CDI devices through the daemon's gRPC socket: a container asks for devices by
//! `CDI_devices` and by `cdi.k8s.io/*` annotation; the spec files' device nodes (host
//! `/dev/null` and `/dev/zero` under vendor names), env and mounts show inside the running
//! container. An unknown device, or one whose only spec file is broken, fails CreateContainer
//! with InvalidArgument naming it (and the file), leaving nothing; other files still work; a
//! spec file written while the daemon runs is used without a restart. Verbose Status lists the
//! resolvable devices and the broken files.

mod common;

use common::cri::*;
use common::*;
use sandboxd::api::v1 as cri;
use tonic::Code;

fn with_cdi(mut c: cri::ContainerConfig, devices: &[&str]) -> cri::ContainerConfig {
    c.cdi_devices = devices
        .iter()
        .map(|n| cri::CdiDevice {
            name: n.to_string(),
        })
        .collect();
    c
}

#[test]
fn devices_by_field_and_annotation_show_in_the_container() {
    let env = Env::new("cdi");
    let dir = env.base.join("cdi");
    let data = env.base.join("cdi-data");
    std::fs::create_dir_all(dir.join("vendor")).unwrap();
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("marker"), "from the spec file\n").unwrap();
    std::fs::write(
        dir.join("null.json"),
        serde_json::json!({
            "cdiVersion": "0.6.0",
            "kind": "sandboxd.test/null",
            "containerEdits": {"env": ["SPEC_LEVEL=yes"]},
            "devices": [{
                "name": "n0",
                "containerEdits": {
                    "deviceNodes": [{"path": "/dev/vendor-null", "hostPath": "/dev/null"}],
                    "env": ["VENDOR_NULL=1", "PATH=/vendor/bin:/usr/bin:/bin"],
                    "mounts": [{"hostPath": data, "containerPath": "/vendor-data",
                                "options": ["ro", "bind"]}]
                }
            }]
        })
        .to_string(),
    )
    .unwrap();
    // YAML, in a subdirectory.
    std::fs::write(
        dir.join("vendor/zero.yaml"),
        "cdiVersion: 0.6.0\nkind: sandboxd.test/zero\ndevices:\n- name: z0\n  containerEdits:\n    deviceNodes:\n    - path: /dev/vendor-zero\n      hostPath: /dev/zero\n    env:\n    - VENDOR_ZERO=1\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("broken.json"),
        r#"{"cdiVersion": "0.6.0", "kind": "#,
    )
    .unwrap();

    let (_d, rt, mut c) = daemon(&env);
    // Verbose Status (what `sandboxctl info` prints) lists what resolves and what is broken.
    let info = rt
        .block_on(c.status(cri::StatusRequest { verbose: true }))
        .unwrap()
        .into_inner()
        .info;
    let cdi: serde_json::Value = serde_json::from_str(&info["cdi"]).unwrap();
    assert_eq!(
        cdi["devices"]["sandboxd.test/zero=z0"],
        dir.join("vendor/zero.yaml").display().to_string()
    );
    assert!(cdi["devices"]["sandboxd.test/null=n0"].is_string(), "{cdi}");
    assert!(
        cdi["brokenSpecFiles"][dir.join("broken.json").display().to_string()].is_string(),
        "{cdi}"
    );
    let p = pod("cdi", serde_json::json!({}));
    let sb = run_pod(&rt, &mut c, &p);
    let cfg = with_cdi(
        ctr(
            "gpu",
            &["sleep", "1000"],
            serde_json::json!({"annotations": {"cdi.k8s.io/test-plugin": "sandboxd.test/zero=z0"}}),
        ),
        &["sandboxd.test/null=n0"],
    );
    let id = create(&rt, &mut c, &sb, &p, cfg).unwrap();
    start(&rt, &mut c, &id);
    let out = exec(
        &rt,
        &mut c,
        &id,
        "env | sort; stat -c '%n %F %t:%T' /dev/vendor-null /dev/vendor-zero; \
         head -c 4 /dev/vendor-zero | od -An -tx1; echo gone > /dev/vendor-null && echo wrote; \
         cat /vendor-data/marker; touch /vendor-data/x 2>/dev/null || echo read-only",
    );
    for want in [
        "VENDOR_NULL=1",
        "VENDOR_ZERO=1",
        "SPEC_LEVEL=yes",
        // A device's env var replaces the container's of the same name.
        "PATH=/vendor/bin:/usr/bin:/bin",
        "/dev/vendor-null character special file 1:3",
        "/dev/vendor-zero character special file 1:5",
        "00 00 00 00",
        "wrote",
        "from the spec file",
        "read-only",
    ] {
        assert!(out.contains(want), "{want:?} not in:\n{out}");
    }
    assert_eq!(out.matches("PATH=").count(), 1, "{out}");

    // Unknown, and known only to a broken file: InvalidArgument naming the device and the
    // file; nothing made.
    for (name, also) in [
        ("sandboxd.test/null=nope", "sandboxd.test/null=nope"),
        ("sandboxd.test/broken=b0", "broken.json"),
    ] {
        let e = create(
            &rt,
            &mut c,
            &sb,
            &p,
            with_cdi(ctr("bad", &["true"], serde_json::json!({})), &[name]),
        )
        .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(
            e.message().contains(name) && e.message().contains(also),
            "{e:?}"
        );
    }
    let listed = rt
        .block_on(c.list_containers(cri::ListContainersRequest { filter: None }))
        .unwrap()
        .into_inner()
        .containers;
    assert_eq!(listed.len(), 1, "{listed:?}");

    // A spec file written now is read before the next container that asks.
    std::fs::write(
        dir.join("late.json"),
        serde_json::json!({
            "cdiVersion": "0.6.0",
            "kind": "sandboxd.test/late",
            "devices": [{"name": "l0", "containerEdits": {"env": ["LATE=1"]}}]
        })
        .to_string(),
    )
    .unwrap();
    let late = create(
        &rt,
        &mut c,
        &sb,
        &p,
        with_cdi(
            ctr("late", &["sleep", "1000"], serde_json::json!({})),
            &["sandboxd.test/late=l0"],
        ),
    )
    .unwrap();
    start(&rt, &mut c, &late);
    assert!(exec(&rt, &mut c, &late, "env").contains("LATE=1"));
    remove_pod(&rt, &mut c, &sb);
    env.assert_no_leaks();
}
