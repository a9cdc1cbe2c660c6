//! Pod metrics through the daemon's socket (ListMetricDescriptors, ListPodSandboxMetrics,
//! PodSandboxStats), checked against what the kernel says inside the pod; and the daemon's
//! own Prometheus endpoint (`metrics_address`).

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::time::Duration;

use common::cri::*;
use common::daemon::{client, rt, Daemon};
use common::*;
use sandboxd::api::v1 as cri;

/// `/proc/net/dev` counters of `iface` as the container sees them: (rx bytes, rx packets,
/// tx bytes, tx packets).
fn counters(rt: &tokio::runtime::Runtime, c: &mut Client, id: &str, iface: &str) -> [u64; 4] {
    let out = exec(rt, c, id, "cat /proc/net/dev");
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{iface}:")))
        .unwrap_or_else(|| panic!("no {iface} in {out}"));
    let v: Vec<u64> = line
        .split_once(':')
        .unwrap()
        .1
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    [v[0], v[1], v[8], v[9]]
}

fn pod_ip(rt: &tokio::runtime::Runtime, c: &mut Client, sb: &str) -> String {
    pod_status(rt, c, sb).network.unwrap().ip
}

/// A metric's value by name and label values.
type Values = HashMap<(String, Vec<String>), u64>;

fn values(ms: &[cri::Metric]) -> Values {
    ms.iter()
        .map(|m| {
            (
                (m.name.clone(), m.label_values.clone()),
                m.value.as_ref().unwrap().value,
            )
        })
        .collect()
}

/// Two pods; one pings the other. The metrics carry cAdvisor's names, every one described
/// with matching label keys; the pod's eth0 counters lie between what the pod's own
/// /proc/net/dev said before and after; the container's memory, processes and written bytes
/// are there; PodSandboxStats carries the network and the process count too.
#[test]
fn pod_metrics_match_the_kernel() {
    let env = Env::new("metrics-pod");
    let (_d, rt, mut c) = daemon(&env);
    let (pa, pb) = (
        pod("ma", serde_json::json!({})),
        pod("mb", serde_json::json!({})),
    );
    let (a, b) = (run_pod(&rt, &mut c, &pa), run_pod(&rt, &mut c, &pb));
    let sleeper = |n: &str| ctr(n, &["sleep", "1000"], serde_json::json!({}));
    let ca = create(&rt, &mut c, &a, &pa, sleeper("pinger")).unwrap();
    let cb = create(&rt, &mut c, &b, &pb, sleeper("target")).unwrap();
    start(&rt, &mut c, &ca);
    start(&rt, &mut c, &cb);
    exec(&rt, &mut c, &ca, "head -c 1048576 /dev/zero > /written");
    let target = pod_ip(&rt, &mut c, &b);
    let out = exec(&rt, &mut c, &ca, &format!("ping -c 3 -W 2 {target}"));
    assert!(out.contains("3 packets received"), "{out}");

    let descriptors = rt
        .block_on(c.list_metric_descriptors(cri::ListMetricDescriptorsRequest {}))
        .unwrap()
        .into_inner()
        .descriptors;
    let keys: HashMap<String, Vec<String>> = descriptors
        .iter()
        .map(|d| (d.name.clone(), d.label_keys.clone()))
        .collect();
    for name in [
        "container_cpu_usage_seconds_total",
        "container_memory_working_set_bytes",
        "container_memory_rss",
        "container_memory_cache",
        "container_network_receive_bytes_total",
        "container_network_transmit_packets_dropped_total",
        "container_processes",
        "container_fs_usage_bytes",
    ] {
        assert!(keys.contains_key(name), "{name} not described");
    }
    assert_eq!(
        keys["container_network_receive_bytes_total"],
        ["id", "name", "image", "interface"]
    );

    let before = counters(&rt, &mut c, &ca, "eth0");
    let all = rt
        .block_on(c.list_pod_sandbox_metrics(cri::ListPodSandboxMetricsRequest {}))
        .unwrap()
        .into_inner()
        .pod_metrics;
    let after = counters(&rt, &mut c, &ca, "eth0");
    assert_eq!(all.len(), 2);
    for p in &all {
        let every = p
            .metrics
            .iter()
            .chain(p.container_metrics.iter().flat_map(|c| &c.metrics));
        for m in every {
            let k = keys
                .get(&m.name)
                .unwrap_or_else(|| panic!("{} not described", m.name));
            assert_eq!(m.label_values.len(), k.len(), "{}", m.name);
        }
    }
    let pa_metrics = all.iter().find(|p| p.pod_sandbox_id == a).unwrap();
    let v = values(&pa_metrics.metrics);
    let net = |name: &str| {
        v[&(
            name.to_string(),
            vec![a.clone(), "ma".into(), String::new(), "eth0".into()],
        )]
    };
    let rx = net("container_network_receive_bytes_total");
    let tx_packets = net("container_network_transmit_packets_total");
    assert!(
        before[0] <= rx && rx <= after[0],
        "{before:?} {rx} {after:?}"
    );
    assert!(before[3] <= tx_packets && tx_packets <= after[3]);
    assert!(tx_packets >= 3, "three pings went out: {tx_packets}");
    assert!(
        !v.keys().any(|(_, l)| l.get(3).is_some_and(|i| i == "lo")),
        "lo is not the pod's traffic"
    );
    let cm = &pa_metrics.container_metrics;
    assert_eq!(cm.len(), 1);
    assert_eq!(cm[0].container_id, ca);
    let cv: HashMap<String, u64> = cm[0]
        .metrics
        .iter()
        .map(|m| (m.name.clone(), m.value.as_ref().unwrap().value))
        .collect();
    assert!(cv["container_memory_working_set_bytes"] > 0);
    assert!(cv["container_processes"] >= 1, "{cv:?}");
    assert!(cv["container_fs_usage_bytes"] >= 1 << 20, "{cv:?}");
    assert!(cv["container_start_time_seconds"] > 1_700_000_000);

    let stats = rt
        .block_on(c.pod_sandbox_stats(cri::PodSandboxStatsRequest {
            pod_sandbox_id: a.clone(),
        }))
        .unwrap()
        .into_inner()
        .stats
        .unwrap()
        .linux
        .unwrap();
    let net = stats.network.expect("network stats");
    let eth0 = net.default_interface.unwrap();
    assert_eq!(eth0.name, "eth0");
    assert!(eth0.rx_bytes.unwrap().value >= before[0]);
    assert!(stats.process.unwrap().process_count.unwrap().value >= 1);
    remove_pod(&rt, &mut c, &a);
    remove_pod(&rt, &mut c, &b);
}

/// A plain HTTP/1.0 GET on 127.0.0.1:`port`: (status line, body).
fn http_get(port: u16, path: &str) -> (String, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

/// Every query of the dashboard we ship (`dashboards/sandboxd-grafana.json`) names series
/// `/metrics` serves (`body`), and filters, groups and labels its legend by labels those
/// series carry (or Prometheus's own target labels, `instance` and `job`; `le` on buckets).
fn check_dashboard(body: &str) {
    use std::collections::{BTreeSet, HashSet};
    // Series name -> the label names of its samples.
    let mut served: HashMap<String, HashSet<String>> = HashMap::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            let names: Vec<String> = match kind {
                "counter" => vec![format!("{name}_total")],
                "histogram" => ["_bucket", "_sum", "_count"]
                    .iter()
                    .map(|s| format!("{name}{s}"))
                    .collect(),
                _ => vec![name.to_string()],
            };
            for n in names {
                served.entry(n).or_default();
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap();
            let labels = served.entry(line[..end].to_string()).or_default();
            if let Some(rest) = line[end..].strip_prefix('{') {
                for kv in rest.split("\",") {
                    if let Some((k, _)) = kv.split_once('=') {
                        labels.insert(k.to_string());
                    }
                }
            }
        }
    }
    // Identifiers following `word` up to the matching `close`: `by (a, b)`, `{a="x"}`, `{{a}}`.
    fn lists(expr: &str, open: &str, close: char) -> Vec<String> {
        let mut out = Vec::new();
        let mut rest = expr;
        while let Some(i) = rest.find(open) {
            rest = &rest[i + open.len()..];
            let inner = &rest[..rest.find(close).unwrap_or(rest.len())];
            for part in inner.split(',') {
                let id: String = part
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !id.is_empty() {
                    out.push(id);
                }
            }
        }
        out
    }
    // Compiled in: the VM lane's guest has the build output, not the source tree.
    let d: serde_json::Value =
        serde_json::from_str(include_str!("../dashboards/sandboxd-grafana.json")).unwrap();
    let mut queries: Vec<(String, String)> = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            queries.push((
                t["expr"].as_str().unwrap().to_string(),
                t["legendFormat"].as_str().unwrap_or("").to_string(),
            ));
        }
    }
    for v in d["templating"]["list"].as_array().unwrap() {
        queries.push((v["query"].as_str().unwrap().to_string(), String::new()));
    }
    assert!(queries.len() >= 10, "{} queries", queries.len());
    let mut used = BTreeSet::new();
    for (expr, legend) in &queries {
        let metrics: Vec<&str> = expr
            .match_indices("sandboxd_")
            .map(|(i, _)| {
                let rest = &expr[i..];
                &rest[..rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len())]
            })
            .collect();
        assert!(!metrics.is_empty(), "{expr}: names no sandboxd metric");
        let mut allowed: HashSet<String> = ["instance", "job"].map(String::from).into();
        for m in &metrics {
            let labels = served
                .get(*m)
                .unwrap_or_else(|| panic!("{expr}: {m} is not served; /metrics:\n{body}"));
            allowed.extend(labels.iter().cloned());
            if m.ends_with("_bucket") {
                allowed.insert("le".into());
            }
            used.insert(m.to_string());
        }
        let grouped = lists(expr, "by (", ')');
        let selected: Vec<String> = lists(expr, "{", '}');
        let label_values = lists(expr, "label_values(", ')').into_iter().skip(1);
        for l in grouped
            .iter()
            .chain(&selected)
            .chain(label_values.collect::<Vec<_>>().iter())
        {
            assert!(
                allowed.contains(l),
                "{expr}: label {l} is on none of {metrics:?} ({allowed:?})"
            );
        }
        for l in lists(legend, "{{", '}') {
            assert!(
                grouped.contains(&l),
                "{expr}: the legend's {{{{{l}}}}} is not kept by the aggregation"
            );
        }
    }
    // And the dashboard shows every family the daemon serves.
    let families: BTreeSet<String> = body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|r| r.split(' ').next().unwrap().to_string())
        .collect();
    for f in families {
        assert!(
            used.iter().any(|u| u.starts_with(&f)),
            "the dashboard shows nothing of {f}"
        );
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// With `metrics_address` set, /metrics shows each RPC's latency count and its errors by
/// code, the failed pull, and the pods and containers by state; other paths are 404. Off
/// by default: only the streaming server listens on TCP.
#[test]
fn prometheus_endpoint() {
    let env = Env::new("metrics-prom");
    let port = free_port();
    sandboxd::image::ImageStore::new(env.cfg.root.join("images"))
        .unwrap()
        .import(&busybox::oci_layout(&env.base, IMAGE), None)
        .unwrap();
    let d = Daemon::start_extra(
        &env,
        &env.cfg,
        &format!("metrics_address = \"127.0.0.1:{port}\"\n"),
    );
    let rt = rt();
    let mut c = rt.block_on(client(&d.socket));
    let p = pod("prom", serde_json::json!({}));
    let sb = run_pod(&rt, &mut c, &p);
    sleeper(&rt, &mut c, &sb, &p, "s");
    for _ in 0..2 {
        let e = rt
            .block_on(c.container_status(cri::ContainerStatusRequest {
                container_id: "0123456789abcdef".into(),
                verbose: false,
            }))
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound);
    }
    // A pull from a port nothing listens on fails.
    let mut images = rt.block_on(async {
        sandboxd::api::v1::image_service_client::ImageServiceClient::new(
            common::daemon::channel(&d.socket).await,
        )
    });
    let dead = free_port();
    rt.block_on(images.pull_image(cri::PullImageRequest {
        image: Some(cri::ImageSpec {
            image: format!("127.0.0.1:{dead}/nothing:here"),
            ..Default::default()
        }),
        ..Default::default()
    }))
    .unwrap_err();

    // An audit (sandboxctl doctor), so its families have samples too.
    common::sandboxctl::sandboxctl_ok(&format!("unix://{}", d.socket.display()), &["doctor"]);

    let (status, body) = http_get(port, "/metrics");
    assert!(status.contains("200"), "{status}");
    for want in [
        "sandboxd_rpc_duration_seconds_count{rpc=\"RunPodSandbox\"} 1",
        "sandboxd_rpc_duration_seconds_count{rpc=\"StartContainer\"} 1",
        "sandboxd_rpc_errors_total{rpc=\"ContainerStatus\",code=\"NotFound\"} 2",
        "sandboxd_image_pulls_total{result=\"failure\"} 1",
        "sandboxd_pods{state=\"ready\"} 1",
        "sandboxd_containers{state=\"running\"} 1",
        "# TYPE sandboxd_rpc_duration_seconds histogram",
    ] {
        assert!(body.contains(want), "{want} missing from\n{body}");
    }
    assert!(!body.contains("rpc_errors_total{rpc=\"RunPodSandbox\""));
    check_dashboard(&body);
    let (status, _) = http_get(port, "/other");
    assert!(status.contains("404"), "{status}");
    remove_pod(&rt, &mut c, &sb);
    drop(d);

    // Off by default.
    let env2 = Env::new("metrics-off");
    let d2 = Daemon::start(&env2);
    let cfg = std::fs::read_to_string(&d2.config).unwrap();
    assert!(!cfg.contains("metrics_address"));
    let listening = sh("ss -Hltnp");
    let pid = d2.pid().to_string();
    let mine = listening
        .lines()
        .filter(|l| l.contains(&format!("pid={pid},")))
        .count();
    assert_eq!(
        mine, 1,
        "only the streaming server listens on TCP by default:\n{listening}"
    );
}

/// The metrics listener serves loopback only unless told otherwise: pods reach the node's
/// other addresses (their bridge's gateway), and the metrics name the node's pods and RPCs.
#[test]
fn metrics_listen_on_loopback_unless_allowed() {
    use sandboxd::server::bind_metrics;
    for a in ["0.0.0.0:0", "[::]:0", "10.0.0.1:0"] {
        let e = bind_metrics(a.parse().unwrap(), false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("not a loopback address") && e.contains("metrics_allow_remote"),
            "{a}: {e}"
        );
    }
    for a in ["127.0.0.1:0", "[::1]:0"] {
        let l = bind_metrics(a.parse().unwrap(), false).unwrap();
        assert!(l.local_addr().unwrap().ip().is_loopback());
    }
    let l = bind_metrics("0.0.0.0:0".parse().unwrap(), true).unwrap();
    assert!(l.local_addr().unwrap().ip().is_unspecified());
}
