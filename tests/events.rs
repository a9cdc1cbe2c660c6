//! GetContainerEvents (kubelet's evented PLEG) through the daemon's socket: pod and container
//! events in order with their statuses, for every subscriber; an exit is reported without
//! any query; a subscriber that stops reading is cut off; exits that happened while the
//! daemon was down are sent once after restart.

mod common;

use std::time::{Duration, Instant};

use common::cri::*;
use common::*;
use sandboxd::api::v1 as cri;
use sandboxd::api::v1::runtime_service_client::RuntimeServiceClient;
use tokio_stream::StreamExt;
use tonic::{Code, Streaming};

use cri::ContainerEventType as T;

fn subscribe(
    rt: &tokio::runtime::Runtime,
    c: &mut Client,
) -> Streaming<cri::ContainerEventResponse> {
    rt.block_on(c.get_container_events(cri::GetEventsRequest {}))
        .unwrap()
        .into_inner()
}

/// The next event, within `limit`.
fn next(
    rt: &tokio::runtime::Runtime,
    s: &mut Streaming<cri::ContainerEventResponse>,
    limit: Duration,
) -> cri::ContainerEventResponse {
    rt.block_on(async { tokio::time::timeout(limit, s.next()).await })
        .expect("no event in time")
        .expect("stream ended")
        .expect("stream error")
}

fn kind(e: &cri::ContainerEventResponse) -> T {
    T::try_from(e.container_event_type).unwrap()
}

fn remove_ctr(rt: &tokio::runtime::Runtime, c: &mut Client, id: &str) {
    rt.block_on(c.remove_container(cri::RemoveContainerRequest {
        container_id: id.into(),
    }))
    .unwrap();
}

/// A pod and a container that exits by itself, seen by two subscribers: the same events in
/// the same order, each carrying the pod's status and its containers' statuses; the exit
/// arrives promptly though nobody asks for any status.
#[test]
fn pod_and_container_events_in_order_for_every_subscriber() {
    let env = Env::new("ev-order");
    let (_d, rt, mut c) = daemon(&env);
    let mut subs = [
        subscribe(&rt, &mut c.clone()),
        subscribe(&rt, &mut c.clone()),
    ];
    let p = pod("events", serde_json::json!({}));
    let sb = run_pod(&rt, &mut c, &p);
    let id = create(
        &rt,
        &mut c,
        &sb,
        &p,
        ctr(
            "quits",
            &["sh", "-c", "sleep 0.5; exit 3"],
            serde_json::json!({}),
        ),
    )
    .unwrap();
    start(&rt, &mut c, &id);
    let started = Instant::now();
    let mut seen = Vec::new();
    for s in subs.iter_mut() {
        let mut got = Vec::new();
        for _ in 0..5 {
            got.push(next(&rt, s, Duration::from_secs(10)));
        }
        seen.push(got);
    }
    // The exit was learned from the monitor, not from a query: no call was made since start.
    let stopped_after = started.elapsed();
    for got in &seen {
        let kinds: Vec<(T, &str)> = got
            .iter()
            .map(|e| (kind(e), e.container_id.as_str()))
            .collect();
        assert_eq!(
            kinds,
            [
                (T::ContainerCreatedEvent, sb.as_str()),
                (T::ContainerStartedEvent, sb.as_str()),
                (T::ContainerCreatedEvent, id.as_str()),
                (T::ContainerStartedEvent, id.as_str()),
                (T::ContainerStoppedEvent, id.as_str()),
            ]
        );
        for e in got {
            let ps = e.pod_sandbox_status.as_ref().expect("pod status");
            assert_eq!(ps.id, sb);
            assert_eq!(ps.state, cri::PodSandboxState::SandboxReady as i32);
            assert!(e.created_at > 0);
        }
        assert!(got[1].containers_statuses.is_empty());
        let st = &got[2].containers_statuses;
        assert_eq!(st.len(), 1);
        assert_eq!(st[0].state, cri::ContainerState::ContainerCreated as i32);
        let st = &got[3].containers_statuses[0];
        assert_eq!(st.state, cri::ContainerState::ContainerRunning as i32);
        let st = &got[4].containers_statuses[0];
        assert_eq!(st.id, id);
        assert_eq!(st.state, cri::ContainerState::ContainerExited as i32);
        assert_eq!(st.exit_code, 3);
        assert_eq!(st.reason, "Error");
    }
    assert!(
        stopped_after < Duration::from_secs(3),
        "the exit (0.5 s after start) took {stopped_after:?} to be reported"
    );
    remove_ctr(&rt, &mut c, &id);
    rt.block_on(c.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: sb.clone(),
    }))
    .unwrap();
    remove_pod(&rt, &mut c, &sb);
    for s in subs.iter_mut() {
        let e = next(&rt, s, Duration::from_secs(5));
        assert_eq!(
            (kind(&e), e.container_id.as_str()),
            (T::ContainerDeletedEvent, id.as_str())
        );
        assert!(
            e.containers_statuses.is_empty(),
            "a deleted container is not listed"
        );
        let e = next(&rt, s, Duration::from_secs(5));
        assert_eq!(
            (kind(&e), e.container_id.as_str()),
            (T::ContainerStoppedEvent, sb.as_str())
        );
        assert_eq!(
            e.pod_sandbox_status.unwrap().state,
            cri::PodSandboxState::SandboxNotready as i32
        );
        let e = next(&rt, s, Duration::from_secs(5));
        assert_eq!(
            (kind(&e), e.container_id.as_str()),
            (T::ContainerDeletedEvent, sb.as_str())
        );
    }
}

/// A client whose connection takes one small frame at a time (a 1 KiB HTTP/2 window), so a
/// subscriber that does not read fills its backlog quickly.
fn slow_client(rt: &tokio::runtime::Runtime, socket: &std::path::Path) -> Client {
    let path = socket.to_path_buf();
    let ch = rt
        .block_on(
            tonic::transport::Endpoint::from_static("http://[::]:50051")
                .initial_stream_window_size(Some(1024))
                .initial_connection_window_size(Some(1024))
                .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                            tokio::net::UnixStream::connect(path).await?,
                        ))
                    }
                })),
        )
        .unwrap();
    RuntimeServiceClient::new(ch)
}

/// With a backlog of 8 and at most 2 subscribers: a third is refused; one that stops
/// reading is cut off with ResourceExhausted (after the events it had), while the other
/// gets every event; its place is free again afterwards.
#[test]
fn a_subscriber_that_stops_reading_is_cut_off() {
    let env = Env::new("ev-slow");
    let mut cfg = env.cfg.clone();
    cfg.events_backlog = 8;
    cfg.events_max_subscribers = 2;
    let (d, rt, mut c) = daemon_with(&env, &cfg);
    let mut slow = subscribe(&rt, &mut slow_client(&rt, &d.socket));
    let mut fast = subscribe(&rt, &mut c.clone());
    let third = rt.block_on(c.get_container_events(cri::GetEventsRequest {}));
    assert_eq!(third.unwrap_err().code(), Code::ResourceExhausted);

    let p = pod("slow", serde_json::json!({}));
    let sb = run_pod(&rt, &mut c, &p);
    let mut published = 2;
    for i in 0..12 {
        let id = create(
            &rt,
            &mut c,
            &sb,
            &p,
            ctr(&format!("c{i}"), &["true"], serde_json::json!({})),
        )
        .unwrap();
        remove_ctr(&rt, &mut c, &id);
        published += 3; // created, stopped (by the removal), deleted
    }
    for _ in 0..published {
        next(&rt, &mut fast, Duration::from_secs(5));
    }
    // The slow one gets what fitted its window and backlog, then the error.
    let (mut had, mut end) = (0, None);
    rt.block_on(async {
        while let Ok(Some(item)) = tokio::time::timeout(Duration::from_secs(5), slow.next()).await {
            match item {
                Ok(_) => had += 1,
                Err(s) => {
                    end = Some(s);
                    break;
                }
            }
        }
    });
    let end = end.expect("the slow subscriber was not cut off");
    assert_eq!(end.code(), Code::ResourceExhausted, "{end:?}");
    assert!(
        end.message().contains("fell 8 events behind"),
        "{}",
        end.message()
    );
    assert!(had < published, "it got {had} of {published}");
    // Its place is free again.
    let mut again = subscribe(&rt, &mut c.clone());
    rt.block_on(c.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: sb.clone(),
    }))
    .unwrap();
    let e = next(&rt, &mut again, Duration::from_secs(5));
    assert_eq!(
        (kind(&e), e.container_id.as_str()),
        (T::ContainerStoppedEvent, sb.as_str())
    );
    remove_pod(&rt, &mut c, &sb);
}

/// A container that exits while the daemon is down (killed -9): the restarted daemon sends
/// its STOPPED event, with the real exit code, to the first subscriber, and only once.
#[test]
fn exits_while_down_are_sent_once_after_restart() {
    let env = Env::new("ev-down");
    let (mut d, rt, mut c) = daemon(&env);
    let p = pod("down", serde_json::json!({}));
    let sb = run_pod(&rt, &mut c, &p);
    let id = create(
        &rt,
        &mut c,
        &sb,
        &p,
        ctr(
            "later",
            &["sh", "-c", "sleep 1.5; exit 7"],
            serde_json::json!({}),
        ),
    )
    .unwrap();
    start(&rt, &mut c, &id);
    d.kill9();
    let exit_file = env.cfg.root.join("containers").join(&id).join("exit");
    let t = Instant::now();
    while !exit_file.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the container never exited"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let d = common::daemon::Daemon::start(&env);
    let mut c = rt.block_on(common::daemon::client(&d.socket));
    let mut first = subscribe(&rt, &mut c.clone());
    let mut second = subscribe(&rt, &mut c.clone());
    let e = next(&rt, &mut first, Duration::from_secs(5));
    assert_eq!(
        (kind(&e), e.container_id.as_str()),
        (T::ContainerStoppedEvent, id.as_str())
    );
    assert_eq!(e.containers_statuses[0].exit_code, 7);
    // Nothing more for either: the second subscriber does not get it again.
    rt.block_on(async {
        for s in [&mut first, &mut second] {
            assert!(tokio::time::timeout(Duration::from_millis(300), s.next())
                .await
                .is_err());
        }
    });
    remove_pod(&rt, &mut c, &sb);
}
