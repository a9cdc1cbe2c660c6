//! `RuntimeService`, containers: create, start, stop, remove, status, list, resources,
//! log reopening, ExecSync and checkpoints.

use tonic::{Request, Response, Status};

use crate::api::v1 as cri;
use crate::cri::{codes, container, resources, CriService};

pub(super) async fn list_containers(
    svc: &CriService,
    req: Request<cri::ListContainersRequest>,
) -> Result<Response<cri::ListContainersResponse>, Status> {
    let filter = container::container_filter(req.get_ref().filter.as_ref())
        .map_err(|e| codes::status_of(&e))?;
    let containers = match filter {
        Some(f) => svc
            .blocking("ListContainers", "", move |rt| Ok(rt.list_containers(&f)))
            .await?
            .iter()
            .map(container::container_to_cri)
            .collect(),
        None => Vec::new(),
    };
    Ok(Response::new(cri::ListContainersResponse { containers }))
}

pub(super) async fn create_container(
    svc: &CriService,
    req: Request<cri::CreateContainerRequest>,
) -> Result<Response<cri::CreateContainerResponse>, Status> {
    let req = req.into_inner();
    let config = req
        .config
        .as_ref()
        .ok_or_else(|| Status::invalid_argument("CreateContainer: config is required"))?;
    let config = container::container_config(config).map_err(|e| codes::status_of(&e))?;
    let sandbox = req.pod_sandbox_id.clone();
    let id = svc
        .call("CreateContainer", &req.pod_sandbox_id, move |rt| {
            rt.create_container(&sandbox, &config)
        })
        .await?;
    crate::telemetry::record_id("container_id", &id);
    tracing::info!(container_id = %id, sandbox_id = %req.pod_sandbox_id, "CreateContainer done");
    Ok(Response::new(cri::CreateContainerResponse {
        container_id: id,
    }))
}

pub(super) async fn start_container(
    svc: &CriService,
    req: Request<cri::StartContainerRequest>,
) -> Result<Response<cri::StartContainerResponse>, Status> {
    let id = req.into_inner().container_id;
    let i = id.clone();
    svc.blocking("StartContainer", &id, move |rt| rt.start_container(&i))
        .await?;
    Ok(Response::new(cri::StartContainerResponse {}))
}

pub(super) async fn stop_container(
    svc: &CriService,
    req: Request<cri::StopContainerRequest>,
) -> Result<Response<cri::StopContainerResponse>, Status> {
    let req = req.into_inner();
    let (i, t) = (req.container_id.clone(), req.timeout.max(0) as u64);
    svc.blocking("StopContainer", &req.container_id, move |rt| {
        rt.stop_container(&i, std::time::Duration::from_secs(t))
    })
    .await?;
    Ok(Response::new(cri::StopContainerResponse {}))
}

pub(super) async fn remove_container(
    svc: &CriService,
    req: Request<cri::RemoveContainerRequest>,
) -> Result<Response<cri::RemoveContainerResponse>, Status> {
    let id = req.into_inner().container_id;
    let i = id.clone();
    svc.blocking("RemoveContainer", &id, move |rt| rt.remove_container(&i))
        .await?;
    Ok(Response::new(cri::RemoveContainerResponse {}))
}

pub(super) async fn container_status(
    svc: &CriService,
    req: Request<cri::ContainerStatusRequest>,
) -> Result<Response<cri::ContainerStatusResponse>, Status> {
    let req = req.into_inner();
    let i = req.container_id.clone();
    let verbose = req.verbose;
    let (r, spec) = svc
        .blocking("ContainerStatus", &req.container_id, move |rt| {
            let r = rt.container_status(&i)?;
            let spec = if verbose {
                rt.container_runtime_spec(&r)
            } else {
                None
            };
            Ok((r, spec))
        })
        .await?;
    let info = container::verbose_info(verbose, &r, spec);
    Ok(Response::new(cri::ContainerStatusResponse {
        status: Some(container::status_to_cri(&r)),
        info,
    }))
}

pub(super) async fn update_container_resources(
    svc: &CriService,
    req: Request<cri::UpdateContainerResourcesRequest>,
) -> Result<Response<cri::UpdateContainerResourcesResponse>, Status> {
    let req = req.into_inner();
    let res = resources(&req.linux.unwrap_or_default());
    let i = req.container_id.clone();
    svc.blocking("UpdateContainerResources", &req.container_id, move |rt| {
        rt.update_container_resources(&i, &res)
    })
    .await?;
    Ok(Response::new(cri::UpdateContainerResourcesResponse {}))
}

pub(super) async fn reopen_container_log(
    svc: &CriService,
    req: Request<cri::ReopenContainerLogRequest>,
) -> Result<Response<cri::ReopenContainerLogResponse>, Status> {
    let id = req.into_inner().container_id;
    let i = id.clone();
    svc.blocking("ReopenContainerLog", &id, move |rt| {
        rt.reopen_container_log(&i)
    })
    .await?;
    Ok(Response::new(cri::ReopenContainerLogResponse {}))
}

pub(super) async fn exec_sync(
    svc: &CriService,
    req: Request<cri::ExecSyncRequest>,
) -> Result<Response<cri::ExecSyncResponse>, Status> {
    let req = req.into_inner();
    let (i, cmd, t) = (
        req.container_id.clone(),
        req.cmd,
        std::time::Duration::from_secs(req.timeout.max(0) as u64),
    );
    // Raised if this future is dropped (the client cancelled or its deadline passed):
    // the command is killed then, not left to run out its timeout for nobody.
    let cancel = crate::process::Cancel::new()
        .map_err(|e| Status::resource_exhausted(format!("ExecSync: eventfd: {e}")))?;
    let _on_drop = CancelOnDrop(cancel.clone());
    let r = svc
        .blocking("ExecSync", &req.container_id, move |rt| {
            rt.exec_sync_cancellable(&i, &cmd, t, cancel)
        })
        .await?;
    Ok(Response::new(cri::ExecSyncResponse {
        stdout: r.stdout,
        stderr: r.stderr,
        exit_code: r.exit_code,
    }))
}

pub(super) async fn checkpoint_container(
    svc: &CriService,
    req: Request<cri::CheckpointContainerRequest>,
) -> Result<Response<cri::CheckpointContainerResponse>, Status> {
    let req = req.into_inner();
    let location = std::path::PathBuf::from(&req.location);
    let id = req.container_id.clone();
    svc.blocking("CheckpointContainer", &req.container_id, move |rt| {
        rt.checkpoint_container(&id, &location)
    })
    .await?;
    Ok(Response::new(cri::CheckpointContainerResponse {}))
}

/// Raises its flag when dropped: an RPC future dropped before it finished had its caller go.
struct CancelOnDrop(std::sync::Arc<crate::process::Cancel>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}
