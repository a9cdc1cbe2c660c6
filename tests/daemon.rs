//! End-to-end tests of the daemon through its unix socket with a tonic client: lifecycle,
//! status codes, socket handling, malformed requests, network readiness, streaming URLs and
//! the config file. Kills and restarts are in `daemon_kill9.rs`, concurrent use in
//! `daemon_concurrency.rs`, the sandboxctl CLI in `sandboxctl.rs`.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::daemon::*;
use common::pods::*;
use common::*;
use sandboxd::api::v1 as cri;
use tonic::Code;

#[test]
fn lifecycle_and_status_codes() {
    let env = Env::new("e2e");
    let mut d = Daemon::start(&env);
    assert_eq!(
        std::fs::metadata(&d.socket).unwrap().permissions().mode() & 0o777,
        0o660
    );
    assert_eq!(
        std::fs::metadata(d.socket.parent().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    rt().block_on(async {
        let mut c = client(&d.socket).await;
        let v = c
            .version(cri::VersionRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (v.runtime_name.as_str(), v.runtime_api_version.as_str()),
            ("sandboxd", "v1")
        );
        let st = c
            .status(cri::StatusRequest { verbose: false })
            .await
            .unwrap()
            .into_inner()
            .status
            .unwrap();
        assert!(st.conditions.iter().all(|c| c.status), "{st:?}");
        let cfg = c
            .runtime_config(cri::RuntimeConfigRequest {})
            .await
            .unwrap()
            .into_inner();
        // kubelet follows the runtime's driver: systemd where it is PID 1 (the VM lane).
        let expected = if sandboxd::cgroups::systemd::booted() {
            cri::CgroupDriver::Systemd
        } else {
            cri::CgroupDriver::Cgroupfs
        };
        assert_eq!(cfg.linux.unwrap().cgroup_driver, expected as i32);

        let id = c
            .run_pod_sandbox(run_req(pod_config("web", "u-web", true)))
            .await
            .unwrap()
            .into_inner()
            .pod_sandbox_id;
        let s = status(&mut c, &id).await.unwrap();
        assert_eq!(s.state, cri::PodSandboxState::SandboxReady as i32);
        let ip = s.network.unwrap().ip;
        assert!(ip.starts_with(&env.subnet_prefix), "{ip}");
        let netns = env
            .cfg
            .netns_dir
            .join(list_names(&env.cfg.netns_dir).pop().unwrap());
        assert!(addrs_in(&netns, "eth0").contains(&ip));
        // Prefixes resolve; verbose status carries the record.
        let v = c
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: id[..10].into(),
                verbose: true,
            })
            .await
            .unwrap()
            .into_inner();
        assert!(v.info["info"].contains(&id));

        // The same request again returns the same id; another one for the name is AlreadyExists.
        assert_eq!(
            c.run_pod_sandbox(run_req(pod_config("web", "u-web", true)))
                .await
                .unwrap()
                .into_inner()
                .pod_sandbox_id,
            id
        );
        let mut other = pod_config("web", "u-web", true);
        other.hostname = "other".into();
        let e = c.run_pod_sandbox(run_req(other)).await.unwrap_err();
        assert_eq!(e.code(), Code::AlreadyExists);
        assert!(e.message().contains(&id), "{}", e.message());

        // Status codes.
        let unknown = "cd".repeat(32);
        assert_eq!(
            status(&mut c, &unknown).await.unwrap_err().code(),
            Code::NotFound
        );
        c.stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: unknown.clone(),
        })
        .await
        .unwrap();
        c.remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: unknown.clone(),
        })
        .await
        .unwrap();
        let e = c
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(cri::PodSandboxConfig::default()),
                runtime_handler: String::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("config.metadata"), "{}", e.message());
        let e = c
            .run_pod_sandbox(run_req(pod_config("", "u", false)))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("metadata.name"), "{}", e.message());
        let mut r = run_req(pod_config("h", "u-h", false));
        r.runtime_handler = "nope".into();
        assert_eq!(
            c.run_pod_sandbox(r).await.unwrap_err().code(),
            Code::InvalidArgument
        );
        let e = c
            .create_container(cri::CreateContainerRequest::default())
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("config"), "{}", e.message());
        let e = c.exec(cri::ExecRequest::default()).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        let e = c.attach(cri::AttachRequest::default()).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        // Features that do not exist say so instead of pretending.
        let e = c
            .checkpoint_container(cri::CheckpointContainerRequest::default())
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unimplemented);
        assert!(e.message().contains("checkpoint"), "{}", e.message());
        let mut img = sandboxd::api::v1::image_service_client::ImageServiceClient::new(
            channel(&d.socket).await,
        );
        assert!(img
            .list_images(cri::ListImagesRequest::default())
            .await
            .unwrap()
            .into_inner()
            .images
            .is_empty());
        let e = img
            .pull_image(cri::PullImageRequest::default())
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("image reference"), "{}", e.message());

        // Filters.
        let ready = c
            .list_pod_sandbox(cri::ListPodSandboxRequest {
                filter: Some(cri::PodSandboxFilter {
                    state: Some(cri::PodSandboxStateValue {
                        state: cri::PodSandboxState::SandboxNotready as i32,
                    }),
                    ..Default::default()
                }),
            })
            .await
            .unwrap()
            .into_inner()
            .items;
        assert!(ready.is_empty());

        c.stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: id.clone(),
        })
        .await
        .unwrap();
        c.stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: id.clone(),
        })
        .await
        .unwrap();
        assert_eq!(
            status(&mut c, &id).await.unwrap().state,
            cri::PodSandboxState::SandboxNotready as i32
        );
        c.remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.clone(),
        })
        .await
        .unwrap();
        assert!(list(&mut c).await.is_empty());
    });
    // A second daemon on the same socket is refused while the first answers.
    let out = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .arg("--config")
        .arg(&d.config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("already listening"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // SIGTERM: clean exit, socket removed.
    assert!(d.sigterm().success());
    assert!(!d.socket.exists(), "socket left after SIGTERM");
    env.assert_no_leaks();
}

/// Malformed requests: empty names, 10 MB annotations, 10 000 labels get InvalidArgument or
/// ResourceExhausted, and nothing is created.
#[test]
fn malformed_requests_create_nothing() {
    let env = Env::new("e2ebad");
    let d = Daemon::start(&env);
    rt().block_on(async {
        let mut c = client(&d.socket).await;
        let mut big = pod_config("big", "u-big", false);
        big.annotations.insert("a".into(), "x".repeat(10 << 20));
        let mut many = pod_config("many", "u-many", false);
        for i in 0..10_000 {
            many.labels.insert(format!("label-{i}"), "v".into());
        }
        let mut noname = pod_config("n", "", false);
        noname.metadata.as_mut().unwrap().namespace = String::new();
        for (what, cfg) in [
            ("10 MB annotations", big),
            ("10000 labels", many),
            ("empty uid and namespace", noname),
        ] {
            let e = c.run_pod_sandbox(run_req(cfg)).await.unwrap_err();
            assert!(
                matches!(e.code(), Code::InvalidArgument | Code::ResourceExhausted),
                "{what}: {e:?}"
            );
        }
        assert!(list(&mut c).await.is_empty());
    });
    env.assert_no_leaks();
}

/// A conf dir with only a broken config: Status says NetworkReady=false with the reason, and
/// RunPodSandbox fails without creating anything.
#[test]
fn network_not_ready_is_reported() {
    let env = Env::new("e2enet");
    std::fs::write(env.cfg.cni_conf_dir.join("10-broken.conflist"), "{ nope").unwrap();
    let d = Daemon::start(&env);
    rt().block_on(async {
        let mut c = client(&d.socket).await;
        let st = c
            .status(cri::StatusRequest { verbose: false })
            .await
            .unwrap()
            .into_inner()
            .status
            .unwrap();
        let net = st
            .conditions
            .iter()
            .find(|c| c.r#type == "NetworkReady")
            .unwrap();
        assert!(!net.status);
        assert_eq!(net.reason, "NetworkPluginNotReady");
        assert!(
            net.message.contains("10-broken.conflist"),
            "{}",
            net.message
        );
        let rtc = st
            .conditions
            .iter()
            .find(|c| c.r#type == "RuntimeReady")
            .unwrap();
        assert!(rtc.status);
        let e = c
            .run_pod_sandbox(run_req(pod_config("n", "u-n", false)))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Internal);
        assert!(
            e.message().contains("10-broken.conflist"),
            "{}",
            e.message()
        );
        assert!(list(&mut c).await.is_empty());
    });
    env.assert_no_leaks();
}

/// Exec and PortForward through the CRI: the daemon hands out a streaming URL; a SPDY client
/// runs the command on it; requests for a stopped container are refused.
#[test]
fn exec_url_through_the_cri() {
    let env = Env::new("e2eexec");
    let d = Daemon::start(&env);
    let layout = busybox::oci_layout(&env.base, "sandboxd.test/busybox:exec");
    sandboxd::image::ImageStore::new(env.cfg.root.join("images"))
        .unwrap()
        .import(&layout, None)
        .unwrap();
    rt().block_on(async {
        let mut c = client(&d.socket).await;
        let pod = pod_config("exec", "exec-uid", false);
        let sb = c
            .run_pod_sandbox(run_req(pod.clone()))
            .await
            .unwrap()
            .into_inner()
            .pod_sandbox_id;
        let id = c
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: sb.clone(),
                config: Some(cri::ContainerConfig {
                    metadata: Some(cri::ContainerMetadata {
                        name: "idle".into(),
                        attempt: 0,
                    }),
                    image: Some(cri::ImageSpec {
                        image: "sandboxd.test/busybox:exec".into(),
                        ..Default::default()
                    }),
                    command: vec!["sleep".into(), "1000".into()],
                    ..Default::default()
                }),
                sandbox_config: Some(pod),
            })
            .await
            .unwrap()
            .into_inner()
            .container_id;
        c.start_container(cri::StartContainerRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap();
        let url = c
            .exec(cri::ExecRequest {
                container_id: id.clone(),
                cmd: vec!["sh".into(), "-c".into(), "hostname; exit 7".into()],
                stdout: true,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .url;
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");
        let (out, status) = tokio::task::spawn_blocking(move || {
            let mut s = common::spdy::Client::connect(&url, &["v4.channel.k8s.io"]).unwrap();
            let err = s.open(&[("streamtype", "error")]);
            let out = s.open(&[("streamtype", "stdout")]);
            s.wait_ended(&[err, out]);
            (s.text(out), s.text(err))
        })
        .await
        .unwrap();
        assert_eq!(out, "exec\n");
        assert!(
            status.contains("\"NonZeroExitCode\"") && status.contains("\"7\""),
            "{status}"
        );
        let pf = c
            .port_forward(cri::PortForwardRequest {
                pod_sandbox_id: sb.clone(),
                port: vec![80],
            })
            .await
            .unwrap()
            .into_inner()
            .url;
        assert!(pf.contains("/portforward/"), "{pf}");
        let e = c
            .exec(cri::ExecRequest {
                container_id: id.clone(),
                cmd: vec!["true".into()],
                tty: true,
                stdout: true,
                stderr: true,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        c.stop_container(cri::StopContainerRequest {
            container_id: id.clone(),
            timeout: 0,
        })
        .await
        .unwrap();
        let e = c
            .exec(cri::ExecRequest {
                container_id: id.clone(),
                cmd: vec!["true".into()],
                stdout: true,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: sb })
            .await
            .unwrap();
    });
    env.assert_no_leaks();
}

/// Config: flags override the file, the effective config prints as TOML, unknown keys and a
/// bad value are refused with the key named.
#[test]
fn config_file_and_flags() {
    let env = Env::new("e2ecfg");
    let cfg = Daemon::config_file(&env);
    let out = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .args([
            "--config",
            cfg.to_str().unwrap(),
            "--socket",
            "/tmp/other.sock",
            "--cni-bin-dir",
            "/a:/b",
            "--cni-bin-dir",
            "/c",
        ])
        .arg("--print-default-config")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let parsed: toml::Table = toml::from_str(&text).unwrap();
    assert_eq!(parsed["socket"].as_str(), Some("/tmp/other.sock"));
    assert_eq!(
        parsed["root"].as_str(),
        Some(env.cfg.root.to_str().unwrap())
    );
    assert_eq!(parsed["cni_bin_dirs"].as_array().unwrap().len(), 3);
    let bad = env.base.join("bad.toml");
    std::fs::write(&bad, "sockett = \"/x\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .args(["--config", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown key \"sockett\""),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&bad, "infra = \"sometimes\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .args(["--config", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("infra"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Nothing was created by refused configs.
    assert!(!Path::new("/tmp/other.sock").exists());
}

/// A Go gRPC client on a unix socket sends the socket's path as `:authority` unless told
/// otherwise (kubelet and crictl override it; other node tools don't). That is no URI
/// authority, and the HTTP/2 layer used to reset every such request as malformed. Spoken
/// here byte by byte, as such a client writes it: Version answers.
#[test]
fn a_socket_path_as_authority_is_served() {
    use std::io::{Read, Write};
    let env = Env::new("daemon-authority");
    let d = Daemon::start(&env);
    let mut s = std::os::unix::net::UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let frame = |kind: u8, flags: u8, stream: u32, payload: &[u8]| -> Vec<u8> {
        let n = payload.len() as u32;
        let mut f = vec![(n >> 16) as u8, (n >> 8) as u8, n as u8, kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    };
    // HPACK, literals without Huffman coding: a value after an indexed name, or a new name.
    let lit = |index: &[u8], value: &str| -> Vec<u8> {
        let mut v = index.to_vec();
        v.push(value.len() as u8);
        v.extend_from_slice(value.as_bytes());
        v
    };
    let path = d.socket.display().to_string();
    let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
    block.extend(lit(&[0x04], "/runtime.v1.RuntimeService/Version"));
    block.extend(lit(&[0x01], &path)); // :authority
    block.extend(lit(&[0x0f, 0x10], "application/grpc")); // content-type
    block.extend(lit(&[0x00, 0x02, b't', b'e'], "trailers"));
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[])); // SETTINGS
    out.extend(frame(0x1, 0x4, 1, &block)); // HEADERS, END_HEADERS
    out.extend(frame(0x0, 0x1, 1, &[0, 0, 0, 0, 0])); // DATA: an empty VersionRequest, END_STREAM
    s.write_all(&out).unwrap();
    // Read frames until stream 1 answers with data (served) or is reset (refused).
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let answer = loop {
        let mut at = 0;
        let mut found = None;
        while buf.len() >= at + 9 {
            let len = (buf[at] as usize) << 16 | (buf[at + 1] as usize) << 8 | buf[at + 2] as usize;
            let (kind, stream) = (
                buf[at + 3],
                u32::from_be_bytes(buf[at + 5..at + 9].try_into().unwrap()) & 0x7fff_ffff,
            );
            if buf.len() < at + 9 + len {
                break;
            }
            if stream == 1 && (kind == 0x0 || kind == 0x3) {
                found = Some((kind, buf[at + 9..at + 9 + len].to_vec()));
            }
            if kind == 0x7 {
                found = Some((kind, buf[at + 9..at + 9 + len].to_vec())); // GOAWAY
            }
            at += 9 + len;
        }
        if let Some(f) = found {
            break f;
        }
        let n = s.read(&mut chunk).expect("the daemon answered nothing");
        assert!(n > 0, "the daemon closed the connection");
        buf.extend_from_slice(&chunk[..n]);
    };
    assert_eq!(
        answer.0, 0x0,
        "stream reset or connection refused: {answer:?}"
    );
    let text = String::from_utf8_lossy(&answer.1);
    assert!(text.contains("sandboxd"), "{text:?}");
}

/// With no `cgroup_parent` configured the parent is the state root's own (issue 36: two
/// daemons shared `/sandboxd`): pods that name none get their cgroup under it, and a clean
/// shutdown with no pod left removes it, so a short-lived daemon leaves nothing in the node's
/// hierarchies.
#[test]
fn the_default_cgroup_parent_is_the_roots_own_and_goes_at_shutdown() {
    use common::cri::{daemon_with, pod, remove_pod, run_pod, sleeper};
    let env = Env::new("cg-parent");
    let mut cfg = env.cfg.clone();
    cfg.cgroup_parent = String::new();
    let parent = cfg.effective_cgroup_parent();
    assert!(parent.starts_with("/sandboxd-") && parent != env.cfg.cgroup_parent);
    let (mut d, rt, mut c) = daemon_with(&env, &cfg);
    let p = pod("cgp", serde_json::json!({}));
    let sb = run_pod(&rt, &mut c, &p);
    let _id = sleeper(&rt, &mut c, &sb, &p, "s");
    let cg = sandboxd::cgroups::Driver::resolve(cfg.cgroup_driver)
        .unwrap()
        .own_pod_cgroup(&parent, &sb);
    assert!(
        sandboxd::cgroups::controller_dir("memory", &cg).is_some_and(|d| d.is_dir()),
        "{cg}"
    );
    remove_pod(&rt, &mut c, &sb);
    assert_eq!(d.sigterm().code(), Some(0));
    let gone = || {
        if !sandboxd::cgroups::systemd::booted() {
            for h in sandboxd::cgroups::hierarchies() {
                let dir = h.mount_point.join(parent.trim_start_matches('/'));
                assert!(!dir.exists(), "{} left", dir.display());
            }
        }
    };
    gone();
    // A library user's runtime, dropped, likewise.
    let lib = sandboxd::Runtime::new(cfg.clone()).unwrap();
    let sb = lib.run_pod_sandbox(&env.pod("lib", false)).unwrap();
    lib.stop_pod_sandbox(&sb).unwrap();
    lib.remove_pod_sandbox(&sb).unwrap();
    drop(lib);
    gone();
    env.assert_no_leaks();
}

/// Under a service manager (`Type=notify`): `READY=1` once the CRI socket serves (a request
/// made right after it is answered), `STOPPING=1` at SIGTERM, as systemd reads them from
/// `NOTIFY_SOCKET`. The variable reaches no child: runc, given it, proxies the socket into
/// the container and waits for the container's own READY — a container must start as
/// without it, and the environment of its monitor (started by the daemon) does not hold it.
#[test]
fn readiness_reaches_the_service_manager_and_no_child() {
    use common::cri::{pod, remove_pod, run_pod, sleeper};
    let env = Env::new("notify");
    sandboxd::image::ImageStore::new(env.cfg.root.join("images"))
        .unwrap()
        .import(&busybox::oci_layout(&env.base, common::cri::IMAGE), None)
        .unwrap();
    let path = env.base.join("notify.sock");
    let manager = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    manager
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let recv = || {
        let mut buf = [0u8; 4096];
        let n = manager.recv(&mut buf).expect("a notification within 30 s");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let mut d = Daemon::spawn_with_env(&env, &env.cfg, &[("NOTIFY_SOCKET", path.as_os_str())]);
    let ready = recv();
    assert!(
        ready.lines().any(|l| l == "READY=1") && ready.contains("STATUS=serving CRI v1"),
        "{ready:?}"
    );
    // Served from the moment READY=1 is sent: no retry.
    let rt = rt();
    let mut c = rt.block_on(client(&d.socket));
    let v = rt
        .block_on(c.version(cri::VersionRequest::default()))
        .unwrap()
        .into_inner();
    assert_eq!(v.runtime_name, "sandboxd");
    let environ = |pid: u32| {
        std::fs::read(format!("/proc/{pid}/environ"))
            .map(|e| String::from_utf8_lossy(&e).into_owned())
            .unwrap_or_default()
    };
    let p = pod("ntf", serde_json::json!({}));
    let sb = run_pod(&rt, &mut c, &p);
    let id = sleeper(&rt, &mut c, &sb, &p, "s");
    let st = common::cri::container_status(&rt, &mut c, &id);
    assert_eq!(st.state, cri::ContainerState::ContainerRunning as i32);
    // (The daemon's own /proc environ is the block it was started with; its children's are
    // what it passed on.)
    let monitors: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|pid: &u32| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd);
            let argv0 = cmd.split('\0').next().unwrap_or_default();
            argv0.ends_with("sandboxd-monitor") && cmd.contains(id.as_str())
        })
        .collect();
    assert!(!monitors.is_empty(), "no monitor of {id} found");
    for pid in monitors {
        let e = environ(pid);
        assert!(
            e.contains("PATH=") && !e.contains("NOTIFY_SOCKET="),
            "monitor {pid}: {e}"
        );
    }
    remove_pod(&rt, &mut c, &sb);
    assert_eq!(d.sigterm().code(), Some(0));
    let stopping = recv();
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
    env.assert_no_leaks();
}
