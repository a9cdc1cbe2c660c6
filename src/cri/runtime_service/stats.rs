//! `RuntimeService`, use: container and pod stats, their lists, and the pod metrics.

use tonic::{Request, Response, Status};

use crate::api::v1 as cri;
use crate::cri::{codes, container, metrics, pod, stats, CriService};

pub(super) async fn list_container_stats(
    svc: &CriService,
    req: Request<cri::ListContainerStatsRequest>,
) -> Result<Response<cri::ListContainerStatsResponse>, Status> {
    let f = req.into_inner().filter.unwrap_or_default();
    let filter = container::container_filter(Some(&cri::ContainerFilter {
        id: f.id,
        pod_sandbox_id: f.pod_sandbox_id,
        label_selector: f.label_selector,
        state: Some(cri::ContainerStateValue {
            state: cri::ContainerState::ContainerRunning as i32,
        }),
    }))
    .map_err(|e| codes::status_of(&e))?;
    let Some(filter) = filter else {
        return Ok(Response::new(cri::ListContainerStatsResponse {
            stats: Vec::new(),
        }));
    };
    let stats = svc
        .blocking("ListContainerStats", "", move |rt| {
            let now = crate::state::now_nanos();
            Ok(rt
                .containers_usage(&filter)
                .iter()
                .map(|c| container::stats_of(c, now))
                .collect())
        })
        .await?;
    Ok(Response::new(cri::ListContainerStatsResponse { stats }))
}

pub(super) async fn list_pod_sandbox_stats(
    svc: &CriService,
    req: Request<cri::ListPodSandboxStatsRequest>,
) -> Result<Response<cri::ListPodSandboxStatsResponse>, Status> {
    let f = req.into_inner().filter.unwrap_or_default();
    let filter = pod::filter(Some(&cri::PodSandboxFilter {
        id: f.id,
        state: Some(cri::PodSandboxStateValue {
            state: cri::PodSandboxState::SandboxReady as i32,
        }),
        label_selector: f.label_selector,
    }))
    .map_err(|e| codes::status_of(&e))?;
    let stats = match filter {
        Some(filter) => {
            svc.blocking("ListPodSandboxStats", "", move |rt| {
                Ok(rt
                    .pods_usage(&filter, crate::metrics::Depth::Stats)
                    .iter()
                    .map(stats::pod_stats)
                    .collect())
            })
            .await?
        }
        None => Vec::new(),
    };
    Ok(Response::new(cri::ListPodSandboxStatsResponse { stats }))
}

pub(super) async fn container_stats(
    svc: &CriService,
    req: Request<cri::ContainerStatsRequest>,
) -> Result<Response<cri::ContainerStatsResponse>, Status> {
    let id = req.into_inner().container_id;
    let i = id.clone();
    let stats = svc
        .blocking("ContainerStats", &id, move |rt| {
            let c = rt.container_usage_detail(&i)?;
            Ok(container::stats_of(&c, crate::state::now_nanos()))
        })
        .await?;
    Ok(Response::new(cri::ContainerStatsResponse {
        stats: Some(stats),
    }))
}

pub(super) async fn pod_sandbox_stats(
    svc: &CriService,
    req: Request<cri::PodSandboxStatsRequest>,
) -> Result<Response<cri::PodSandboxStatsResponse>, Status> {
    let id = req.into_inner().pod_sandbox_id;
    let i = id.clone();
    let stats = svc
        .call("PodSandboxStats", &id, move |rt| {
            Ok(stats::pod_stats(&rt.pod_usage_detail(&i)?))
        })
        .await?;
    Ok(Response::new(cri::PodSandboxStatsResponse {
        stats: Some(stats),
    }))
}

pub(super) async fn list_metric_descriptors(
    _: &CriService,
    _: Request<cri::ListMetricDescriptorsRequest>,
) -> Result<Response<cri::ListMetricDescriptorsResponse>, Status> {
    Ok(Response::new(cri::ListMetricDescriptorsResponse {
        descriptors: metrics::descriptors(),
    }))
}

pub(super) async fn list_pod_sandbox_metrics(
    svc: &CriService,
    _: Request<cri::ListPodSandboxMetricsRequest>,
) -> Result<Response<cri::ListPodSandboxMetricsResponse>, Status> {
    let pod_metrics = svc
        .blocking("ListPodSandboxMetrics", "", |rt| {
            let ready = crate::model::sandbox::SandboxFilter {
                state: Some(crate::model::sandbox::SandboxState::Ready),
                ..Default::default()
            };
            Ok(rt
                .pods_usage(&ready, crate::metrics::Depth::Metrics)
                .iter()
                .map(metrics::pod)
                .collect())
        })
        .await?;
    Ok(Response::new(cri::ListPodSandboxMetricsResponse {
        pod_metrics,
    }))
}
