//! The operator's view of the daemon, in the Prometheus text format (`--metrics-address`,
//! off by default): per-RPC latency histograms and error counts by gRPC code, image pull
//! bytes, durations and outcomes, and pods and containers by state (counted at scrape
//! time). Encoded by the `prometheus-client` crate; served by a small HTTP/1 server with
//! bounded connections and header time.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::http;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::state::lock;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Rpc {
    rpc: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcError {
    rpc: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct State {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OrphanKind {
    kind: &'static str,
}

/// Counts by state name (pods or containers).
pub type StateCounts = Vec<(&'static str, i64)>;

/// Gives the pod and container counts at scrape time.
pub type CountsFn = Arc<dyn Fn() -> (StateCounts, StateCounts) + Send + Sync>;

/// Distinct RPC names kept as label values; calls to more (a client inventing method names)
/// are counted as `other`, so the series cannot grow without bound.
const MAX_RPC_NAMES: usize = 96;

/// The daemon's metrics.
pub struct DaemonMetrics {
    registry: Registry,
    rpc_seconds: Family<Rpc, Histogram>,
    rpc_errors: Family<RpcError, Counter>,
    rpc_names: Mutex<HashSet<String>>,
    pull_bytes: Counter,
    pull_seconds: Histogram,
    pulls: Family<Outcome, Counter>,
    pods: Family<State, Gauge>,
    containers: Family<State, Gauge>,
    orphans: Family<OrphanKind, Gauge>,
    audit_timestamp: Gauge,
    audit_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
}

impl Default for DaemonMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl DaemonMetrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("sandboxd");
        // 0.25 ms … ~33 s.
        let rpc_seconds = Family::<Rpc, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.00025, 2.0, 18))) as fn() -> Histogram,
        );
        let rpc_errors = Family::<RpcError, Counter>::default();
        let pull_bytes = Counter::default();
        // 50 ms … ~27 min.
        let pull_seconds = Histogram::new(exponential_buckets(0.05, 2.0, 16));
        let pulls = Family::<Outcome, Counter>::default();
        let pods = Family::<State, Gauge>::default();
        let containers = Family::<State, Gauge>::default();
        registry.register(
            "rpc_duration_seconds",
            "CRI calls by method: time to the answer (for streams, to the first message)",
            rpc_seconds.clone(),
        );
        registry.register(
            "rpc_errors",
            "CRI calls answered with an error, by method and gRPC code",
            rpc_errors.clone(),
        );
        registry.register(
            "image_pull_bytes",
            "Bytes of layers downloaded by image pulls (shared layers are not downloaded again)",
            pull_bytes.clone(),
        );
        registry.register(
            "image_pull_duration_seconds",
            "Successful image pulls: time from the request to the image being stored",
            pull_seconds.clone(),
        );
        registry.register(
            "image_pulls",
            "Image pulls by outcome (success or failure)",
            pulls.clone(),
        );
        registry.register("pods", "Pod sandboxes by state", pods.clone());
        registry.register("containers", "Containers by state", containers.clone());
        let orphans = Family::<OrphanKind, Gauge>::default();
        let audit_timestamp = Gauge::default();
        let audit_seconds = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "orphans",
            "Host objects this daemon made that no record owns, by kind, at the last audit",
            orphans.clone(),
        );
        registry.register(
            "audit_timestamp_seconds",
            "When the last audit ended (Unix time)",
            audit_timestamp.clone(),
        );
        registry.register(
            "audit_duration_seconds",
            "How long the last audit took",
            audit_seconds.clone(),
        );
        DaemonMetrics {
            registry,
            rpc_seconds,
            rpc_errors,
            rpc_names: Mutex::new(HashSet::new()),
            pull_bytes,
            pull_seconds,
            pulls,
            pods,
            containers,
            orphans,
            audit_timestamp,
            audit_seconds,
        }
    }

    /// The last audit's orphans by kind, when it ended and how long it took.
    pub fn record_audit(&self, r: &crate::model::audit::Report) {
        for (kind, n) in r.counts() {
            self.orphans
                .get_or_create(&OrphanKind {
                    kind: kind.as_str(),
                })
                .set(n as i64);
        }
        let at =
            r.at.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .unwrap_or_default();
        self.audit_timestamp.set(at.as_secs() as i64);
        self.audit_seconds.set(r.took.as_secs_f64());
    }

    /// One CRI call: its method name, its gRPC code (0 = OK) and how long it took.
    pub fn observe_rpc(&self, method: &str, code: i32, took: Duration) {
        let rpc = {
            let mut names = lock(&self.rpc_names);
            if names.contains(method) {
                method.to_string()
            } else if names.len() < MAX_RPC_NAMES
                && !method.is_empty()
                && method.len() <= 64
                && method.bytes().all(|b| b.is_ascii_alphanumeric())
            {
                names.insert(method.to_string());
                method.to_string()
            } else {
                "other".to_string()
            }
        };
        self.rpc_seconds
            .get_or_create(&Rpc { rpc: rpc.clone() })
            .observe(took.as_secs_f64());
        if code != 0 {
            let code = tonic::Code::from_i32(code);
            self.rpc_errors
                .get_or_create(&RpcError {
                    rpc,
                    code: format!("{code:?}"),
                })
                .inc();
        }
    }

    /// One pull: downloaded bytes and duration when it succeeded.
    pub fn observe_pull(&self, ok: Option<(u64, Duration)>) {
        let result = if ok.is_some() { "success" } else { "failure" };
        self.pulls
            .get_or_create(&Outcome {
                result: result.into(),
            })
            .inc();
        if let Some((bytes, took)) = ok {
            self.pull_bytes.inc_by(bytes);
            self.pull_seconds.observe(took.as_secs_f64());
        }
    }

    /// The text exposition, with the pod and container counts given (by state name).
    pub fn encode(&self, pods: &[(&str, i64)], containers: &[(&str, i64)]) -> String {
        for (family, counts) in [(&self.pods, pods), (&self.containers, containers)] {
            for (state, n) in counts {
                family
                    .get_or_create(&State {
                        state: state.to_string(),
                    })
                    .set(*n);
            }
        }
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "cannot encode metrics");
        }
        out
    }
}

/// A tower layer that times every gRPC call (in its request span when spans are exported,
/// [`crate::telemetry`]) and reads its status: an error answer carries
/// `grpc-status` in its headers (trailers-only); a success has it in the trailers (0).
#[derive(Clone)]
pub struct RpcMetricsLayer(pub Arc<DaemonMetrics>);

impl<S> tower::Layer<S> for RpcMetricsLayer {
    type Service = RpcMetricsService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RpcMetricsService {
            inner,
            metrics: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct RpcMetricsService<S> {
    inner: S,
    metrics: Arc<DaemonMetrics>,
}

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S, B, R> tower::Service<http::Request<B>> for RpcMetricsService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    R: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let method = req
            .uri()
            .path()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string();
        let started = std::time::Instant::now();
        let span = crate::telemetry::request_span(req.uri().path(), req.headers());
        let fut = span.in_scope(|| self.inner.call(req));
        let metrics = self.metrics.clone();
        Box::pin(async move {
            use tracing::Instrument;
            let r = fut.instrument(span.clone()).await;
            let code = match &r {
                Ok(resp) => resp
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|s| s.parse::<i32>().ok())
                    .unwrap_or(0),
                Err(_) => tonic::Code::Internal as i32,
            };
            metrics.observe_rpc(&method, code, started.elapsed());
            crate::telemetry::record_status(&span, code);
            r
        })
    }
}

/// Most scrape connections served at once.
const MAX_CONNECTIONS: usize = 16;

/// Serves `GET /metrics` on `listener` until `shutdown` resolves; `counts` gives the pod and
/// container counts by state at each scrape.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<DaemonMetrics>,
    counts: CountsFn,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    use hyper::service::service_fn;
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => return,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "metrics: too many connections; closing one");
            continue;
        };
        let metrics = metrics.clone();
        let counts = counts.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let metrics = metrics.clone();
                let counts = counts.clone();
                async move {
                    let resp = if req.method() != http::Method::GET {
                        reply(
                            http::StatusCode::METHOD_NOT_ALLOWED,
                            "text/plain",
                            "GET only\n".into(),
                        )
                    } else if req.uri().path() != "/metrics" {
                        reply(
                            http::StatusCode::NOT_FOUND,
                            "text/plain",
                            "see /metrics\n".into(),
                        )
                    } else {
                        let (pods, containers) = tokio::task::spawn_blocking(move || counts())
                            .await
                            .unwrap_or_default();
                        let body = metrics.encode(&pods, &containers);
                        reply(
                            http::StatusCode::OK,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            body,
                        )
                    };
                    Ok::<_, std::convert::Infallible>(resp)
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(5))
                .max_buf_size(16 << 10)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
            // A scrape that takes longer than this is cut off.
            let _ = tokio::time::timeout(Duration::from_secs(60), conn).await;
        });
    }
}

fn reply(
    status: http::StatusCode,
    content_type: &str,
    body: String,
) -> http::Response<http_body_util::Full<bytes::Bytes>> {
    let mut r = http::Response::new(http_body_util::Full::new(bytes::Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_rpcs_pulls_and_states() {
        let m = DaemonMetrics::new();
        m.observe_rpc("RunPodSandbox", 0, Duration::from_millis(3));
        m.observe_rpc("RunPodSandbox", 5, Duration::from_millis(1));
        m.observe_pull(Some((1000, Duration::from_secs(1))));
        m.observe_pull(None);
        let text = m.encode(&[("ready", 2)], &[("running", 3), ("exited", 1)]);
        for want in [
            "sandboxd_rpc_duration_seconds_count{rpc=\"RunPodSandbox\"} 2",
            "sandboxd_rpc_errors_total{rpc=\"RunPodSandbox\",code=\"NotFound\"} 1",
            "sandboxd_image_pull_bytes_total 1000",
            "sandboxd_image_pulls_total{result=\"failure\"} 1",
            "sandboxd_pods{state=\"ready\"} 2",
            "sandboxd_containers{state=\"running\"} 3",
        ] {
            assert!(text.contains(want), "{want} missing from\n{text}");
        }
    }

    #[test]
    fn invented_method_names_are_bounded() {
        let m = DaemonMetrics::new();
        for i in 0..1000 {
            m.observe_rpc(&format!("Made{i}"), 12, Duration::from_millis(1));
        }
        m.observe_rpc("bad/name", 12, Duration::from_millis(1));
        let text = m.encode(&[], &[]);
        let series = text
            .lines()
            .filter(|l| l.starts_with("sandboxd_rpc_errors_total{"))
            .count();
        assert_eq!(series, MAX_RPC_NAMES + 1, "{text}");
    }
}
