//! PullImage from a real registry (Debian's docker-registry on 127.0.0.1): plain, behind
//! htpasswd basic auth, through a configured mirror; concurrent pulls share one download; the
//! pulled image runs.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::registry::Registry;
use common::*;
use sandboxd::image::{Auth, RegistryConfig};
use sandboxd::{ContainerConfig, ContainerState};

#[test]
fn pull_share_download_and_run() {
    let env = Env::new("reg-pull");
    let reg = Registry::start(&env.base.join("registry"), None);
    let layer = reg.push_busybox("test/busybox", "1", None);
    let rt = env.runtime();
    let name = format!("{}/test/busybox:1", reg.addr);

    // Four pulls at once: one download of the layer, one image.
    let ids: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| s.spawn(|| rt.pull_image(&name, &Auth::default()).unwrap().id))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(ids.iter().all(|i| *i == ids[0]), "{ids:?}");
    assert_eq!(
        reg.blob_gets(&layer),
        1,
        "the layer was downloaded more than once"
    );
    let img = rt.images().get(&name).unwrap();
    assert_eq!(img.repo_tags, vec![name.clone()]);
    assert!(img.repo_digests[0].starts_with(&format!("{}/test/busybox@sha256:", reg.addr)));
    // Pulling by digest finds the same image.
    let by_digest = rt
        .pull_image(&img.repo_digests[0], &Auth::default())
        .unwrap();
    assert_eq!(by_digest.id, img.id);

    // The pulled image runs.
    let mut pod = env.pod("pulled", false);
    pod.log_directory = env.base.join("logs").to_string_lossy().into();
    let sb = rt.run_pod_sandbox(&pod).unwrap();
    let c = ContainerConfig {
        metadata: sandboxd::ContainerMetadata {
            name: "pulled".into(),
            attempt: 0,
        },
        image: name.clone(),
        command: vec!["sh".into(), "-c".into(), "echo pulled-and-running".into()],
        log_path: "pulled.log".into(),
        ..Default::default()
    };
    let id = rt.create_container(&sb, &c).unwrap();
    rt.start_container(&id).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while rt.container_status(&id).unwrap().state != ContainerState::Exited {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = std::fs::read_to_string(env.base.join("logs/pulled.log")).unwrap();
    assert!(log.contains("stdout F pulled-and-running"), "{log}");

    // An unknown tag fails with the registry's answer, and stores nothing new.
    let e = rt
        .pull_image(&format!("{}/test/busybox:nope", reg.addr), &Auth::default())
        .unwrap_err();
    assert!(
        matches!(e, sandboxd::Error::NotFound { .. })
            && e.to_string().to_lowercase().contains("manifest unknown"),
        "{e}"
    );
    assert_eq!(rt.images().list().len(), 1);
    rt.remove_pod_sandbox(&sb).unwrap();
    env.assert_no_leaks();
}

/// Two images on one large layer, pulled at once: the layer is fetched from the registry
/// once (the second pull waits for the first's fetch), and both images are whole.
#[test]
fn concurrent_pulls_of_two_images_fetch_a_shared_layer_once() {
    use common::busybox::{config_of, layer_of, sha, Entry};
    let env = Env::new("reg-shared");
    let reg = Registry::start(&env.base.join("registry"), None);
    // 8 MiB that does not compress, stored as is: its fetch lasts long enough for both pulls
    // to want it at once.
    let big = common::busybox::noise(8 << 20, 0x9e37_79b9_7f4a_7c15);
    let gz = common::busybox::stored_gzip;
    let shared_tar = layer_of(&[Entry::File("shared.bin", &big)]);
    let shared = gz(&shared_tar);
    let names: Vec<String> = ["a", "b"]
        .iter()
        .map(|n| {
            let own = layer_of(&[Entry::File(n, n.as_bytes())]);
            let config = config_of(&[&shared_tar, &own], &["sh"]);
            reg.push_image(
                &format!("test/{n}"),
                "1",
                None,
                &[shared.clone(), gz(&own)],
                &config,
            );
            format!("{}/test/{n}:1", reg.addr)
        })
        .collect();
    // One GET per fetch of the layer, so that the registry's log counts fetches.
    let mut cfg = env.cfg.clone();
    cfg.images.range_parts = 1;
    let rt = sandboxd::Runtime::new(cfg).unwrap();
    let ids: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = names
            .iter()
            .map(|n| s.spawn(|| rt.pull_image(n, &Auth::default()).unwrap().id))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_ne!(ids[0], ids[1]);
    assert_eq!(
        reg.blob_gets(&sha(&shared)),
        1,
        "the shared layer was fetched more than once"
    );
    let layers = env.cfg.root.join("images/layers");
    let shared_dir = layers.join(&sha(&shared_tar)["sha256:".len()..]);
    assert_eq!(
        std::fs::metadata(shared_dir.join("shared.bin"))
            .unwrap()
            .len(),
        big.len() as u64
    );
    for n in &names {
        assert!(rt.images().get(n).is_some(), "{n} not recorded");
    }
    env.assert_no_leaks();
}

/// A large layer from a registry that answers range requests comes in parallel parts (as
/// containerd 2.1's multipart fetch): every GET of it is a 206, none a 200, and the layer
/// unpacks whole — also when the budget for parts held ahead lets only some run ahead (the
/// others stream as they are read). With `range_parts = 1` it is one GET.
#[test]
fn a_large_layer_comes_in_parallel_parts() {
    use common::busybox::{config_of, layer_of, sha, Entry};
    let env = Env::new("reg-ranges");
    let reg = Registry::start(&env.base.join("registry"), None);
    let data = common::busybox::noise(6 << 20, 0x2545_f491_4f6c_dd1d);
    let tar = layer_of(&[Entry::File("data.bin", &data)]);
    let gz = common::busybox::stored_gzip(&tar);
    reg.push_image(
        "test/big",
        "1",
        None,
        std::slice::from_ref(&gz),
        &config_of(&[&tar], &["sh"]),
    );
    let gets = |status: &str| {
        std::fs::read_to_string(&reg.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("\"GET /v2/") && l.contains(&format!("/blobs/{} ", sha(&gz))))
            .filter(|l| l.contains(&format!("\" {status} ")))
            .count()
    };
    let name = format!("{}/test/big:1", reg.addr);
    let mut cfg = env.cfg.clone();
    cfg.images.range_parts = 4;
    cfg.images.range_part_bytes = 1 << 20;
    // Room for two parts ahead of the one read.
    cfg.images.range_buffer_bytes = 2 << 20;
    let rt = sandboxd::Runtime::new(cfg.clone()).unwrap();
    rt.pull_image(&name, &Auth::default()).unwrap();
    let layer = env
        .cfg
        .root
        .join("images/layers")
        .join(&sha(&tar)["sha256:".len()..]);
    assert_eq!(std::fs::read(layer.join("data.bin")).unwrap(), data);
    assert_eq!(gets("200"), 0, "a whole GET of the layer");
    assert!(
        gets("206") >= 7,
        "{} range GETs, want one per MiB",
        gets("206")
    );
    rt.remove_image(&name).unwrap();
    drop(rt);
    cfg.images.range_parts = 1;
    let rt = sandboxd::Runtime::new(cfg).unwrap();
    rt.pull_image(&name, &Auth::default()).unwrap();
    assert_eq!(gets("200"), 1, "range_parts = 1: one whole GET");
    rt.remove_image(&name).unwrap();
    drop(rt);
    env.assert_no_leaks();
}

#[test]
fn pull_with_basic_auth_and_through_a_mirror() {
    let env = Env::new("reg-auth");
    let user = ("sandbox", "s3cret");
    let reg = Registry::start(&env.base.join("registry"), Some(user));
    reg.push_busybox("private/busybox", "2", Some(user));
    let rt = env.runtime();
    let name = format!("{}/private/busybox:2", reg.addr);

    let e = rt.pull_image(&name, &Auth::default()).unwrap_err();
    assert!(
        matches!(e, sandboxd::Error::Unauthenticated(_)) && e.to_string().contains("credentials"),
        "{e}"
    );
    let wrong = Auth {
        username: user.0.into(),
        password: "nope".into(),
        ..Default::default()
    };
    let e = rt.pull_image(&name, &wrong).unwrap_err();
    assert!(matches!(e, sandboxd::Error::Unauthenticated(_)), "{e}");
    assert!(rt.images().list().is_empty());
    let right = Auth {
        username: user.0.into(),
        password: user.1.into(),
        ..Default::default()
    };
    let img = rt.pull_image(&name, &right).unwrap();
    assert_eq!(img.repo_tags, vec![name]);
    drop(rt);

    // A registry name that resolves nowhere, served by a configured mirror.
    let mut cfg = env.cfg.clone();
    let mut regs = BTreeMap::new();
    regs.insert(
        "registry.sandboxd.invalid".to_string(),
        RegistryConfig {
            mirrors: vec![format!("http://{}", reg.addr)],
            ..Default::default()
        },
    );
    cfg.registries = regs;
    // Credentials given for a registry never go to its mirror (a registry on a closed
    // loopback port here, so nothing is resolved or sent off this machine)...
    let closed = free_loopback_addr();
    cfg.registries.insert(
        closed.clone(),
        RegistryConfig {
            mirrors: vec![format!("http://{}", reg.addr)],
            ..Default::default()
        },
    );
    let rt = sandboxd::Runtime::new(cfg).unwrap();
    let e = rt
        .pull_image(&format!("{closed}/private/busybox:2"), &right)
        .unwrap_err();
    assert!(e.to_string().contains("wants credentials"), "{e}");
    // ...only credentials given for the mirror (CRI server_address) do.
    let for_mirror = Auth {
        server_address: format!("http://{}", reg.addr),
        ..right
    };
    let via = rt
        .pull_image("registry.sandboxd.invalid/private/busybox:2", &for_mirror)
        .unwrap();
    assert_eq!(via.id, img.id);
    assert!(via
        .repo_tags
        .contains(&"registry.sandboxd.invalid/private/busybox:2".to_string()));
    env.assert_no_leaks();
}

#[test]
fn pull_over_https_with_a_configured_ca() {
    let env = Env::new("reg-tls");
    let dir = env.base.join("registry");
    let reg = Registry::start_with(&dir, None, true);
    reg.push_busybox("tls/busybox", "3", None);
    let name = format!("{}/tls/busybox:3", reg.addr);

    // Unknown CA: HTTPS refuses the certificate and plain HTTP gets no registry.
    let rt = env.runtime();
    let e = rt
        .pull_image(&name, &Auth::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("https://") && e.contains("http://"), "{e}");
    assert!(e.to_lowercase().contains("certificate"), "{e}");
    assert!(rt.images().list().is_empty());
    drop(rt);

    // The CA through a symlink, as certificates in /etc/ssl/certs are.
    std::os::unix::fs::symlink(dir.join("ca.pem"), dir.join("ca-link.pem")).unwrap();
    let mut cfg = env.cfg.clone();
    cfg.registries.insert(
        reg.addr.clone(),
        RegistryConfig {
            ca_file: Some(dir.join("ca-link.pem")),
            ..Default::default()
        },
    );
    let rt = sandboxd::Runtime::new(cfg).unwrap();
    let img = rt.pull_image(&name, &Auth::default()).unwrap();
    assert_eq!(img.repo_tags, vec![name]);
    env.assert_no_leaks();
}

/// The files operators keep for the peers, read at each pull (no restart): a containerd
/// hosts.toml whose mirror is an HTTPS registry trusted by its `ca`, then by `skip_verify`;
/// a registries.conf that blocks a prefix, mirrors a registry (`insecure`) and moves a
/// repository to a registry behind basic auth; the credentials from a docker config.json,
/// only for the host they are keyed by.
#[test]
fn pull_configured_by_hosts_toml_registries_conf_and_auth_file() {
    let env = Env::new("reg-files");
    let tls_dir = env.base.join("registry-tls");
    let tls = Registry::start_with(&tls_dir, None, true);
    tls.push_busybox("tls/busybox", "3", None);
    let user = ("sandbox", "s3cret");
    let private = Registry::start(&env.base.join("registry-auth"), Some(user));
    private.push_busybox("private/busybox", "2", Some(user));
    // The image's own registry: a closed loopback port, so only a configured endpoint serves.
    let closed = free_loopback_addr();
    let files = env.base.join("etc");
    let hosts = files.join("certs.d").join(&closed);
    std::fs::create_dir_all(&hosts).unwrap();
    std::fs::create_dir_all(files.join("registries.conf.d")).unwrap();
    let mut cfg = env.cfg.clone();
    cfg.registry_files = sandboxd::image::RegistryFilesConfig {
        hosts_dirs: vec![files.join("absent"), files.join("certs.d")],
        registries_conf: Some(files.join("registries.conf")),
        registries_conf_d: Some(files.join("registries.conf.d")),
        global_auth_file: Some(files.join("config.json")),
        signature_policy: None,
    };
    let rt = sandboxd::Runtime::new(cfg).unwrap();
    let none = Auth::default();

    // hosts.toml: the mirror with `settings`, then the server (closed).
    let hosts_toml = |settings: &str| {
        let text = format!(
            "server = \"http://{closed}\"\n[host.\"https://{}\"]\n{settings}",
            tls.addr
        );
        std::fs::write(hosts.join("hosts.toml"), text).unwrap()
    };
    // The test's CA.
    hosts_toml(&format!(
        "  capabilities = [\"pull\", \"resolve\"]\n  ca = \"{}\"\n",
        tls_dir.join("ca.pem").display()
    ));
    let name = format!("{closed}/tls/busybox:3");
    let img = rt.pull_image(&name, &none).unwrap();
    assert_eq!(img.repo_tags, vec![name.clone()]);
    rt.remove_image(&img.id).unwrap();
    // skip_verify instead of the CA; then neither: the certificate is refused, and the error
    // names both endpoints the file gave.
    hosts_toml("  skip_verify = true\n");
    let img = rt.pull_image(&name, &none).unwrap();
    rt.remove_image(&img.id).unwrap();
    hosts_toml("");
    let e = rt
        .pull_image(&format!("{closed}/tls/busybox:other"), &none)
        .unwrap_err()
        .to_string();
    assert!(e.to_lowercase().contains("certificate"), "{e}");
    assert!(
        e.contains(&format!("https://{}/v2", tls.addr))
            && e.contains(&format!("http://{closed}/v2")),
        "{e}"
    );
    // A host that may only pull (not resolve) serves no tag: only the server is tried.
    hosts_toml("  capabilities = [\"pull\"]\n  skip_verify = true\n");
    let e = rt
        .pull_image(&format!("{closed}/tls/busybox:other"), &none)
        .unwrap_err()
        .to_string();
    assert!(!e.contains(&tls.addr), "{e}");

    // registries.conf: a blocked prefix is refused before anything is resolved or sent; a
    // drop-in moves a repository of a name that resolves nowhere to the private registry.
    std::fs::write(
        files.join("registries.conf"),
        "[[registry]]\nprefix = \"registry.sandboxd.invalid/blocked\"\nblocked = true\n",
    )
    .unwrap();
    std::fs::write(
        files.join("registries.conf.d/50-moved.conf"),
        format!(
            "[[registry]]\nprefix = \"registry.sandboxd.invalid/moved\"\nlocation = \"{}/private\"\n",
            private.addr
        ),
    )
    .unwrap();
    let e = rt
        .pull_image("registry.sandboxd.invalid/blocked/busybox:2", &none)
        .unwrap_err();
    assert!(
        matches!(e, sandboxd::Error::PermissionDenied(_))
            && e.to_string().contains("registry.sandboxd.invalid/blocked")
            && e.to_string().contains("registries.conf"),
        "{e}"
    );
    // A mirror from registries.conf (insecure: its certificate is not checked) for a registry
    // on another closed port, which no hosts.toml speaks for.
    let closed2 = free_loopback_addr();
    std::fs::write(
        files.join("registries.conf.d/40-mirror.conf"),
        format!(
            "[[registry]]\nlocation = \"{closed2}\"\n[[registry.mirror]]\nlocation = \"{}\"\ninsecure = true\n",
            tls.addr
        ),
    )
    .unwrap();
    let via = format!("{closed2}/tls/busybox:3");
    let img = rt.pull_image(&via, &none).unwrap();
    assert_eq!(img.repo_tags, vec![via]);
    rt.remove_image(&img.id).unwrap();
    let moved = "registry.sandboxd.invalid/moved/busybox:2";
    // No credentials anywhere: the registry's own refusal.
    let e = rt.pull_image(moved, &none).unwrap_err();
    assert!(matches!(e, sandboxd::Error::Unauthenticated(_)), "{e}");
    // The auth file's entry for another host is not sent; the one for this host is.
    let b64 = |s: &str| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(s)
    };
    std::fs::write(
        files.join("config.json"),
        format!(
            r#"{{"auths": {{"{}": {{"auth": "{}"}}}}}}"#,
            tls.addr,
            b64("sandbox:s3cret")
        ),
    )
    .unwrap();
    assert!(matches!(
        rt.pull_image(moved, &none).unwrap_err(),
        sandboxd::Error::Unauthenticated(_)
    ));
    std::fs::write(
        files.join("config.json"),
        format!(
            r#"{{"auths": {{"http://{}": {{"auth": "{}"}}}}}}"#,
            private.addr,
            b64("sandbox:s3cret")
        ),
    )
    .unwrap();
    let img = rt.pull_image(moved, &none).unwrap();
    assert_eq!(img.repo_tags, vec![moved.to_string()]);
    // The request's own credentials, when it has any, are used instead of the file's.
    let wrong = Auth {
        username: "sandbox".into(),
        password: "nope".into(),
        ..Default::default()
    };
    rt.remove_image(&img.id).unwrap();
    assert!(matches!(
        rt.pull_image(moved, &wrong).unwrap_err(),
        sandboxd::Error::Unauthenticated(_)
    ));
    env.assert_no_leaks();
}

/// Short names as CRI-O resolves them from registries.conf: an alias is the one place asked;
/// else each unqualified-search registry in turn (a closed port, then two registries); the
/// stored image is found again by the short name (status, a container, removal); an empty
/// search list refuses short names.
#[test]
fn short_names_resolve_by_alias_then_search_registries() {
    let env = Env::new("reg-short");
    let a = Registry::start(&env.base.join("registry-a"), None);
    let b = Registry::start(&env.base.join("registry-b"), None);
    // Busybox with a label of its own name: three distinct images.
    let push = |reg: &Registry, repo: &str, tag: &str| {
        let (layer, config) = common::busybox::gzip_layer_and_config();
        let mut c: serde_json::Value = serde_json::from_slice(&config).unwrap();
        c["config"]["Labels"]["name"] = format!("{repo}:{tag}").into();
        reg.push_image(repo, tag, None, &[layer], &serde_json::to_vec(&c).unwrap());
    };
    push(&a, "team/app", "1");
    push(&b, "onlyb", "1");
    push(&b, "real/busybox", "2");
    let closed = free_loopback_addr();
    let files = env.base.join("etc");
    std::fs::create_dir_all(files.join("registries.conf.d")).unwrap();
    std::fs::write(
        files.join("registries.conf"),
        format!(
            "unqualified-search-registries = [\"{closed}\", \"{}\", \"{}\"]\nshort-name-mode = \"enforcing\"\n",
            a.addr, b.addr
        ),
    )
    .unwrap();
    std::fs::write(
        files.join("registries.conf.d/50-aliases.conf"),
        format!("[aliases]\n\"alias\" = \"{}/real/busybox\"\n", b.addr),
    )
    .unwrap();
    let mut cfg = env.cfg.clone();
    cfg.registry_files.registries_conf = Some(files.join("registries.conf"));
    cfg.registry_files.registries_conf_d = Some(files.join("registries.conf.d"));
    cfg.registry_files.hosts_dirs = vec![];
    cfg.registry_files.signature_policy = None;
    let rt = sandboxd::Runtime::new(cfg).unwrap();
    let none = Auth::default();
    let asked = |reg: &Registry, repo: &str| {
        std::fs::read_to_string(&reg.log)
            .unwrap_or_default()
            .contains(&format!("/v2/{repo}/manifests/"))
    };

    // The first search registry that has it (the closed port and A are asked before B).
    let img = rt.pull_image("team/app:1", &none).unwrap();
    assert_eq!(img.repo_tags, vec![format!("{}/team/app:1", a.addr)]);
    let onlyb = rt.pull_image("onlyb:1", &none).unwrap();
    assert_eq!(onlyb.repo_tags, vec![format!("{}/onlyb:1", b.addr)]);
    assert!(asked(&a, "onlyb"), "A was not asked first");
    // An alias is the only candidate: A is never asked for it.
    let aliased = rt.pull_image("alias:2", &none).unwrap();
    assert_eq!(
        aliased.repo_tags,
        vec![format!("{}/real/busybox:2", b.addr)]
    );
    assert!(!asked(&a, "alias") && !asked(&b, "alias"));
    // Found again by the short name, as kubelet's ImageStatus and CreateContainer ask.
    assert_eq!(rt.images().get("team/app:1").unwrap().id, img.id);
    assert_eq!(rt.images().get("onlyb:1").unwrap().id, onlyb.id);
    assert_eq!(rt.images().get("alias:2").unwrap().id, aliased.id);
    assert!(rt.images().get("team/app:2").is_none());
    assert!(rt.images().get("busybox").is_none());
    let sb = rt.run_pod_sandbox(&env.pod("short", false)).unwrap();
    let c = ContainerConfig {
        metadata: sandboxd::ContainerMetadata {
            name: "short".into(),
            attempt: 0,
        },
        image: "alias:2".into(),
        command: vec!["true".into()],
        ..Default::default()
    };
    let id = rt.create_container(&sb, &c).unwrap();
    assert_eq!(rt.container_status(&id).unwrap().image_id, aliased.id);
    rt.remove_pod_sandbox(&sb).unwrap();
    // Nowhere: the registry's NotFound, the message naming every candidate.
    let e = rt.pull_image("nowhere:1", &none).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, sandboxd::Error::NotFound { .. }), "{e}");
    for reg in [&closed, &a.addr, &b.addr] {
        assert!(msg.contains(&format!("{reg}/nowhere:1")), "{msg}");
    }
    // Removal by the short name.
    rt.remove_image("team/app:1").unwrap();
    assert!(rt.images().get(&format!("{}/team/app:1", a.addr)).is_none());
    // An empty search list (a later drop-in's) refuses short names; aliases still resolve.
    std::fs::write(
        files.join("registries.conf.d/60-strict.conf"),
        "unqualified-search-registries = []\n",
    )
    .unwrap();
    let e = rt.pull_image("onlyb:1", &none).unwrap_err();
    assert!(
        matches!(e, sandboxd::Error::InvalidArgument(_))
            && e.to_string().contains("60-strict.conf"),
        "{e}"
    );
    assert!(rt.images().get("onlyb:1").is_none());
    assert_eq!(rt.images().get("alias:2").unwrap().id, aliased.id);
    env.assert_no_leaks();
}

/// A P-256 key pair (ring) and its public key as the PEM `cosign generate-key-pair` writes.
struct SigningKey {
    pair: ring::signature::EcdsaKeyPair,
    pem: String,
}

impl SigningKey {
    fn new() -> SigningKey {
        use base64::Engine;
        use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        // SubjectPublicKeyInfo of an id-ecPublicKey on prime256v1, then the point.
        let mut der = vec![
            0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06,
            0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
        ];
        der.extend_from_slice(pair.public_key().as_ref());
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        let lines: Vec<&str> = b64
            .as_bytes()
            .chunks(64)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        let pem = format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            lines.join("\n")
        );
        SigningKey { pair, pem }
    }

    /// A cosign "simple signing" payload claiming `name` for `digest`, and its signature.
    fn sign(&self, name: &str, digest: &str) -> (Vec<u8>, Vec<u8>) {
        let payload = serde_json::to_vec(&serde_json::json!({
            "critical": {
                "identity": {"docker-reference": name},
                "image": {"docker-manifest-digest": digest},
                "type": "cosign container image signature"
            },
            "optional": null
        }))
        .unwrap();
        let sig = self
            .pair
            .sign(&ring::rand::SystemRandom::new(), &payload)
            .unwrap();
        (payload, sig.as_ref().to_vec())
    }
}

/// Stores signatures for `digest` as cosign does: the manifest `sha256-<hex>.sig` in `repo`,
/// a layer per (payload, signature).
fn push_signatures(reg: &Registry, repo: &str, digest: &str, sigs: &[(Vec<u8>, Vec<u8>)]) {
    use base64::Engine;
    let config =
        br#"{"architecture":"","os":"","config":{},"rootfs":{"type":"layers","diff_ids":[]}}"#;
    reg.push_blob(repo, None, config);
    let mut layers = Vec::new();
    for (payload, sig) in sigs {
        reg.push_blob(repo, None, payload);
        layers.push(serde_json::json!({
            "mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
            "digest": common::busybox::sha(payload),
            "size": payload.len(),
            "annotations": {
                "dev.cosignproject.cosign/signature":
                    base64::engine::general_purpose::STANDARD.encode(sig)
            }
        }));
    }
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": common::busybox::sha(config), "size": config.len()},
        "layers": layers,
    }))
    .unwrap();
    let tag = format!("sha256-{}.sig", digest.trim_start_matches("sha256:"));
    reg.push_manifest(
        repo,
        &tag,
        None,
        &manifest,
        "application/vnd.oci.image.manifest.v1+json",
    );
}

#[test]
fn pulls_follow_the_signature_policy_with_sigstore_signatures() {
    let env = Env::new("reg-policy");
    let reg = Registry::start(&env.base.join("registry"), None);
    let a = &reg.addr;
    let (layer, config) = common::busybox::gzip_layer_and_config();
    let layer_digest = common::busybox::sha(&layer);
    let push = |repo: &str| reg.push_image(repo, "1", None, std::slice::from_ref(&layer), &config);
    let ours = SigningKey::new();
    let theirs = SigningKey::new();
    std::fs::write(env.base.join("ours.pub"), &ours.pem).unwrap();
    std::fs::write(env.base.join("theirs.pub"), &theirs.pem).unwrap();
    let key = env.base.join("ours.pub").display().to_string();
    // Pushes `repo:1` signed by `by`, the signature claiming `claim` (after the registry).
    let push_signed = |repo: &str, by: &SigningKey, claim: &str| {
        let digest = push(repo);
        push_signatures(
            &reg,
            repo,
            &digest,
            &[by.sign(&format!("{a}/{claim}"), &digest)],
        );
        digest
    };

    // Signed by our key, claiming the repository (cosign's claim).
    let signed = push_signed("test/signed", &ours, "test/signed");
    // Unsigned; signed by another key.
    push("test/unsigned");
    push_signed("test/other-key", &theirs, "test/other-key");
    // A manifest changed after signing (another digest): the original's signature copied to
    // it, and that signature's payload edited to name the new digest.
    let tampered = reg.push_image(
        "test/tampered",
        "1",
        None,
        std::slice::from_ref(&layer),
        &[&config[..], b" "].concat(),
    );
    let (payload, sig) = ours.sign(&format!("{a}/test/tampered"), &signed);
    let edited = String::from_utf8(payload.clone())
        .unwrap()
        .replace(&signed, &tampered);
    push_signatures(
        &reg,
        "test/tampered",
        &tampered,
        &[(payload, sig.clone()), (edited.into_bytes(), sig)],
    );
    // Under the default identity (matchRepoDigestOrExact) a tag pull needs the tag claimed.
    push_signed("test/exact/tagged", &ours, "test/exact/tagged:1");
    push_signed("test/exact/untagged", &ours, "test/exact/untagged");
    push("test/open/app");
    push("test/closed/app");

    // The registry needs our signature; one namespace needs the exact name; one repository
    // is open, another closed, each overriding the registry's scope.
    let policy = serde_json::json!({
        "default": [{"type": "insecureAcceptAnything"}],
        "transports": {"docker": {
            a.as_str(): [{"type": "sigstoreSigned", "keyPath": key, "signedIdentity": {"type": "matchRepository"}}],
            format!("{a}/test/exact"): [{"type": "sigstoreSigned", "keyPath": key}],
            format!("{a}/test/open"): [{"type": "insecureAcceptAnything"}],
            format!("{a}/test/closed"): [{"type": "reject"}],
        }}
    });
    std::fs::write(
        env.cfg.registry_files.signature_policy.as_ref().unwrap(),
        serde_json::to_vec_pretty(&policy).unwrap(),
    )
    .unwrap();
    let rt = env.runtime();
    let none = Auth::default();
    let refused = |image: &str, says: &str| match rt.pull_image(&format!("{a}/{image}"), &none) {
        Err(e @ sandboxd::Error::PermissionDenied(_)) => {
            let m = e.to_string();
            assert!(m.contains(says), "{image}: {m}");
            assert!(
                m.contains("policy.json"),
                "{image}: names no policy file: {m}"
            );
        }
        other => panic!("{image}: expected a refusal, got {other:?}"),
    };
    let pushed = std::fs::read_to_string(&reg.log).unwrap().len();
    refused("test/unsigned:1", "no sigstore signature is stored");
    // By digest too (the digest of the signed image, stored under the unsigned repository).
    refused(&format!("test/unsigned@{signed}"), "no sigstore signature");
    refused(
        "test/other-key:1",
        "verifies with none of the policy's keys",
    );
    refused(
        "test/tampered:1",
        &format!("is for \"{signed}\", not {tampered}"),
    );
    refused("test/tampered:1", "verifies with none of the policy's keys");
    refused("test/exact/untagged:1", "does not accept");
    refused("test/closed/app:1", "rejected");
    // A rejected image is not asked of the registry; no refused image's layer was fetched.
    let log = std::fs::read_to_string(&reg.log).unwrap();
    assert!(
        !log[pushed..].contains("/v2/test/closed/"),
        "the registry was asked for a rejected image"
    );
    assert_eq!(
        reg.blob_gets(&layer_digest),
        0,
        "a refused image's layer was fetched"
    );

    for image in ["test/signed:1", "test/exact/tagged:1", "test/open/app:1"] {
        rt.pull_image(&format!("{a}/{image}"), &none)
            .unwrap_or_else(|e| panic!("{image}: {e}"));
    }
    rt.pull_image(&format!("{a}/test/signed@{signed}"), &none)
        .unwrap();
    // A policy file that does not parse fails the pull naming it, never accepts.
    std::fs::write(
        env.cfg.registry_files.signature_policy.as_ref().unwrap(),
        r#"{"default": [{"type": "sigstoreSigned"}]}"#,
    )
    .unwrap();
    let e = rt
        .pull_image(&format!("{a}/test/open/app:1"), &none)
        .unwrap_err();
    assert!(e.to_string().contains("names no key"), "{e}");
}
