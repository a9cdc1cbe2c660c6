//! `RuntimeService`: the trait's methods forward to one module per concern, each converting
//! its request, running the core call (on the blocking pool when it makes process calls) and
//! converting the answer. A new RPC goes in the module of its concern.

mod containers;
mod events;
mod pods;
mod stats;
mod status;
mod streams;

use tonic::{Request, Response, Status};

use crate::api::v1 as cri;
use crate::api::v1::runtime_service_server::RuntimeService;
use crate::cri::{list_streams, CriService};

#[tonic::async_trait]
impl RuntimeService for CriService {
    async fn version(
        &self,
        _req: Request<cri::VersionRequest>,
    ) -> Result<Response<cri::VersionResponse>, Status> {
        status::version(self, _req).await
    }
    async fn run_pod_sandbox(
        &self,
        req: Request<cri::RunPodSandboxRequest>,
    ) -> Result<Response<cri::RunPodSandboxResponse>, Status> {
        pods::run_pod_sandbox(self, req).await
    }
    async fn stop_pod_sandbox(
        &self,
        req: Request<cri::StopPodSandboxRequest>,
    ) -> Result<Response<cri::StopPodSandboxResponse>, Status> {
        pods::stop_pod_sandbox(self, req).await
    }
    async fn remove_pod_sandbox(
        &self,
        req: Request<cri::RemovePodSandboxRequest>,
    ) -> Result<Response<cri::RemovePodSandboxResponse>, Status> {
        pods::remove_pod_sandbox(self, req).await
    }
    async fn pod_sandbox_status(
        &self,
        req: Request<cri::PodSandboxStatusRequest>,
    ) -> Result<Response<cri::PodSandboxStatusResponse>, Status> {
        pods::pod_sandbox_status(self, req).await
    }
    async fn list_pod_sandbox(
        &self,
        req: Request<cri::ListPodSandboxRequest>,
    ) -> Result<Response<cri::ListPodSandboxResponse>, Status> {
        pods::list_pod_sandbox(self, req).await
    }
    async fn list_containers(
        &self,
        req: Request<cri::ListContainersRequest>,
    ) -> Result<Response<cri::ListContainersResponse>, Status> {
        containers::list_containers(self, req).await
    }
    async fn list_container_stats(
        &self,
        req: Request<cri::ListContainerStatsRequest>,
    ) -> Result<Response<cri::ListContainerStatsResponse>, Status> {
        stats::list_container_stats(self, req).await
    }
    async fn list_pod_sandbox_stats(
        &self,
        req: Request<cri::ListPodSandboxStatsRequest>,
    ) -> Result<Response<cri::ListPodSandboxStatsResponse>, Status> {
        stats::list_pod_sandbox_stats(self, req).await
    }
    async fn update_runtime_config(
        &self,
        _req: Request<cri::UpdateRuntimeConfigRequest>,
    ) -> Result<Response<cri::UpdateRuntimeConfigResponse>, Status> {
        status::update_runtime_config(self, _req).await
    }
    async fn status(
        &self,
        req: Request<cri::StatusRequest>,
    ) -> Result<Response<cri::StatusResponse>, Status> {
        status::status(self, req).await
    }
    async fn runtime_config(
        &self,
        _req: Request<cri::RuntimeConfigRequest>,
    ) -> Result<Response<cri::RuntimeConfigResponse>, Status> {
        status::runtime_config(self, _req).await
    }

    type GetContainerEventsStream = std::pin::Pin<
        Box<dyn tokio_stream::Stream<Item = Result<cri::ContainerEventResponse, Status>> + Send>,
    >;
    async fn get_container_events(
        &self,
        _req: Request<cri::GetEventsRequest>,
    ) -> Result<Response<Self::GetContainerEventsStream>, Status> {
        events::get_container_events(self, _req).await
    }
    async fn create_container(
        &self,
        req: Request<cri::CreateContainerRequest>,
    ) -> Result<Response<cri::CreateContainerResponse>, Status> {
        containers::create_container(self, req).await
    }
    async fn start_container(
        &self,
        req: Request<cri::StartContainerRequest>,
    ) -> Result<Response<cri::StartContainerResponse>, Status> {
        containers::start_container(self, req).await
    }
    async fn stop_container(
        &self,
        req: Request<cri::StopContainerRequest>,
    ) -> Result<Response<cri::StopContainerResponse>, Status> {
        containers::stop_container(self, req).await
    }
    async fn remove_container(
        &self,
        req: Request<cri::RemoveContainerRequest>,
    ) -> Result<Response<cri::RemoveContainerResponse>, Status> {
        containers::remove_container(self, req).await
    }
    async fn container_status(
        &self,
        req: Request<cri::ContainerStatusRequest>,
    ) -> Result<Response<cri::ContainerStatusResponse>, Status> {
        containers::container_status(self, req).await
    }
    async fn update_container_resources(
        &self,
        req: Request<cri::UpdateContainerResourcesRequest>,
    ) -> Result<Response<cri::UpdateContainerResourcesResponse>, Status> {
        containers::update_container_resources(self, req).await
    }
    async fn reopen_container_log(
        &self,
        req: Request<cri::ReopenContainerLogRequest>,
    ) -> Result<Response<cri::ReopenContainerLogResponse>, Status> {
        containers::reopen_container_log(self, req).await
    }
    async fn exec_sync(
        &self,
        req: Request<cri::ExecSyncRequest>,
    ) -> Result<Response<cri::ExecSyncResponse>, Status> {
        containers::exec_sync(self, req).await
    }
    async fn exec(
        &self,
        req: Request<cri::ExecRequest>,
    ) -> Result<Response<cri::ExecResponse>, Status> {
        streams::exec(self, req).await
    }
    async fn attach(
        &self,
        req: Request<cri::AttachRequest>,
    ) -> Result<Response<cri::AttachResponse>, Status> {
        streams::attach(self, req).await
    }
    async fn port_forward(
        &self,
        req: Request<cri::PortForwardRequest>,
    ) -> Result<Response<cri::PortForwardResponse>, Status> {
        streams::port_forward(self, req).await
    }
    async fn container_stats(
        &self,
        req: Request<cri::ContainerStatsRequest>,
    ) -> Result<Response<cri::ContainerStatsResponse>, Status> {
        stats::container_stats(self, req).await
    }
    async fn pod_sandbox_stats(
        &self,
        req: Request<cri::PodSandboxStatsRequest>,
    ) -> Result<Response<cri::PodSandboxStatsResponse>, Status> {
        stats::pod_sandbox_stats(self, req).await
    }
    async fn checkpoint_container(
        &self,
        req: Request<cri::CheckpointContainerRequest>,
    ) -> Result<Response<cri::CheckpointContainerResponse>, Status> {
        containers::checkpoint_container(self, req).await
    }
    async fn list_metric_descriptors(
        &self,
        _req: Request<cri::ListMetricDescriptorsRequest>,
    ) -> Result<Response<cri::ListMetricDescriptorsResponse>, Status> {
        stats::list_metric_descriptors(self, _req).await
    }
    async fn list_pod_sandbox_metrics(
        &self,
        _req: Request<cri::ListPodSandboxMetricsRequest>,
    ) -> Result<Response<cri::ListPodSandboxMetricsResponse>, Status> {
        stats::list_pod_sandbox_metrics(self, _req).await
    }

    type StreamPodSandboxesStream = list_streams::Chunks<cri::StreamPodSandboxesResponse>;

    async fn stream_pod_sandboxes(
        &self,
        req: Request<cri::StreamPodSandboxesRequest>,
    ) -> Result<Response<Self::StreamPodSandboxesStream>, Status> {
        self.stream_pods(req.into_inner().filter).await
    }

    type StreamContainersStream = list_streams::Chunks<cri::StreamContainersResponse>;

    async fn stream_containers(
        &self,
        req: Request<cri::StreamContainersRequest>,
    ) -> Result<Response<Self::StreamContainersStream>, Status> {
        self.stream_containers_of(req.into_inner().filter).await
    }

    type StreamContainerStatsStream = list_streams::Chunks<cri::StreamContainerStatsResponse>;

    async fn stream_container_stats(
        &self,
        req: Request<cri::StreamContainerStatsRequest>,
    ) -> Result<Response<Self::StreamContainerStatsStream>, Status> {
        self.stream_container_stats_of(req.into_inner().filter)
            .await
    }

    type StreamPodSandboxStatsStream = list_streams::Chunks<cri::StreamPodSandboxStatsResponse>;

    async fn stream_pod_sandbox_stats(
        &self,
        req: Request<cri::StreamPodSandboxStatsRequest>,
    ) -> Result<Response<Self::StreamPodSandboxStatsStream>, Status> {
        self.stream_pod_stats_of(req.into_inner().filter).await
    }

    type StreamPodSandboxMetricsStream = list_streams::Chunks<cri::StreamPodSandboxMetricsResponse>;

    async fn stream_pod_sandbox_metrics(
        &self,
        _: Request<cri::StreamPodSandboxMetricsRequest>,
    ) -> Result<Response<Self::StreamPodSandboxMetricsStream>, Status> {
        self.stream_pod_metrics().await
    }
    async fn update_pod_sandbox_resources(
        &self,
        req: Request<cri::UpdatePodSandboxResourcesRequest>,
    ) -> Result<Response<cri::UpdatePodSandboxResourcesResponse>, Status> {
        pods::update_pod_sandbox_resources(self, req).await
    }
}
