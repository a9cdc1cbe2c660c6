//! The streaming server for real: one-time URLs, exec over SPDY/3.1 (our own client written
//! from the protocol description) and over WebSocket (tungstenite's client), TTY with resize,
//! port forwarding into the pod's network namespace, over TLS too. Attach is in
//! `streaming_attach.rs`, the server's limits (URL expiry, idle and capped sessions, slow
//! readers, half-open connections, no leaks after many sessions) in `streaming_limits.rs`.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::spdy::Client;
use common::streaming::*;
use sandboxd::streaming::{StreamingConfig, StreamingServer, Target};
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest, Message};

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
        rustls::crypto::ring::default_provider(),
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
