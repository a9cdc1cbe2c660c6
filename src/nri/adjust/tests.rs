use super::*;

fn env(k: &str, v: &str) -> api::ContainerAdjustment {
    api::ContainerAdjustment {
        env: vec![api::KeyValue {
            key: k.into(),
            value: v.into(),
        }],
        ..Default::default()
    }
}

#[test]
fn a_second_plugin_setting_the_same_key_is_a_conflict() {
    let mut spec = json!({"process": {"env": ["PATH=/bin", "A=0"]}});
    let mut o = Owners::default();
    apply(&mut spec, &env("A", "1"), "10-one", &mut o).unwrap();
    assert_eq!(spec["process"]["env"], json!(["PATH=/bin", "A=1"]));
    let e = apply(&mut spec, &env("A", "2"), "20-two", &mut o).unwrap_err();
    assert_eq!(
        e,
        "NRI plugins 10-one and 20-two both tried to set env \"A\""
    );
    // Another key is free.
    apply(&mut spec, &env("B", "2"), "20-two", &mut o).unwrap();
}

#[test]
fn a_removal_frees_the_key_for_its_remover_only() {
    let mut spec = json!({"process": {"env": ["A=0"]}, "mounts": [{"destination": "/x"}]});
    let mut o = Owners::default();
    apply(&mut spec, &env("-A", ""), "10-one", &mut o).unwrap();
    assert_eq!(spec["process"]["env"], json!([]));
    apply(&mut spec, &env("A", "again"), "10-one", &mut o).unwrap();
    assert!(apply(&mut spec, &env("A", "other"), "20-two", &mut o).is_err());
    let rm = api::ContainerAdjustment {
        mounts: vec![api::Mount {
            destination: "-/x".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    apply(&mut spec, &rm, "20-two", &mut o).unwrap();
    assert_eq!(spec["mounts"], json!([]));
}

#[test]
fn what_sandboxd_cannot_do_is_refused_by_name() {
    let mut spec = json!({});
    let a = api::ContainerAdjustment {
        linux: Some(api::LinuxContainerAdjustment {
            io_priority: Some(Default::default()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let e = apply(&mut spec, &a, "10-one", &mut Owners::default()).unwrap_err();
    assert!(e.contains("linux.io_priority"), "{e}");
    // A cgroups path: a plain one or systemd's, never one that climbs out.
    let path = |p: &str| api::ContainerAdjustment {
        linux: Some(api::LinuxContainerAdjustment {
            cgroups_path: p.into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    for good in ["/kubepods/pod1/c1", "kubepods.slice:cri:c1"] {
        let mut s = json!({});
        apply(&mut s, &path(good), "10-one", &mut Owners::default()).unwrap();
        assert_eq!(s["linux"]["cgroupsPath"], good);
    }
    for bad in [
        "/a/../../etc",
        "relative/x",
        "/a//b",
        "a.slice:x",
        "x:y:z",
        "/a/b\n",
    ] {
        assert!(
            apply(&mut json!({}), &path(bad), "10-one", &mut Owners::default()).is_err(),
            "{bad}"
        );
    }
    let bad_cpus = api::ContainerAdjustment {
        linux: Some(api::LinuxContainerAdjustment {
            resources: Some(api::LinuxResources {
                cpu: Some(api::LinuxCpu {
                    cpus: "0\n1".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert!(apply(&mut spec, &bad_cpus, "10-one", &mut Owners::default()).is_err());
}

/// One plugin's ops on one key in one answer end as the last of them, keyed entries no op
/// names keep their place, and keys set are appended in the order of their last set (what
/// applying them one by one gave).
#[test]
fn ops_in_one_answer_apply_as_if_one_by_one() {
    let mut spec = json!({"process": {"env": ["PATH=/bin", "A=0", "C=0", "noequals", "D=0"]}});
    let kv = |k: &str, v: &str| api::KeyValue {
        key: k.into(),
        value: v.into(),
    };
    let a = api::ContainerAdjustment {
        env: vec![
            kv("A", "1"),
            kv("B", "1"),
            kv("A", "2"),
            kv("-C", ""),
            kv("-D", ""),
            kv("D", "1"),
        ],
        ..Default::default()
    };
    apply(&mut spec, &a, "10-one", &mut Owners::default()).unwrap();
    assert_eq!(
        spec["process"]["env"],
        json!(["PATH=/bin", "noequals", "B=1", "A=2", "D=1"])
    );
}

/// More entries of a kind than any plugin needs are refused whole, before any work: an
/// answer within the message limit cannot keep the daemon busy (issue 36: 80,000 env vars
/// took 32 s with the pod's lock held).
#[test]
fn an_adjustment_with_too_many_entries_is_refused() {
    let many = |n: usize| api::ContainerAdjustment {
        env: (0..n)
            .map(|i| api::KeyValue {
                key: format!("V{i}"),
                value: "x".into(),
            })
            .collect(),
        ..Default::default()
    };
    let mut spec = json!({"process": {"env": (0..MAX_ENTRIES).map(|i| format!("S{i}=1")).collect::<Vec<_>>()}});
    apply(
        &mut spec,
        &many(MAX_ENTRIES),
        "10-one",
        &mut Owners::default(),
    )
    .unwrap();
    assert_eq!(
        spec["process"]["env"].as_array().unwrap().len(),
        2 * MAX_ENTRIES
    );
    let e = apply(&mut spec, &many(80_000), "20-two", &mut Owners::default()).unwrap_err();
    assert!(e.contains("80000 env") && e.contains("4096"), "{e}");
}
