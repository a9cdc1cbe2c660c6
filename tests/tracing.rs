//! The daemon's spans over OTLP/gRPC (`[tracing] endpoint`), received by an OTLP trace
//! service this test serves on loopback: one span per request continuing the caller's
//! `traceparent`, the CRI call inside it with the pod's and container's ids, and the steps
//! below it (CNI plugins, OCI runtime calls, an NRI plugin's requests, a pull from
//! docker-registry); errors as error spans; the sampling ratio; the log lines left as they were.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cri::*;
use common::daemon::{client, rt, Daemon};
use common::nri_plugin::{Behavior, TestPlugin};
use common::registry::Registry;
use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use sandboxd::api::v1 as cri;

/// One received span, its attributes as text.
#[derive(Debug, Clone)]
struct Span {
    trace: String,
    id: String,
    parent: String,
    name: String,
    kind: i32,
    /// 2: error.
    status: i32,
    attrs: HashMap<String, String>,
    resource: HashMap<String, String>,
}

#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<Span>>>);

fn text(v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut out = self.0.lock().unwrap();
        for rs in req.into_inner().resource_spans {
            let resource: HashMap<_, _> = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .map(|kv| (kv.key.clone(), text(&kv.value)))
                .collect();
            for s in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                out.push(Span {
                    trace: hex(&s.trace_id),
                    id: hex(&s.span_id),
                    parent: hex(&s.parent_span_id),
                    name: s.name,
                    kind: s.kind,
                    status: s.status.map_or(0, |st| st.code),
                    attrs: s
                        .attributes
                        .iter()
                        .map(|kv| (kv.key.clone(), text(&kv.value)))
                        .collect(),
                    resource: resource.clone(),
                });
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Serves the OTLP trace service on a free loopback port: the runtime serving it (kept for
/// the test's length), what it receives, and its endpoint.
fn serve() -> (tokio::runtime::Runtime, Collector, String) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let c = Collector::default();
    let l = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = l.local_addr().unwrap();
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(c.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(l)),
    );
    (rt, c, format!("http://{addr}"))
}

/// A daemon of the test's config whose `tracing` table is `table` (inline TOML), and a client.
fn daemon_tracing(env: &Env, table: &str) -> (Daemon, tokio::runtime::Runtime, Client) {
    let d = Daemon::start_extra(env, &env.cfg, &format!("tracing = {table}\n"));
    let rt = rt();
    let c = rt.block_on(client(&d.socket));
    (d, rt, c)
}

/// A request with W3C trace context metadata.
fn traced<T>(msg: T, trace: &str, parent: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert(
        "traceparent",
        format!("00-{trace}-{parent}-01").parse().unwrap(),
    );
    r
}

/// Every span below `root` (by parent links), `root` first.
fn tree<'a>(spans: &'a [Span], root: &'a Span) -> Vec<&'a Span> {
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        let id = &out[i].id;
        out.extend(spans.iter().filter(|s| &s.parent == id));
        i += 1;
    }
    out
}

fn request<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    spans
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no span {name} among {:#?}", names(spans)))
}

fn names(spans: &[Span]) -> Vec<String> {
    spans.iter().map(|s| s.name.clone()).collect()
}

/// Asserts that a span `name` with `attrs` is in `steps` (a request's tree, named `under`).
fn assert_step(steps: &[&Span], under: &str, name: &str, attrs: &[(&str, &str)]) {
    let found = steps.iter().any(|s| {
        s.name == name
            && attrs
                .iter()
                .all(|(k, v)| s.attrs.get(*k).map(String::as_str) == Some(*v))
    });
    assert!(
        found,
        "no {name} span with {attrs:?} below {under}: {steps:#?}"
    );
}

#[test]
fn spans_reach_an_otlp_collector_with_ids_steps_and_the_callers_trace() {
    let env = Env::new("otlp");
    let (_server, got, endpoint) = serve();
    let reg = Registry::start(&env.base.join("registry"), None);
    reg.push_busybox("test/traced", "1", None);
    sandboxd::image::ImageStore::new(env.cfg.root.join("images"))
        .unwrap()
        .import(&common::busybox::oci_layout(&env.base, IMAGE), None)
        .unwrap();
    let (mut d, rt, mut c) = daemon_tracing(
        &env,
        &format!("{{ endpoint = \"{endpoint}\", service_name = \"sandboxd-test\" }}"),
    );
    let plugin = TestPlugin::connect(
        &env.cfg.nri.socket_path,
        Behavior {
            name: "traced".into(),
            idx: "10".into(),
            ..Default::default()
        },
    );
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller = "00f067aa0ba902b7";
    let p = pod("traced", serde_json::json!({}));
    let sb = rt
        .block_on(c.run_pod_sandbox(traced(
            cri::RunPodSandboxRequest {
                config: Some(p.clone()),
                runtime_handler: String::new(),
            },
            trace,
            caller,
        )))
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    let id = sleeper(&rt, &mut c, &sb, &p, "work");
    let missing = rt
        .block_on(c.container_status(cri::ContainerStatusRequest {
            container_id: "no-such-container".into(),
            verbose: false,
        }))
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);
    let image = format!("{}/test/traced:1", reg.addr);
    let mut ic = image_client(&rt, &d);
    rt.block_on(ic.pull_image(cri::PullImageRequest {
        image: Some(cri::ImageSpec {
            image: image.clone(),
            ..Default::default()
        }),
        auth: None,
        sandbox_config: None,
    }))
    .unwrap();
    rt.block_on(c.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: sb.clone(),
    }))
    .unwrap();
    remove_pod(&rt, &mut c, &sb);
    plugin.wait_for("REMOVE_POD_SANDBOX traced");
    drop(plugin);
    // SIGTERM: the exporter sends what is queued before the daemon exits.
    assert!(d.sigterm().success());
    let spans = got.0.lock().unwrap().clone();

    // The resource names the service and the node.
    let run = request(&spans, "runtime.v1.RuntimeService/RunPodSandbox");
    assert_eq!(run.resource["service.name"], "sandboxd-test", "{run:#?}");
    assert_eq!(
        run.resource["host.name"],
        nix::unistd::gethostname().unwrap().to_string_lossy()
    );
    // The request continues the caller's trace: its trace id, its span as the parent.
    assert_eq!((run.trace.as_str(), run.parent.as_str()), (trace, caller));
    assert_eq!(run.kind, 2, "a server span: {run:#?}");
    assert_eq!(run.attrs["rpc.grpc.status_code"], "0");
    assert_eq!(run.status, 0);
    // The id the call made is the request's attribute.
    assert_eq!(run.attrs["sandbox_id"], sb);
    let steps = tree(&spans, run);
    let under = "RunPodSandbox";
    assert_step(&steps, under, "cri", &[("rpc", "RunPodSandbox")]);
    let add = [
        ("command", "ADD"),
        ("plugin", "bridge"),
        ("container_id", &sb),
    ];
    assert_step(&steps, under, "cni", &add);
    let nri = [("plugin", "10-traced"), ("request", "RUN_POD_SANDBOX")];
    assert_step(&steps, under, "nri", &nri);
    assert!(steps.iter().all(|s| s.trace == trace));

    // A call without trace context starts its own trace; its steps carry the container's id.
    let create = request(&spans, "runtime.v1.RuntimeService/CreateContainer");
    assert_ne!(create.trace, trace);
    assert_eq!(create.parent, "", "a root span: {create:#?}");
    assert_eq!(
        (
            create.attrs["sandbox_id"].as_str(),
            create.attrs["container_id"].as_str()
        ),
        (sb.as_str(), id.as_str())
    );
    let steps = tree(&spans, create);
    let under = "CreateContainer";
    let nri = [("plugin", "10-traced"), ("request", "CreateContainer")];
    assert_step(&steps, under, "nri", &nri);
    assert_step(
        &steps,
        under,
        "oci_runtime",
        &[("op", "create"), ("container_id", &id)],
    );
    let start = request(&spans, "runtime.v1.RuntimeService/StartContainer");
    let run_start = [("op", "start"), ("container_id", id.as_str())];
    assert_step(
        &tree(&spans, start),
        "StartContainer",
        "oci_runtime",
        &run_start,
    );
    let stop = request(&spans, "runtime.v1.RuntimeService/StopPodSandbox");
    let del = [("command", "DEL"), ("plugin", "bridge")];
    assert_step(&tree(&spans, stop), "StopPodSandbox", "cni", &del);

    // A refused call: an error span with its gRPC code.
    let status = request(&spans, "runtime.v1.RuntimeService/ContainerStatus");
    assert_eq!(status.status, 2, "{status:#?}");
    assert_eq!(status.attrs["rpc.grpc.status_code"], "5");

    // The pull, a step of its request.
    let pull = request(&spans, "runtime.v1.ImageService/PullImage");
    assert_step(
        &tree(&spans, pull),
        "PullImage",
        "pull",
        &[("image", &image)],
    );

    // Every parent was exported (or is the caller's): no step is cut off from its call.
    for s in &spans {
        assert!(
            s.parent.is_empty() || s.parent == caller || spans.iter().any(|p| p.id == s.parent),
            "span {} has a parent that was never exported",
            s.name
        );
    }
    // The logs are as without an exporter: calls named by their `cri` span, no request spans.
    let log = std::fs::read_to_string(&d.log).unwrap();
    assert!(log.contains("cri{rpc=\"RunPodSandbox\""), "{log}");
    assert!(!log.contains("request{"), "request spans in the log");
}

#[test]
fn the_sampling_ratio_picks_new_traces_and_a_callers_choice_is_kept() {
    let env = Env::new("otlp-ratio");
    let (_server, got, endpoint) = serve();
    let (mut d, rt, mut c) = daemon_tracing(
        &env,
        &format!("{{ endpoint = \"{endpoint}\", sampling_ratio = 0.0 }}"),
    );
    let trace = "0af7651916cd43dd8448eb211c80319c";
    for _ in 0..20 {
        rt.block_on(c.version(cri::VersionRequest::default()))
            .unwrap();
    }
    rt.block_on(c.version(traced(
        cri::VersionRequest::default(),
        trace,
        "b7ad6b7169203331",
    )))
    .unwrap();
    assert!(d.sigterm().success());
    let spans = got.0.lock().unwrap().clone();
    let versions: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "runtime.v1.RuntimeService/Version")
        .collect();
    assert_eq!(
        versions.len(),
        1,
        "ratio 0: only the sampled caller's call: {spans:#?}"
    );
    assert_eq!(versions[0].trace, trace);
    assert_eq!(versions[0].resource["service.name"], "sandboxd");
}

#[test]
fn a_collector_that_is_not_there_holds_no_call() {
    let env = Env::new("otlp-absent");
    let (mut d, rt, mut c) = daemon_tracing(
        &env,
        &format!("{{ endpoint = \"http://{}\" }}", free_loopback_addr()),
    );
    let started = Instant::now();
    for _ in 0..200 {
        rt.block_on(c.version(cri::VersionRequest::default()))
            .unwrap();
    }
    let per_call = started.elapsed() / 200;
    assert!(per_call < Duration::from_millis(50), "{per_call:?} a call");
    // The exit does not wait for the collector beyond the export timeout (5 s).
    let started = Instant::now();
    assert!(d.sigterm().success());
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_bad_tracing_table_fails_the_start_naming_the_key() {
    let env = Env::new("otlp-bad");
    for (table, says) in [
        (
            "{ endpoint = \"https://collector:4317\" }",
            "TLS to the collector",
        ),
        (
            "{ endpoint = \"http://127.0.0.1:4317\", sampling_ratio = 2.0 }",
            "sampling_ratio",
        ),
        ("{ endpont = \"http://127.0.0.1:4317\" }", "endpont"),
    ] {
        let cfg = Daemon::config_file_extra(&env, &env.cfg, &format!("tracing = {table}\n"));
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandboxd"))
            .arg("--config")
            .arg(&cfg)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{table}: started");
        assert!(err.contains(says), "{table}: {err}");
    }
}
