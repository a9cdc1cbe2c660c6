//! A busybox image the tests build themselves from Debian's busybox-static: as an OCI image
//! layout (gzip layer) and as a docker-archive tar (plain layer).

use std::path::{Path, PathBuf};

use sha2::Digest;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn sha(b: &[u8]) -> String {
    format!("sha256:{}", hex(&sha2::Sha256::digest(b)))
}

const APPLETS: &[&str] = &[
    "sh", "cat", "echo", "sleep", "id", "ls", "touch", "grep", "nc", "wget", "true", "false",
    "kill", "ps", "head", "yes", "env", "hostname", "ip", "printf", "tail", "dd", "wc", "seq",
    "tr", "sed", "mkdir", "rm", "cut", "cmp", "stat", "unshare", "mount", "stty", "tty", "netstat",
];

/// The uncompressed layer tar: /bin/busybox plus applet symlinks, /etc/passwd with an `app`
/// user (uid 1234), and the usual mount points.
pub fn layer_tar() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let dir = |b: &mut tar::Builder<Vec<u8>>, p: &str, mode: u32| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(mode);
        h.set_size(0);
        b.append_data(&mut h, p, &[][..]).unwrap();
    };
    for d in ["bin", "etc", "proc", "sys", "dev", "root", "home", "var"] {
        dir(&mut b, d, 0o755);
    }
    dir(&mut b, "tmp", 0o1777);
    let file = |b: &mut tar::Builder<Vec<u8>>, p: &str, mode: u32, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(mode);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, p, data).unwrap();
    };
    file(
        &mut b,
        "bin/busybox",
        0o755,
        &std::fs::read("/bin/busybox").expect("busybox-static installed (scripts/setup)"),
    );
    file(
        &mut b,
        "etc/passwd",
        0o644,
        b"root:x:0:0:root:/root:/bin/sh\napp:x:1234:1234:app:/home:/bin/sh\n",
    );
    file(
        &mut b,
        "etc/group",
        0o644,
        b"root:x:0:\napp:x:1234:\nextra:x:4321:app\n",
    );
    for a in APPLETS {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        h.set_mode(0o777);
        b.append_link(&mut h, format!("bin/{a}"), "busybox")
            .unwrap();
    }
    b.into_inner().unwrap()
}

pub fn config(layer: &[u8], cmd: &[&str]) -> Vec<u8> {
    config_of(&[layer], cmd)
}

pub fn config_of(layers: &[&[u8]], cmd: &[&str]) -> Vec<u8> {
    let diff_ids: Vec<String> = layers.iter().map(|l| sha(l)).collect();
    serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Cmd": cmd, "Env": ["PATH=/bin", "IMAGE_VAR=from-image"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .unwrap()
}

/// One entry of a hand-made layer.
pub enum Entry<'a> {
    File(&'a str, &'a [u8]),
    Fifo(&'a str),
    Symlink(&'a str, &'a str),
    /// Raw header name (for names the tar builder refuses, such as whiteouts of `..`).
    RawFile(&'a [u8]),
}

/// An uncompressed layer tar of `entries`.
pub fn layer_of(entries: &[Entry]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(0);
        match e {
            Entry::File(p, data) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(data.len() as u64);
                b.append_data(&mut h, p, *data).unwrap();
            }
            Entry::Fifo(p) => {
                h.set_entry_type(tar::EntryType::Fifo);
                b.append_data(&mut h, p, &[][..]).unwrap();
            }
            Entry::Symlink(p, target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                b.append_link(&mut h, p, target).unwrap();
            }
            Entry::RawFile(name) => {
                let mut h = tar::Header::new_old();
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(0);
                h.set_mode(0o644);
                h.as_old_mut().name[..name.len()].copy_from_slice(name);
                h.set_cksum();
                b.append(&h, &[][..]).unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

/// Writes an OCI image layout of busybox named `name` under `dir`; returns the layout dir.
pub fn oci_layout(dir: &Path, name: &str) -> PathBuf {
    oci_layout_with(dir, name, &[])
}

/// An OCI image layout of busybox with `extra` layers (uncompressed tars) on top.
pub fn oci_layout_with(dir: &Path, name: &str, extra: &[Vec<u8>]) -> PathBuf {
    oci_layout_configured(dir, name, extra, serde_json::json!({}))
}

/// [`oci_layout_with`], with `config` merged into the image config's `config` object (e.g.
/// `{"StopSignal": "SIGUSR1"}`).
pub fn oci_layout_configured(
    dir: &Path,
    name: &str,
    extra: &[Vec<u8>],
    config: serde_json::Value,
) -> PathBuf {
    let layout = dir.join(format!(
        "oci-{}",
        name.replace(|c: char| !c.is_ascii_alphanumeric(), "-")
    ));
    let blobs = layout.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |data: &[u8]| {
        let d = sha(data);
        std::fs::write(blobs.join(&d[7..]), data).unwrap();
        (d, data.len())
    };
    let layer = layer_tar();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &layer).unwrap();
    let (ld, ls) = put(&gz.finish().unwrap());
    let mut descs = vec![
        serde_json::json!({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": ld, "size": ls}),
    ];
    for l in extra {
        let (d, s) = put(l);
        descs.push(serde_json::json!({"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": d, "size": s}));
    }
    let all: Vec<&[u8]> = std::iter::once(layer.as_slice())
        .chain(extra.iter().map(Vec::as_slice))
        .collect();
    let mut image_config: serde_json::Value =
        serde_json::from_slice(&config_of(&all, &["sh"])).unwrap();
    if let (Some(c), serde_json::Value::Object(patch)) =
        (image_config["config"].as_object_mut(), config)
    {
        c.extend(patch);
    }
    let (cd, cs) = put(&serde_json::to_vec(&image_config).unwrap());
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cs},
        "layers": descs,
    }))
    .unwrap();
    let (md, ms) = put(&manifest);
    std::fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": ms,
            "annotations": {"io.containerd.image.name": name}}]}))
        .unwrap(),
    )
    .unwrap();
    std::fs::write(
        layout.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    layout
}

/// Writes a docker-archive tar of busybox tagged `tag`; returns its path.
pub fn docker_archive(dir: &Path, tag: &str) -> PathBuf {
    let layer = layer_tar();
    let cfg = config(&layer, &["sh"]);
    let manifest = serde_json::to_vec(&serde_json::json!([{"Config": "config.json", "RepoTags": [tag], "Layers": ["abc/layer.tar"]}])).unwrap();
    let mut b = tar::Builder::new(Vec::new());
    for (p, data) in [
        ("manifest.json", &manifest),
        ("config.json", &cfg),
        ("abc/layer.tar", &layer),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, p, &data[..]).unwrap();
    }
    let path = dir.join("busybox-docker.tar");
    std::fs::write(&path, b.into_inner().unwrap()).unwrap();
    path
}

/// The gzip-compressed layer and the image config (for pushing to a registry).
pub fn gzip_layer_and_config() -> (Vec<u8>, Vec<u8>) {
    let layer = layer_tar();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &layer).unwrap();
    (gz.finish().unwrap(), config(&layer, &["sh"]))
}

/// `len` bytes that do not compress (xorshift from `seed`), for layers whose size matters.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// `tar` as a gzip stream of stored blocks (no compression: quick, and as large as the tar).
pub fn stored_gzip(tar: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::none());
    std::io::Write::write_all(&mut gz, tar).unwrap();
    gz.finish().unwrap()
}
