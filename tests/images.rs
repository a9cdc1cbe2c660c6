//! The image store with images the test builds itself: OCI layout and docker-archive import,
//! layer unpacking, tags and digests, removal, and a corrupt blob rejected.

mod common;

use common::*;
use sandboxd::image::ImageStore;

#[test]
fn import_list_and_remove() {
    let env = Env::new("images");
    let store = ImageStore::new(env.base.join("images")).unwrap();
    let layout = busybox::oci_layout(&env.base, "sandboxd.test/busybox:oci");
    let imgs = store.import(&layout, None).unwrap();
    assert_eq!(imgs.len(), 1);
    let img = &imgs[0];
    assert_eq!(img.repo_tags, vec!["sandboxd.test/busybox:oci".to_string()]);
    assert!(img.repo_digests[0].starts_with("sandboxd.test/busybox@sha256:"));
    assert_eq!(img.config.cmd, vec!["sh".to_string()]);
    let layer = store.layer_dir(&img.layers[0]).unwrap();
    assert!(layer.join("bin/busybox").is_file());
    assert_eq!(
        std::fs::read_link(layer.join("bin/sh")).unwrap(),
        std::path::PathBuf::from("busybox")
    );

    // The docker archive of the same content is the same image, with a second tag.
    let archive = busybox::docker_archive(&env.base, "sandboxd.test/busybox:docker");
    let again = store.import(&archive, None).unwrap();
    assert_eq!(again[0].id, img.id);
    assert_eq!(store.list().len(), 1);
    let got = store.get("sandboxd.test/busybox:docker").unwrap();
    assert_eq!(got.repo_tags.len(), 2);
    assert_eq!(store.get(&img.id[7..19]).unwrap().id, img.id);
    assert!(store.get("sandboxd.test/busybox:nope").is_none());
    // An oci-archive: the layout as a tar.
    let tarred = env.base.join("oci.tar");
    sh(&format!(
        "tar -C {} -cf {} .",
        layout.display(),
        tarred.display()
    ));
    assert_eq!(
        store
            .import(&tarred, Some("sandboxd.test/busybox:tarred"))
            .unwrap()[0]
            .id,
        img.id
    );

    // Removing one tag removes the image with all its tags; a layer a container still uses
    // stays until it no longer does, then nothing is left.
    let in_use: std::collections::HashSet<String> = img.layers.iter().cloned().collect();
    assert!(store.remove("sandboxd.test/busybox:oci", &in_use).unwrap());
    assert!(store.list().is_empty());
    assert!(store.get("sandboxd.test/busybox:docker").is_none());
    assert!(layer.exists(), "a layer in use was collected");
    store.collect(&Default::default()).unwrap();
    assert!(!layer.exists());
    assert!(list_names(&store.dir.join("blobs/sha256")).is_empty());
    assert!(list_names(&store.dir.join("layers")).is_empty());
    assert!(!store.remove("sandboxd.test/busybox:oci", &in_use).unwrap());
}

#[test]
fn corrupt_blob_is_rejected() {
    let env = Env::new("imgcorrupt");
    let store = ImageStore::new(env.base.join("images")).unwrap();
    let layout = busybox::oci_layout(&env.base, "sandboxd.test/busybox:bad");
    // Flip bytes in the (gzip) layer blob: its digest no longer matches.
    let blobs = layout.join("blobs/sha256");
    let biggest = list_names(&blobs)
        .into_iter()
        .max_by_key(|n| std::fs::metadata(blobs.join(n)).unwrap().len())
        .unwrap();
    let mut data = std::fs::read(blobs.join(&biggest)).unwrap();
    let n = data.len();
    data[n / 2] ^= 0xff;
    std::fs::write(blobs.join(&biggest), data).unwrap();
    let e = store.import(&layout, None).unwrap_err().to_string();
    assert!(e.contains("holds"), "{e}");
    assert!(list_names(&store.dir.join("layers")).is_empty());
    assert!(
        !store.dir.join("blobs/sha256").join(&biggest).exists(),
        "corrupt blob stored"
    );
    assert!(store.list().is_empty());
}

/// A pull or import killed mid-way leaves its partial layer in the store's `tmp/`: the next
/// start removes it at once (its writing process is gone), and keeps what a live process is
/// still writing there.
#[test]
fn start_up_collects_what_killed_pulls_left() {
    use std::os::unix::fs::DirBuilderExt;
    let env = Env::new("img-tmp");
    let tmp = env.cfg.root.join("images/tmp");
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let gone_pid = child.id();
    child.wait().unwrap();
    let gone = tmp.join(format!("layer-{gone_pid}-0123456789abcdef"));
    let live = tmp.join(format!("layer-{}-fedcba9876543210", std::process::id()));
    for d in [gone.join("usr/lib"), live.clone()] {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&d)
            .unwrap();
    }
    std::fs::write(gone.join("usr/lib/partial.so"), vec![7u8; 1 << 20]).unwrap();
    let rt = env.runtime();
    assert!(
        !gone.exists(),
        "the killed pull's partial layer is still there"
    );
    assert!(live.exists(), "a live writer's work was removed");
    std::fs::remove_dir_all(&live).unwrap();
    drop(rt);
    env.assert_no_leaks();
}
