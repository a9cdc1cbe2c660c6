//! The CRI v1 gRPC services: `RuntimeService` and `ImageService`. They translate between CRI
//! messages and the core [`Runtime`](crate::Runtime) (whose calls block on process calls, so
//! they run on tokio's blocking pool) and nothing more. What this host cannot do (checkpoint
//! where CRIU does not work) answers `Unimplemented` with the reason: never a fake success.

#[doc(hidden)]
mod admin;
pub mod codes;
#[doc(hidden)]
pub mod container;
pub mod crictl_json;
#[doc(hidden)]
pub mod events;
mod health;
#[doc(hidden)]
pub mod image;
mod image_service;
mod list_streams;
#[doc(hidden)]
pub mod metrics;
#[doc(hidden)]
pub mod pod;
mod runtime_service;
mod stats;

use std::sync::Arc;

use tonic::{Request, Status};

use crate::Runtime;

/// The time left before the client's deadline (`grpc-timeout`), a little early so that our
/// answer reaches it before its own timer or tonic's fires.
fn client_deadline<T>(req: &Request<T>) -> Option<std::time::Duration> {
    let v = req.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (num, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = num.parse().ok()?;
    let d = match unit {
        "H" => std::time::Duration::from_secs(n.saturating_mul(3600)),
        "M" => std::time::Duration::from_secs(n.saturating_mul(60)),
        "S" => std::time::Duration::from_secs(n),
        "m" => std::time::Duration::from_millis(n),
        "u" => std::time::Duration::from_micros(n),
        "n" => std::time::Duration::from_nanos(n),
        _ => return None,
    };
    Some(
        d.saturating_sub(d / 20)
            .saturating_sub(std::time::Duration::from_millis(5)),
    )
}

/// The `info` map of a verbose status answer: `{"info": <value as JSON>}`, empty otherwise.
fn verbose_info<T: serde::Serialize>(
    verbose: bool,
    value: Option<&T>,
) -> std::collections::HashMap<String, String> {
    value
        .filter(|_| verbose)
        .map(|v| {
            (
                "info".to_string(),
                serde_json::to_string(v).unwrap_or_default(),
            )
        })
        .into_iter()
        .collect()
}

/// Both CRI services over one core runtime.
#[derive(Clone)]
pub struct CriService {
    rt: Arc<Runtime>,
    streaming: Option<Arc<crate::streaming::StreamingServer>>,
}

impl CriService {
    /// Both services over `rt`, without a streaming server: Exec, Attach and PortForward
    /// answer `Unimplemented` until [`with_streaming`](Self::with_streaming).
    pub fn new(rt: Arc<Runtime>) -> Self {
        CriService {
            rt,
            streaming: None,
        }
    }

    /// Serves Exec and PortForward URLs on this streaming server.
    pub fn with_streaming(mut self, s: Arc<crate::streaming::StreamingServer>) -> Self {
        self.streaming = Some(s);
        self
    }

    fn streaming(&self) -> Result<Arc<crate::streaming::StreamingServer>, Status> {
        self.streaming
            .clone()
            .ok_or_else(|| Status::unimplemented("this server runs no streaming server"))
    }

    /// A one-time streaming URL for `target` (checked against the runtime on the blocking pool).
    async fn stream_url(
        &self,
        rpc: &'static str,
        id: &str,
        target: crate::streaming::Target,
    ) -> Result<String, Status> {
        let s = self.streaming()?;
        let for_pod = matches!(target, crate::streaming::Target::PortForward { .. });
        let f = move |_: &Runtime| s.exec_url(target);
        match for_pod {
            true => self.call(rpc, id, f).await,
            false => self.blocking(rpc, id, f).await,
        }
    }

    /// Runs a blocking core call on the blocking pool, inside a span naming the sandbox.
    async fn call<T, F>(&self, rpc: &'static str, sandbox_id: &str, f: F) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce(&Runtime) -> crate::error::Result<T> + Send + 'static,
    {
        if rpc != "RunPodSandbox" {
            crate::telemetry::record_id("sandbox_id", sandbox_id);
        }
        let span = tracing::info_span!("cri", rpc, sandbox_id = %sandbox_id);
        self.in_span(rpc, span, f).await
    }

    /// [`call`](Self::call) for container and image RPCs: the span names the object.
    async fn blocking<T, F>(&self, rpc: &'static str, id: &str, f: F) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce(&Runtime) -> crate::error::Result<T> + Send + 'static,
    {
        if !rpc.contains("Image") {
            crate::telemetry::record_id("container_id", id);
        }
        let span = tracing::info_span!("cri", rpc, container_id = %id);
        self.in_span(rpc, span, f).await
    }

    async fn in_span<T, F>(&self, rpc: &'static str, span: tracing::Span, f: F) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce(&Runtime) -> crate::error::Result<T> + Send + 'static,
    {
        let rt = self.rt.clone();
        // Entered inside the closure: every event of the core call carries the request's ids.
        let inner = span.clone();
        let r = tokio::task::spawn_blocking(move || {
            let _g = inner.enter();
            f(&rt)
        })
        .await
        .map_err(|e| Status::internal(format!("{rpc}: worker failed: {e}")))?;
        r.map_err(|e| {
            let _g = span.enter();
            tracing::warn!(error = %e, "{rpc} failed");
            codes::status_of(&e)
        })
    }
}

/// The resources a cgroup applies, from the CRI's (a container's, or a pod's own and its
/// overhead).
pub fn resources(
    r: &crate::api::v1::LinuxContainerResources,
) -> crate::model::resources::Resources {
    crate::model::resources::Resources {
        cpu_period: r.cpu_period,
        cpu_quota: r.cpu_quota,
        cpu_shares: r.cpu_shares,
        memory_limit_in_bytes: r.memory_limit_in_bytes,
        oom_score_adj: r.oom_score_adj,
        cpuset_cpus: r.cpuset_cpus.clone(),
        cpuset_mems: r.cpuset_mems.clone(),
        memory_swap_limit_in_bytes: r.memory_swap_limit_in_bytes,
        hugepage_limits: r
            .hugepage_limits
            .iter()
            .map(|h| (h.page_size.clone(), h.limit))
            .collect(),
        unified: r
            .unified
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    }
}
