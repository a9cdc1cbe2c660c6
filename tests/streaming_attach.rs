//! Attach through the streaming server: to a container's own stdio over SPDY and WebSocket
//! (the container keeps running), and to a container created with a terminal, with resize.

mod common;

use std::time::{Duration, Instant};

use common::spdy::Client;
use common::streaming::*;
use common::*;
use sandboxd::streaming::{StreamingConfig, Target};
use sandboxd::{ContainerConfig, Error};
use tokio_tungstenite::tungstenite::Message;

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

/// stdin_once: input and the end of input that reach the monitor in one read are both
/// delivered, the input first (the close used to win and drop the input).
#[test]
fn stdin_and_its_end_in_one_read_are_both_delivered() {
    use sandboxd_shim_common::attach::{
        frame, parse_header, CLOSE_STDIN, HEADER_LEN, STDIN, STDOUT,
    };
    use std::io::{Read, Write};
    let env = Env::new("st-once");
    let rt = env.runtime();
    rt.images()
        .import(&busybox::oci_layout(&env.base, IMAGE), None)
        .unwrap();
    let sb = rt.run_pod_sandbox(&env.pod("st-once", false)).unwrap();
    let c = ContainerConfig {
        metadata: sandboxd::ContainerMetadata {
            name: "once".into(),
            attempt: 0,
        },
        image: IMAGE.into(),
        command: vec![
            "sh".into(),
            "-c".into(),
            "read x; echo heard $x; cat; echo eof".into(),
        ],
        stdin: true,
        stdin_once: true,
        ..Default::default()
    };
    let id = rt.create_container(&sb, &c).unwrap();
    rt.start_container(&id).unwrap();
    let socket = rt.container_status(&id).unwrap().attach_socket.unwrap();
    let mut s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // Both frames in one write: the monitor reads them together.
    let mut both = frame(STDIN, b"you\n");
    both.extend(frame(CLOSE_STDIN, b""));
    s.write_all(&both).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !String::from_utf8_lossy(&out).contains("eof") {
        assert!(
            Instant::now() < deadline,
            "got {:?}",
            String::from_utf8_lossy(&out)
        );
        let mut h = [0u8; HEADER_LEN];
        if s.read_exact(&mut h).is_err() {
            break;
        }
        let (kind, len) = parse_header(h);
        let mut p = vec![0u8; len];
        s.read_exact(&mut p).unwrap();
        if kind == STDOUT {
            out.extend(p);
        }
    }
    // The input reached the process, and the end of input reached `cat`.
    assert_eq!(String::from_utf8_lossy(&out), "heard you\neof\n");
    rt.remove_pod_sandbox(&sb).unwrap();
    env.assert_no_leaks();
}
