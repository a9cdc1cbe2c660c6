//! Unit tests of layer unpacking: formats, whiteouts, hostile entries, limits.
use super::*;
use std::path::PathBuf;

fn tar_of(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    build(&mut b);
    b.into_inner().unwrap()
}

fn header(kind: tar::EntryType, path: &str, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(0o755);
    h.set_uid(1000);
    h.set_gid(1001);
    let _ = h.set_path(path);
    h.set_cksum();
    h
}

fn raw_entry(
    b: &mut tar::Builder<Vec<u8>>,
    kind: tar::EntryType,
    name: &[u8],
    link: Option<&[u8]>,
    data: &[u8],
) {
    // Writes names verbatim (the builder refuses "..": hostile layers need raw headers).
    let mut h = tar::Header::new_old();
    h.set_entry_type(kind);
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    if let Some(l) = link {
        h.as_old_mut().linkname[..l.len()].copy_from_slice(l);
    }
    h.set_cksum();
    b.append(&h, data).unwrap();
}

/// Removes its dirs when dropped, whether the test passed or not.
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for d in &self.0 {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sandboxd-unpack-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn files_links_whiteouts_and_gzip() {
    let data = tar_of(|b| {
        b.append(&header(tar::EntryType::Directory, "etc/", 0), &[][..])
            .unwrap();
        b.append(
            &header(tar::EntryType::Regular, "etc/hello", 5),
            &b"hello"[..],
        )
        .unwrap();
        let mut l = header(tar::EntryType::Link, "etc/hello2", 0);
        l.set_link_name("etc/hello").unwrap();
        l.set_cksum();
        b.append(&l, &[][..]).unwrap();
        let mut s = header(tar::EntryType::Symlink, "bin", 0);
        s.set_link_name("/usr/bin").unwrap();
        s.set_cksum();
        b.append(&s, &[][..]).unwrap();
        b.append(&header(tar::EntryType::Regular, "etc/.wh.gone", 0), &[][..])
            .unwrap();
        b.append(
            &header(tar::EntryType::Regular, "var/.wh..wh..opq", 0),
            &[][..],
        )
        .unwrap();
        b.append(&header(tar::EntryType::Char, "dev/null", 0), &[][..])
            .unwrap();
    });
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &data).unwrap();
    let gz = gz.finish().unwrap();
    let root = tmp("ok");
    let a = apply(Box::new(&gz[..]), &root).unwrap();
    assert_eq!(a.whiteouts, 2);
    assert_eq!(a.skipped_devices, 1);
    assert_eq!(std::fs::read(root.join("etc/hello")).unwrap(), b"hello");
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(root.join("etc/hello")).unwrap();
    assert_eq!(
        (m.uid(), m.gid(), m.mode() & 0o7777, m.nlink()),
        (1000, 1001, 0o755, 2)
    );
    assert_eq!(
        std::fs::read_link(root.join("bin")).unwrap(),
        PathBuf::from("/usr/bin")
    );
    let wh = std::fs::symlink_metadata(root.join("etc/gone")).unwrap();
    use std::os::unix::fs::FileTypeExt;
    assert!(wh.file_type().is_char_device() && wh.rdev() == 0);
    assert!(!root.join("dev/null").exists());
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn zstd_layer_and_its_diff_id() {
    let data = tar_of(|b| {
        b.append(&header(tar::EntryType::Directory, "opt/", 0), &[][..])
            .unwrap();
        b.append(&header(tar::EntryType::Regular, "opt/z", 4), &b"zstd"[..])
            .unwrap();
    });
    let z = zstd::encode_all(&data[..], 1).unwrap();
    assert_eq!(&z[..4], b"\x28\xb5\x2f\xfd", "not a zstd frame");
    let root = tmp("zstd");
    let (_, diff_id) = apply_layer(Box::new(&z[..]), &root, &Limits::default()).unwrap();
    use sha2::Digest;
    assert_eq!(
        diff_id,
        format!("sha256:{}", hex(&sha2::Sha256::digest(&data)))
    );
    assert_eq!(std::fs::read(root.join("opt/z")).unwrap(), b"zstd");
    std::fs::remove_dir_all(&root).unwrap();
}

/// A gzip layer of two members and a zstd layer of two frames with a skippable frame before
/// and between them (as zstd:chunked writes): every member and frame is unpacked, and the
/// diff id is that of the whole tar.
#[test]
fn multi_member_gzip_and_multi_frame_zstd() {
    let data = tar_of(|b| {
        b.append(&header(tar::EntryType::Regular, "a", 3), &b"one"[..])
            .unwrap();
        b.append(&header(tar::EntryType::Regular, "b", 3), &b"two"[..])
            .unwrap();
    });
    let (head, tail) = data.split_at(700);
    use sha2::Digest;
    let want = format!("sha256:{}", hex(&sha2::Sha256::digest(&data)));
    let mut gz = Vec::new();
    for part in [head, tail] {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut e, part).unwrap();
        gz.extend(e.finish().unwrap());
    }
    let skippable = |payload: &[u8]| {
        let mut f = vec![0x5e, 0x2a, 0x4d, 0x18];
        f.extend((payload.len() as u32).to_le_bytes());
        f.extend(payload);
        f
    };
    let mut zst = skippable(b"table of contents");
    zst.extend(zstd::encode_all(head, 1).unwrap());
    zst.extend(skippable(b""));
    zst.extend(zstd::encode_all(tail, 1).unwrap());
    zst.extend(skippable(b"footer"));
    for (name, layer) in [("multigz", gz), ("multizst", zst)] {
        let root = tmp(name);
        let (_, diff_id) = apply_layer(Box::new(&layer[..]), &root, &Limits::default()).unwrap();
        assert_eq!(diff_id, want, "{name}");
        assert_eq!(std::fs::read(root.join("b")).unwrap(), b"two", "{name}");
        std::fs::remove_dir_all(&root).unwrap();
    }
    // A skippable frame cut short is an error, not an early end.
    let mut cut = skippable(b"0123456789");
    cut.truncate(9);
    let mut whole = zstd::encode_all(&data[..], 1).unwrap();
    whole.extend(cut);
    let root = tmp("cutzst");
    assert!(apply_layer(Box::new(&whole[..]), &root, &Limits::default()).is_err());
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn hostile_layers_cannot_escape() {
    let outside = tmp("outside");
    // 1. "../" in a path.
    let t = tar_of(|b| raw_entry(b, tar::EntryType::Regular, b"../../escape", None, b"x"));
    let root = tmp("h1");
    assert!(apply(Box::new(&t[..]), &root)
        .unwrap_err()
        .to_string()
        .contains(".."));
    // 2. An absolute path lands inside the layer.
    let abs = outside.join("abs");
    let t = tar_of(|b| {
        raw_entry(
            b,
            tar::EntryType::Regular,
            abs.to_str().unwrap().as_bytes(),
            None,
            b"x",
        )
    });
    let root = tmp("h2");
    apply(Box::new(&t[..]), &root).unwrap();
    assert!(!abs.exists());
    assert!(root.join(abs.strip_prefix("/").unwrap()).exists());
    // 3. A symlinked parent pointing outside, then a file through it.
    let t = tar_of(|b| {
        raw_entry(
            b,
            tar::EntryType::Symlink,
            b"link",
            Some(outside.to_str().unwrap().as_bytes()),
            b"",
        );
        raw_entry(b, tar::EntryType::Regular, b"link/pwned", None, b"x");
    });
    let root = tmp("h3");
    assert!(apply(Box::new(&t[..]), &root).is_err());
    assert!(!outside.join("pwned").exists());
    // 4. A hardlink to a file outside the layer.
    let secret = outside.join("secret");
    std::fs::write(&secret, "s").unwrap();
    let t = tar_of(|b| {
        raw_entry(
            b,
            tar::EntryType::Link,
            b"stolen",
            Some(b"../../../../../../../../tmp/x"),
            b"",
        )
    });
    let root = tmp("h4");
    assert!(apply(Box::new(&t[..]), &root).is_err());
    let t = tar_of(|b| {
        raw_entry(
            b,
            tar::EntryType::Link,
            b"stolen",
            Some(secret.to_str().unwrap().as_bytes()),
            b"",
        )
    });
    let root5 = tmp("h5");
    assert!(
        apply(Box::new(&t[..]), &root5).is_err(),
        "absolute hardlink target resolved outside"
    );
    // 5. A whiteout through a symlinked parent.
    let t = tar_of(|b| {
        raw_entry(
            b,
            tar::EntryType::Symlink,
            b"l2",
            Some(outside.to_str().unwrap().as_bytes()),
            b"",
        );
        raw_entry(b, tar::EntryType::Regular, b"l2/.wh.secret", None, b"");
    });
    let root6 = tmp("h6");
    assert!(apply(Box::new(&t[..]), &root6).is_err());
    assert!(secret.exists(), "whiteout removed a file outside the layer");
    // 6. A whiteout of ".." (`.wh...`) or "." would empty the layer's parent.
    let sibling = root6
        .parent()
        .unwrap()
        .join(format!("sandboxd-unpack-{}-sibling", std::process::id()));
    std::fs::create_dir_all(&sibling).unwrap();
    for name in [&b"dir/.wh..."[..], b"dir/.wh..", b".wh."] {
        let t = tar_of(|b| raw_entry(b, tar::EntryType::Regular, name, None, b""));
        let root7 = tmp("h7");
        assert!(
            apply(Box::new(&t[..]), &root7).is_err(),
            "{:?} accepted",
            String::from_utf8_lossy(name)
        );
        assert!(
            sibling.exists() && root7.exists(),
            "a whiteout removed the layer's parent"
        );
        let _ = std::fs::remove_dir_all(root7);
    }
    let _ = std::fs::remove_dir_all(&sibling);
    for d in [
        outside,
        root,
        root5,
        root6,
        tmp("h1"),
        tmp("h2"),
        tmp("h3"),
        tmp("h4"),
    ] {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// A directory's time is set at the end, once its entries are in: by then a later entry may
/// have put a symlink where one of its parents was, and the time must not land where that
/// link points.
#[test]
fn directory_times_do_not_follow_a_later_symlink() {
    let outside = tmp("times-outside");
    let root = tmp("times");
    let _cleanup = Cleanup(vec![root.clone(), outside.clone()]);
    std::fs::create_dir(outside.join("b")).unwrap();
    let before = filetime(1000);
    nix::sys::stat::utimensat(
        nix::fcntl::AT_FDCWD,
        &outside.join("b"),
        &before,
        &before,
        nix::sys::stat::UtimensatFlags::NoFollowSymlink,
    )
    .unwrap();
    let t = tar_of(|b| {
        let mut d = header(tar::EntryType::Directory, "a/", 0);
        d.set_mtime(5);
        d.set_cksum();
        b.append(&d, &[][..]).unwrap();
        let mut d = header(tar::EntryType::Directory, "a/b/", 0);
        d.set_mtime(5);
        d.set_cksum();
        b.append(&d, &[][..]).unwrap();
        raw_entry(
            b,
            tar::EntryType::Symlink,
            b"a",
            Some(outside.to_str().unwrap().as_bytes()),
            b"",
        );
    });
    apply(Box::new(&t[..]), &root).unwrap();
    assert!(std::fs::symlink_metadata(root.join("a"))
        .unwrap()
        .file_type()
        .is_symlink());
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(outside.join("b")).unwrap().mtime(),
        1000,
        "a directory time was set through the layer's symlink"
    );
}

/// Entries deep below the layer's root and in no order: each lands where its path says,
/// past the parents the unpacker keeps open; a directory replaced by a file is no parent of
/// a later entry, whatever was open.
#[test]
fn deep_and_scattered_entries() {
    let deep = vec!["d"; 100].join("/") + "/f";
    let t = tar_of(|b| {
        for (path, data) in [
            (deep.as_str(), &b"deep"[..]),
            ("x/y/f1", b"1"),
            ("z/f2", b"2"),
            ("x/y/f3", b"3"),
            ("d/d/g", b"g"),
        ] {
            let mut h = header(tar::EntryType::Regular, "", data.len() as u64);
            b.append_data(&mut h, path, data).unwrap();
        }
    });
    let root = tmp("deep");
    let replaced = tmp("replaced");
    let _cleanup = Cleanup(vec![root.clone(), replaced.clone()]);
    let a = apply(Box::new(&t[..]), &root).unwrap();
    assert_eq!(a.entries, 5);
    for (path, data) in [
        (deep.as_str(), "deep"),
        ("x/y/f3", "3"),
        ("z/f2", "2"),
        ("d/d/g", "g"),
    ] {
        assert_eq!(
            std::fs::read_to_string(root.join(path)).unwrap(),
            data,
            "{path}"
        );
    }

    let t = tar_of(|b| {
        raw_entry(b, tar::EntryType::Regular, b"x/y/f1", None, b"1");
        raw_entry(b, tar::EntryType::Regular, b"x", None, b"now a file");
        raw_entry(b, tar::EntryType::Regular, b"x/y/f2", None, b"2");
    });
    let e = apply(Box::new(&t[..]), &replaced).unwrap_err();
    assert!(
        matches!(e, LayerError::Hostile { .. }),
        "a file's name used as a parent: {e}"
    );
    assert_eq!(
        std::fs::read_to_string(replaced.join("x")).unwrap(),
        "now a file"
    );
}
