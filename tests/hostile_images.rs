//! Hostile images and registries: archives with symlinks, and pulls bounded against a lying
//! registry and decompression bombs, leaving nothing in the store. (The suite: hostile*.rs.)

mod common;

use std::time::Duration;

use common::cri::*;
use common::*;
use sandboxd::api::v1 as cri;
use sandboxd::Runtime;

/// A tar of `(name, symlink target or None, data)` members.
fn tar_members(members: &[(&str, Option<&str>, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, link, data) in members {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        match link {
            Some(t) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                b.append_link(&mut h, name, t).unwrap();
            }
            None => {
                h.set_size(data.len() as u64);
                b.append_data(&mut h, name, *data).unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

/// Archives are read from themselves only: a docker-archive whose config is a symlink to a
/// root-only host file, or whose layer is a symlink to /dev/zero, is refused (quickly),
/// nothing of the host lands in the store; links inside the archive still work; an OCI
/// layout dir with a symlinked blob is refused too. (Issue item: docker-archive symlinks.)
#[test]
fn archives_are_read_from_themselves_only() {
    let env = Env::new("hostile-archive");
    let store = &sandboxd::image::ImageStore::new(env.base.join("store")).unwrap();
    let secret = env.base.join("secret");
    std::fs::write(&secret, b"{\"host\": \"secret\"}").unwrap();
    sh(&format!("chmod 600 {}", secret.display()));
    let (layer, config) = {
        let l = busybox::layer_tar();
        let c = serde_json::to_vec(&serde_json::json!({
            "architecture": "amd64", "os": "linux", "config": {"Cmd": ["sh"]},
            "rootfs": {"type": "layers", "diff_ids": [busybox::sha(&l)]}}))
        .unwrap();
        (l, c)
    };
    let manifest =
        br#"[{"Config":"cfg.json","RepoTags":["sandboxd.test/evil:1"],"Layers":["l/layer.tar"]}]"#;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "config symlinked to a host file",
            tar_members(&[
                ("manifest.json", None, manifest),
                ("cfg.json", Some(secret.to_str().unwrap()), b""),
                ("l/layer.tar", None, &layer),
            ]),
        ),
        (
            "layer symlinked to /dev/zero",
            tar_members(&[
                ("manifest.json", None, manifest),
                ("cfg.json", None, &config),
                ("l/layer.tar", Some("/dev/zero"), b""),
            ]),
        ),
    ];
    for (what, data) in cases {
        let path = env.base.join("evil.tar");
        std::fs::write(&path, data).unwrap();
        let t = std::time::Instant::now();
        let e = store.import(&path, None);
        assert!(e.is_err(), "{what}: imported");
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{what}: took {:?}",
            t.elapsed()
        );
        for blob in list_names(&store.dir.join("blobs/sha256")) {
            let data = std::fs::read(store.dir.join("blobs/sha256").join(&blob)).unwrap();
            assert!(
                !data.windows(6).any(|w| w == b"secret"),
                "{what}: the host file was copied"
            );
        }
        assert!(store.list().is_empty());
    }
    // A symlink to another member of the archive is fine (docker save makes such links).
    let ok = tar_members(&[
        ("manifest.json", None, manifest),
        ("real.json", None, &config),
        ("cfg.json", Some("real.json"), b""),
        ("blobs/layer.tar", None, &layer),
        ("l/layer.tar", Some("../blobs/layer.tar"), b""),
    ]);
    let path = env.base.join("ok.tar");
    std::fs::write(&path, ok).unwrap();
    assert_eq!(store.import(&path, None).unwrap().len(), 1);

    // An OCI layout dir whose layer blob is a symlink to a host file.
    let layout = busybox::oci_layout(&env.base, "sandboxd.test/evil-layout:1");
    let blobs = layout.join("blobs/sha256");
    let biggest = list_names(&blobs)
        .into_iter()
        .max_by_key(|n| std::fs::metadata(blobs.join(n)).unwrap().len())
        .unwrap();
    std::fs::remove_file(blobs.join(&biggest)).unwrap();
    std::os::unix::fs::symlink(&secret, blobs.join(&biggest)).unwrap();
    let e = store.import(&layout, None).unwrap_err();
    assert!(e.to_string().contains("symlink"), "{e}");
    env.assert_no_leaks();
}

/// A gzip layer holding one file of `size` zero bytes (tiny compressed: a decompression bomb).
fn zero_bomb(size: u64) -> (Vec<u8>, String) {
    use std::io::Write;
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_path("zeros").unwrap();
    h.set_size(size);
    h.set_mode(0o644);
    h.set_cksum();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut sha = <sha2::Sha256 as sha2::Digest>::new();
    let mut both = |b: &[u8]| {
        gz.write_all(b).unwrap();
        sha2::Digest::update(&mut sha, b);
    };
    both(h.as_bytes());
    let zeros = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(zeros.len() as u64) as usize;
        both(&zeros[..n]);
        left -= n as u64;
    }
    let pad = (512 - (size % 512) as usize) % 512;
    both(&vec![0u8; pad + 1024]);
    let diff_id = format!("sha256:{}", {
        let d = sha2::Digest::finalize(sha);
        d.iter().map(|b| format!("{b:02x}")).collect::<String>()
    });
    (gz.finish().unwrap(), diff_id)
}

/// Nothing of a refused pull is in the store: no image, no layer, no temp file.
fn assert_store_empty(rt: &Runtime) {
    assert!(rt.images().list().is_empty());
    assert!(
        list_names(&rt.images().dir.join("layers")).is_empty(),
        "a layer was left"
    );
    assert!(
        list_names(&rt.images().dir.join("tmp")).is_empty(),
        "temp files left"
    );
}

/// Pulls are bounded: a manifest over 4 MiB, a layer longer than its descriptor, a
/// decompression bomb, a layer of too many entries and a pull the free space cannot hold
/// are all refused, leaving nothing in the store. (Issue item: pull limits.)
#[test]
fn pulls_are_bounded() {
    use common::fake_registry::{Answer, FakeRegistry};
    let env = Env::new("hostile-pull");
    let mut cfg = env.cfg.clone();
    cfg.images.max_layer_bytes = 8 << 20;
    cfg.images.max_layer_entries = 1000;
    let rt = sandboxd::Runtime::new(cfg.clone()).unwrap();
    // A lying registry.
    let (small_layer, small_cfg) = busybox::gzip_layer_and_config();
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": busybox::sha(&small_cfg), "size": small_cfg.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": busybox::sha(&small_layer), "size": 100}],
    }))
    .unwrap();
    let huge = vec![b' '; 5 << 20];
    let (cfg_digest, layer_digest) = (busybox::sha(&small_cfg), busybox::sha(&small_layer));
    let fake = FakeRegistry::start(move |path| {
        let m = "application/vnd.oci.image.manifest.v1+json";
        if path.ends_with("/manifests/huge") {
            Some(Answer::json(huge.clone(), m))
        } else if path.ends_with("/manifests/liar") || path.ends_with("/manifests/liar-chunked") {
            Some(Answer::json(manifest.clone(), m))
        } else if path.ends_with(&format!("/blobs/{cfg_digest}")) {
            Some(Answer::json(small_cfg.clone(), "application/octet-stream"))
        } else if path.ends_with(&format!("/blobs/{layer_digest}")) {
            let mut a = Answer::json(small_layer.clone(), "application/octet-stream");
            a.content_length = false;
            Some(a)
        } else {
            None
        }
    });
    let e = rt
        .pull_image(&format!("{}/x/huge:huge", fake.addr), &Default::default())
        .unwrap_err();
    assert!(e.to_string().contains("limit"), "{e}");
    let e = rt
        .pull_image(&format!("{}/x/liar:liar", fake.addr), &Default::default())
        .unwrap_err();
    assert!(e.to_string().contains("more than the 100 bytes"), "{e}");
    assert_store_empty(&rt);

    // A real registry with a decompression bomb, and a layer of too many entries.
    let reg = common::registry::Registry::start(&env.base.join("registry"), None);
    let (bomb, bomb_diff) = zero_bomb(16 << 20);
    let config = |diff: &str| {
        serde_json::to_vec(&serde_json::json!({"architecture": "amd64", "os": "linux",
            "config": {"Cmd": ["sh"]}, "rootfs": {"type": "layers", "diff_ids": [diff]}}))
        .unwrap()
    };
    reg.push_image(
        "x/bomb",
        "1",
        None,
        std::slice::from_ref(&bomb),
        &config(&bomb_diff),
    );
    let t = std::time::Instant::now();
    let e = rt
        .pull_image(&format!("{}/x/bomb:1", reg.addr), &Default::default())
        .unwrap_err();
    assert!(e.to_string().contains("larger than the limit"), "{e}");
    assert!(matches!(e, sandboxd::Error::ResourceExhausted(_)), "{e}");
    assert!(t.elapsed() < Duration::from_secs(30));
    let many: Vec<String> = (0..2000).map(|i| format!("f{i}")).collect();
    let entries: Vec<busybox::Entry> = many.iter().map(|n| busybox::Entry::File(n, b"")).collect();
    let tar = busybox::layer_of(&entries);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &tar).unwrap();
    let gz = gz.finish().unwrap();
    reg.push_image("x/many", "1", None, &[gz], &config(&busybox::sha(&tar)));
    let e = rt
        .pull_image(&format!("{}/x/many:1", reg.addr), &Default::default())
        .unwrap_err();
    assert!(e.to_string().contains("more than 1000 entries"), "{e}");
    assert!(matches!(e, sandboxd::Error::ResourceExhausted(_)), "{e}");
    assert_store_empty(&rt);
    drop(rt);
    // No room: refused before a byte is written.
    cfg.images.min_free_bytes = u64::MAX / 4;
    let rt = sandboxd::Runtime::new(cfg).unwrap();
    reg.push_busybox("x/ok", "1", None);
    let e = rt
        .pull_image(&format!("{}/x/ok:1", reg.addr), &Default::default())
        .unwrap_err();
    assert!(matches!(e, sandboxd::Error::ResourceExhausted(_)), "{e}");
    assert_store_empty(&rt);
    env.assert_no_leaks();
}

/// Large layers by range requests, against registries that do not play along: one that
/// ignores `Range` (a 200 of the whole layer) is read as that one stream; one that answers
/// with another range than asked for is refused with both ranges named, leaving nothing.
#[test]
fn range_requests_against_registries_that_ignore_or_twist_them() {
    use common::fake_registry::{FakeRegistry, OneLayer};
    let env = Env::new("hostile-ranges");
    let mut cfg = env.cfg.clone();
    cfg.images.range_parts = 4;
    cfg.images.range_part_bytes = 1 << 20;
    let rt = sandboxd::Runtime::new(cfg).unwrap();
    // 3 MiB that gzip stores as is: three parts.
    let data = busybox::noise(3 << 20, 0x1234_5678);
    let tar = busybox::layer_of(&[busybox::Entry::File("data.bin", &data)]);
    let gz = busybox::stored_gzip(&tar);
    let config = serde_json::to_vec(&serde_json::json!({"architecture": "amd64", "os": "linux",
        "config": {"Cmd": ["sh"]}, "rootfs": {"type": "layers", "diff_ids": [busybox::sha(&tar)]}}))
    .unwrap();
    let img = OneLayer::new(
        config,
        gz.clone(),
        "application/vnd.oci.image.layer.v1.tar+gzip",
    );
    let whole = FakeRegistry::start(move |path| img.answer(path, None));
    rt.pull_image(&format!("{}/x/whole:1", whole.addr), &Default::default())
        .unwrap();
    let layer = rt
        .images()
        .dir
        .join("layers")
        .join(&busybox::sha(&tar)[7..]);
    assert_eq!(std::fs::read(layer.join("data.bin")).unwrap(), data);
    rt.remove_image(&format!("{}/x/whole:1", whole.addr))
        .unwrap();

    let img = OneLayer::new(
        serde_json::to_vec(&serde_json::json!({"architecture": "amd64", "os": "linux",
            "config": {"Cmd": ["sh"]}, "rootfs": {"type": "layers", "diff_ids": [busybox::sha(&tar)]}}))
        .unwrap(),
        gz.clone(),
        "application/vnd.oci.image.layer.v1.tar+gzip",
    );
    let layer_digest = busybox::sha(&gz);
    let size = gz.len();
    let twisted = FakeRegistry::start(move |path| {
        let mut a = img.answer(path, None)?;
        if path.ends_with(&layer_digest) {
            // The layer's last 100 bytes, whatever was asked for.
            a.status = 206;
            a.body = std::sync::Arc::new(a.body[size - 100..].to_vec());
            a.headers = vec![format!(
                "Content-Range: bytes {}-{}/{size}",
                size - 100,
                size - 1
            )];
        }
        Some(a)
    });
    let e = rt
        .pull_image(
            &format!("{}/x/twisted:1", twisted.addr),
            &Default::default(),
        )
        .unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains(&format!("asked for bytes 0-1048575/{size}"))
            && m.contains(&format!("bytes {}-", size - 100)),
        "{m}"
    );
    assert_store_empty(&rt);
    drop(rt);
    env.assert_no_leaks();
}

/// A registry that stalls (one byte every 5 s) no longer holds a pull, its threads and its
/// waiters for ever: with no progress for `image_pull_progress_timeout` seconds the pull is
/// cancelled with DeadlineExceeded saying so, and nothing of it is left (no pull in flight,
/// no temp file). A slow pull that keeps moving finishes, though it takes longer than that.
#[test]
fn a_stalled_pull_is_cancelled_a_slow_one_is_not() {
    use common::fake_registry::{FakeRegistry, OneLayer};
    let env = Env::new("hostile-stall");
    let mut cfg = env.cfg.clone();
    cfg.image_pull_progress_timeout = 2;
    let rt = sandboxd::Runtime::new(cfg).unwrap();
    let (layer, config) = busybox::gzip_layer_and_config();
    let chunk = layer.len() / 8 + 1;
    let img = OneLayer::new(config, layer, "application/vnd.oci.image.layer.v1.tar+gzip");
    let fake = FakeRegistry::start(move |path| {
        img.answer(
            path,
            Some(if path.starts_with("/v2/x/stall/") {
                (1, Duration::from_secs(5))
            } else {
                // Eight steps 400 ms apart: 3.2 s in all, never 2 s without a byte.
                (chunk, Duration::from_millis(400))
            }),
        )
    });
    let t = std::time::Instant::now();
    let e = rt
        .pull_image(&format!("{}/x/stall:1", fake.addr), &Default::default())
        .unwrap_err();
    assert!(matches!(e, sandboxd::Error::DeadlineExceeded(_)), "{e:?}");
    assert!(e.to_string().contains("no progress for 2 s"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert!(rt.images().pulls.is_empty(), "a pull is still in flight");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !list_names(&rt.images().dir.join("tmp")).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "temp files left: {:?}",
            list_names(&rt.images().dir.join("tmp"))
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(rt.images().list().is_empty());

    let t = std::time::Instant::now();
    rt.pull_image(&format!("{}/x/slow:1", fake.addr), &Default::default())
        .unwrap();
    assert!(t.elapsed() > Duration::from_secs(2), "{:?}", t.elapsed());
    env.assert_no_leaks();
}

/// Artifacts are a namespace of their own (issue 36), each reproduced as a tenant would:
/// two artifacts with the same empty config keep their own files; an artifact whose blob is
/// exactly an image layer's tar does not stand in for that layer; an artifact whose config is
/// a runnable image's config does not turn that image into an artifact.
#[test]
fn artifacts_have_their_own_identity_and_layers() {
    let env = Env::new("v136-artifact-id");
    let reg = common::registry::Registry::start(&env.base.join("registry"), None);
    let empty = b"{}".to_vec();
    // An image of busybox plus a layer with /marker, and its config.
    let marker = busybox::layer_of(&[busybox::Entry::File("marker", b"the image's own layer")]);
    let base = busybox::layer_tar();
    let image_config = busybox::config_of(&[&base, &marker], &["sh"]);
    let push_artifact = |repo: &str, config: &[u8], files: &[(&[u8], &str)]| {
        reg.push_blob(repo, None, config);
        let mut layers = Vec::new();
        for (data, title) in files {
            reg.push_blob(repo, None, data);
            layers.push(serde_json::json!({"mediaType": "application/octet-stream",
                "digest": busybox::sha(data), "size": data.len(),
                "annotations": {"org.opencontainers.image.title": title}}));
        }
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "artifactType": "application/vnd.example.model.v1",
            "config": {"mediaType": "application/vnd.oci.empty.v1+json",
                "digest": busybox::sha(config), "size": config.len()},
            "layers": layers,
        }))
        .unwrap();
        reg.push_manifest(
            repo,
            "v1",
            None,
            &manifest,
            "application/vnd.oci.image.manifest.v1+json",
        );
        format!("{}/{repo}:v1", reg.addr)
    };
    let a = push_artifact(
        "tenant-a/model",
        &empty,
        &[(b"tenant a's weights", "model.bin")],
    );
    let b = push_artifact(
        "tenant-b/model",
        &empty,
        &[(b"tenant b's weights", "model.bin")],
    );
    // The same blob under another title is another file.
    let b2 = push_artifact(
        "tenant-b/renamed",
        &empty,
        &[(b"tenant b's weights", "other.bin")],
    );
    let poison = push_artifact("tenant-c/poison", &empty, &[(&marker, "poison")]);
    let hijack = push_artifact("tenant-c/hijack", &image_config, &[(b"x", "x")]);
    let (d, rt, mut c) = daemon(&env);
    let mut ic = image_client(&rt, &d);
    let pull =
        |ic: &mut cri::image_service_client::ImageServiceClient<tonic::transport::Channel>,
         name: &str|
         -> String {
            rt.block_on(ic.pull_image(cri::PullImageRequest {
                image: Some(cri::ImageSpec {
                    image: name.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }))
            .unwrap()
            .into_inner()
            .image_ref
        };
    let ids: Vec<String> = [&a, &b, &b2, &poison]
        .iter()
        .map(|n| pull(&mut ic, n))
        .collect();
    let unique: std::collections::HashSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), 4, "each artifact is its own image: {ids:?}");
    // The image is pulled after the artifact whose blob is its layer's tar, then an artifact
    // with its config.
    let gz = |t: &[u8]| busybox::stored_gzip(t);
    reg.push_image(
        "tenant-d/app",
        "v1",
        None,
        &[gz(&base), gz(&marker)],
        &image_config,
    );
    let app = format!("{}/tenant-d/app:v1", reg.addr);
    let app_id = pull(&mut ic, &app);
    assert_eq!(app_id, busybox::sha(&image_config));
    let hijack_id = pull(&mut ic, &hijack);
    assert_ne!(hijack_id, app_id);
    let p = pod("artifact-id", serde_json::json!({}));
    let sb = run_pod(&rt, &mut c, &p);
    let vol = |path: &str, name: &str| cri::Mount {
        container_path: path.into(),
        image: Some(cri::ImageSpec {
            image: name.into(),
            ..Default::default()
        }),
        readonly: true,
        ..Default::default()
    };
    let mut cfg = ctr("app", &["sleep", "1000"], serde_json::json!({}));
    cfg.image = Some(cri::ImageSpec {
        image: app.clone(),
        ..Default::default()
    });
    cfg.mounts = vec![vol("/a", &a), vol("/b", &b), vol("/b2", &b2)];
    let id = create(&rt, &mut c, &sb, &p, cfg).expect("the image is still a runnable image");
    start(&rt, &mut c, &id);
    assert_eq!(
        exec(&rt, &mut c, &id, "cat /marker"),
        "the image's own layer"
    );
    assert!(!exec(&rt, &mut c, &id, "ls /").contains("poison"));
    assert_eq!(
        exec(&rt, &mut c, &id, "cat /a/model.bin"),
        "tenant a's weights"
    );
    assert_eq!(
        exec(&rt, &mut c, &id, "cat /b/model.bin"),
        "tenant b's weights"
    );
    assert_eq!(exec(&rt, &mut c, &id, "ls /b2"), "other.bin\n");
    remove_pod(&rt, &mut c, &sb);
    env.assert_no_leaks();
}
