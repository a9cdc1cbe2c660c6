//! `RuntimeService`, pod sandboxes: run, stop, remove, status, list, resize.

use tonic::{Request, Response, Status};

use crate::api::v1 as cri;
use crate::cri::{codes, pod, resources, verbose_info, CriService};

pub(super) async fn run_pod_sandbox(
    svc: &CriService,
    req: Request<cri::RunPodSandboxRequest>,
) -> Result<Response<cri::RunPodSandboxResponse>, Status> {
    let config = pod::pod_config(req.get_ref()).map_err(|e| codes::status_of(&e))?;
    let name = config.reserved_name();
    let id = svc
        .call("RunPodSandbox", &name, move |rt| {
            rt.run_pod_sandbox(&config)
        })
        .await?;
    crate::telemetry::record_id("sandbox_id", &id);
    tracing::info!(sandbox_id = %id, name = %name, "RunPodSandbox done");
    Ok(Response::new(cri::RunPodSandboxResponse {
        pod_sandbox_id: id,
    }))
}

pub(super) async fn stop_pod_sandbox(
    svc: &CriService,
    req: Request<cri::StopPodSandboxRequest>,
) -> Result<Response<cri::StopPodSandboxResponse>, Status> {
    let id = req.into_inner().pod_sandbox_id;
    let i = id.clone();
    svc.call("StopPodSandbox", &id, move |rt| rt.stop_pod_sandbox(&i))
        .await?;
    Ok(Response::new(cri::StopPodSandboxResponse {}))
}

pub(super) async fn remove_pod_sandbox(
    svc: &CriService,
    req: Request<cri::RemovePodSandboxRequest>,
) -> Result<Response<cri::RemovePodSandboxResponse>, Status> {
    let id = req.into_inner().pod_sandbox_id;
    let i = id.clone();
    svc.call("RemovePodSandbox", &id, move |rt| rt.remove_pod_sandbox(&i))
        .await?;
    Ok(Response::new(cri::RemovePodSandboxResponse {}))
}

pub(super) async fn pod_sandbox_status(
    svc: &CriService,
    req: Request<cri::PodSandboxStatusRequest>,
) -> Result<Response<cri::PodSandboxStatusResponse>, Status> {
    // Status reads memory only (no process call): answered inline, no thread hop.
    let req = req.into_inner();
    let span =
        tracing::debug_span!("cri", rpc = "PodSandboxStatus", sandbox_id = %req.pod_sandbox_id);
    let _g = span.enter();
    let status = svc
        .rt
        .pod_sandbox_status(&req.pod_sandbox_id)
        .map_err(|e| codes::status_of(&e))?;
    // A quarantined sandbox has no readable record: its status says what is known.
    let record = match req.verbose {
        true => svc.rt.sandbox_record(&status.id).ok(),
        false => None,
    };
    let info = verbose_info(req.verbose, record.as_ref());
    Ok(Response::new(cri::PodSandboxStatusResponse {
        status: Some(pod::status_to_cri(&status)),
        info,
        containers_statuses: Vec::new(),
        timestamp: crate::state::now_nanos(),
    }))
}

pub(super) async fn list_pod_sandbox(
    svc: &CriService,
    req: Request<cri::ListPodSandboxRequest>,
) -> Result<Response<cri::ListPodSandboxResponse>, Status> {
    let filter = pod::filter(req.get_ref().filter.as_ref()).map_err(|e| codes::status_of(&e))?;
    let items = match filter {
        Some(f) => svc
            .rt
            .list_pod_sandboxes(&f)
            .iter()
            .map(pod::sandbox_to_cri)
            .collect(),
        None => Vec::new(),
    };
    Ok(Response::new(cri::ListPodSandboxResponse { items }))
}

pub(super) async fn update_pod_sandbox_resources(
    svc: &CriService,
    req: Request<cri::UpdatePodSandboxResourcesRequest>,
) -> Result<Response<cri::UpdatePodSandboxResourcesResponse>, Status> {
    let req = req.into_inner();
    let overhead = req.overhead.as_ref().map(resources);
    let resources = req.resources.as_ref().map(resources);
    let id = req.pod_sandbox_id;
    let i = id.clone();
    svc.call("UpdatePodSandboxResources", &id, move |rt| {
        rt.update_pod_sandbox_resources(&i, overhead, resources)
    })
    .await?;
    Ok(Response::new(cri::UpdatePodSandboxResourcesResponse {}))
}
