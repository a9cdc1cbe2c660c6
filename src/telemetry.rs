//! Traces for operators: the daemon's spans (one per gRPC request, the CRI call inside it and
//! its steps: CNI plugins, OCI runtime calls, pulls, NRI requests) exported over OTLP/gRPC to
//! a collector when `[tracing] endpoint` is set, as CRI-O's `tracing_endpoint` and
//! containerd's OTLP plugin do. A request that carries W3C `traceparent` metadata (kubelet
//! sends it when its own tracing is on) continues the caller's trace.
//!
//! Off by default, and then nothing here runs: the request span is `Span::none()`. Bounded:
//! the batch processor's queue holds at most 2048 spans (more are dropped, not buffered), an
//! export waits at most `timeout_seconds`, and the exporter has its own thread and runtime,
//! so a slow or absent collector never holds a CRI call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hyper::http;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// `[tracing]` of the daemon's config file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct TracingConfig {
    /// The collector's OTLP/gRPC address, `http://HOST:PORT` (e.g. a node-local collector
    /// at `http://127.0.0.1:4317`); unset (the default): no spans are exported.
    pub endpoint: Option<String>,
    /// Share of new traces recorded, 0.0–1.0 (a request whose caller's trace is sampled is
    /// always recorded, one whose caller's is not never is).
    pub sampling_ratio: f64,
    /// The `service.name` of the spans' resource.
    pub service_name: String,
    /// Longest wait for one export to the collector.
    pub timeout_seconds: u64,
}

impl Default for TracingConfig {
    fn default() -> Self {
        TracingConfig {
            endpoint: None,
            sampling_ratio: 1.0,
            service_name: "sandboxd".into(),
            timeout_seconds: 5,
        }
    }
}

impl TracingConfig {
    /// Refuses what would fail only when the first span is exported.
    pub fn check(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(format!("[tracing] {m}")));
        if !(0.0..=1.0).contains(&self.sampling_ratio) {
            return bad(format!(
                "sampling_ratio {}: expected 0.0 to 1.0",
                self.sampling_ratio
            ));
        }
        if self.service_name.is_empty() || self.service_name.len() > 255 {
            return bad("service_name: expected 1 to 255 bytes".into());
        }
        if !(1..=600).contains(&self.timeout_seconds) {
            return bad(format!(
                "timeout_seconds {}: expected 1 to 600",
                self.timeout_seconds
            ));
        }
        let Some(ep) = &self.endpoint else {
            return Ok(());
        };
        let uri: http::Uri = match ep.parse() {
            Ok(u) => u,
            Err(e) => return bad(format!("endpoint {ep:?}: {e}")),
        };
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return bad(format!(
                    "endpoint {ep:?}: TLS to the collector is not served; send to a collector on \
                     the node (http://127.0.0.1:4317) and let it forward over TLS"
                ))
            }
            _ => return bad(format!("endpoint {ep:?}: expected http://HOST:PORT")),
        }
        if uri.host().is_none_or(str::is_empty) || uri.port_u16().is_none() {
            return bad(format!("endpoint {ep:?}: expected http://HOST:PORT"));
        }
        if uri.path() != "/" && !uri.path().is_empty() {
            return bad(format!(
                "endpoint {ep:?}: a gRPC endpoint has no path (the service's is fixed)"
            ));
        }
        Ok(())
    }
}

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported (request spans are made only then).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Target of the request spans: the log layers leave them out (every log line inside a call
/// already names the call by its `cri` span).
pub const REQUEST_TARGET: &str = "sandboxd::request";

/// The span of one gRPC request (`path` as `/runtime.v1.RuntimeService/RunPodSandbox`),
/// continuing the caller's trace from its `traceparent` metadata; `Span::none()` when
/// nothing is exported.
pub fn request_span(path: &str, headers: &http::HeaderMap) -> tracing::Span {
    if !enabled() {
        return tracing::Span::none();
    }
    let name = path.trim_start_matches('/');
    let (service, method) = name.split_once('/').unwrap_or((name, ""));
    let span = tracing::info_span!(
        target: REQUEST_TARGET,
        "request",
        otel.name = name,
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = service,
        rpc.method = method,
        rpc.grpc.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        sandbox_id = tracing::field::Empty,
        container_id = tracing::field::Empty,
    );
    use opentelemetry::propagation::TextMapPropagator;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let parent =
        opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&Headers(headers));
    use opentelemetry::trace::TraceContextExt;
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
    span
}

/// Records the pod's or container's id on the current request's span (a no-op without one):
/// a collector's search by id finds the request, also the one that made the id.
pub fn record_id(field: &'static str, id: &str) {
    if enabled() && !id.is_empty() {
        tracing::Span::current().record(field, id);
    }
}

/// Records a request's gRPC status on its span (an error's status is the span's status).
pub fn record_status(span: &tracing::Span, code: i32) {
    if span.is_none() {
        return;
    }
    span.record("rpc.grpc.status_code", code);
    if code != 0 {
        span.record("otel.status_code", "error");
    }
}

/// gRPC metadata as the propagator reads it.
struct Headers<'a>(&'a http::HeaderMap);

impl opentelemetry::propagation::Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// The exporter while the daemon runs: dropping it flushes the spans still queued (up to the
/// export timeout) and stops its thread.
pub struct Exporter {
    provider: opentelemetry_sdk::trace::SdkTracerProvider,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        ENABLED.store(false, Ordering::Relaxed);
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "OTLP exporter: spans still queued at exit were not sent");
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

/// The tracing layer that turns the daemon's spans into OTLP spans, and the exporter behind
/// it; `None` when `[tracing] endpoint` is unset.
pub fn layer<S>(
    cfg: &TracingConfig,
) -> Result<
    Option<(
        tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::SdkTracer>,
        Exporter,
    )>,
>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig;
    use opentelemetry_sdk::trace::Sampler;
    cfg.check()?;
    let Some(endpoint) = &cfg.endpoint else {
        return Ok(None);
    };
    let fail = |m: String| Error::Config(format!("[tracing] endpoint {endpoint}: {m}"));
    // tonic's channel runs its connection on the runtime it is made in: this one, whose
    // single worker does nothing else, while the batch processor's thread waits on it.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("otlp-export")
        .enable_all()
        .build()
        .map_err(|e| fail(format!("runtime: {e}")))?;
    let exporter = {
        let _in = runtime.enter();
        opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint.clone())
            .with_timeout(Duration::from_secs(cfg.timeout_seconds))
            .build()
            .map_err(|e| fail(e.to_string()))?
    };
    let mut resource = opentelemetry_sdk::Resource::builder_empty()
        .with_service_name(cfg.service_name.clone())
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ));
    if let Ok(h) = nix::unistd::gethostname() {
        resource = resource.with_attribute(opentelemetry::KeyValue::new(
            "host.name",
            h.to_string_lossy().into_owned(),
        ));
    }
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            cfg.sampling_ratio,
        ))))
        .with_resource(resource.build())
        .build();
    let layer = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("sandboxd"))
        .with_tracked_inactivity(false)
        .with_threads(false);
    ENABLED.store(true, Ordering::Relaxed);
    Ok(Some((
        layer,
        Exporter {
            provider,
            runtime: Some(runtime),
        },
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_refusals_name_the_key() {
        let with = |f: &dyn Fn(&mut TracingConfig)| {
            let mut c = TracingConfig::default();
            f(&mut c);
            c.check().err().map(|e| e.to_string()).unwrap_or_default()
        };
        assert_eq!(with(&|_| {}), "");
        assert_eq!(
            with(&|c| c.endpoint = Some("http://127.0.0.1:4317".into())),
            ""
        );
        for (ep, says) in [
            ("https://collector:4317", "TLS to the collector"),
            ("127.0.0.1:4317", "expected http://HOST:PORT"),
            ("http://127.0.0.1", "expected http://HOST:PORT"),
            ("http://127.0.0.1:4317/v1/traces", "has no path"),
            ("http://[::1", "endpoint"),
        ] {
            let e = with(&|c| c.endpoint = Some(ep.into()));
            assert!(e.contains(says) && e.contains("[tracing]"), "{ep}: {e}");
        }
        assert!(with(&|c| c.sampling_ratio = 1.5).contains("sampling_ratio"));
        assert!(with(&|c| c.sampling_ratio = f64::NAN).contains("sampling_ratio"));
        assert!(with(&|c| c.timeout_seconds = 0).contains("timeout_seconds"));
        assert!(with(&|c| c.service_name.clear()).contains("service_name"));
    }
}
