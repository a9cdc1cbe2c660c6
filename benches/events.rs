//! Container exit → STOPPED event latency through GetContainerEvents. One pod; containers
//! that sleep 0.3 s and exit are started `--concurrency` at a time, `--containers` in all,
//! while one subscriber reads events. Latency = when the subscriber received the STOPPED
//! event − the exit time the event reports (`finished_at`: when the monitor recorded the
//! exit). For comparison, kubelet's relisting PLEG (without events) sees an exit after half
//! its 1 s period on average, a full period at worst.
//! Run it with `scripts/bench-events`, which records the table in bench/RESULTS.md.
//!
//! Usage: cargo bench --bench events -- [--containers N] [--concurrency C]

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;

use common::cri::*;
use common::Env;
use sandboxd::api::v1 as cri;
use tokio_stream::StreamExt;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    let (n, conc) = (arg("--containers", 60), arg("--concurrency", 6).max(1));
    let env = Env::new("bench-events");
    let (_d, rt, mut c) = daemon(&env);
    let mut events = rt
        .block_on(c.get_container_events(cri::GetEventsRequest {}))
        .unwrap()
        .into_inner();
    let p = pod("ev", serde_json::json!({}));
    let sb = run_pod(&rt, &mut c, &p);
    let mut latencies_ms = Vec::new();
    let mut started = 0;
    while started < n {
        let batch = conc.min(n - started);
        let mut ids = Vec::new();
        for i in 0..batch {
            let cfg = ctr(
                &format!("c{}", started + i),
                &["sleep", "0.3"],
                serde_json::json!({}),
            );
            let id = create(&rt, &mut c, &sb, &p, cfg).unwrap();
            start(&rt, &mut c, &id);
            ids.push(id);
        }
        started += batch;
        // Wait for each one's STOPPED event, taking the receive time at once.
        let mut pending: HashMap<String, ()> = ids.iter().map(|i| (i.clone(), ())).collect();
        while !pending.is_empty() {
            let e = rt
                .block_on(async {
                    tokio::time::timeout(std::time::Duration::from_secs(30), events.next()).await
                })
                .expect("no event within 30 s")
                .expect("stream ended")
                .expect("stream error");
            let got = now_ns();
            if e.container_event_type != cri::ContainerEventType::ContainerStoppedEvent as i32
                || pending.remove(&e.container_id).is_none()
            {
                continue;
            }
            let st = e
                .containers_statuses
                .iter()
                .find(|s| s.id == e.container_id)
                .expect("its status");
            latencies_ms.push((got - st.finished_at) as f64 / 1e6);
        }
        for id in ids {
            rt.block_on(c.remove_container(cri::RemoveContainerRequest { container_id: id }))
                .unwrap();
        }
    }
    remove_pod(&rt, &mut c, &sb);
    latencies_ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!("| containers | at once | p50 ms | p90 ms | p99 ms | max ms | relisting PLEG (1 s period): mean / max ms |");
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | 500 / 1000 |",
        latencies_ms.len(),
        conc,
        pct(&latencies_ms, 0.5),
        pct(&latencies_ms, 0.9),
        pct(&latencies_ms, 0.99),
        latencies_ms.last().copied().unwrap_or(0.0),
    );
}
