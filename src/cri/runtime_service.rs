//! `RuntimeService`: each RPC converts its request, runs the core call (on the blocking pool
//! when it makes process calls) and converts the answer.

use crate::api::v1 as cri;
use crate::api::v1::runtime_service_server::RuntimeService;
use tonic::{Request, Response, Status};

use super::*;

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
        let config = pod::pod_config(req.get_ref()).map_err(|e| codes::status_of(&e))?;
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
            .map_err(|e| codes::status_of(&e))?;
        // A quarantined sandbox has no readable record: its status says what is known.
        let record = match req.verbose {
            true => self.rt.sandbox_record(&status.id).ok(),
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

    async fn list_pod_sandbox(
        &self,
        req: Request<cri::ListPodSandboxRequest>,
    ) -> Result<Response<cri::ListPodSandboxResponse>, Status> {
        let filter =
            pod::filter(req.get_ref().filter.as_ref()).map_err(|e| codes::status_of(&e))?;
        let items = match filter {
            Some(f) => self
                .rt
                .list_pod_sandboxes(&f)
                .iter()
                .map(pod::sandbox_to_cri)
                .collect(),
            None => Vec::new(),
        };
        Ok(Response::new(cri::ListPodSandboxResponse { items }))
    }

    async fn list_containers(
        &self,
        req: Request<cri::ListContainersRequest>,
    ) -> Result<Response<cri::ListContainersResponse>, Status> {
        let filter = container::container_filter(req.get_ref().filter.as_ref())
            .map_err(|e| codes::status_of(&e))?;
        let containers = match filter {
            Some(f) => self
                .blocking("ListContainers", "", move |rt| Ok(rt.list_containers(&f)))
                .await?
                .iter()
                .map(container::container_to_cri)
                .collect(),
            None => Vec::new(),
        };
        Ok(Response::new(cri::ListContainersResponse { containers }))
    }

    async fn list_container_stats(
        &self,
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
        let stats = self
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

    async fn list_pod_sandbox_stats(
        &self,
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
                self.blocking("ListPodSandboxStats", "", move |rt| {
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
        let health = self.call("Status", "", |rt| Ok(rt.health())).await?;
        let mut resp = health::status_to_cri(health, self.rt.config(), verbose);
        if verbose {
            // The CDI devices containers can ask for, and the spec files not used (why).
            let (devices, errors) = self.call("Status", "", |rt| Ok(rt.cdi_devices())).await?;
            resp.info.insert(
                "cdi".to_string(),
                serde_json::json!({"devices": devices, "brokenSpecFiles": errors}).to_string(),
            );
            // The NRI plugins connected, in call order.
            let nri = &self.rt.config().nri;
            resp.info.insert(
                "nri".to_string(),
                serde_json::json!({
                    "enabled": nri.enable,
                    "socket": (nri.enable && !nri.disable_connections).then_some(&nri.socket_path),
                    "plugins": self.rt.nri_plugins(),
                })
                .to_string(),
            );
        }
        Ok(Response::new(resp))
    }

    async fn runtime_config(
        &self,
        _: Request<cri::RuntimeConfigRequest>,
    ) -> Result<Response<cri::RuntimeConfigResponse>, Status> {
        Ok(Response::new(cri::RuntimeConfigResponse {
            linux: Some(cri::LinuxRuntimeConfiguration {
                cgroup_driver: match self.rt.cgroup_driver() {
                    crate::cgroups::Driver::Systemd => cri::CgroupDriver::Systemd,
                    crate::cgroups::Driver::Cgroupfs => cri::CgroupDriver::Cgroupfs,
                } as i32,
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
        let sub = self
            .rt
            .subscribe_events()
            .map_err(|e| codes::status_of(&e))?;
        tracing::debug!("event subscriber connected");
        // One event in flight to the connection; the backlog is the hub's, bounded.
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    n = sub.next() => n,
                    _ = tx.closed() => break,
                };
                let item = match next {
                    Ok(ev) => Ok(events::event_to_cri(&ev)),
                    Err(crate::events::Ended::FellBehind { backlog }) => Err(Status::resource_exhausted(format!(
                        "this event subscriber fell {backlog} events behind and was disconnected; relist and subscribe again"
                    ))),
                    Err(crate::events::Ended::FellBehindBytes { bytes }) => Err(Status::resource_exhausted(format!(
                        "this event subscriber fell {bytes} bytes of events behind and was disconnected; relist and subscribe again"
                    ))),
                    Err(crate::events::Ended::Closed) => break,
                };
                let last = item.is_err();
                if tx.send(item).await.is_err() || last {
                    break;
                }
            }
            tracing::debug!("event subscriber gone");
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn create_container(
        &self,
        req: Request<cri::CreateContainerRequest>,
    ) -> Result<Response<cri::CreateContainerResponse>, Status> {
        let req = req.into_inner();
        let config = req
            .config
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("CreateContainer: config is required"))?;
        let config = container::container_config(config).map_err(|e| codes::status_of(&e))?;
        let sandbox = req.pod_sandbox_id.clone();
        let id = self
            .call("CreateContainer", &req.pod_sandbox_id, move |rt| {
                rt.create_container(&sandbox, &config)
            })
            .await?;
        tracing::info!(container_id = %id, sandbox_id = %req.pod_sandbox_id, "CreateContainer done");
        Ok(Response::new(cri::CreateContainerResponse {
            container_id: id,
        }))
    }

    async fn start_container(
        &self,
        req: Request<cri::StartContainerRequest>,
    ) -> Result<Response<cri::StartContainerResponse>, Status> {
        let id = req.into_inner().container_id;
        let i = id.clone();
        self.blocking("StartContainer", &id, move |rt| rt.start_container(&i))
            .await?;
        Ok(Response::new(cri::StartContainerResponse {}))
    }

    async fn stop_container(
        &self,
        req: Request<cri::StopContainerRequest>,
    ) -> Result<Response<cri::StopContainerResponse>, Status> {
        let req = req.into_inner();
        let (i, t) = (req.container_id.clone(), req.timeout.max(0) as u64);
        self.blocking("StopContainer", &req.container_id, move |rt| {
            rt.stop_container(&i, std::time::Duration::from_secs(t))
        })
        .await?;
        Ok(Response::new(cri::StopContainerResponse {}))
    }

    async fn remove_container(
        &self,
        req: Request<cri::RemoveContainerRequest>,
    ) -> Result<Response<cri::RemoveContainerResponse>, Status> {
        let id = req.into_inner().container_id;
        let i = id.clone();
        self.blocking("RemoveContainer", &id, move |rt| rt.remove_container(&i))
            .await?;
        Ok(Response::new(cri::RemoveContainerResponse {}))
    }

    async fn container_status(
        &self,
        req: Request<cri::ContainerStatusRequest>,
    ) -> Result<Response<cri::ContainerStatusResponse>, Status> {
        let req = req.into_inner();
        let i = req.container_id.clone();
        let r = self
            .blocking("ContainerStatus", &req.container_id, move |rt| {
                rt.container_status(&i)
            })
            .await?;
        let info = verbose_info(req.verbose, Some(&r));
        Ok(Response::new(cri::ContainerStatusResponse {
            status: Some(container::status_to_cri(&r)),
            info,
        }))
    }

    async fn update_container_resources(
        &self,
        req: Request<cri::UpdateContainerResourcesRequest>,
    ) -> Result<Response<cri::UpdateContainerResourcesResponse>, Status> {
        let req = req.into_inner();
        let res = super::resources(&req.linux.unwrap_or_default());
        let i = req.container_id.clone();
        self.blocking("UpdateContainerResources", &req.container_id, move |rt| {
            rt.update_container_resources(&i, &res)
        })
        .await?;
        Ok(Response::new(cri::UpdateContainerResourcesResponse {}))
    }

    async fn reopen_container_log(
        &self,
        req: Request<cri::ReopenContainerLogRequest>,
    ) -> Result<Response<cri::ReopenContainerLogResponse>, Status> {
        let id = req.into_inner().container_id;
        let i = id.clone();
        self.blocking("ReopenContainerLog", &id, move |rt| {
            rt.reopen_container_log(&i)
        })
        .await?;
        Ok(Response::new(cri::ReopenContainerLogResponse {}))
    }

    async fn exec_sync(
        &self,
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
        let r = self
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

    async fn exec(
        &self,
        req: Request<cri::ExecRequest>,
    ) -> Result<Response<cri::ExecResponse>, Status> {
        let r = req.into_inner();
        let id = r.container_id.clone();
        let url = self
            .stream_url(
                "Exec",
                &id,
                crate::streaming::Target::Exec {
                    container_id: r.container_id,
                    cmd: r.cmd,
                    tty: r.tty,
                    stdin: r.stdin,
                    stdout: r.stdout,
                    stderr: r.stderr,
                },
            )
            .await?;
        Ok(Response::new(cri::ExecResponse { url }))
    }

    async fn attach(
        &self,
        req: Request<cri::AttachRequest>,
    ) -> Result<Response<cri::AttachResponse>, Status> {
        let r = req.into_inner();
        let id = r.container_id.clone();
        let url = self
            .stream_url(
                "Attach",
                &id,
                crate::streaming::Target::Attach {
                    container_id: r.container_id,
                    tty: r.tty,
                    stdin: r.stdin,
                    stdout: r.stdout,
                    stderr: r.stderr,
                },
            )
            .await?;
        Ok(Response::new(cri::AttachResponse { url }))
    }

    async fn port_forward(
        &self,
        req: Request<cri::PortForwardRequest>,
    ) -> Result<Response<cri::PortForwardResponse>, Status> {
        let r = req.into_inner();
        let id = r.pod_sandbox_id.clone();
        let mut ports = Vec::new();
        for p in &r.port {
            ports.push(
                u16::try_from(*p).ok().filter(|p| *p > 0).ok_or_else(|| {
                    Status::invalid_argument(format!("port {p} is not a TCP port"))
                })?,
            );
        }
        let url = self
            .stream_url(
                "PortForward",
                &id,
                crate::streaming::Target::PortForward {
                    sandbox_id: r.pod_sandbox_id,
                    ports,
                },
            )
            .await?;
        Ok(Response::new(cri::PortForwardResponse { url }))
    }

    async fn container_stats(
        &self,
        req: Request<cri::ContainerStatsRequest>,
    ) -> Result<Response<cri::ContainerStatsResponse>, Status> {
        let id = req.into_inner().container_id;
        let i = id.clone();
        let stats = self
            .blocking("ContainerStats", &id, move |rt| {
                let c = rt.container_usage_detail(&i)?;
                Ok(container::stats_of(&c, crate::state::now_nanos()))
            })
            .await?;
        Ok(Response::new(cri::ContainerStatsResponse {
            stats: Some(stats),
        }))
    }

    async fn pod_sandbox_stats(
        &self,
        req: Request<cri::PodSandboxStatsRequest>,
    ) -> Result<Response<cri::PodSandboxStatsResponse>, Status> {
        let id = req.into_inner().pod_sandbox_id;
        let i = id.clone();
        let stats = self
            .call("PodSandboxStats", &id, move |rt| {
                Ok(stats::pod_stats(&rt.pod_usage_detail(&i)?))
            })
            .await?;
        Ok(Response::new(cri::PodSandboxStatsResponse {
            stats: Some(stats),
        }))
    }

    async fn checkpoint_container(
        &self,
        req: Request<cri::CheckpointContainerRequest>,
    ) -> Result<Response<cri::CheckpointContainerResponse>, Status> {
        let req = req.into_inner();
        let location = std::path::PathBuf::from(&req.location);
        let id = req.container_id.clone();
        self.blocking("CheckpointContainer", &req.container_id, move |rt| {
            rt.checkpoint_container(&id, &location)
        })
        .await?;
        Ok(Response::new(cri::CheckpointContainerResponse {}))
    }

    async fn list_metric_descriptors(
        &self,
        _: Request<cri::ListMetricDescriptorsRequest>,
    ) -> Result<Response<cri::ListMetricDescriptorsResponse>, Status> {
        Ok(Response::new(cri::ListMetricDescriptorsResponse {
            descriptors: metrics::descriptors(),
        }))
    }

    async fn list_pod_sandbox_metrics(
        &self,
        _: Request<cri::ListPodSandboxMetricsRequest>,
    ) -> Result<Response<cri::ListPodSandboxMetricsResponse>, Status> {
        let pod_metrics = self
            .blocking("ListPodSandboxMetrics", "", |rt| {
                let ready = crate::SandboxFilter {
                    state: Some(crate::SandboxState::Ready),
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
        let req = req.into_inner();
        let overhead = req.overhead.as_ref().map(super::resources);
        let resources = req.resources.as_ref().map(super::resources);
        let id = req.pod_sandbox_id;
        let i = id.clone();
        self.call("UpdatePodSandboxResources", &id, move |rt| {
            rt.update_pod_sandbox_resources(&i, overhead, resources)
        })
        .await?;
        Ok(Response::new(cri::UpdatePodSandboxResourcesResponse {}))
    }
}

/// Raises its flag when dropped: an RPC future dropped before it finished had its caller go.
struct CancelOnDrop(std::sync::Arc<crate::process::Cancel>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}
