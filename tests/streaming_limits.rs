//! The streaming server's limits: one-time URLs checked and expiring, no leaks after many
//! sessions, idle sessions timed out and sessions capped, slow readers holding the process
//! back, half-open connections capped and timed out.

mod common;

use std::time::{Duration, Instant};

use common::spdy::Client;
use common::streaming::*;
use common::*;
use sandboxd::streaming::{StreamingConfig, StreamingServer, Target};
use sandboxd::Error;

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

/// A flood of half-open connections (more arriving all the time, the total cap full) does not
/// lock out a real client: at the cap the oldest connection that has sent no request makes
/// room, so a client that sends its request at once gets its session.
#[test]
fn a_real_exec_gets_through_a_half_open_flood() {
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};
    let s = setup("st-flood", "exec sleep 1000", 60);
    let srv = s
        .tokio
        .block_on(StreamingServer::start(
            s.rt.clone(),
            StreamingConfig {
                max_connections: 64,
                max_connections_per_ip: 64,
                header_timeout_secs: 30,
                ..Default::default()
            },
        ))
        .unwrap();
    let addr = srv.addr;
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let flood = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut held = std::collections::VecDeque::new();
            while !stop.load(Ordering::Relaxed) {
                if let Ok(mut c) = std::net::TcpStream::connect(addr) {
                    let _ = c.write_all(b"GET /exec/x HTTP/1.1\r\n");
                    held.push_back(c);
                }
                if held.len() > 300 {
                    held.pop_front();
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    for i in 0..5 {
        let url = srv
            .exec_url(Target::Exec {
                container_id: s.container.clone(),
                cmd: vec!["echo".into(), format!("alive {i}")],
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
        assert_eq!(c.text(out), format!("alive {i}\n"));
    }
    stop.store(true, Ordering::Relaxed);
    flood.join().unwrap();
    s.finish();
}
