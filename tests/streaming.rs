//! The streaming server for real: one-time URLs, exec over SPDY/3.1 (our own client written
//! from the protocol description) and over WebSocket (tungstenite's client), TTY with resize,
//! port forwarding into the pod's network namespace, and no leaks after many sessions.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::spdy::Client;
use common::*;
use sandboxd::streaming::{StreamingConfig, StreamingServer, Target};
use sandboxd::{ContainerConfig, Error, Runtime};
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest, Message};

const IMAGE: &str = "sandboxd.test/busybox:stream";

struct Setup {
    env: Env,
    rt: Arc<Runtime>,
    tokio: tokio::runtime::Runtime,
    server: Arc<StreamingServer>,
    sandbox: String,
    container: String,
}

/// A runtime with the test image, a tokio runtime and a streaming server on it.
fn server(
    env: &Env,
    cfg: StreamingConfig,
) -> (Arc<Runtime>, tokio::runtime::Runtime, Arc<StreamingServer>) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("sandboxd=debug")
        .with_test_writer()
        .try_init();
    let rt = Arc::new(env.runtime());
    rt.images()
        .import(&busybox::oci_layout(&env.base, IMAGE), None)
        .unwrap();
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = tokio
        .block_on(StreamingServer::start(rt.clone(), cfg))
        .unwrap();
    (rt, tokio, server)
}

fn setup(name: &str, script: &str, ttl: u64) -> Setup {
    let env = Env::new(name);
    let cfg = StreamingConfig {
        token_ttl_secs: ttl,
        ..Default::default()
    };
    let (rt, tokio, server) = server(&env, cfg);
    let sandbox = rt.run_pod_sandbox(&env.pod(name, false)).unwrap();
    let c = ContainerConfig {
        metadata: sandboxd::ContainerMetadata {
            name: "main".into(),
            attempt: 0,
        },
        image: IMAGE.into(),
        command: vec!["sh".into(), "-c".into(), script.into()],
        ..Default::default()
    };
    let container = rt.create_container(&sandbox, &c).unwrap();
    rt.start_container(&container).unwrap();
    Setup {
        env,
        rt,
        tokio,
        server,
        sandbox,
        container,
    }
}

impl Setup {
    fn exec_url(&self, cmd: &str, tty: bool, stdin: bool, stderr: bool) -> String {
        self.server
            .exec_url(Target::Exec {
                container_id: self.container.clone(),
                cmd: vec!["sh".into(), "-c".into(), cmd.into()],
                tty,
                stdin,
                stdout: true,
                stderr,
            })
            .unwrap()
    }

    fn finish(self) {
        self.rt.remove_pod_sandbox(&self.sandbox).unwrap();
        self.env.assert_no_leaks();
        drop(self.tokio);
    }
}

fn status(json: &str) -> serde_json::Value {
    serde_json::from_str(json).unwrap_or_else(|e| panic!("error stream {json:?}: {e}"))
}

#[test]
fn spdy_exec_output_exit_code_and_single_use() {
    let s = setup("st-spdy", "exec sleep 1000", 60);
    let url = s.exec_url("echo out; echo err >&2; exit 3", false, false, true);
    let mut c = Client::connect(&url, &["v4.channel.k8s.io", "channel.k8s.io"]).unwrap();
    assert_eq!(c.protocol, "v4.channel.k8s.io");
    let err = c.open(&[("streamtype", "error")]);
    let out = c.open(&[("streamtype", "stdout")]);
    let eout = c.open(&[("streamtype", "stderr")]);
    c.ping(1);
    c.wait_ended(&[err, out, eout]);
    assert_eq!(c.text(out), "out\n");
    assert_eq!(c.text(eout), "err\n");
    let st = status(&c.text(err));
    assert_eq!(st["status"], "Failure");
    assert_eq!(st["reason"], "NonZeroExitCode");
    assert_eq!(st["details"]["causes"][0]["reason"], "ExitCode");
    assert_eq!(st["details"]["causes"][0]["message"], "3");
    assert_eq!(st["metadata"], serde_json::json!({}));
    // The URL was good for one use.
    let again = Client::connect(&url, &["v4.channel.k8s.io"]).err().unwrap();
    assert!(again.starts_with("HTTP/1.1 404"), "{again}");

    // Success; stdin streamed in and closed with FIN.
    let url = s.exec_url("cat; echo done", false, true, false);
    let mut c = Client::connect(&url, &["v4.channel.k8s.io"]).unwrap();
    let err = c.open(&[("streamtype", "error")]);
    let inp = c.open(&[("streamtype", "stdin")]);
    let out = c.open(&[("streamtype", "stdout")]);
    c.send(inp, b"hello ", false);
    c.send(inp, b"spdy\n", true);
    c.wait_ended(&[err, out]);
    // The server acknowledged the stdin data with window updates (stream and session).
    assert_eq!(
        c.window_updates
            .iter()
            .filter(|(id, _)| *id == inp)
            .map(|(_, n)| n)
            .sum::<u32>(),
        11
    );
    assert!(c.window_updates.iter().any(|(id, _)| *id == 0));
    assert_eq!(c.text(out), "hello spdy\ndone\n");
    assert_eq!(status(&c.text(err))["status"], "Success");

    // Unknown protocol versions are refused, listing what the server speaks.
    let url = s.exec_url("true", false, false, false);
    let e = Client::connect(&url, &["v9.channel.k8s.io"]).err().unwrap();
    assert!(
        e.starts_with("HTTP/1.1 403") && e.contains("v4.channel.k8s.io"),
        "{e}"
    );
    s.finish();
}

#[test]
fn spdy_exec_with_a_terminal_and_resize() {
    let s = setup("st-tty", "exec sleep 1000", 60);
    let url = s.exec_url("read x; stty size; echo got $x", true, true, false);
    let mut c = Client::connect(&url, &["v4.channel.k8s.io"]).unwrap();
    let err = c.open(&[("streamtype", "error")]);
    let inp = c.open(&[("streamtype", "stdin")]);
    let out = c.open(&[("streamtype", "stdout")]);
    let resize = c.open(&[("streamtype", "resize")]);
    c.send(resize, b"{\"Width\":100,\"Height\":40}\n", false);
    std::thread::sleep(Duration::from_millis(200));
    c.send(inp, b"typed\r", false);
    c.wait_ended(&[err, out]);
    let text = c.text(out);
    assert!(
        text.contains("40 100"),
        "{text:?} / error stream: {}",
        c.text(err)
    );
    assert!(text.contains("got typed"), "{text:?}");
    assert_eq!(status(&c.text(err))["status"], "Success");

    // A command that cannot start ends the session with a failure instead of hanging.
    let url = s
        .server
        .exec_url(Target::Exec {
            container_id: s.container.clone(),
            cmd: vec!["/no/such/binary".into()],
            tty: true,
            stdin: false,
            stdout: true,
            stderr: false,
        })
        .unwrap();
    let t = Instant::now();
    let mut c = Client::connect(&url, &["v4.channel.k8s.io"]).unwrap();
    let err = c.open(&[("streamtype", "error")]);
    let out = c.open(&[("streamtype", "stdout")]);
    let _resize = c.open(&[("streamtype", "resize")]);
    c.wait_ended(&[err, out]);
    assert_eq!(status(&c.text(err))["status"], "Failure", "{}", c.text(err));
    assert!(t.elapsed() < Duration::from_secs(20));
    s.finish();
}

fn ws_connect(
    url: &str,
    protocol: &str,
) -> tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<std::net::TcpStream>> {
    let mut req = url
        .replace("http://", "ws://")
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("Sec-WebSocket-Protocol", protocol.parse().unwrap());
    let (ws, resp) = tungstenite::connect(req).unwrap();
    assert_eq!(
        resp.headers().get("sec-websocket-protocol").unwrap(),
        protocol
    );
    ws
}

/// Reads channel messages until the server closes; returns per-channel bytes.
fn ws_collect(
    ws: &mut tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<std::net::TcpStream>>,
    b64: bool,
) -> std::collections::HashMap<u8, Vec<u8>> {
    use base64::Engine;
    let mut out: std::collections::HashMap<u8, Vec<u8>> = Default::default();
    loop {
        match ws.read() {
            Ok(Message::Binary(b)) if !b64 => {
                out.entry(b[0]).or_default().extend_from_slice(&b[1..])
            }
            Ok(Message::Text(t)) if b64 => {
                let t = t.as_bytes();
                let data = base64::engine::general_purpose::STANDARD
                    .decode(&t[1..])
                    .unwrap();
                out.entry(t[0] - b'0').or_default().extend_from_slice(&data);
            }
            Ok(Message::Close(_)) | Err(_) => return out,
            Ok(_) => {}
        }
    }
}

#[test]
fn websocket_exec_v5_close_v4_and_base64() {
    let s = setup("st-ws", "exec sleep 1000", 60);
    // v5: stdin closed with the CLOSE message; exit code 2 reported as NonZeroExitCode.
    let url = s.exec_url("cat; exit 2", false, true, true);
    let mut ws = ws_connect(&url, "v5.channel.k8s.io");
    ws.send(Message::binary(b"\x00via websocket\n".to_vec()))
        .unwrap();
    ws.send(Message::binary(vec![255u8, 0])).unwrap();
    let got = ws_collect(&mut ws, false);
    assert_eq!(got[&1], b"via websocket\n");
    let st = status(&String::from_utf8_lossy(&got[&3]));
    assert_eq!(st["reason"], "NonZeroExitCode");
    assert_eq!(st["details"]["causes"][0]["message"], "2");

    // base64 flavour of v4.
    let url = s.exec_url("echo b64; echo e >&2", false, false, true);
    let mut ws = ws_connect(&url, "v4.base64.channel.k8s.io");
    let got = ws_collect(&mut ws, true);
    assert_eq!(got[&1], b"b64\n");
    assert_eq!(got[&2], b"e\n");
    assert_eq!(
        status(&String::from_utf8_lossy(&got[&3]))["status"],
        "Success"
    );
    s.finish();
}

#[test]
fn port_forward_over_spdy_and_websocket() {
    let s = setup("st-pf", "while :; do echo pong | nc -l -p 8080; done", 60);
    // Wait for the listener inside the pod (nc listens again after each connection).
    let listening = || {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let r =
                s.rt.exec_sync(
                    &s.container,
                    &[
                        "sh".into(),
                        "-c".into(),
                        "netstat -ltn | grep -q ':8080 '".into(),
                    ],
                    Duration::from_secs(5),
                )
                .unwrap();
            if r.exit_code == 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "nothing listens on 8080 in the pod"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    listening();
    let url = s
        .server
        .exec_url(Target::PortForward {
            sandbox_id: s.sandbox.clone(),
            ports: vec![8080],
        })
        .unwrap();
    let mut c = Client::connect(&url, &["portforward.k8s.io"]).unwrap();
    let err = c.open(&[
        ("streamtype", "error"),
        ("port", "8080"),
        ("requestid", "0"),
    ]);
    let data = c.open(&[("streamtype", "data"), ("port", "8080"), ("requestid", "0")]);
    c.send(err, b"", true);
    c.send(data, b"ping\n", false);
    c.wait_for(data, "pong");
    assert_eq!(c.text(data), "pong\n");
    // A port nobody listens on: the error stream says so.
    let err2 = c.open(&[("streamtype", "error"), ("port", "9"), ("requestid", "1")]);
    let data2 = c.open(&[("streamtype", "data"), ("port", "9"), ("requestid", "1")]);
    c.wait_ended(&[err2, data2]);
    assert!(
        c.text(err2).contains("error forwarding port 9"),
        "{}",
        c.text(err2)
    );
    drop(c);

    listening();
    let url = s
        .server
        .exec_url(Target::PortForward {
            sandbox_id: s.sandbox.clone(),
            ports: vec![8080],
        })
        .unwrap();
    let mut ws = ws_connect(&url, "v4.channel.k8s.io");
    // The server opens both channels of port 0 with the port number, little-endian.
    for ch in [0u8, 1] {
        let m = loop {
            if let Message::Binary(b) = ws.read().unwrap() {
                break b;
            }
        };
        assert_eq!(m.to_vec(), vec![ch, 0x90, 0x1f]);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    ws.send(Message::binary(b"\x00ping\n".to_vec())).unwrap();
    while !String::from_utf8_lossy(&got).contains("pong") && Instant::now() < deadline {
        if let Ok(Message::Binary(b)) = ws.read() {
            if b[0] == 0 {
                got.extend_from_slice(&b[1..]);
            }
        }
    }
    assert_eq!(got, b"pong\n");
    drop(ws);
    s.finish();
}

#[test]
fn urls_are_checked_expire_and_sessions_leave_nothing() {
    let s = setup("st-urls", "exec sleep 1000", 1);
    let bad = |t: Target| s.server.exec_url(t).unwrap_err();
    let exec = |tty, stdin, stdout, stderr| Target::Exec {
        container_id: s.container.clone(),
        cmd: vec!["true".into()],
        tty,
        stdin,
        stdout,
        stderr,
    };
    assert!(matches!(
        bad(exec(false, false, false, false)),
        Error::InvalidArgument(_)
    ));
    assert!(matches!(
        bad(exec(true, false, true, true)),
        Error::InvalidArgument(_)
    ));
    assert!(matches!(
        bad(Target::Exec {
            container_id: "0123456789abcdef".into(),
            cmd: vec!["true".into()],
            tty: false,
            stdin: false,
            stdout: true,
            stderr: false
        }),
        Error::NotFound { .. }
    ));
    // Expired after its TTL.
    let url = s.exec_url("true", false, false, false);
    std::thread::sleep(Duration::from_millis(1500));
    let e = Client::connect(&url, &["v4.channel.k8s.io"]).err().unwrap();
    assert!(e.starts_with("HTTP/1.1 404"), "{e}");

    // 20 concurrent sessions: all exit codes right, then no runtime exec, no extra fds.
    let fds = || list_names(std::path::Path::new("/proc/self/fd")).len();
    let threads = || list_names(std::path::Path::new("/proc/self/task")).len();
    let before = fds();
    let threads_before = threads();
    let urls: Vec<String> = (0..20)
        .map(|i| s.exec_url(&format!("echo {i}; exit {}", i % 4), false, false, false))
        .collect();
    std::thread::scope(|sc| {
        for (i, url) in urls.iter().enumerate() {
            sc.spawn(move || {
                let mut c = Client::connect(url, &["v4.channel.k8s.io"]).unwrap();
                let err = c.open(&[("streamtype", "error")]);
                let out = c.open(&[("streamtype", "stdout")]);
                c.wait_ended(&[err, out]);
                assert_eq!(c.text(out), format!("{i}\n"));
                let st = status(&c.text(err));
                if i % 4 == 0 {
                    assert_eq!(st["status"], "Success");
                } else {
                    assert_eq!(st["details"]["causes"][0]["message"], (i % 4).to_string());
                }
            });
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while fds() > before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(fds() <= before, "fds: {before} before, {} after", fds());
    // Threads: the sessions' own are gone (a few runtime helpers may idle a while).
    let deadline = Instant::now() + Duration::from_secs(15);
    while threads() > threads_before + 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        threads() <= threads_before + 2,
        "threads: {threads_before} before, {} after",
        threads()
    );
    // `sandboxd-monitor exec --runtime …` and the runtime's `exec --detach …` of this test.
    let left: Vec<String> = processes_mentioning(&s.env.base.display().to_string())
        .into_iter()
        .filter(|c| c.contains(" exec --runtime ") || c.contains(" exec --detach "))
        .collect();
    assert!(left.is_empty(), "runtime exec processes left: {left:?}");
    let ps =
        s.rt.exec_sync(
            &s.container,
            &["ps".into(), "-o".into(), "stat,args".into()],
            Duration::from_secs(5),
        )
        .unwrap();
    let ps = String::from_utf8_lossy(&ps.stdout);
    assert!(
        !ps.lines().any(|l| l.trim_start().starts_with('Z')),
        "zombies: {ps}"
    );
    s.finish();
}

#[test]
fn attach_over_spdy_and_websocket_keeps_the_container_running() {
    let env = Env::new("st-attach");
    let (rt, tokio, server) = server(&env, StreamingConfig::default());
    let mut pod = env.pod("st-attach", false);
    pod.log_directory = env.base.join("logs").to_string_lossy().into();
    let sb = rt.run_pod_sandbox(&pod).unwrap();
    let c = ContainerConfig {
        metadata: sandboxd::ContainerMetadata {
            name: "reader".into(),
            attempt: 0,
        },
        image: IMAGE.into(),
        command: vec![
            "sh".into(),
            "-c".into(),
            "echo ready; while read line; do echo \"got $line\"; echo \"err $line\" >&2; done; echo bye".into(),
        ],
        stdin: true,
        log_path: "reader.log".into(),
        ..Default::default()
    };
    let id = rt.create_container(&sb, &c).unwrap();
    rt.start_container(&id).unwrap();
    let attach = |stdin: bool| {
        server
            .exec_url(Target::Attach {
                container_id: id.clone(),
                tty: false,
                stdin,
                stdout: true,
                stderr: true,
            })
            .unwrap()
    };

    // SPDY: write a line, read the container's answer on stdout and stderr, detach.
    let mut c1 = Client::connect(&attach(true), &["v4.channel.k8s.io"]).unwrap();
    let _err = c1.open(&[("streamtype", "error")]);
    let inp = c1.open(&[("streamtype", "stdin")]);
    let out = c1.open(&[("streamtype", "stdout")]);
    let eout = c1.open(&[("streamtype", "stderr")]);
    c1.send(inp, b"one\n", false);
    c1.wait_for(out, "got one");
    c1.wait_for(eout, "err one");
    drop(c1); // detach
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        rt.container_status(&id).unwrap().state,
        sandboxd::ContainerState::Running,
        "detaching stopped the container"
    );

    // WebSocket: attach again, same stdin.
    let mut ws = ws_connect(&attach(true), "v4.channel.k8s.io");
    ws.send(Message::binary(b"\x00two\n".to_vec())).unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !String::from_utf8_lossy(&got).contains("got two") {
        assert!(
            Instant::now() < deadline,
            "{}",
            String::from_utf8_lossy(&got)
        );
        if let Ok(Message::Binary(b)) = ws.read() {
            if b[0] == 1 {
                got.extend_from_slice(&b[1..]);
            }
        }
    }
    // While this client holds stdin, another attacher's input is dropped.
    let mut c3 = Client::connect(&attach(true), &["v4.channel.k8s.io"]).unwrap();
    let _e3 = c3.open(&[("streamtype", "error")]);
    let in3 = c3.open(&[("streamtype", "stdin")]);
    let _o3 = c3.open(&[("streamtype", "stdout")]);
    let _x3 = c3.open(&[("streamtype", "stderr")]);
    c3.send(in3, b"three\n", false);
    std::thread::sleep(Duration::from_millis(500));
    ws.send(Message::binary(b"\x00four\n".to_vec())).unwrap();
    let mut more = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !String::from_utf8_lossy(&more).contains("got four") {
        assert!(
            Instant::now() < deadline,
            "{}",
            String::from_utf8_lossy(&more)
        );
        if let Ok(Message::Binary(b)) = ws.read() {
            if b[0] == 1 {
                more.extend_from_slice(&b[1..]);
            }
        }
    }
    assert!(
        !String::from_utf8_lossy(&more).contains("three"),
        "a second writer got through: {}",
        String::from_utf8_lossy(&more)
    );
    drop(c3);
    // The container exiting ends the attach with success.
    rt.stop_container(&id, Duration::ZERO).unwrap();
    let rest = ws_collect(&mut ws, false);
    assert_eq!(
        status(&String::from_utf8_lossy(&rest[&3]))["status"],
        "Success"
    );
    // The CRI log got everything too.
    let log = std::fs::read_to_string(env.base.join("logs/reader.log")).unwrap();
    assert!(
        log.contains("stdout F got one") && log.contains("stdout F got two"),
        "{log}"
    );
    assert!(log.contains("stderr F err one"), "{log}");

    // Stdin for a container created without it is refused.
    let c2 = ContainerConfig {
        metadata: sandboxd::ContainerMetadata {
            name: "nostdin".into(),
            attempt: 0,
        },
        image: IMAGE.into(),
        command: vec!["sleep".into(), "1000".into()],
        ..Default::default()
    };
    let id2 = rt.create_container(&sb, &c2).unwrap();
    rt.start_container(&id2).unwrap();
    let e = server
        .exec_url(Target::Attach {
            container_id: id2,
            tty: false,
            stdin: true,
            stdout: true,
            stderr: false,
        })
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    rt.remove_pod_sandbox(&sb).unwrap();
    env.assert_no_leaks();
    drop(tokio);
}

#[test]
fn idle_sessions_time_out_and_sessions_are_capped() {
    let s = setup("st-limits", "exec sleep 1000", 60);
    let strict = s
        .tokio
        .block_on(StreamingServer::start(
            s.rt.clone(),
            StreamingConfig {
                idle_timeout_secs: 1,
                max_sessions: 1,
                ..Default::default()
            },
        ))
        .unwrap();
    let url = |srv: &StreamingServer| {
        srv.exec_url(Target::Exec {
            container_id: s.container.clone(),
            cmd: vec!["sleep".into(), "31".into()],
            tty: false,
            stdin: false,
            stdout: true,
            stderr: false,
        })
        .unwrap()
    };
    let t = Instant::now();
    let mut c = Client::connect(&url(&strict), &["v4.channel.k8s.io"]).unwrap();
    let err = c.open(&[("streamtype", "error")]);
    let out = c.open(&[("streamtype", "stdout")]);
    // While it runs, a second session is refused.
    let e = Client::connect(&url(&strict), &["v4.channel.k8s.io"])
        .err()
        .unwrap();
    assert!(e.starts_with("HTTP/1.1 503"), "{e}");
    // No traffic for the idle timeout: the server ends the session and kills the command.
    c.wait_ended(&[err, out]);
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "idle session lived {:?}",
        t.elapsed()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ps =
            s.rt.exec_sync(
                &s.container,
                &["ps".into(), "-o".into(), "args".into()],
                Duration::from_secs(5),
            )
            .unwrap();
        if !String::from_utf8_lossy(&ps.stdout).contains("sleep 31") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the idle session's command was not killed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    s.finish();
}

/// The number a counting loop in the container last wrote to `/tmp/<name>`.
fn counter(s: &Setup, name: &str) -> u64 {
    let r =
        s.rt.exec_sync(
            &s.container,
            &["cat".into(), format!("/tmp/{name}")],
            Duration::from_secs(5),
        )
        .unwrap();
    String::from_utf8_lossy(&r.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

/// Waits until no process in the container mentions `marker`.
fn wait_no_process(s: &Setup, marker: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let ps =
            s.rt.exec_sync(
                &s.container,
                &["ps".into(), "-o".into(), "args".into()],
                Duration::from_secs(5),
            )
            .unwrap();
        let ps = String::from_utf8_lossy(&ps.stdout).into_owned();
        if !ps.contains(marker) {
            return;
        }
        assert!(Instant::now() < deadline, "{marker} still runs:\n{ps}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A loop writing 64 KiB blocks to stdout and counting them in `/tmp/<name>`.
fn producer(name: &str) -> String {
    format!("i=0; while :; do head -c 65536 /dev/zero; i=$((i+1)); echo $i > /tmp/{name}; done")
}

#[test]
fn slow_readers_hold_the_process_back_and_time_out() {
    let s = setup("st-backpressure", "exec sleep 1000", 60);
    let srv = s
        .tokio
        .block_on(StreamingServer::start(
            s.rt.clone(),
            StreamingConfig {
                write_timeout_secs: 5,
                ..Default::default()
            },
        ))
        .unwrap();
    let exec = |cmd: String| {
        srv.exec_url(Target::Exec {
            container_id: s.container.clone(),
            cmd: vec!["sh".into(), "-c".into(), cmd],
            tty: false,
            stdin: false,
            stdout: true,
            stderr: false,
        })
        .unwrap()
    };
    // SPDY: the client opens its streams, then stops reading. The process is held back once
    // the pipe, our fixed buffers and the sockets are full; it does not stream into our memory.
    let mut c = Client::connect(&exec(producer("spdy")), &["v4.channel.k8s.io"]).unwrap();
    let err = c.open(&[("streamtype", "error")]);
    let out = c.open(&[("streamtype", "stdout")]);
    std::thread::sleep(Duration::from_millis(2000));
    let a = counter(&s, "spdy");
    std::thread::sleep(Duration::from_millis(1000));
    let b = counter(&s, "spdy");
    assert!(a > 0, "the producer never ran");
    assert_eq!(
        a, b,
        "the process kept writing to a client that does not read"
    );
    assert!(
        a * 64 < 64 * 1024,
        "{a} blocks (64 KiB) queued before the stall"
    );
    // Past the write timeout the session is closed and the process killed.
    wait_no_process(&s, "/tmp/spdy");
    c.read_timeout(Some(Duration::from_secs(5)));
    c.wait_ended(&[err, out]);

    // WebSocket: the same.
    let url = exec(producer("ws"));
    let ws = ws_connect(&url, "v4.channel.k8s.io");
    std::thread::sleep(Duration::from_millis(2000));
    let a = counter(&s, "ws");
    std::thread::sleep(Duration::from_millis(1000));
    let b = counter(&s, "ws");
    assert!(a > 0, "the producer never ran");
    assert_eq!(
        a, b,
        "the process kept writing to a client that does not read"
    );
    assert!(
        a * 64 < 64 * 1024,
        "{a} blocks (64 KiB) queued before the stall"
    );
    wait_no_process(&s, "/tmp/ws");
    drop(ws);

    // A SPDY client that does flow control gets no more than its windows allow.
    let url = srv
        .exec_url(Target::Exec {
            container_id: s.container.clone(),
            cmd: vec![
                "sh".into(),
                "-c".into(),
                "read go; head -c 200000 /dev/zero".into(),
            ],
            tty: false,
            stdin: true,
            stdout: true,
            stderr: false,
        })
        .unwrap();
    let mut c = Client::connect(&url, &["v4.channel.k8s.io"]).unwrap();
    let err = c.open(&[("streamtype", "error")]);
    let inp = c.open(&[("streamtype", "stdin")]);
    let out = c.open(&[("streamtype", "stdout")]);
    c.window_update(0, 1); // we do flow control: 64 KiB per stream to start with
    c.send(inp, b"go\n", true);
    c.read_available(Duration::from_millis(1500));
    assert_eq!(c.data.get(&out).map_or(0, |d| d.len()), 65536);
    c.window_update(out, 10_000);
    c.window_update(0, 10_000);
    c.read_available(Duration::from_millis(1500));
    assert_eq!(c.data.get(&out).map_or(0, |d| d.len()), 75536);
    c.window_update(out, 1 << 20);
    c.window_update(0, 1 << 20);
    c.wait_ended(&[err, out]);
    assert_eq!(c.data.get(&out).map_or(0, |d| d.len()), 200_000);
    assert_eq!(status(&c.text(err))["status"], "Success");
    s.finish();
}

#[test]
fn half_open_connections_are_capped_and_timed_out() {
    let s = setup("st-slowloris", "exec sleep 1000", 60);
    let srv = s
        .tokio
        .block_on(StreamingServer::start(
            s.rt.clone(),
            StreamingConfig {
                max_connections_per_ip: 10,
                header_timeout_secs: 1,
                ..Default::default()
            },
        ))
        .unwrap();
    use std::io::{Read, Write};
    // 40 clients that send half a request header and then nothing.
    let conns: Vec<std::net::TcpStream> = (0..40)
        .map(|_| {
            let mut c = std::net::TcpStream::connect(srv.addr).unwrap();
            c.write_all(b"GET /exec/x HTTP/1.1\r\nHost: a\r\n").unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            c
        })
        .collect();
    // Past the per-address cap, connections are closed at once; the others within the
    // header timeout.
    std::thread::sleep(Duration::from_millis(200));
    fn closed(mut c: &std::net::TcpStream) -> bool {
        c.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let mut b = [0u8; 256];
        match c.read(&mut b) {
            Ok(n) => n == 0 || n < b.len(), // EOF, or an error answer before it
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        }
    }
    let closed_fast = conns.iter().filter(|c| closed(c)).count();
    assert!(
        closed_fast >= 30,
        "only {closed_fast} connections refused at once"
    );
    std::thread::sleep(Duration::from_millis(1500));
    let open = conns.iter().filter(|c| !closed(c)).count();
    assert_eq!(open, 0, "half-open connections outlived the header timeout");
    // A kept-alive connection idle after an answered request is closed the same way.
    let mut c = std::net::TcpStream::connect(srv.addr).unwrap();
    c.write_all(b"GET /exec/unknown HTTP/1.1\r\nHost: a\r\n\r\n")
        .unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 512];
    let n = c.read(&mut b).unwrap();
    assert!(String::from_utf8_lossy(&b[..n]).contains("404"));
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        closed(&c),
        "an idle kept-alive connection outlived the header timeout"
    );
    drop(conns);
    // The server still serves a real client.
    let url = srv
        .exec_url(Target::Exec {
            container_id: s.container.clone(),
            cmd: vec!["echo".into(), "alive".into()],
            tty: false,
            stdin: false,
            stdout: true,
            stderr: false,
        })
        .unwrap();
    let mut c = Client::connect(&url, &["v4.channel.k8s.io"]).unwrap();
    let err = c.open(&[("streamtype", "error")]);
    let out = c.open(&[("streamtype", "stdout")]);
    c.wait_ended(&[err, out]);
    assert_eq!(c.text(out), "alive\n");
    s.finish();
}

#[test]
fn streaming_over_tls() {
    let s = setup("st-tls", "exec sleep 1000", 60);
    let dir = s.env.base.join("tls");
    common::registry::make_tls_files(&dir);
    let tls = s
        .tokio
        .block_on(StreamingServer::start(
            s.rt.clone(),
            StreamingConfig {
                tls_cert_file: Some(dir.join("cert.pem")),
                tls_key_file: Some(dir.join("key.pem")),
                ..Default::default()
            },
        ))
        .unwrap();
    let url = tls
        .exec_url(Target::Exec {
            container_id: s.container.clone(),
            cmd: vec!["echo".into(), "over tls".into()],
            tty: false,
            stdin: false,
            stdout: true,
            stderr: false,
        })
        .unwrap();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    // A rustls client trusting the test's CA, and tungstenite's WebSocket over it.
    use rustls_pki_types::pem::PemObject;
    use tokio_rustls::rustls;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls_pki_types::CertificateDer::from_pem_file(dir.join("ca.pem")).unwrap())
        .unwrap();
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let host = url
        .strip_prefix("https://")
        .unwrap()
        .split('/')
        .next()
        .unwrap();
    let tcp = std::net::TcpStream::connect(host).unwrap();
    let conn = rustls::ClientConnection::new(
        Arc::new(cfg),
        rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap(),
    )
    .unwrap();
    let stream = rustls::StreamOwned::new(conn, tcp);
    let mut req = url
        .replace("https://", "wss://")
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "v4.channel.k8s.io".parse().unwrap(),
    );
    let (mut ws, _) = tungstenite::client(req, stream).unwrap();
    let mut out = Vec::new();
    loop {
        match ws.read() {
            Ok(Message::Binary(b)) if b[0] == 1 => out.extend_from_slice(&b[1..]),
            Ok(Message::Close(_)) | Err(_) => break,
            _ => {}
        }
    }
    assert_eq!(out, b"over tls\n");
    // Plain HTTP to the TLS port gets nowhere.
    assert!(Client::connect(&url.replace("https://", "http://"), &["v4.channel.k8s.io"]).is_err());
    s.finish();
}

#[test]
fn container_with_a_terminal_attach_and_resize() {
    let env = Env::new("st-ttyctr");
    let (rt, tokio, server) = server(&env, StreamingConfig::default());
    let mut pod = env.pod("st-ttyctr", false);
    pod.log_directory = env.base.join("logs").to_string_lossy().into();
    let sb = rt.run_pod_sandbox(&pod).unwrap();
    let c = ContainerConfig {
        metadata: sandboxd::ContainerMetadata {
            name: "term".into(),
            attempt: 0,
        },
        image: IMAGE.into(),
        command: vec![
            "sh".into(),
            "-c".into(),
            "tty; read x; stty size; echo got $x".into(),
        ],
        stdin: true,
        tty: true,
        log_path: "term.log".into(),
        ..Default::default()
    };
    let id = rt.create_container(&sb, &c).unwrap();
    rt.start_container(&id).unwrap();
    // Attaching without a terminal to a container that has one is refused.
    let no = server.exec_url(Target::Attach {
        container_id: id.clone(),
        tty: false,
        stdin: true,
        stdout: true,
        stderr: false,
    });
    assert!(matches!(no, Err(Error::InvalidArgument(_))), "{no:?}");
    let url = server
        .exec_url(Target::Attach {
            container_id: id.clone(),
            tty: true,
            stdin: true,
            stdout: true,
            stderr: false,
        })
        .unwrap();
    let mut c1 = Client::connect(&url, &["v4.channel.k8s.io"]).unwrap();
    let err = c1.open(&[("streamtype", "error")]);
    let inp = c1.open(&[("streamtype", "stdin")]);
    let out = c1.open(&[("streamtype", "stdout")]);
    let resize = c1.open(&[("streamtype", "resize")]);
    c1.send(resize, b"{\"Width\":120,\"Height\":30}\n", false);
    std::thread::sleep(Duration::from_millis(300));
    c1.send(inp, b"hi\r", false);
    c1.wait_ended(&[err, out]);
    let text = c1.text(out);
    assert!(text.contains("30 120"), "{text:?}");
    assert!(text.contains("got hi"), "{text:?}");
    assert_eq!(status(&c1.text(err))["status"], "Success");
    // The terminal's output reached the CRI log as stdout.
    let log = std::fs::read_to_string(env.base.join("logs/term.log")).unwrap();
    assert!(log.contains("stdout F /dev/pts/"), "{log}");
    assert!(log.contains("got hi"), "{log}");
    rt.remove_pod_sandbox(&sb).unwrap();
    env.assert_no_leaks();
    drop(tokio);
}
