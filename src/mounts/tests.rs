use super::*;

#[test]
fn parses_mountinfo_lines() {
    let text = "36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n\
                40 22 0:50 / /run/netns rw shared:7 - tmpfs tmpfs rw\n";
    let m = parse_mountinfo(text);
    assert_eq!(m[0].mount_point, PathBuf::from("/mnt/with space"));
    assert_eq!(m[0].fs_type, "ext3");
    assert_eq!(m[0].optional, vec!["master:1".to_string()]);
    assert_eq!(m[1].optional, vec!["shared:7".to_string()]);
    assert_eq!(m[1].fs_type, "tmpfs");
}

#[test]
fn removal_never_enters_a_mount() {
    let d = std::env::temp_dir().join(format!("sandboxd-rmtree-{}", std::process::id()));
    let keep = std::env::temp_dir().join(format!("sandboxd-rmtree-keep-{}", std::process::id()));
    std::fs::create_dir_all(d.join("a/mnt")).unwrap();
    std::fs::create_dir_all(&keep).unwrap();
    std::fs::write(keep.join("precious"), b"x").unwrap();
    mount(
        Some(&keep),
        &d.join("a/mnt"),
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .unwrap();
    assert!(is_mount_root(&d.join("a/mnt")));
    assert!(!is_mount_root(&d.join("a")));
    remove_tree(&d).unwrap();
    assert!(!d.exists());
    assert!(
        keep.join("precious").exists(),
        "removal went into a bind mount"
    );
    std::fs::remove_dir_all(&keep).unwrap();
}

#[test]
fn recursive_read_only_tree() {
    if !recursive_read_only_supported() {
        return;
    }
    let base = std::env::temp_dir().join(format!("sandboxd-rro-{}", std::process::id()));
    let src = base.join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    mount(
        Some("tmpfs"),
        &src.join("sub"),
        Some("tmpfs"),
        MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
    let target = base.join("ro");
    mount_tree_copy(&src, &target, true, None).unwrap();
    assert!(std::fs::write(target.join("x"), b"x").is_err());
    assert!(
        std::fs::write(target.join("sub/x"), b"x").is_err(),
        "a submount stayed writable"
    );
    assert!(
        std::fs::write(src.join("sub/x"), b"x").is_ok(),
        "the source became read-only"
    );
    remove_tree(&target).unwrap();
    unmount_all(&src.join("sub")).unwrap();
    remove_tree(&base).unwrap();
}

#[test]
fn reads_own_table() {
    let t = mountinfo().unwrap();
    assert!(t.iter().any(|m| m.mount_point == Path::new("/proc")));
}
