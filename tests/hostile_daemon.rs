//! The daemon as a process under attack: exec and ExecSync floods and half-open streaming
//! connections, with its memory and Version latency bounded. (The suite: hostile*.rs.)

mod common;

use std::time::Duration;

use common::hostile::IMAGE;
use common::*;

/// The daemon under attack, as a process: ExecSync commands producing 1 GiB, exec sessions
/// streaming to clients that stop reading, and 2000 half-open streaming connections. Each
/// is bounded (the daemon's memory stays within a fixed bound over its idle size), and
/// meanwhile Version keeps answering within a second. (Items: exec backpressure, ExecSync
/// buffering, slowloris.)
#[test]
fn the_daemon_stays_bounded_and_responsive_under_attack() {
    use common::daemon::{client, rt, Daemon};
    use sandboxd::api::v1 as cri;
    let env = Env::new("hostile-daemon");
    sandboxd::server::raise_fd_limit();
    sandboxd::image::ImageStore::new(env.cfg.root.join("images"))
        .unwrap()
        .import(&busybox::oci_layout(&env.base, IMAGE), None)
        .unwrap();
    let mut cfg = env.cfg.clone();
    cfg.streaming.header_timeout_secs = 2;
    let d = Daemon::start_with(&env, &cfg);
    let tokio = rt();
    let mut c = tokio.block_on(client(&d.socket));
    let pod = sandboxd::cri::crictl_json::pod_config(
        serde_json::json!({"metadata": {"name": "attack", "namespace": "h", "uid": "attack-uid"}})
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    let sb = tokio
        .block_on(c.run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(pod.clone()),
            runtime_handler: String::new(),
        }))
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    let ctr = sandboxd::cri::crictl_json::container_config(
        serde_json::json!({"metadata": {"name": "victim"}, "image": {"image": IMAGE},
            "command": ["sleep", "1000"]})
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    let id = tokio
        .block_on(c.create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sb.clone(),
            config: Some(ctr),
            sandbox_config: Some(pod),
        }))
        .unwrap()
        .into_inner()
        .container_id;
    tokio
        .block_on(c.start_container(cri::StartContainerRequest {
            container_id: id.clone(),
        }))
        .unwrap();
    // Version's latency, and that it answers at all.
    let version_ms = |c: &mut sandboxd::api::v1::runtime_service_client::RuntimeServiceClient<
        tonic::transport::Channel,
    >| {
        let t = std::time::Instant::now();
        tokio
            .block_on(c.version(cri::VersionRequest::default()))
            .unwrap();
        t.elapsed().as_millis()
    };
    version_ms(&mut c);
    let idle_kib = d.status_kib("VmRSS");
    let bound_kib = idle_kib + 128 * 1024;

    // ExecSync of 1 GiB, two at once: the output is capped while it runs.
    let mut execs = Vec::new();
    for _ in 0..2 {
        let mut cc = c.clone();
        let id = id.clone();
        execs.push(tokio.spawn(async move {
            cc.exec_sync(cri::ExecSyncRequest {
                container_id: id,
                cmd: vec![
                    "head".into(),
                    "-c".into(),
                    "1073741824".into(),
                    "/dev/zero".into(),
                ],
                timeout: 120,
            })
            .await
            .map(|r| r.into_inner().stdout.len())
        }));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(version_ms(&mut c) < 1000, "Version slow during ExecSync");
    // Each keeps at most its cap; together they fill the daemon-wide budget (the one that
    // finishes first frees its share only when it answers), never more than both caps.
    let got: Vec<usize> = execs
        .into_iter()
        .map(|e| tokio.block_on(e).unwrap().unwrap())
        .collect();
    let budget = sandboxd::Config::default().exec_sync_output_budget as usize;
    assert!(
        got.iter()
            .all(|n| *n > 0 && *n <= sandboxd::container::MAX_EXEC_OUTPUT),
        "{got:?}"
    );
    assert!(
        got.iter().sum::<usize>() >= budget,
        "{got:?} under the {budget} budget"
    );
    let hwm = d.status_kib("VmHWM");
    assert!(
        hwm < bound_kib,
        "ExecSync peak {hwm} KiB, idle {idle_kib} KiB: not bounded by the output cap"
    );

    // Exec sessions to clients that stop reading, and one whose process floods the stderr
    // its client did not ask for (drained and dropped, not buffered).
    let mut clients = Vec::new();
    for i in 0..5 {
        let cmd = if i < 4 {
            "cat /dev/zero"
        } else {
            "cat /dev/zero >&2"
        };
        let url = tokio
            .block_on(c.exec(cri::ExecRequest {
                container_id: id.clone(),
                cmd: vec!["sh".into(), "-c".into(), cmd.into()],
                tty: false,
                stdin: false,
                stdout: true,
                stderr: false,
                ..Default::default()
            }))
            .unwrap()
            .into_inner()
            .url;
        let mut s = common::spdy::Client::connect(&url, &["v4.channel.k8s.io"]).unwrap();
        s.open(&[("streamtype", "error")]);
        s.open(&[("streamtype", "stdout")]);
        clients.push(s); // never read again
    }
    for _ in 0..3 {
        std::thread::sleep(Duration::from_secs(1));
        assert!(
            version_ms(&mut c) < 1000,
            "Version slow during the exec flood"
        );
    }
    let rss = d.status_kib("VmRSS");
    assert!(
        rss < idle_kib + 64 * 1024,
        "exec sessions to stalled clients grew the daemon from {idle_kib} to {rss} KiB"
    );
    drop(clients);

    // 2000 half-open connections to the streaming server.
    let url = tokio
        .block_on(c.exec(cri::ExecRequest {
            container_id: id.clone(),
            cmd: vec!["true".into()],
            tty: false,
            stdin: false,
            stdout: true,
            stderr: false,
            ..Default::default()
        }))
        .unwrap()
        .into_inner()
        .url;
    let addr = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let mut half_open = Vec::new();
    for _ in 0..2000 {
        if let Ok(mut s) = std::net::TcpStream::connect(&addr) {
            let _ = std::io::Write::write_all(&mut s, b"GET /exec/x HTTP/1.1\r\n");
            half_open.push(s);
        }
    }
    assert!(
        version_ms(&mut c) < 1000,
        "Version slow with 2000 half-open connections"
    );
    let listed = tokio
        .block_on(c.list_pod_sandbox(cri::ListPodSandboxRequest { filter: None }))
        .unwrap()
        .into_inner()
        .items
        .len();
    assert_eq!(listed, 1);
    std::thread::sleep(Duration::from_secs(3)); // past the header timeout
    drop(half_open);
    // The streaming server serves again.
    let mut s = common::spdy::Client::connect(&url, &["v4.channel.k8s.io"]).unwrap();
    let e = s.open(&[("streamtype", "error")]);
    let o = s.open(&[("streamtype", "stdout")]);
    s.wait_ended(&[e, o]);
    assert!(d.status_kib("VmRSS") < bound_kib);

    tokio
        .block_on(c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: sb }))
        .unwrap();
    env.assert_no_leaks();
}

/// Long ExecSync calls (exec probes with hour-long timeouts are ordinary pod specs) are capped
/// per container: past `exec_sync_max_per_container` they are refused at once with
/// ResourceExhausted instead of taking the node's CRI threads; the rest of the CRI keeps
/// answering meanwhile; and when their callers go away (cancelled RPCs) their commands are
/// killed within seconds instead of running out their timeouts for nobody.
#[test]
fn exec_sync_is_capped_per_container_and_stops_when_its_caller_goes() {
    use common::cri::*;
    use sandboxd::api::v1 as cri;
    use std::time::Instant;
    let env = Env::new("hostile-execsync");
    let mut cfg = env.cfg.clone();
    cfg.exec_sync_max_per_container = 8;
    let (_d, rt, mut c) = daemon_with(&env, &cfg);
    let p = pod("execs", serde_json::json!({}));
    let sb = run_pod(&rt, &mut c, &p);
    let id = sleeper(&rt, &mut c, &sb, &p, "target");
    let sleeping = || {
        processes_mentioning("sleep 3600")
            .iter()
            .filter(|c| c.trim() == "sleep 3600")
            .count()
    };
    let calls: Vec<_> = (0..20)
        .map(|_| {
            let mut c2 = c.clone();
            let id = id.clone();
            rt.spawn(async move {
                c2.exec_sync(cri::ExecSyncRequest {
                    container_id: id,
                    cmd: vec!["sleep".into(), "3600".into()],
                    timeout: 3600,
                })
                .await
            })
        })
        .collect();
    // 12 refused at once, 8 running.
    let deadline = Instant::now() + Duration::from_secs(20);
    while calls.iter().filter(|t| t.is_finished()).count() < 12 || sleeping() < 8 {
        assert!(
            Instant::now() < deadline,
            "{} finished, {} sleeping",
            calls.iter().filter(|t| t.is_finished()).count(),
            sleeping()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(sleeping(), 8);
    let (done, running): (Vec<_>, Vec<_>) = calls.into_iter().partition(|t| t.is_finished());
    assert_eq!(done.len(), 12);
    for t in done {
        let e = rt.block_on(t).unwrap().unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
        assert!(e.message().contains("exec_sync_max_per_container"), "{e:?}");
    }
    // The rest of the CRI answers quickly meanwhile.
    let mut times: Vec<Duration> = (0..50)
        .map(|_| {
            let t = Instant::now();
            rt.block_on(c.container_status(cri::ContainerStatusRequest {
                container_id: id.clone(),
                verbose: false,
            }))
            .unwrap();
            t.elapsed()
        })
        .collect();
    times.sort();
    // Starved, every call would wait; the slowest few of 50 also wait for the host's
    // scheduler when a VM lane shares the cores (one CI run: 56, 75, 187 ms, the 47 others
    // under 19 ms), so the bound is on the 90th percentile.
    assert!(times[44] < Duration::from_millis(100), "{times:?}");
    // The callers go: their commands are killed.
    for t in running {
        t.abort();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while sleeping() > 0 {
        assert!(Instant::now() < deadline, "{} still sleeping", sleeping());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(exec(&rt, &mut c, &id, "echo ok"), "ok\n");
    remove_pod(&rt, &mut c, &sb);
    env.assert_no_leaks();
}

/// A pull every caller has left stops: kubelet's call that timed out (or was cancelled) no
/// longer leaves a download holding a thread and a connection until the progress timeout.
/// While another caller still waits, the shared pull goes on.
#[test]
fn a_pull_stops_when_every_caller_has_gone() {
    use common::daemon::{rt, Daemon};
    use common::fake_registry::{FakeRegistry, OneLayer};
    use sandboxd::api::v1 as cri;
    use sandboxd::api::v1::image_service_client::ImageServiceClient;
    let env = Env::new("hostile-pullgone");
    let d = Daemon::start(&env);
    let (layer, config) = busybox::gzip_layer_and_config();
    let img = OneLayer::new(config, layer, "application/vnd.oci.image.layer.v1.tar+gzip");
    // A byte every 5 s: never stalled long enough for the progress timeout (300 s).
    let fake = FakeRegistry::start(move |path| img.answer(path, Some((1, Duration::from_secs(5)))));
    let image = format!("{}/x/drip:1", fake.addr);
    let tokio = rt();
    let socket = d.socket.to_string_lossy().into_owned();
    let client = || {
        let socket = socket.clone();
        async move {
            ImageServiceClient::new(
                common::daemon::connect(&socket, Duration::from_secs(30))
                    .await
                    .unwrap(),
            )
        }
    };
    let pull = |deadline: Duration| {
        let image = image.clone();
        let client = client();
        async move {
            let mut images = client.await;
            let mut req = tonic::Request::new(cri::PullImageRequest {
                image: Some(cri::ImageSpec {
                    image,
                    ..Default::default()
                }),
                ..Default::default()
            });
            req.set_timeout(deadline);
            images
                .pull_image(req)
                .await
                .map(|_| ())
                .map_err(|e| e.code())
        }
    };
    let in_flight = || {
        tokio.block_on(async {
            let mut images = client().await;
            images
                .image_status(cri::ImageStatusRequest {
                    image: Some(cri::ImageSpec {
                        image: image.clone(),
                        ..Default::default()
                    }),
                    verbose: true,
                })
                .await
                .unwrap()
                .into_inner()
                .info
                .contains_key("pullProgress")
        })
    };
    let first = tokio.spawn(pull(Duration::from_secs(1)));
    let second = tokio.spawn(pull(Duration::from_secs(6)));
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        first.is_finished(),
        "the first caller's deadline has passed"
    );
    assert!(in_flight(), "the pull stopped while a caller still waits");
    // The daemon answers DeadlineExceeded a little before the deadline; tonic's client also
    // keeps the deadline itself and, when the answer is late (a loaded host: CI runs this
    // beside a VM lane), ends the call first with its own Cancelled. Either is the call ended
    // at its deadline; a pull that answered or failed otherwise is not.
    for call in [first, second] {
        let got = tokio.block_on(call).unwrap();
        assert!(
            matches!(
                got,
                Err(tonic::Code::DeadlineExceeded | tonic::Code::Cancelled)
            ),
            "{got:?}"
        );
    }
    let t = std::time::Instant::now();
    while in_flight() {
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "the pull goes on with no caller left"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let tmp = env.cfg.root.join("images/tmp");
    while !list_names(&tmp).is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "partial layers left: {:?}",
            list_names(&tmp)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(d);
    env.assert_no_leaks();
}
