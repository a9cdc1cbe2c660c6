//! Lazy eStargz and zstd:chunked layers (`[images] lazy_pull`): pulled from a real registry (Debian's
//! docker-registry), served by `sandboxd lazyfs` over FUSE, run before the last byte arrived;
//! completed in the background into an unpacked layer that later containers stack; unmounted
//! with the image. And what hostile layers and registries do: a TOC pointing outside the
//! blob (refused), chunk digests that lie (EIO, not wrong bytes), a registry that ignores
//! Range (the full pull), one that stops answering ranges mid-way (EIO within the bound, not
//! a hang).

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::busybox::{config_of, layer_of, layer_tar, noise, sha, Entry};
use common::registry::Registry;
use common::*;
use sandboxd::image::estargz::{self, WriteOptions};
use sandboxd::image::zstd_chunked;
use sandboxd::image::Auth;
use sandboxd::{ContainerConfig, ContainerState};

/// The test's env and registry; None (the test skips, saying why) without FUSE.
fn start(test: &str) -> Option<(Env, Registry)> {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("SKIPPED: no /dev/fuse on this machine");
        return None;
    }
    let env = Env::new(test);
    let reg = Registry::start(&env.base.join("registry"), None);
    Some((env, reg))
}

/// An eStargz blob of `tar`, its uncompressed stream (for the config's diff id) and its TOC
/// digest.
fn estargz_of(tar: &[u8], prefetch: &[&str], chunk: u64) -> (Vec<u8>, Vec<u8>, String) {
    let mut blob = Vec::new();
    let w = estargz::write(
        tar,
        &mut blob,
        &WriteOptions {
            chunk_size: chunk,
            prefetch: prefetch.iter().map(|s| s.to_string()).collect(),
        },
    )
    .unwrap();
    (blob.clone(), plain(&blob), w.toc_digest)
}

fn plain(blob: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(blob)
        .read_to_end(&mut out)
        .unwrap();
    out
}

/// `blob` with its TOC entries changed by `f` (a new TOC member and footer after the same
/// file members): the new blob, its plain stream, its TOC digest.
fn retoc(blob: &[u8], f: impl Fn(&mut Vec<serde_json::Value>)) -> (Vec<u8>, Vec<u8>, String) {
    let off = estargz::parse_footer(&blob[blob.len() - 51..]).unwrap() as usize;
    let json = estargz::toc_json(&blob[off..blob.len() - 51]).unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&json).unwrap();
    f(v["entries"].as_array_mut().unwrap());
    let json = serde_json::to_vec(&v).unwrap();
    let mut h = tar::Header::new_ustar();
    h.set_path(estargz::TOC_NAME).unwrap();
    h.set_size(json.len() as u64);
    h.set_mode(0o444);
    h.set_cksum();
    let mut t = h.as_bytes().to_vec();
    t.extend_from_slice(&json);
    t.resize(t.len().div_ceil(512) * 512 + 1024, 0);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &t).unwrap();
    let mut out = blob[..off].to_vec();
    out.extend_from_slice(&gz.finish().unwrap());
    out.extend_from_slice(&estargz::footer(off as u64));
    let p = plain(&out);
    (out, p, sha(&json))
}

fn ann(toc: &str) -> serde_json::Value {
    serde_json::json!({ estargz::TOC_DIGEST_ANNOTATION: toc })
}

/// The lazy mounts (mountinfo's mount points of `fuse.sandboxd-lazy`) under `root`.
fn lazy_mounts(root: &Path) -> Vec<String> {
    let r = root.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(" - fuse.sandboxd-lazy "))
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|m| m.starts_with(&r))
        .collect()
}

/// The pids of `sandboxd lazyfs` servers of layers under `root`.
fn servers(root: &Path) -> Vec<i32> {
    let r = root.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let c = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let c = String::from_utf8_lossy(&c).replace('\0', " ");
            c.contains(" lazyfs ") && c.contains(&r)
        })
        .collect()
}

/// Bytes of `GET …/blobs/<digest>` answers, by status (docker-registry's access log:
/// `"GET … HTTP/1.1" 206 1048576 …`).
fn served(reg: &Registry, digest: &str) -> (u64, u64, usize) {
    let (mut partial, mut whole, mut n) = (0, 0, 0);
    for l in reg.blob_requests(digest) {
        let after = l.split("HTTP/1.1\" ").nth(1).unwrap_or("");
        let mut it = after.split(' ');
        let status = it.next().unwrap_or("");
        let bytes: u64 = it.next().and_then(|b| b.parse().ok()).unwrap_or(0);
        match status {
            "206" => {
                partial += bytes;
                n += 1;
            }
            "200" => whole += bytes,
            _ => {}
        }
    }
    (partial, whole, n)
}

fn lazy_runtime(env: &Env) -> sandboxd::Runtime {
    let mut cfg = env.cfg.clone();
    cfg.images.lazy_pull = true;
    cfg.images.lazy_helper = Some(PathBuf::from(env!("CARGO_BIN_EXE_sandboxd")));
    cfg.images.lazy_fetch_timeout_seconds = 1;
    // What the pull and the first container fetch is seen apart from the background's.
    cfg.images.lazy_background_delay_seconds = 8;
    sandboxd::Runtime::new(cfg).unwrap()
}

fn wait_until(what: &str, limit: Duration, f: impl Fn() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn run_to_exit(
    rt: &sandboxd::Runtime,
    env: &Env,
    sb: &str,
    image: &str,
    name: &str,
    cmd: &str,
) -> (String, String) {
    let c = ContainerConfig {
        metadata: sandboxd::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        },
        image: image.into(),
        command: vec!["sh".into(), "-c".into(), cmd.into()],
        log_path: format!("{name}.log"),
        ..Default::default()
    };
    let id = rt.create_container(sb, &c).unwrap();
    rt.start_container(&id).unwrap();
    wait_until("the container exits", Duration::from_secs(30), || {
        rt.container_status(&id).unwrap().state == ContainerState::Exited
    });
    let log = std::fs::read_to_string(env.base.join(format!("logs/{name}.log"))).unwrap();
    (id, log)
}

/// A pod `pod_name` running a container of `image` that reads `/data/hello` (expecting
/// `hello`) and the first 100 bytes of `/data/big.bin`, to its exit: the pod and container.
fn run_reader(
    rt: &sandboxd::Runtime,
    env: &Env,
    pod_name: &str,
    image: &str,
    hello: &str,
) -> (String, String) {
    let mut pod = env.pod(pod_name, false);
    pod.log_directory = env.base.join("logs").to_string_lossy().into();
    let sb = rt.run_pod_sandbox(&pod).unwrap();
    let (first, log) = run_to_exit(
        rt,
        env,
        &sb,
        image,
        "first",
        "cat /data/hello; head -c 100 /data/big.bin | wc -c",
    );
    assert!(
        log.contains(&format!("stdout F {hello}")) && log.contains("stdout F 100"),
        "{log}"
    );
    (sb, first)
}

/// The 16 bytes at `off` of the file at `path` are those of `want`.
fn assert_bytes_at(path: &Path, want: &[u8], off: usize) {
    let f = std::fs::File::open(path).unwrap();
    let mut b = [0u8; 16];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, off as u64).unwrap();
    assert_eq!(&b, &want[off..off + 16]);
}

/// The lowerdirs of the rootfs overlay mounted at `rootfs`.
fn lowerdirs(rootfs: &Path) -> String {
    let r = rootfs.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(r.as_str()))
        .and_then(|l| l.split("lowerdir=").nth(1))
        .map(|s| s.split(',').next().unwrap_or("").to_string())
        .unwrap_or_default()
}

#[test]
fn lazy_pull_runs_before_the_layer_arrives_then_completes_and_unmounts() {
    let Some((env, reg)) = start("lazy-run") else {
        return;
    };
    // busybox, its binary prefetched; a 48 MiB data layer of which the container reads 6 bytes.
    let (bb, bb_plain, bb_toc) = estargz_of(&layer_tar(), &["bin/busybox"], 4 << 20);
    let big = noise(48 << 20, 0x2545_f491_4f6c_dd1d);
    let data_tar = layer_of(&[
        Entry::File("data/big.bin", &big),
        Entry::File("data/hello", b"hello\n"),
        Entry::Symlink("data/link", "hello"),
    ]);
    let (data, data_plain, data_toc) = estargz_of(&data_tar, &[], 1 << 20);
    let config = config_of(&[&bb_plain, &data_plain], &["sh"]);
    reg.push_annotated(
        "test/lazy",
        "1",
        &[(bb.clone(), ann(&bb_toc)), (data.clone(), ann(&data_toc))],
        &config,
    );
    let rt = lazy_runtime(&env);
    let name = format!("{}/test/lazy:1", reg.addr);
    let img = rt.pull_image(&name, &Auth::default()).unwrap();
    let root = &env.cfg.root;
    let mounts = lazy_mounts(root);
    assert_eq!(mounts.len(), 2, "two lazy mounts: {mounts:?}");
    let data_dir = root
        .join("images/lazy")
        .join(&img.layers[1]["sha256:".len()..]);
    // What the pull fetched of the big layer: its footer and TOC, by range, nothing whole.
    let (partial, whole, _) = served(&reg, &sha(&data));
    assert_eq!(whole, 0, "the big layer was fetched whole");
    assert!(
        partial < 64 << 10,
        "the pull fetched {partial} bytes of the big layer"
    );
    // The tree is there at once, with its modes, sizes and links.
    let mnt = data_dir.join("mnt");
    let meta = std::fs::metadata(mnt.join("data/big.bin")).unwrap();
    assert_eq!(meta.len(), big.len() as u64);
    assert_eq!(
        std::fs::read_link(mnt.join("data/link")).unwrap(),
        Path::new("hello")
    );
    assert!(!mnt.join(estargz::TOC_NAME).exists());
    // The modes are the layer's; nothing is writable, not even for root.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(mnt.join("data/hello"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o644
    );
    let e = std::fs::OpenOptions::new()
        .write(true)
        .open(mnt.join("data/hello"))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");

    // A daemon restart leaves the servers serving (their own sessions) and the image listed.
    drop(rt);
    let rt = lazy_runtime(&env);
    assert_eq!(lazy_mounts(root).len(), 2);
    assert!(rt.images().get(&name).is_some());
    // A container runs from the lazy layers and prints what it read.
    let (sb, first) = run_reader(&rt, &env, "lazy", &name, "hello");
    // A byte deep in the big file is what the layer holds.
    assert_bytes_at(&mnt.join("data/big.bin"), &big, 40 << 20);

    // The background fetch completes each layer: unpacked (diff id checked) beside the mount.
    for l in &img.layers {
        let d = root.join("images/layers").join(&l["sha256:".len()..]);
        wait_until(
            "the layer is completed and unpacked",
            Duration::from_secs(120),
            || d.is_dir(),
        );
    }
    let unpacked = root
        .join("images/layers")
        .join(&img.layers[1]["sha256:".len()..]);
    assert_eq!(std::fs::read(unpacked.join("data/big.bin")).unwrap(), big);
    assert!(!unpacked.join(estargz::TOC_NAME).exists());
    assert!(!unpacked.join(estargz::NO_PREFETCH_LANDMARK).exists());
    // The reads fetched a few blocks by range; the background fetched the rest in one
    // stream, as a full pull does, its start (which the reads had) read from the read cache
    // (and wrote nothing of it into the read cache): no byte of the blob came twice but
    // the blocks around what was read.
    let (partial, whole, requests) = served(&reg, &sha(&data));
    let len = data.len() as u64;
    assert!(
        partial + whole >= len && partial + whole < len + (8 << 20) && requests < 16,
        "{requests} ranges of {partial} bytes, {whole} bytes whole, of a {len}-byte blob"
    );
    // The busybox layer's prefetch took it whole: its completion asked the registry for
    // nothing more.
    let (bb_partial, bb_whole, _) = served(&reg, &sha(&bb));
    assert!(
        bb_whole == 0 && bb_partial < bb.len() as u64 + (256 << 10),
        "the busybox layer ({} bytes) was served {bb_partial} bytes by range, {bb_whole} whole",
        bb.len()
    );
    let cache = std::fs::metadata(data_dir.join("blob")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert!(
        cache.blocks() * 512 < 8 << 20,
        "the read cache holds {} bytes",
        cache.blocks() * 512
    );
    // Reads of what no read fetched now come from the unpacked layer (no more ranges).
    assert_bytes_at(&mnt.join("data/big.bin"), &big, 20 << 20);
    assert_eq!(
        served(&reg, &sha(&data)).2,
        requests,
        "a read after completion asked the registry"
    );
    // A container made now stacks the unpacked layers; the first one kept its lazy mount.
    let c = ContainerConfig {
        metadata: sandboxd::ContainerMetadata {
            name: "second".into(),
            attempt: 0,
        },
        image: name.clone(),
        command: vec!["cat".into(), "/data/hello".into()],
        log_path: "second.log".into(),
        ..Default::default()
    };
    let second = rt.create_container(&sb, &c).unwrap();
    let rootfs = root.join("containers").join(&second).join("rootfs");
    let lower = lowerdirs(&rootfs);
    assert!(
        lower.contains("/images/layers/") && !lower.contains("/images/lazy/"),
        "{lower}"
    );
    let lower_first = lowerdirs(&root.join("containers").join(&first).join("rootfs"));
    assert!(lower_first.contains("/images/lazy/"), "{lower_first}");

    // The image goes: its lazy layers are unmounted and their servers end.
    assert_eq!(servers(root).len(), 2, "one server per lazy layer");
    rt.remove_container(&second).unwrap();
    rt.remove_container(&first).unwrap();
    rt.remove_pod_sandbox(&sb).unwrap();
    rt.remove_image(&name).unwrap();
    assert!(lazy_mounts(root).is_empty(), "{:?}", lazy_mounts(root));
    wait_until("the servers end", Duration::from_secs(10), || {
        servers(root).is_empty()
    });
    // (Its dot files are the servers' shared marker and slots.)
    let left: Vec<_> = std::fs::read_dir(root.join("images/lazy"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    env.assert_no_leaks();
}

/// A TOC that points outside the blob is refused at pull; one whose chunk digests lie is
/// served, and reading the lying file fails with EIO rather than giving the bytes.
#[test]
fn hostile_tocs_refused_and_lying_chunks_read_as_eio() {
    let Some((env, reg)) = start("lazy-hostile") else {
        return;
    };
    let tar = layer_of(&[
        Entry::File("ok", b"fine\n"),
        Entry::File("liar", &noise(3 << 20, 7)),
    ]);
    let (blob, _, _) = estargz_of(&tar, &[], 1 << 20);
    let rt = lazy_runtime(&env);
    // 1. A chunk offset past the TOC.
    let (outside, outside_plain, outside_toc) = retoc(&blob, |es| {
        for e in es.iter_mut().filter(|e| e["name"] == "liar") {
            e["offset"] = serde_json::json!(1u64 << 40);
        }
    });
    reg.push_annotated(
        "test/outside",
        "1",
        &[(outside, ann(&outside_toc))],
        &config_of(&[&outside_plain], &["sh"]),
    );
    let e = rt
        .pull_image(&format!("{}/test/outside:1", reg.addr), &Auth::default())
        .unwrap_err();
    assert!(
        matches!(e, sandboxd::Error::InvalidArgument(_))
            && e.to_string().contains("not before the TOC"),
        "{e}"
    );
    // 2. The TOC's digest annotation does not match the TOC.
    let (honest, honest_plain, _) = retoc(&blob, |_| {});
    reg.push_annotated(
        "test/wrongtoc",
        "1",
        &[(honest, ann(&format!("sha256:{}", "0".repeat(64))))],
        &config_of(&[&honest_plain], &["sh"]),
    );
    let e = rt
        .pull_image(&format!("{}/test/wrongtoc:1", reg.addr), &Auth::default())
        .unwrap_err();
    assert!(e.to_string().contains("annotation says"), "{e}");
    assert!(lazy_mounts(&env.cfg.root).is_empty());
    // 3. Chunk digests that lie: the second chunk of "liar" claims other bytes.
    let (lying, lying_plain, lying_toc) = retoc(&blob, |es| {
        for e in es
            .iter_mut()
            .filter(|e| e["name"] == "liar" && e["type"] == "chunk")
        {
            e["chunkDigest"] = serde_json::json!(format!("sha256:{}", "ab".repeat(32)));
        }
    });
    reg.push_annotated(
        "test/lying",
        "1",
        &[(lying, ann(&lying_toc))],
        &config_of(&[&lying_plain], &["sh"]),
    );
    let name = format!("{}/test/lying:1", reg.addr);
    let img = rt.pull_image(&name, &Auth::default()).unwrap();
    let mnt = env
        .cfg
        .root
        .join("images/lazy")
        .join(&img.layers[0]["sha256:".len()..])
        .join("mnt");
    assert_eq!(std::fs::read(mnt.join("ok")).unwrap(), b"fine\n");
    let f = std::fs::File::open(mnt.join("liar")).unwrap();
    let mut b = vec![0u8; 4096];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, 0).unwrap();
    let e = std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, (1 << 20) + 10).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    drop(f);
    // 4. The server killed (as a reboot would end it): the next start removes the layer and
    // drops the image that named it, so kubelet pulls it again.
    for pid in servers(&env.cfg.root) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL).unwrap();
    }
    wait_until("the server dies", Duration::from_secs(10), || {
        servers(&env.cfg.root).is_empty()
    });
    drop(rt);
    let rt = lazy_runtime(&env);
    assert!(
        rt.images().get(&name).is_none(),
        "the image of a lost lazy layer is still listed"
    );
    assert!(lazy_mounts(&env.cfg.root).is_empty());
    assert!(!env
        .cfg
        .root
        .join("images/lazy")
        .join(&img.layers[0]["sha256:".len()..])
        .exists());
    drop(rt);
    env.assert_no_leaks();
}

/// A registry that ignores `Range` (answers 200 with the whole blob): the layer is pulled
/// whole, as any other; a registry that stops answering range requests after the TOC: a read
/// of a file not fetched yet fails with EIO within the bound, and the server keeps serving
/// what it has.
#[test]
fn registries_that_ignore_or_drop_ranges() {
    use common::fake_registry::{Answer, FakeRegistry};
    if !Path::new("/dev/fuse").exists() {
        eprintln!("SKIPPED: no /dev/fuse on this machine");
        return;
    }
    let env = Env::new("lazy-ranges");
    let tar = layer_of(&[
        Entry::File("f", &noise(2 << 20, 11)),
        Entry::File("g", b"gee\n"),
    ]);
    let (blob, plain, toc) = estargz_of(&tar, &[], 1 << 20);
    let config = config_of(&[&plain], &["sh"]);
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha(&config), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": sha(&blob), "size": blob.len(), "annotations": ann(&toc)}],
    }))
    .unwrap();
    let toc_off = estargz::parse_footer(&blob[blob.len() - 51..]).unwrap() as usize;
    let route = {
        let (manifest, config, blob) = (manifest.clone(), config.clone(), blob.clone());
        move |path: &str, range: Option<(usize, usize)>, ranged: bool| -> Option<Answer> {
            if path.contains("/manifests/") {
                return Some(Answer::json(
                    manifest.clone(),
                    "application/vnd.oci.image.manifest.v1+json",
                ));
            }
            if path.ends_with(&sha(&config)) {
                return Some(Answer::json(config.clone(), "application/octet-stream"));
            }
            if !path.ends_with(&sha(&blob)) {
                return None;
            }
            match (ranged, range) {
                (true, Some((s, e))) if s >= toc_off => {
                    let mut a = Answer::json(blob[s..=e].to_vec(), "application/octet-stream");
                    a.status = 206;
                    a.headers
                        .push(format!("Content-Range: bytes {s}-{e}/{}", blob.len()));
                    Some(a)
                }
                // File content asked for: an error (the registry broke after the pull).
                (true, Some(_)) => Some(Answer {
                    status: 503,
                    ..Answer::json(b"down".to_vec(), "text/plain")
                }),
                _ => Some(Answer::json(blob.clone(), "application/octet-stream")),
            }
        }
    };
    let rt = lazy_runtime(&env);
    // 1. Ranges ignored: the whole layer, unpacked, no lazy mount.
    let whole = {
        let route = route.clone();
        FakeRegistry::start_with_range(move |p, r| route(p, r, false))
    };
    let img = rt
        .pull_image(&format!("{}/test/whole:1", whole.addr), &Auth::default())
        .unwrap();
    assert!(rt.images().has_layer(&img.layers[0]));
    assert!(lazy_mounts(&env.cfg.root).is_empty());
    rt.remove_image(&img.id).unwrap();
    // 2. Content ranges fail: the pull (footer, TOC) works, a read fails with EIO in bounded
    // time (1 s a request, three attempts).
    let broken = FakeRegistry::start_with_range(move |p, r| route(p, r, true));
    let img = rt
        .pull_image(&format!("{}/test/broken:1", broken.addr), &Auth::default())
        .unwrap();
    let mnt = env
        .cfg
        .root
        .join("images/lazy")
        .join(&img.layers[0]["sha256:".len()..])
        .join("mnt");
    assert_eq!(std::fs::metadata(mnt.join("g")).unwrap().len(), 4);
    let t = Instant::now();
    let e = std::fs::read(mnt.join("g")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "EIO after {:?}",
        t.elapsed()
    );
    rt.remove_image(&img.id).unwrap();
    assert!(lazy_mounts(&env.cfg.root).is_empty());
    wait_until("the server ends", Duration::from_secs(10), || {
        servers(&env.cfg.root).is_empty()
    });
    env.assert_no_leaks();
}

/// A pod with its own user namespace stacks lazy layers idmapped (FUSE takes idmapped mounts
/// where the kernel offers them to a server that asks, 6.12 on): the image's files are root's
/// in the pod and read through the lazy view.
#[test]
fn lazy_layers_in_a_user_namespace_pod() {
    let Some((env, reg)) = start("lazy-userns") else {
        return;
    };
    let (bb, bb_plain, bb_toc) = estargz_of(&layer_tar(), &[], 4 << 20);
    let data_tar = layer_of(&[Entry::File("data/hello", b"hello from the lazy layer\n")]);
    let (data, data_plain, data_toc) = estargz_of(&data_tar, &[], 1 << 20);
    reg.push_annotated(
        "test/lazy-userns",
        "1",
        &[(bb, ann(&bb_toc)), (data, ann(&data_toc))],
        &config_of(&[&bb_plain, &data_plain], &["sh"]),
    );
    let mut cfg = env.cfg.clone();
    cfg.images.lazy_pull = true;
    cfg.images.lazy_helper = Some(PathBuf::from(env!("CARGO_BIN_EXE_sandboxd")));
    // The background fetch waits: the container must read through the FUSE view.
    cfg.images.lazy_background_delay_seconds = 600;
    let rt = sandboxd::Runtime::new(cfg).unwrap();
    let name = format!("{}/test/lazy-userns:1", reg.addr);
    rt.pull_image(&name, &Auth::default()).unwrap();
    const HOST: u32 = 65536 * 213;
    let map = vec![sandboxd::model::sandbox::IdMapping {
        container_id: 0,
        host_id: HOST,
        length: 65536,
    }];
    let mut pod = env.pod("lazy-userns", false);
    pod.log_directory = env.base.join("logs").to_string_lossy().into();
    pod.user_namespace = Some(sandboxd::model::sandbox::IdMap {
        uids: map.clone(),
        gids: map,
    });
    let sb = match rt.run_pod_sandbox(&pod) {
        Ok(sb) => sb,
        Err(sandboxd::Error::Unimplemented(why)) => {
            eprintln!("SKIPPED: this node offers no user namespaces: {why}");
            rt.remove_image(&name).unwrap();
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let (id, log) = run_to_exit(
        &rt,
        &env,
        &sb,
        &name,
        "reader",
        "cat /data/hello; stat -c owner=%u /data/hello",
    );
    assert!(
        log.contains("stdout F hello from the lazy layer") && log.contains("stdout F owner=0"),
        "{log}"
    );
    let root = &env.cfg.root;
    assert!(
        !root
            .join("images/layers")
            .join(&rt.images().get(&name).unwrap().layers[1]["sha256:".len()..])
            .exists(),
        "the layer was unpacked: the container did not read the lazy view"
    );
    rt.remove_container(&id).unwrap();
    rt.remove_pod_sandbox(&sb).unwrap();
    rt.remove_image(&name).unwrap();
    assert!(lazy_mounts(root).is_empty(), "{:?}", lazy_mounts(root));
    wait_until("the servers end", Duration::from_secs(10), || {
        servers(root).is_empty()
    });
    env.assert_no_leaks();
}

/// A zstd:chunked blob of `tar` (chunks of `chunk` bytes), its annotations as the manifest
/// carries them; the blob decompresses to `tar` itself.
fn zstd_chunked_of(tar: &[u8], chunk: u64) -> (Vec<u8>, serde_json::Value) {
    let mut blob = Vec::new();
    let w = zstd_chunked::write(tar, &mut blob, chunk).unwrap();
    let ann: serde_json::Map<String, serde_json::Value> = w
        .annotations
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
        .collect();
    (blob, serde_json::Value::Object(ann))
}

/// `blob` (zstd:chunked, annotated `ann`) with its TOC entries changed by `f`: the file frames
/// kept, a new TOC frame (and empty tar-split and footer) after them; the new annotations.
fn zstd_retoc(
    blob: &[u8],
    ann: &serde_json::Value,
    f: impl Fn(&mut Vec<serde_json::Value>),
) -> (Vec<u8>, serde_json::Value) {
    let pos = zstd_chunked::Position::parse(
        ann[zstd_chunked::MANIFEST_POSITION_ANNOTATION]
            .as_str()
            .unwrap(),
        blob.len() as u64,
    )
    .unwrap();
    let z = &blob[pos.offset as usize..(pos.offset + pos.length) as usize];
    let json = zstd_chunked::toc_json(z, pos.uncompressed).unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&json).unwrap();
    f(v["entries"].as_array_mut().unwrap());
    let json = serde_json::to_vec(&v).unwrap();
    let z = zstd::bulk::compress(&json, 3).unwrap();
    let start = pos.frame_start() as usize;
    let mut out = blob[..start].to_vec();
    let skippable = |out: &mut Vec<u8>, data: &[u8]| {
        out.extend_from_slice(&[0x50, 0x2a, 0x4d, 0x18]);
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(data);
    };
    skippable(&mut out, &z);
    let mut ann = ann.clone();
    ann[zstd_chunked::MANIFEST_CHECKSUM_ANNOTATION] = serde_json::json!(sha(&z));
    ann[zstd_chunked::MANIFEST_POSITION_ANNOTATION] =
        serde_json::json!(format!("{}:{}:{}:1", start + 8, z.len(), json.len()));
    (out, ann)
}

/// zstd:chunked layers (containers/storage's format, as podman pushes them) take the same
/// lazy path: the TOC read by the range its position annotation names and checked against
/// its checksum annotation, the container run before the layer arrived, the layer completed
/// into an unpacked one equal to the tar; a name eStargz keeps for itself is an ordinary file
/// here. And what hostile zstd:chunked layers do: a position outside the blob and a checksum
/// that lies are refused at pull, chunk digests that lie read as EIO.
#[test]
fn zstd_chunked_layers_are_lazy_too() {
    let Some((env, reg)) = start("lazy-zstd") else {
        return;
    };
    let big = noise(12 << 20, 0x1234_5678_9abc_def1);
    let data_tar = layer_of(&[
        Entry::File("data/big.bin", &big),
        Entry::File("data/hello", b"hello zstd\n"),
        Entry::Symlink("data/link", "hello"),
        Entry::File("stargz.index.json", b"not eStargz's\n"),
    ]);
    let bb_tar = layer_tar();
    let (bb, bb_ann) = zstd_chunked_of(&bb_tar, 4 << 20);
    let (data, data_ann) = zstd_chunked_of(&data_tar, 1 << 20);
    reg.push_annotated(
        "test/zstd",
        "1",
        &[
            (bb.clone(), bb_ann.clone()),
            (data.clone(), data_ann.clone()),
        ],
        &config_of(&[&bb_tar, &data_tar], &["sh"]),
    );
    let rt = lazy_runtime(&env);
    let root = &env.cfg.root;
    let name = format!("{}/test/zstd:1", reg.addr);
    let img = rt.pull_image(&name, &Auth::default()).unwrap();
    assert_eq!(lazy_mounts(root).len(), 2, "{:?}", lazy_mounts(root));
    let (partial, whole, _) = served(&reg, &sha(&data));
    assert_eq!(whole, 0, "the data layer was fetched whole");
    assert!(partial < 64 << 10, "the pull fetched {partial} bytes");
    let data_dir = root
        .join("images/lazy")
        .join(&img.layers[1]["sha256:".len()..]);
    let mnt = data_dir.join("mnt");
    assert_eq!(
        std::fs::metadata(mnt.join("data/big.bin")).unwrap().len(),
        big.len() as u64
    );
    assert_eq!(
        std::fs::read(mnt.join("stargz.index.json")).unwrap(),
        b"not eStargz's\n"
    );
    let (sb, first) = run_reader(&rt, &env, "lazy-zstd", &name, "hello zstd");
    assert_bytes_at(&mnt.join("data/big.bin"), &big, 9 << 20);
    // (Two chunks of the 12 read, each a 1 MiB frame over two 1 MiB blocks.)
    let (partial, _, _) = served(&reg, &sha(&data));
    assert!(partial < 8 << 20, "the reads fetched {partial} bytes");
    // Completed in the background: the unpacked layer is the tar, the diff id checked.
    for l in &img.layers {
        let d = root.join("images/layers").join(&l["sha256:".len()..]);
        wait_until("the layer is completed", Duration::from_secs(120), || {
            d.is_dir()
        });
    }
    let unpacked = root
        .join("images/layers")
        .join(&img.layers[1]["sha256:".len()..]);
    assert_eq!(std::fs::read(unpacked.join("data/big.bin")).unwrap(), big);
    assert_eq!(
        std::fs::read(unpacked.join("stargz.index.json")).unwrap(),
        b"not eStargz's\n"
    );
    rt.remove_container(&first).unwrap();
    rt.remove_pod_sandbox(&sb).unwrap();
    rt.remove_image(&name).unwrap();

    // Hostile: a TOC position past the blob's end.
    let mut outside_ann = data_ann.clone();
    outside_ann[zstd_chunked::MANIFEST_POSITION_ANNOTATION] =
        serde_json::json!(format!("{}:100:100:1", data.len() + 1));
    reg.push_annotated(
        "test/zstd-outside",
        "1",
        &[(data.clone(), outside_ann)],
        &config_of(&[&data_tar], &["sh"]),
    );
    let e = rt
        .pull_image(
            &format!("{}/test/zstd-outside:1", reg.addr),
            &Auth::default(),
        )
        .unwrap_err();
    assert!(
        matches!(e, sandboxd::Error::InvalidArgument(_))
            && e.to_string().contains("outside the blob"),
        "{e}"
    );
    // A checksum annotation that is not the TOC's.
    let mut lying_sum = data_ann.clone();
    lying_sum[zstd_chunked::MANIFEST_CHECKSUM_ANNOTATION] =
        serde_json::json!(format!("sha256:{}", "0".repeat(64)));
    reg.push_annotated(
        "test/zstd-sum",
        "1",
        &[(data.clone(), lying_sum)],
        &config_of(&[&data_tar], &["sh"]),
    );
    let e = rt
        .pull_image(&format!("{}/test/zstd-sum:1", reg.addr), &Auth::default())
        .unwrap_err();
    assert!(e.to_string().contains("annotation says"), "{e}");
    // A chunk offset past the TOC (the TOC itself honest about it).
    let (outside, outside_ann) = zstd_retoc(&data, &data_ann, |es| {
        for e in es.iter_mut().filter(|e| e["name"] == "data/hello") {
            e["offset"] = serde_json::json!(1u64 << 40);
        }
    });
    reg.push_annotated(
        "test/zstd-chunk-outside",
        "1",
        &[(outside, outside_ann)],
        &config_of(&[&data_tar], &["sh"]),
    );
    let e = rt
        .pull_image(
            &format!("{}/test/zstd-chunk-outside:1", reg.addr),
            &Auth::default(),
        )
        .unwrap_err();
    assert!(e.to_string().contains("not before the TOC"), "{e}");
    assert!(lazy_mounts(root).is_empty(), "{:?}", lazy_mounts(root));
    // Chunk digests that lie: the big file's later chunks claim other bytes.
    let (lying, lying_ann) = zstd_retoc(&data, &data_ann, |es| {
        for e in es
            .iter_mut()
            .filter(|e| e["name"] == "data/big.bin" && e["type"] == "chunk")
        {
            e["chunkDigest"] = serde_json::json!(format!("sha256:{}", "ab".repeat(32)));
        }
    });
    reg.push_annotated(
        "test/zstd-lying",
        "1",
        &[(lying, lying_ann)],
        &config_of(&[&data_tar], &["sh"]),
    );
    let lying_name = format!("{}/test/zstd-lying:1", reg.addr);
    let img = rt.pull_image(&lying_name, &Auth::default()).unwrap();
    let mnt = root
        .join("images/lazy")
        .join(&img.layers[0]["sha256:".len()..])
        .join("mnt");
    assert_eq!(
        std::fs::read(mnt.join("data/hello")).unwrap(),
        b"hello zstd\n"
    );
    let f = std::fs::File::open(mnt.join("data/big.bin")).unwrap();
    let mut b = vec![0u8; 4096];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, 0).unwrap();
    let e = std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, (1 << 20) + 10).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    drop(f);
    rt.remove_image(&lying_name).unwrap();
    assert!(lazy_mounts(root).is_empty(), "{:?}", lazy_mounts(root));
    wait_until("the servers end", Duration::from_secs(10), || {
        servers(root).is_empty()
    });
    drop(rt);
    env.assert_no_leaks();
}
