//! The CRI v1 gRPC services: `RuntimeService` and `ImageService`. They translate between CRI
//! messages and the core [`Runtime`](crate::Runtime) (whose calls block on process calls, so
//! they run on tokio's blocking pool) and nothing more. RPCs whose feature does not exist
//! (container events, checkpoint, CRI metrics) answer `Unimplemented` with a message saying
//! so: never a fake success.

pub mod client;
pub mod convert;
pub mod convert_ctr;

use std::sync::Arc;

use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_server::ImageService;
use k8s_cri::v1::runtime_service_server::RuntimeService;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::Runtime;

fn not_yet(rpc: &str, why: &str) -> Status {
    Status::unimplemented(format!("{rpc}: {why}"))
}

/// One pod's stats: its cgroup (which holds every container's) and its running containers.
fn pod_stats(
    rt: &Runtime,
    r: &crate::SandboxRecord,
    running: &[&crate::ContainerRecord],
    now: i64,
) -> cri::PodSandboxStats {
    let (cpu, memory) =
        convert_ctr::usage_to_cri(&crate::cgroups::usage(&r.pod_cgroup(rt.config())), now);
    let containers = running
        .iter()
        .filter(|c| c.sandbox_id == r.id)
        .map(|c| convert_ctr::stats_to_cri(c, &crate::cgroups::usage(&c.cgroup), now))
        .collect();
    cri::PodSandboxStats {
        attributes: Some(cri::PodSandboxAttributes {
            id: r.id.clone(),
            metadata: Some(convert::metadata_to_cri(&r.config.metadata)),
            labels: convert::unsorted(&r.config.labels),
            annotations: convert::unsorted(&r.config.annotations),
        }),
        linux: Some(cri::LinuxPodSandboxStats {
            cpu: Some(cpu),
            memory: Some(memory),
            network: None,
            process: None,
            containers,
        }),
        windows: None,
    }
}

/// Stats of the ready pods `filter` matches, with one pass over the running containers.
fn pods_stats(rt: &Runtime, filter: &crate::SandboxFilter) -> Vec<cri::PodSandboxStats> {
    let now = crate::sandbox::now_nanos();
    let running = rt.list_containers(&crate::ContainerFilter {
        state: Some(crate::ContainerState::Running),
        ..Default::default()
    });
    let running: Vec<&crate::ContainerRecord> = running.iter().collect();
    rt.list_pod_sandboxes(filter)
        .iter()
        .filter_map(|s| rt.sandbox_record(&s.id).ok())
        .map(|r| pod_stats(rt, &r, &running, now))
        .collect()
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
        F: FnOnce(&Runtime) -> crate::Result<T> + Send + 'static,
    {
        let span = tracing::info_span!("cri", rpc, sandbox_id = %sandbox_id);
        self.in_span(rpc, span, f).await
    }

    /// [`call`](Self::call) for container and image RPCs: the span names the object.
    async fn blocking<T, F>(&self, rpc: &'static str, id: &str, f: F) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce(&Runtime) -> crate::Result<T> + Send + 'static,
    {
        let span = tracing::info_span!("cri", rpc, container_id = %id);
        self.in_span(rpc, span, f).await
    }

    async fn in_span<T, F>(&self, rpc: &'static str, span: tracing::Span, f: F) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce(&Runtime) -> crate::Result<T> + Send + 'static,
    {
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
        let record = match req.verbose {
            true => Some(
                self.rt
                    .sandbox_record(&status.id)
                    .map_err(|e| convert::status_of(&e))?,
            ),
            false => None,
        };
        let info = verbose_info(req.verbose, record.as_ref());
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
        req: Request<cri::ListContainersRequest>,
    ) -> Result<Response<cri::ListContainersResponse>, Status> {
        let filter = convert_ctr::container_filter(req.get_ref().filter.as_ref())
            .map_err(|e| convert::status_of(&e))?;
        let containers = match filter {
            Some(f) => self
                .blocking("ListContainers", "", move |rt| Ok(rt.list_containers(&f)))
                .await?
                .iter()
                .map(convert_ctr::container_to_cri)
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
        let filter = convert_ctr::container_filter(Some(&cri::ContainerFilter {
            id: f.id,
            pod_sandbox_id: f.pod_sandbox_id,
            label_selector: f.label_selector,
            state: Some(cri::ContainerStateValue {
                state: cri::ContainerState::ContainerRunning as i32,
            }),
        }))
        .map_err(|e| convert::status_of(&e))?;
        let Some(filter) = filter else {
            return Ok(Response::new(cri::ListContainerStatsResponse {
                stats: Vec::new(),
            }));
        };
        let stats = self
            .blocking("ListContainerStats", "", move |rt| {
                let now = crate::sandbox::now_nanos();
                Ok(rt
                    .list_containers(&filter)
                    .iter()
                    .map(|r| convert_ctr::stats_to_cri(r, &crate::cgroups::usage(&r.cgroup), now))
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
        let filter = convert::filter(Some(&cri::PodSandboxFilter {
            id: f.id,
            state: Some(cri::PodSandboxStateValue {
                state: cri::PodSandboxState::SandboxReady as i32,
            }),
            label_selector: f.label_selector,
        }))
        .map_err(|e| convert::status_of(&e))?;
        let stats = match filter {
            Some(filter) => {
                self.blocking("ListPodSandboxStats", "", move |rt| {
                    Ok(pods_stats(rt, &filter))
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
        Err(not_yet(
            "get_container_events",
            "evented PLEG is not supported; kubelet falls back to relisting",
        ))
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
        let config = convert_ctr::container_config(config).map_err(|e| convert::status_of(&e))?;
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
            status: Some(convert_ctr::status_to_cri(&r)),
            info,
        }))
    }

    async fn update_container_resources(
        &self,
        req: Request<cri::UpdateContainerResourcesRequest>,
    ) -> Result<Response<cri::UpdateContainerResourcesResponse>, Status> {
        let req = req.into_inner();
        let res = convert_ctr::resources(&req.linux.unwrap_or_default());
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
        let r = self
            .blocking("ExecSync", &req.container_id, move |rt| {
                rt.exec_sync(&i, &cmd, t)
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
                let r = rt.container_record(&i)?;
                let u = crate::cgroups::usage(&r.cgroup);
                Ok(convert_ctr::stats_to_cri(
                    &r,
                    &u,
                    crate::sandbox::now_nanos(),
                ))
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
                let r = rt.sandbox_record(&i)?;
                let running = rt.list_containers(&crate::ContainerFilter {
                    sandbox_id: Some(r.id.clone()),
                    state: Some(crate::ContainerState::Running),
                    ..Default::default()
                });
                let running: Vec<_> = running.iter().collect();
                Ok(pod_stats(rt, &r, &running, crate::sandbox::now_nanos()))
            })
            .await?;
        Ok(Response::new(cri::PodSandboxStatsResponse {
            stats: Some(stats),
        }))
    }

    async fn checkpoint_container(
        &self,
        _: Request<cri::CheckpointContainerRequest>,
    ) -> Result<Response<cri::CheckpointContainerResponse>, Status> {
        Err(not_yet(
            "checkpoint_container",
            "checkpointing is not supported",
        ))
    }

    async fn list_metric_descriptors(
        &self,
        _: Request<cri::ListMetricDescriptorsRequest>,
    ) -> Result<Response<cri::ListMetricDescriptorsResponse>, Status> {
        Err(not_yet(
            "list_metric_descriptors",
            "CRI metrics are not supported; use ListContainerStats",
        ))
    }

    async fn list_pod_sandbox_metrics(
        &self,
        _: Request<cri::ListPodSandboxMetricsRequest>,
    ) -> Result<Response<cri::ListPodSandboxMetricsResponse>, Status> {
        Err(not_yet(
            "list_pod_sandbox_metrics",
            "CRI metrics are not supported; use ListContainerStats",
        ))
    }
}

#[tonic::async_trait]
impl ImageService for CriService {
    async fn list_images(
        &self,
        req: Request<cri::ListImagesRequest>,
    ) -> Result<Response<cri::ListImagesResponse>, Status> {
        let want = req
            .into_inner()
            .filter
            .and_then(|f| f.image)
            .map(|i| i.image)
            .filter(|i| !i.is_empty());
        let images = self
            .blocking("ListImages", "", move |rt| {
                Ok(match want {
                    Some(name) => rt.images().get(&name).into_iter().collect(),
                    None => rt.images().list(),
                })
            })
            .await?;
        Ok(Response::new(cri::ListImagesResponse {
            images: images.iter().map(convert_ctr::image_to_cri).collect(),
        }))
    }

    async fn image_status(
        &self,
        req: Request<cri::ImageStatusRequest>,
    ) -> Result<Response<cri::ImageStatusResponse>, Status> {
        let req = req.into_inner();
        let name = req.image.map(|i| i.image).unwrap_or_default();
        let n = name.clone();
        let img = self
            .blocking("ImageStatus", &name, move |rt| Ok(rt.images().get(&n)))
            .await?;
        // An unknown image is an empty answer, not an error (kubelet then pulls it).
        let info = verbose_info(req.verbose, img.as_ref());
        Ok(Response::new(cri::ImageStatusResponse {
            image: img.as_ref().map(convert_ctr::image_to_cri),
            info,
        }))
    }

    async fn pull_image(
        &self,
        req: Request<cri::PullImageRequest>,
    ) -> Result<Response<cri::PullImageResponse>, Status> {
        let req = req.into_inner();
        let name = req.image.map(|i| i.image).unwrap_or_default();
        let auth = convert_ctr::auth(req.auth.as_ref()).map_err(|e| convert::status_of(&e))?;
        let n = name.clone();
        let img = self
            .blocking("PullImage", &name, move |rt| rt.pull_image(&n, &auth))
            .await?;
        tracing::info!(image = %name, image_id = %img.id, "PullImage done");
        Ok(Response::new(cri::PullImageResponse { image_ref: img.id }))
    }

    async fn remove_image(
        &self,
        req: Request<cri::RemoveImageRequest>,
    ) -> Result<Response<cri::RemoveImageResponse>, Status> {
        let name = req.into_inner().image.map(|i| i.image).unwrap_or_default();
        let n = name.clone();
        self.call("RemoveImage", &name, move |rt| rt.remove_image(&n))
            .await?;
        Ok(Response::new(cri::RemoveImageResponse {}))
    }

    async fn image_fs_info(
        &self,
        _: Request<cri::ImageFsInfoRequest>,
    ) -> Result<Response<cri::ImageFsInfoResponse>, Status> {
        let (usage, mountpoint) = self
            .blocking("ImageFsInfo", "", |rt| {
                Ok((rt.images().usage(), rt.images().dir.clone()))
            })
            .await?;
        let fs = cri::FilesystemUsage {
            timestamp: crate::sandbox::now_nanos(),
            fs_id: Some(cri::FilesystemIdentifier {
                mountpoint: mountpoint.to_string_lossy().into_owned(),
            }),
            used_bytes: Some(cri::UInt64Value { value: usage.0 }),
            inodes_used: Some(cri::UInt64Value { value: usage.1 }),
        };
        Ok(Response::new(cri::ImageFsInfoResponse {
            image_filesystems: vec![fs],
            container_filesystems: Vec::new(),
        }))
    }
}
