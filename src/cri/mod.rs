//! The CRI v1 gRPC services: `RuntimeService` and `ImageService`. They translate between CRI
//! messages and the core [`Runtime`](crate::Runtime) (whose calls block on process calls, so
//! they run on tokio's blocking pool) and nothing more. Container and image RPCs answer
//! `Unimplemented` until the container layer exists: never a fake success.

pub mod client;
pub mod convert;

use std::sync::Arc;

use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_server::ImageService;
use k8s_cri::v1::runtime_service_server::RuntimeService;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::Runtime;

const CONTAINERS: &str =
    "containers are not supported by this sandboxd version yet (sandboxes only)";
const IMAGES: &str =
    "images are not supported by this sandboxd version yet (the infra process needs no image)";

fn not_yet(rpc: &str, why: &str) -> Status {
    Status::unimplemented(format!("{rpc}: {why}"))
}

/// Both CRI services over one core runtime.
#[derive(Clone)]
pub struct CriService {
    rt: Arc<Runtime>,
}

impl CriService {
    pub fn new(rt: Arc<Runtime>) -> Self {
        CriService { rt }
    }

    /// Runs a blocking core call on the blocking pool, inside a span naming the sandbox.
    async fn call<T, F>(&self, rpc: &'static str, sandbox_id: &str, f: F) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce(&Runtime) -> crate::Result<T> + Send + 'static,
    {
        let span = tracing::info_span!("cri", rpc, sandbox_id = %sandbox_id);
        let rt = self.rt.clone();
        let r = tokio::task::spawn_blocking(move || f(&rt))
            .instrument(span.clone())
            .await
            .map_err(|e| Status::internal(format!("{rpc}: worker failed: {e}")))?;
        r.map_err(|e| {
            let _g = span.enter();
            tracing::warn!(error = %e, "{rpc} failed");
            convert::status_of(&e)
        })
    }
}

#[tonic::async_trait]
impl RuntimeService for CriService {
    async fn version(
        &self,
        _: Request<cri::VersionRequest>,
    ) -> Result<Response<cri::VersionResponse>, Status> {
        Ok(Response::new(cri::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "sandboxd".into(),
            runtime_version: env!("CARGO_PKG_VERSION").into(),
            runtime_api_version: "v1".into(),
        }))
    }

    async fn run_pod_sandbox(
        &self,
        req: Request<cri::RunPodSandboxRequest>,
    ) -> Result<Response<cri::RunPodSandboxResponse>, Status> {
        let config = convert::pod_config(req.get_ref()).map_err(|e| convert::status_of(&e))?;
        let name = config.reserved_name();
        let id = self
            .call("RunPodSandbox", &name, move |rt| {
                rt.run_pod_sandbox(&config)
            })
            .await?;
        tracing::info!(sandbox_id = %id, name = %name, "RunPodSandbox done");
        Ok(Response::new(cri::RunPodSandboxResponse {
            pod_sandbox_id: id,
        }))
    }

    async fn stop_pod_sandbox(
        &self,
        req: Request<cri::StopPodSandboxRequest>,
    ) -> Result<Response<cri::StopPodSandboxResponse>, Status> {
        let id = req.into_inner().pod_sandbox_id;
        let i = id.clone();
        self.call("StopPodSandbox", &id, move |rt| rt.stop_pod_sandbox(&i))
            .await?;
        Ok(Response::new(cri::StopPodSandboxResponse {}))
    }

    async fn remove_pod_sandbox(
        &self,
        req: Request<cri::RemovePodSandboxRequest>,
    ) -> Result<Response<cri::RemovePodSandboxResponse>, Status> {
        let id = req.into_inner().pod_sandbox_id;
        let i = id.clone();
        self.call("RemovePodSandbox", &id, move |rt| rt.remove_pod_sandbox(&i))
            .await?;
        Ok(Response::new(cri::RemovePodSandboxResponse {}))
    }

    async fn pod_sandbox_status(
        &self,
        req: Request<cri::PodSandboxStatusRequest>,
    ) -> Result<Response<cri::PodSandboxStatusResponse>, Status> {
        // Status reads memory only (no process call): answered inline, no thread hop.
        let req = req.into_inner();
        let span =
            tracing::debug_span!("cri", rpc = "PodSandboxStatus", sandbox_id = %req.pod_sandbox_id);
        let _g = span.enter();
        let status = self
            .rt
            .pod_sandbox_status(&req.pod_sandbox_id)
            .map_err(|e| convert::status_of(&e))?;
        let mut info = std::collections::HashMap::new();
        if req.verbose {
            let r = self
                .rt
                .sandbox_record(&status.id)
                .map_err(|e| convert::status_of(&e))?;
            info.insert(
                "info".to_string(),
                serde_json::to_string(&r).unwrap_or_default(),
            );
        }
        Ok(Response::new(cri::PodSandboxStatusResponse {
            status: Some(convert::status_to_cri(&status)),
            info,
            containers_statuses: Vec::new(),
            timestamp: crate::sandbox::now_nanos(),
        }))
    }

    async fn list_pod_sandbox(
        &self,
        req: Request<cri::ListPodSandboxRequest>,
    ) -> Result<Response<cri::ListPodSandboxResponse>, Status> {
        let filter =
            convert::filter(req.get_ref().filter.as_ref()).map_err(|e| convert::status_of(&e))?;
        let items = match filter {
            Some(f) => self
                .rt
                .list_pod_sandboxes(&f)
                .iter()
                .map(convert::sandbox_to_cri)
                .collect(),
            None => Vec::new(),
        };
        Ok(Response::new(cri::ListPodSandboxResponse { items }))
    }

    async fn list_containers(
        &self,
        _: Request<cri::ListContainersRequest>,
    ) -> Result<Response<cri::ListContainersResponse>, Status> {
        // No container can exist yet: an empty list is the truth, and kubelet lists often.
        Ok(Response::new(cri::ListContainersResponse {
            containers: Vec::new(),
        }))
    }

    async fn list_container_stats(
        &self,
        _: Request<cri::ListContainerStatsRequest>,
    ) -> Result<Response<cri::ListContainerStatsResponse>, Status> {
        Ok(Response::new(cri::ListContainerStatsResponse {
            stats: Vec::new(),
        }))
    }

    async fn list_pod_sandbox_stats(
        &self,
        _: Request<cri::ListPodSandboxStatsRequest>,
    ) -> Result<Response<cri::ListPodSandboxStatsResponse>, Status> {
        Err(not_yet(
            "list_pod_sandbox_stats",
            "pod stats arrive with the container layer",
        ))
    }

    async fn update_runtime_config(
        &self,
        _: Request<cri::UpdateRuntimeConfigRequest>,
    ) -> Result<Response<cri::UpdateRuntimeConfigResponse>, Status> {
        // The pod CIDR comes from the CNI config; nothing else is runtime-tunable.
        Ok(Response::new(cri::UpdateRuntimeConfigResponse {}))
    }

    async fn status(
        &self,
        req: Request<cri::StatusRequest>,
    ) -> Result<Response<cri::StatusResponse>, Status> {
        let verbose = req.get_ref().verbose;
        let (network, handlers, cfg) = self
            .call("Status", "", |rt| {
                let net = rt.network().map_err(|e| e.to_string()).and_then(|l| {
                    rt.cni.check_plugins(&l).map_err(|e| e.to_string())?;
                    Ok(l)
                });
                let handlers: Vec<String> = rt.cfg.runtimes.keys().cloned().collect();
                Ok((net, handlers, rt.cfg.clone()))
            })
            .await?;
        let mut conditions = vec![cri::RuntimeCondition {
            r#type: "RuntimeReady".into(),
            status: true,
            reason: String::new(),
            message: String::new(),
        }];
        let mut info = std::collections::HashMap::new();
        match &network {
            Ok(list) => {
                conditions.push(cri::RuntimeCondition {
                    r#type: "NetworkReady".into(),
                    status: true,
                    reason: String::new(),
                    message: String::new(),
                });
                if verbose {
                    info.insert(
                        "network".to_string(),
                        serde_json::to_string(list).unwrap_or_default(),
                    );
                }
            }
            Err(e) => conditions.push(cri::RuntimeCondition {
                r#type: "NetworkReady".into(),
                status: false,
                reason: "NetworkPluginNotReady".into(),
                message: e.clone(),
            }),
        }
        if verbose {
            info.insert(
                "config".to_string(),
                serde_json::to_string(&cfg).unwrap_or_default(),
            );
        }
        Ok(Response::new(cri::StatusResponse {
            status: Some(cri::RuntimeStatus { conditions }),
            info,
            runtime_handlers: handlers
                .into_iter()
                .map(|name| cri::RuntimeHandler {
                    name,
                    features: None,
                })
                .collect(),
            features: None,
        }))
    }

    async fn runtime_config(
        &self,
        _: Request<cri::RuntimeConfigRequest>,
    ) -> Result<Response<cri::RuntimeConfigResponse>, Status> {
        Ok(Response::new(cri::RuntimeConfigResponse {
            linux: Some(cri::LinuxRuntimeConfiguration {
                cgroup_driver: cri::CgroupDriver::Cgroupfs as i32,
            }),
        }))
    }

    type GetContainerEventsStream = std::pin::Pin<
        Box<dyn tokio_stream::Stream<Item = Result<cri::ContainerEventResponse, Status>> + Send>,
    >;

    async fn get_container_events(
        &self,
        _: Request<cri::GetEventsRequest>,
    ) -> Result<Response<Self::GetContainerEventsStream>, Status> {
        Err(not_yet("get_container_events", CONTAINERS))
    }

    async fn create_container(
        &self,
        _: Request<cri::CreateContainerRequest>,
    ) -> Result<Response<cri::CreateContainerResponse>, Status> {
        Err(not_yet("create_container", CONTAINERS))
    }

    async fn start_container(
        &self,
        _: Request<cri::StartContainerRequest>,
    ) -> Result<Response<cri::StartContainerResponse>, Status> {
        Err(not_yet("start_container", CONTAINERS))
    }

    async fn stop_container(
        &self,
        _: Request<cri::StopContainerRequest>,
    ) -> Result<Response<cri::StopContainerResponse>, Status> {
        Err(not_yet("stop_container", CONTAINERS))
    }

    async fn remove_container(
        &self,
        _: Request<cri::RemoveContainerRequest>,
    ) -> Result<Response<cri::RemoveContainerResponse>, Status> {
        Err(not_yet("remove_container", CONTAINERS))
    }

    async fn container_status(
        &self,
        _: Request<cri::ContainerStatusRequest>,
    ) -> Result<Response<cri::ContainerStatusResponse>, Status> {
        Err(not_yet("container_status", CONTAINERS))
    }

    async fn update_container_resources(
        &self,
        _: Request<cri::UpdateContainerResourcesRequest>,
    ) -> Result<Response<cri::UpdateContainerResourcesResponse>, Status> {
        Err(not_yet("update_container_resources", CONTAINERS))
    }

    async fn reopen_container_log(
        &self,
        _: Request<cri::ReopenContainerLogRequest>,
    ) -> Result<Response<cri::ReopenContainerLogResponse>, Status> {
        Err(not_yet("reopen_container_log", CONTAINERS))
    }

    async fn exec_sync(
        &self,
        _: Request<cri::ExecSyncRequest>,
    ) -> Result<Response<cri::ExecSyncResponse>, Status> {
        Err(not_yet("exec_sync", CONTAINERS))
    }

    async fn exec(
        &self,
        _: Request<cri::ExecRequest>,
    ) -> Result<Response<cri::ExecResponse>, Status> {
        Err(not_yet("exec", CONTAINERS))
    }

    async fn attach(
        &self,
        _: Request<cri::AttachRequest>,
    ) -> Result<Response<cri::AttachResponse>, Status> {
        Err(not_yet("attach", CONTAINERS))
    }

    async fn port_forward(
        &self,
        _: Request<cri::PortForwardRequest>,
    ) -> Result<Response<cri::PortForwardResponse>, Status> {
        Err(not_yet("port_forward", CONTAINERS))
    }

    async fn container_stats(
        &self,
        _: Request<cri::ContainerStatsRequest>,
    ) -> Result<Response<cri::ContainerStatsResponse>, Status> {
        Err(not_yet("container_stats", CONTAINERS))
    }

    async fn pod_sandbox_stats(
        &self,
        _: Request<cri::PodSandboxStatsRequest>,
    ) -> Result<Response<cri::PodSandboxStatsResponse>, Status> {
        Err(not_yet("pod_sandbox_stats", CONTAINERS))
    }

    async fn checkpoint_container(
        &self,
        _: Request<cri::CheckpointContainerRequest>,
    ) -> Result<Response<cri::CheckpointContainerResponse>, Status> {
        Err(not_yet("checkpoint_container", CONTAINERS))
    }

    async fn list_metric_descriptors(
        &self,
        _: Request<cri::ListMetricDescriptorsRequest>,
    ) -> Result<Response<cri::ListMetricDescriptorsResponse>, Status> {
        Err(not_yet("list_metric_descriptors", CONTAINERS))
    }

    async fn list_pod_sandbox_metrics(
        &self,
        _: Request<cri::ListPodSandboxMetricsRequest>,
    ) -> Result<Response<cri::ListPodSandboxMetricsResponse>, Status> {
        Err(not_yet("list_pod_sandbox_metrics", CONTAINERS))
    }
}

#[tonic::async_trait]
impl ImageService for CriService {
    async fn list_images(
        &self,
        _: Request<cri::ListImagesRequest>,
    ) -> Result<Response<cri::ListImagesResponse>, Status> {
        Err(not_yet("list_images", IMAGES))
    }

    async fn image_status(
        &self,
        _: Request<cri::ImageStatusRequest>,
    ) -> Result<Response<cri::ImageStatusResponse>, Status> {
        Err(not_yet("image_status", IMAGES))
    }

    async fn pull_image(
        &self,
        _: Request<cri::PullImageRequest>,
    ) -> Result<Response<cri::PullImageResponse>, Status> {
        Err(not_yet("pull_image", IMAGES))
    }

    async fn remove_image(
        &self,
        _: Request<cri::RemoveImageRequest>,
    ) -> Result<Response<cri::RemoveImageResponse>, Status> {
        Err(not_yet("remove_image", IMAGES))
    }

    async fn image_fs_info(
        &self,
        _: Request<cri::ImageFsInfoRequest>,
    ) -> Result<Response<cri::ImageFsInfoResponse>, Status> {
        Err(not_yet("image_fs_info", IMAGES))
    }
}
