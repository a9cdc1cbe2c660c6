//! sandboxctl, the CLI, against a daemon through its socket: pod, container and image
//! commands with crictl-style JSON files, pulls with credentials, and the interactive commands
//! (exec -i/-t, attach, port-forward) over the streaming server.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::daemon::Daemon;
use common::sandboxctl::{sandboxctl, sandboxctl_ok};
use common::*;
use sandboxd::api::v1 as cri;

/// sandboxctl against the daemon with a crictl-style file: runp, pods, inspectp by prefix,
/// stopp, rmp.
#[test]
fn sandboxctl_drives_the_daemon() {
    let env = Env::new("e2ectl");
    let d = Daemon::start(&env);
    let ep = format!("unix://{}", d.socket.display());
    let ctl = |args: &[&str]| sandboxctl_ok(&ep, args);
    let pod = env.base.join("pod.json");
    std::fs::write(
        &pod,
        r#"{"metadata":{"name":"ctl","namespace":"default","uid":"ctl-uid","attempt":1},
            "log_directory":"/tmp/ctl-logs","hostname":"ctl-host","labels":{"app":"ctl"},
            "port_mappings":[{"protocol":"TCP","container_port":80,"host_port":0}],
            "linux":{"security_context":{"namespace_options":{"pid":"CONTAINER","network":0}}}}"#,
    )
    .unwrap();
    let id = ctl(&["runp", pod.to_str().unwrap()]).trim().to_string();
    assert_eq!(id.len(), 64);
    let pods: serde_json::Value =
        serde_json::from_str(&ctl(&["-o", "json", "pods", "--label", "app=ctl"])).unwrap();
    assert_eq!(pods["items"][0]["id"], serde_json::json!(id));
    assert!(ctl(&["pods"]).contains("ctl"));
    let inspect: serde_json::Value = serde_json::from_str(&ctl(&["inspectp", &id[..7]])).unwrap();
    assert_eq!(
        inspect["status"]["metadata"]["attempt"],
        serde_json::json!(1)
    );
    assert!(inspect["status"]["network"]["ip"]
        .as_str()
        .unwrap()
        .starts_with(&env.subnet_prefix));
    assert_eq!(
        inspect["info"]["info"]["infra_mode"],
        serde_json::json!("pinned")
    );
    assert!(ctl(&["version"]).contains("sandboxd"));

    // doctor: a live pod is no orphan; what a killed pull and a crash left is, until --fix.
    assert!(ctl(&["doctor"]).contains("0 orphan(s)"));
    let partial = env.cfg.root.join("images/tmp/layer-999999999-x");
    let userns = env.cfg.root.join("userns").join("f".repeat(64));
    std::fs::create_dir_all(&partial).unwrap();
    std::fs::create_dir_all(&userns).unwrap();
    let out = sandboxctl(&ep, &["doctor", "-o", "json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let paths: Vec<&str> = report["orphans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths.len(), 2, "{report}");
    assert!(paths.contains(&partial.to_str().unwrap()), "{report}");
    assert!(paths.contains(&userns.to_str().unwrap()), "{report}");
    let young = sandboxctl(&ep, &["doctor", "--fix", "--grace", "3600"])
        .output()
        .unwrap();
    assert_eq!(young.status.code(), Some(1), "{young:?}");
    assert!(partial.exists() && userns.exists());
    let fixed = ctl(&["doctor", "--fix", "--grace", "0"]);
    assert_eq!(fixed.matches("removed").count(), 2, "{fixed}");
    assert!(!partial.exists() && !userns.exists());
    assert!(ctl(&["doctor"]).contains("0 orphan(s)"));

    assert!(ctl(&["stopp", &id[..9]]).contains(&id));
    assert!(ctl(&["rmp", &id[..9]]).contains(&id));
    assert!(ctl(&["pods", "-q"]).trim().is_empty());
    env.assert_no_leaks();
}

/// Containers and images through sandboxctl and the daemon: import, create, start, logs,
/// exec, ps, inspect, stop, rm, rmi (refused while used), with crictl-style JSON files.
#[test]
fn sandboxctl_containers_and_images() {
    let env = Env::new("e2ectr");
    // Writable layers measured again once a second old (10 s by default).
    let mut cfg = env.cfg.clone();
    cfg.stats_collect_period = Duration::from_secs(1);
    let d = Daemon::start_with(&env, &cfg);
    let ep = format!("unix://{}", d.socket.display());
    let ctl_out = |args: &[&str]| sandboxctl(&ep, args).output().unwrap();
    let ctl = |args: &[&str]| sandboxctl_ok(&ep, args);
    let archive = busybox::docker_archive(&env.base, "sandboxd.test/busybox:e2e");
    let root = env.cfg.root.to_string_lossy().into_owned();
    assert!(ctl(&[
        "images",
        "import",
        "--root",
        &root,
        archive.to_str().unwrap()
    ])
    .contains("sha256:"));
    assert!(ctl(&["images"]).contains("sandboxd.test/busybox"));

    let logs = env.base.join("logs");
    let pod = env.base.join("pod.json");
    std::fs::write(
        &pod,
        format!(
            r#"{{"metadata":{{"name":"e2e","namespace":"default","uid":"e2e-uid"}},
                "log_directory":"{}"}}"#,
            logs.display()
        ),
    )
    .unwrap();
    let ctr = env.base.join("ctr.json");
    std::fs::write(
        &ctr,
        r#"{"metadata":{"name":"talker"},"image":{"image":"sandboxd.test/busybox:e2e"},
            "command":["sh","-c","echo hello from $WHO; exec sleep 1000"],
            "envs":[{"key":"WHO","value":"e2e"}],"log_path":"talker.log",
            "linux":{"security_context":{"run_as_user":{"value":1234},
                     "capabilities":{"drop_capabilities":["NET_RAW"]}}}}"#,
    )
    .unwrap();
    let pod_id = ctl(&["runp", pod.to_str().unwrap()]).trim().to_string();
    let id = ctl(&[
        "create",
        &pod_id[..8],
        ctr.to_str().unwrap(),
        pod.to_str().unwrap(),
    ])
    .trim()
    .to_string();
    assert_eq!(id.len(), 64);
    assert!(ctl(&["ps", "-a"]).contains("CONTAINER_CREATED"));
    ctl(&["start", &id[..8]]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ctl(&["logs", &id[..8]]).contains("hello from e2e") {
        assert!(Instant::now() < deadline, "no log output");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(logs.join("talker.log").is_file());
    assert_eq!(ctl(&["exec", &id[..8], "id", "-u"]), "1234\n");
    let out = ctl_out(&["exec", &id[..8], "sh", "-c", "exit 4"]);
    assert_eq!(out.status.code(), Some(4));
    let ps: serde_json::Value = serde_json::from_str(&ctl(&["-o", "json", "ps"])).unwrap();
    assert_eq!(ps["containers"][0]["id"], serde_json::json!(id));
    let inspect: serde_json::Value = serde_json::from_str(&ctl(&["inspect", &id[..8]])).unwrap();
    assert_eq!(
        inspect["status"]["state"],
        serde_json::json!(cri::ContainerState::ContainerRunning as i32)
    );
    assert_eq!(
        inspect["info"]["info"]["sandbox_id"],
        serde_json::json!(pod_id)
    );
    ctl(&[
        "exec",
        &id[..8],
        "sh",
        "-c",
        "head -c 100000 /dev/zero > /tmp/blob",
    ]);
    // What the container wrote lands in its writable layer, as measured within the period
    // after it was written; each value carries the time it was measured.
    let layer = |s: &serde_json::Value| {
        let w = &s["stats"][0]["writable_layer"];
        (
            w["used_bytes"]["value"].as_u64().unwrap(),
            w["timestamp"].as_i64().unwrap(),
        )
    };
    let first: serde_json::Value = serde_json::from_str(&ctl(&["-o", "json", "stats"])).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let stats = loop {
        let s: serde_json::Value = serde_json::from_str(&ctl(&["-o", "json", "stats"])).unwrap();
        if layer(&s).0 >= 100_000 || Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(layer(&stats).0 >= 100_000, "{first} then {stats}");
    assert!(layer(&stats).1 > layer(&first).1, "{first} then {stats}");
    assert_eq!(stats["stats"][0]["attributes"]["id"], serde_json::json!(id));
    assert!(
        stats["stats"][0]["memory"]["usage_bytes"]["value"]
            .as_u64()
            .unwrap()
            > 0,
        "{stats}"
    );
    // Removing the image it runs from removes the image; the container keeps its layers
    // (they go with it).
    let layers = env.cfg.root.join("images/layers");
    let before = list_names(&layers);
    assert!(!before.is_empty());
    ctl(&["images", "rm", "sandboxd.test/busybox:e2e"]);
    assert!(!ctl(&["images"]).contains("busybox"));
    assert_eq!(list_names(&layers), before, "a layer in use was collected");
    assert!(ctl(&["exec", &id[..8], "true"]).is_empty());
    ctl(&["stop", "-t", "0", &id[..8]]);
    let inspect: serde_json::Value = serde_json::from_str(&ctl(&["inspect", &id[..8]])).unwrap();
    assert_eq!(inspect["status"]["exit_code"], serde_json::json!(137));
    ctl(&["rm", &id[..8]]);
    assert!(ctl(&["ps", "-a", "-q"]).trim().is_empty());
    assert!(
        list_names(&layers).is_empty(),
        "layers left after the container went"
    );
    ctl(&["rmp", &pod_id[..8]]);
    env.assert_no_leaks();
}

/// PullImage through the daemon with credentials, from an htpasswd-protected registry.
#[test]
fn sandboxctl_pulls_with_credentials() {
    let env = Env::new("e2epull");
    let user = ("kube", "pa55");
    let reg = common::registry::Registry::start(&env.base.join("registry"), Some(user));
    reg.push_busybox("app/busybox", "v1", Some(user));
    let d = Daemon::start(&env);
    let ep = format!("unix://{}", d.socket.display());
    let ctl = |args: &[&str]| sandboxctl(&ep, args).output().unwrap();
    let name = format!("{}/app/busybox:v1", reg.addr);
    let out = ctl(&["pull", &name]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Unauthenticated"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = ctl(&["pull", "--creds", "kube:pa55", &name]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("sha256:"));
    let list = String::from_utf8(ctl(&["images"]).stdout).unwrap();
    assert!(
        list.contains(&format!("{}/app/busybox", reg.addr)),
        "{list}"
    );
    env.assert_no_leaks();
}

/// sandboxctl's interactive commands over the streaming server: exec -i with stdin EOF,
/// exec -it with the remote exit code, and port-forward to a server in the pod.
#[test]
fn sandboxctl_exec_interactive_and_port_forward() {
    use std::io::{BufRead, Read, Write};
    let env = Env::new("e2estream");
    let d = Daemon::start(&env);
    let ep = format!("unix://{}", d.socket.display());
    let layout = busybox::oci_layout(&env.base, "sandboxd.test/busybox:streams");
    let root = env.cfg.root.to_string_lossy().into_owned();
    let ctl_cmd = |args: &[&str]| sandboxctl(&ep, args);
    let ctl = |args: &[&str]| sandboxctl_ok(&ep, args);
    let with_stdin = |args: &[&str], input: &[u8]| {
        let mut child = ctl_cmd(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        child.wait_with_output().unwrap()
    };
    ctl(&[
        "images",
        "import",
        "--root",
        &root,
        layout.to_str().unwrap(),
    ]);
    let pod = env.base.join("pod.json");
    std::fs::write(
        &pod,
        r#"{"metadata":{"name":"streams","namespace":"default","uid":"streams-uid"}}"#,
    )
    .unwrap();
    let ctr = env.base.join("ctr.json");
    std::fs::write(
        &ctr,
        r#"{"metadata":{"name":"srv"},"image":{"image":"sandboxd.test/busybox:streams"},
            "command":["sh","-c","while :; do echo pong | nc -l -p 8080; done"]}"#,
    )
    .unwrap();
    let pod_id = ctl(&["runp", pod.to_str().unwrap()]).trim().to_string();
    let id = ctl(&[
        "create",
        &pod_id,
        ctr.to_str().unwrap(),
        pod.to_str().unwrap(),
    ])
    .trim()
    .to_string();
    ctl(&["start", &id]);

    let out = with_stdin(&["exec", "-i", &id, "cat"], b"hello stdin\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"hello stdin\n");
    let out = with_stdin(
        &["exec", "-i", &id, "sh", "-c", "cat; echo oops >&2; exit 5"],
        b"x",
    );
    assert_eq!(out.status.code(), Some(5));
    assert_eq!(out.stdout, b"x");
    assert_eq!(out.stderr, b"oops\n");
    let out = with_stdin(
        &["exec", "-i", "-t", &id, "sh"],
        b"echo in-$((6*7))\nexit 4\n",
    );
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("in-42"));

    // Attach to the container's own output: nc's loop prints nothing, so give it a second
    // container that does, created with stdin.
    let talker = env.base.join("talker.json");
    std::fs::write(
        &talker,
        r#"{"metadata":{"name":"talker"},"image":{"image":"sandboxd.test/busybox:streams"},
            "command":["sh","-c","read x; echo heard $x; exit 0"],"stdin":true}"#,
    )
    .unwrap();
    let tid = ctl(&[
        "create",
        &pod_id,
        talker.to_str().unwrap(),
        pod.to_str().unwrap(),
    ])
    .trim()
    .to_string();
    ctl(&["start", &tid]);
    let out = with_stdin(&["attach", "-i", &tid], b"you\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "heard you\n");

    let mut pf = ctl_cmd(&["port-forward", &pod_id, "127.0.0.1:0:8080"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(pf.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let local = line
        .strip_prefix("Forwarding from ")
        .and_then(|l| l.split(" -> ").next())
        .unwrap_or_else(|| panic!("{line:?}"))
        .to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    let got = loop {
        let mut conn = std::net::TcpStream::connect(&local).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        conn.write_all(b"ping\n").unwrap();
        let mut got = String::new();
        let _ = conn.read_to_string(&mut got);
        if got.contains("pong") || Instant::now() > deadline {
            break got;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(got, "pong\n");
    let _ = pf.kill();
    let _ = pf.wait();
    ctl(&["rmp", &pod_id]);
    env.assert_no_leaks();
}

/// A pull in flight is visible layer by layer: `ImageStatus` with `verbose` carries
/// `info["pullProgress"]` (bytes received of each layer's size, rising, never past it), gone
/// once the pull ends; and `sandboxctl pull` on a terminal draws a bar per layer from it,
/// while off a terminal it prints only the result.
#[test]
fn sandboxctl_pull_shows_layer_progress() {
    use common::busybox::{self, Entry};
    use common::fake_registry::{Answer, FakeRegistry};
    let env = Env::new("e2eprog");
    // Two incompressible 1 MiB layers, sent 64 KiB every 60 ms (~1 s each), and busybox.
    let noise = |seed: u32| busybox::noise(1 << 20, u64::from(seed).wrapping_mul(2654435761));
    let gz = |tar: &[u8]| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut e, tar).unwrap();
        e.finish().unwrap()
    };
    let (n1, n2) = (noise(1), noise(2));
    let tars = [
        busybox::layer_tar(),
        busybox::layer_of(&[Entry::File("noise1", &n1)]),
        busybox::layer_of(&[Entry::File("noise2", &n2)]),
    ];
    let blobs: Vec<Vec<u8>> = tars.iter().map(|t| gz(t)).collect();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux", "config": {"Cmd": ["sh"]},
        "rootfs": {"type": "layers", "diff_ids": tars.iter().map(|t| busybox::sha(t)).collect::<Vec<_>>()},
    }))
    .unwrap();
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": busybox::sha(&config), "size": config.len()},
        "layers": blobs.iter().map(|b| serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": busybox::sha(b), "size": b.len()})).collect::<Vec<_>>(),
    }))
    .unwrap();
    let sizes: Vec<u64> = blobs.iter().map(|b| b.len() as u64).collect();
    let digests: Vec<String> = blobs.iter().map(|b| busybox::sha(b)).collect();
    let fake = {
        let (blobs, config, manifest) = (blobs.clone(), config.clone(), manifest.clone());
        FakeRegistry::start(move |path| {
            if path.ends_with("/manifests/1") {
                return Some(Answer::json(
                    manifest.clone(),
                    "application/vnd.oci.image.manifest.v1+json",
                ));
            }
            if path.ends_with(&busybox::sha(&config)) {
                return Some(Answer::json(config.clone(), "application/octet-stream"));
            }
            let b = blobs.iter().find(|b| path.ends_with(&busybox::sha(b)))?;
            let mut a = Answer::json(b.clone(), "application/octet-stream");
            a.pace = Some((64 << 10, Duration::from_millis(60)));
            Some(a)
        })
    };
    let d = Daemon::start(&env);
    let ep = format!("unix://{}", d.socket.display());
    let image = format!("{}/x/slow:1", fake.addr);
    let rt = common::daemon::rt();
    let mut images = rt.block_on(async {
        sandboxd::api::v1::image_service_client::ImageServiceClient::new(
            common::daemon::channel(&d.socket).await,
        )
    });
    let progress = |images: &mut sandboxd::api::v1::image_service_client::ImageServiceClient<_>| {
        let r = rt
            .block_on(images.image_status(cri::ImageStatusRequest {
                image: Some(cri::ImageSpec {
                    image: image.clone(),
                    ..Default::default()
                }),
                verbose: true,
            }))
            .unwrap()
            .into_inner();
        r.info
            .get("pullProgress")
            .map(|j| serde_json::from_str::<serde_json::Value>(j).unwrap())
    };
    assert!(progress(&mut images).is_none());
    // sandboxctl under `script`, so that its stderr is a terminal.
    let cmd = format!("{} -r {ep} pull {image}", env!("CARGO_BIN_EXE_sandboxctl"));
    let pull = std::process::Command::new("script")
        .args(["-qefc", &cmd, "/dev/null"])
        .env("TERM", "xterm")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen: Vec<serde_json::Value> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        match progress(&mut images) {
            Some(p) => seen.push(p),
            None if !seen.is_empty() => break,
            None => {}
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = pull.wait_with_output().unwrap();
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{shown}");
    // The daemon's view: every layer listed with the manifest's size, bytes rising.
    let with_layers: Vec<&serde_json::Value> = seen
        .iter()
        .filter(|p| p["layers"].as_array().is_some_and(|l| l.len() == 3))
        .collect();
    assert!(with_layers.len() >= 3, "{seen:?}");
    for p in &with_layers {
        assert_eq!(p["image"], serde_json::json!(image));
        for (i, l) in p["layers"].as_array().unwrap().iter().enumerate() {
            assert_eq!(l["digest"], serde_json::json!(digests[i]));
            assert_eq!(l["size"], serde_json::json!(sizes[i]));
            assert!(l["received"].as_u64().unwrap() <= sizes[i], "{l}");
        }
    }
    let received = |p: &serde_json::Value| p["layers"][1]["received"].as_u64().unwrap();
    let partial: Vec<u64> = with_layers
        .iter()
        .map(|p| received(p))
        .filter(|r| *r > 0 && *r < sizes[1])
        .collect();
    assert!(partial.len() >= 2, "no partial progress seen: {seen:?}");
    assert!(partial.windows(2).all(|w| w[0] <= w[1]), "{partial:?}");
    assert!(with_layers
        .iter()
        .any(|p| p["layers"][1]["state"] == serde_json::json!("downloading")));
    assert!(progress(&mut images).is_none());
    // The terminal's view: a bar per layer by short digest, and the result.
    for dg in &digests {
        assert!(shown.contains(&dg[7..19]), "no bar for {dg}: {shown}");
    }
    assert!(shown.contains("Image is up to date for sha256:"), "{shown}");
    assert!(
        shown.contains("MiB") && shown.contains("] ") && shown.contains(" done"),
        "{shown}"
    );
    // A re-pull of a tag whose layers are all here fetches none of them.
    let out = sandboxctl(&ep, &["pull", &image]).output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).is_empty());
    drop(d);
    env.assert_no_leaks();
}

/// What a package installs from both binaries: completion scripts that the shells accept,
/// man pages that `man` renders (naming the subcommands), and `--version` naming the commit
/// and the CRI served — as crictl and containerd ship theirs.
#[test]
fn completions_man_pages_and_versions() {
    let env = Env::new("ctl-docs");
    let dir = env.base.clone();
    // The commit the scripts export at build time (scripts/commit); this test binary is
    // compiled by the same cargo run as the two binaries, so it sees the same value.
    let expected = option_env!("SANDBOXD_COMMIT").unwrap_or("unknown");
    for bin in [
        env!("CARGO_BIN_EXE_sandboxd"),
        env!("CARGO_BIN_EXE_sandboxctl"),
    ] {
        let run = |args: &[&str]| {
            let out = std::process::Command::new(bin).args(args).output().unwrap();
            assert!(out.status.success(), "{bin} {args:?}: {out:?}");
            String::from_utf8(out.stdout).unwrap()
        };
        let v = run(&["--version"]);
        assert!(
            v.contains(&format!("(commit {expected}"))
                && v.contains("CRI runtime.v1, cri-api v1.36"),
            "{v} (expected commit {expected})"
        );
        let name = std::path::Path::new(bin)
            .file_name()
            .unwrap()
            .to_str()
            .unwrap();
        let bash = dir.join(format!("{name}.bash"));
        std::fs::write(&bash, run(&["completion", "bash"])).unwrap();
        let (ok, out) = sh_ok(&format!(
            "bash -c 'source {} && complete -p {name}'",
            bash.display()
        ));
        assert!(ok && out.contains(&format!("_{name}")), "{out}");
        let zsh = run(&["completion", "zsh"]);
        assert!(zsh.starts_with(&format!("#compdef {name}")), "{zsh}");
        let page = dir.join(format!("{name}.1"));
        std::fs::write(&page, run(&["man"])).unwrap();
        let (ok, text) = sh_ok(&format!("MANWIDTH=100 man -l {} 2>&1", page.display()));
        let sub = if name == "sandboxd" {
            "completion"
        } else {
            "doctor"
        };
        assert!(
            ok && text.contains("SYNOPSIS") && text.contains(sub),
            "{text}"
        );
    }
}
