//! A real NRI plugin for the tests: it connects to the daemon's NRI socket, splits it with
//! the protocol's multiplexer, serves the `Plugin` service over ttrpc, registers through the
//! `Runtime` service, and records every event it is sent ("EVENT name", the container's name
//! for container events, the pod's for pod events). It can adjust containers, refuse an
//! event, block in one until released, or never answer one.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sandboxd_nri_api::api;
use sandboxd_nri_api::ttrpc;
use sandboxd_nri_api::ttrpc::asynchronous::transport::{Listener, Socket};

/// What the plugin does.
#[derive(Clone, Default)]
pub struct Behavior {
    pub name: String,
    pub idx: String,
    /// Subscription mask (0: every event).
    pub events: i32,
    /// Applied to every container created.
    pub adjust: Option<api::ContainerAdjustment>,
    /// Refuse this event (by its protocol name) this many times.
    pub fail: Option<(&'static str, usize)>,
    /// Never answer this event.
    pub hang: Option<&'static str>,
    /// Wait in this event until [`TestPlugin::release`].
    pub block: Option<&'static str>,
    /// As a validator, reject every container's adjustments.
    pub reject: bool,
}

#[derive(Default)]
struct State {
    events: Vec<String>,
    /// Per state-change event: `EVENT NAME netns=PATH adjusted=BOOL pod=ID` (the pod's network
    /// namespace path, whether the container's env shows `NRI_ADJUSTED`, the pod's id).
    details: Vec<String>,
    synced: Option<(Vec<String>, Vec<String>)>,
    fails_left: usize,
}

struct Handler {
    b: Behavior,
    state: Arc<Mutex<State>>,
    release: Arc<tokio::sync::Notify>,
}

impl Handler {
    /// Records `event` and acts on it as told.
    async fn on(&self, event: &str, who: &str) -> ttrpc::Result<()> {
        self.state
            .lock()
            .unwrap()
            .events
            .push(format!("{event} {who}"));
        if self.b.hang == Some(event) {
            std::future::pending::<()>().await;
        }
        if self.b.block == Some(event) {
            self.release.notified().await;
        }
        if let Some((e, _)) = self.b.fail {
            let mut s = self.state.lock().unwrap();
            if e == event && s.fails_left > 0 {
                s.fails_left -= 1;
                return Err(ttrpc::Error::RpcStatus(ttrpc::get_status(
                    ttrpc::Code::FAILED_PRECONDITION,
                    format!("test plugin {} refuses {event}", self.b.name),
                )));
            }
        }
        Ok(())
    }
}

fn names(pod: &Option<api::PodSandbox>, c: &Option<api::Container>) -> String {
    match c {
        Some(c) => c.name.clone(),
        None => pod.as_ref().map(|p| p.name.clone()).unwrap_or_default(),
    }
}

#[sandboxd_nri_api::async_trait]
impl sandboxd_nri_api::PluginService for Handler {
    async fn configure(
        &self,
        _ctx: &ttrpc::asynchronous::TtrpcContext,
        req: api::ConfigureRequest,
    ) -> ttrpc::Result<api::ConfigureResponse> {
        self.state
            .lock()
            .unwrap()
            .events
            .push(format!("CONFIGURE {}", req.runtime_name));
        Ok(api::ConfigureResponse {
            events: self.b.events,
            request_timeout: 0,
        })
    }

    async fn synchronize(
        &self,
        _ctx: &ttrpc::asynchronous::TtrpcContext,
        req: api::SynchronizeRequest,
    ) -> ttrpc::Result<api::SynchronizeResponse> {
        self.on("SYNCHRONIZE", "").await?;
        let mut s = self.state.lock().unwrap();
        let (pods, ctrs) = s.synced.get_or_insert_with(Default::default);
        pods.extend(req.pods.iter().map(|p| p.name.clone()));
        ctrs.extend(req.containers.iter().map(|c| c.name.clone()));
        Ok(api::SynchronizeResponse {
            update: vec![],
            more: req.more,
        })
    }

    async fn create_container(
        &self,
        _ctx: &ttrpc::asynchronous::TtrpcContext,
        req: api::CreateContainerRequest,
    ) -> ttrpc::Result<api::CreateContainerResponse> {
        self.on("CREATE_CONTAINER", &names(&req.pod, &req.container))
            .await?;
        Ok(api::CreateContainerResponse {
            adjust: self.b.adjust.clone(),
            update: vec![],
            evict: vec![],
        })
    }

    async fn update_container(
        &self,
        _ctx: &ttrpc::asynchronous::TtrpcContext,
        req: api::UpdateContainerRequest,
    ) -> ttrpc::Result<api::UpdateContainerResponse> {
        self.on("UPDATE_CONTAINER", &names(&req.pod, &req.container))
            .await?;
        Ok(api::UpdateContainerResponse::default())
    }

    async fn stop_container(
        &self,
        _ctx: &ttrpc::asynchronous::TtrpcContext,
        req: api::StopContainerRequest,
    ) -> ttrpc::Result<api::StopContainerResponse> {
        self.on("STOP_CONTAINER", &names(&req.pod, &req.container))
            .await?;
        Ok(api::StopContainerResponse::default())
    }

    async fn update_pod_sandbox(
        &self,
        _ctx: &ttrpc::asynchronous::TtrpcContext,
        req: api::UpdatePodSandboxRequest,
    ) -> ttrpc::Result<api::UpdatePodSandboxResponse> {
        let mem = req
            .linux_resources
            .and_then(|r| r.memory)
            .and_then(|m| m.limit)
            .map_or(0, |l| l.value);
        self.on(
            "UPDATE_POD_SANDBOX",
            &format!("{} memory={mem}", names(&req.pod, &None)),
        )
        .await?;
        Ok(api::UpdatePodSandboxResponse {})
    }

    async fn validate_container_adjustment(
        &self,
        _ctx: &ttrpc::asynchronous::TtrpcContext,
        req: api::ValidateContainerAdjustmentRequest,
    ) -> ttrpc::Result<api::ValidateContainerAdjustmentResponse> {
        let env: Vec<String> = req
            .adjust
            .iter()
            .flat_map(|a| a.env.iter().map(|kv| kv.key.clone()))
            .collect();
        let plugins: Vec<String> = req
            .plugins
            .iter()
            .map(|p| format!("{}-{}", p.index, p.name))
            .collect();
        self.on(
            "VALIDATE",
            &format!(
                "{} env={} plugins={}",
                names(&req.pod, &req.container),
                env.join(","),
                plugins.join(",")
            ),
        )
        .await?;
        Ok(api::ValidateContainerAdjustmentResponse {
            reject: self.b.reject,
            reason: if self.b.reject {
                format!("test policy {} says no", self.b.name)
            } else {
                String::new()
            },
        })
    }

    async fn state_change(
        &self,
        _ctx: &ttrpc::asynchronous::TtrpcContext,
        req: api::StateChangeEvent,
    ) -> ttrpc::Result<api::Empty> {
        let event = api::Event::try_from(req.event)
            .map(|e| e.as_str_name())
            .unwrap_or("UNKNOWN");
        let netns = req
            .pod
            .as_ref()
            .and_then(|p| p.linux.as_ref())
            .and_then(|l| l.namespaces.iter().find(|n| n.r#type == "network"))
            .map(|n| n.path.clone())
            .unwrap_or_default();
        let adjusted = req
            .container
            .as_ref()
            .is_some_and(|c| c.env.iter().any(|e| e.starts_with("NRI_ADJUSTED=")));
        let pod_id = req.pod.as_ref().map(|p| p.id.clone()).unwrap_or_default();
        self.state.lock().unwrap().details.push(format!(
            "{event} {} netns={netns} adjusted={adjusted} pod={pod_id}",
            names(&req.pod, &req.container)
        ));
        self.on(event, &names(&req.pod, &req.container)).await?;
        Ok(api::Empty {})
    }
}

/// A connected, registered and synchronized plugin; dropping it disconnects it.
pub struct TestPlugin {
    state: Arc<Mutex<State>>,
    release: Arc<tokio::sync::Notify>,
    client: sandboxd_nri_api::RuntimeClient,
    rt: Option<tokio::runtime::Runtime>,
}

impl Drop for TestPlugin {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl TestPlugin {
    /// Connects to `socket` and waits (up to 10 s) until the daemon has synchronized it.
    pub fn connect(socket: &Path, b: Behavior) -> TestPlugin {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let state = Arc::new(Mutex::new(State {
            fails_left: b.fail.map_or(0, |(_, n)| n),
            ..Default::default()
        }));
        let release = Arc::new(tokio::sync::Notify::new());
        let handler = Arc::new(Handler {
            b: b.clone(),
            state: state.clone(),
            release: release.clone(),
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        let sock = loop {
            match rt.block_on(tokio::net::UnixStream::connect(socket)) {
                Ok(s) => break s,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("connect {}: {e}", socket.display()),
            }
        };
        let client = rt.block_on(async {
            let trunk = sandboxd_nri_api::mux::split(sock);
            let one = futures_util::stream::iter([Ok::<_, std::io::Error>(trunk.plugin_service)]);
            let mut server = ttrpc::asynchronous::Server::new()
                .register_service(sandboxd_nri_api::create_plugin(handler))
                .add_listener(Listener::new(one));
            server.start().await.unwrap();
            let client = sandboxd_nri_api::RuntimeClient::new(ttrpc::asynchronous::Client::new(
                Socket::new(trunk.runtime_service),
            ));
            client
                .register_plugin(
                    ttrpc::context::with_duration(Duration::from_secs(5)),
                    &api::RegisterPluginRequest {
                        plugin_name: b.name.clone(),
                        plugin_idx: b.idx.clone(),
                        nri_version: String::new(),
                    },
                )
                .await
                .unwrap();
            // The server and trunk live as long as the runtime does.
            tokio::spawn(async move {
                let _keep = (server, trunk.task);
                std::future::pending::<()>().await;
            });
            client
        });
        let p = TestPlugin {
            state,
            release,
            client,
            rt: Some(rt),
        };
        p.wait(
            |s| s.synced.is_some() || s.events.iter().any(|e| e.starts_with("SYNCHRONIZE")),
            "Synchronize",
        );
        p
    }

    fn wait(&self, f: impl Fn(&State) -> bool, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !f(&self.state.lock().unwrap()) {
            assert!(Instant::now() < deadline, "the plugin never got {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until an event `"EVENT who"` has been received.
    pub fn wait_for(&self, event: &str) {
        self.wait(|s| s.events.iter().any(|e| e == event), event);
    }

    /// The events received, Configure and Synchronize left out.
    /// What each state-change event carried (see `State::details`).
    pub fn details(&self) -> Vec<String> {
        self.state.lock().unwrap().details.clone()
    }

    pub fn events(&self) -> Vec<String> {
        self.state
            .lock()
            .unwrap()
            .events
            .iter()
            .filter(|e| !e.starts_with("CONFIGURE") && !e.starts_with("SYNCHRONIZE"))
            .cloned()
            .collect()
    }

    /// The pods' and containers' names in Synchronize.
    pub fn synced(&self) -> (Vec<String>, Vec<String>) {
        self.state
            .lock()
            .unwrap()
            .synced
            .clone()
            .unwrap_or_default()
    }

    /// An unsolicited update (UpdateContainers): container `id`'s memory limit; returns the
    /// updates the runtime says failed.
    pub fn update_memory(&self, id: &str, limit: i64) -> Vec<api::ContainerUpdate> {
        let req = api::UpdateContainersRequest {
            update: vec![api::ContainerUpdate {
                container_id: id.into(),
                linux: Some(api::LinuxContainerUpdate {
                    resources: Some(api::LinuxResources {
                        memory: Some(api::LinuxMemory {
                            limit: Some(api::OptionalInt64 { value: limit }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                }),
                ignore_failure: false,
            }],
            evict: vec![],
        };
        self.rt
            .as_ref()
            .unwrap()
            .block_on(
                self.client.update_containers(
                    ttrpc::context::with_duration(Duration::from_secs(10)),
                    &req,
                ),
            )
            .unwrap()
            .failed
    }

    /// An unsolicited UpdateContainers as given: the answer, or the error status.
    pub fn update(
        &self,
        req: api::UpdateContainersRequest,
    ) -> Result<api::UpdateContainersResponse, ttrpc::Error> {
        self.rt.as_ref().unwrap().block_on(
            self.client
                .update_containers(ttrpc::context::with_duration(Duration::from_secs(60)), &req),
        )
    }

    /// Sends `req` and does not wait for its answer (dropping the plugin drops the wait).
    pub fn send_update(&self, req: api::UpdateContainersRequest) {
        let client = self.client.clone();
        self.rt.as_ref().unwrap().spawn(async move {
            let _ = client
                .update_containers(ttrpc::context::with_duration(Duration::from_secs(60)), &req)
                .await;
        });
    }

    /// Sends every request at once and waits for all the answers.
    pub fn updates_at_once(
        &self,
        reqs: Vec<api::UpdateContainersRequest>,
    ) -> Vec<Result<api::UpdateContainersResponse, ttrpc::Error>> {
        let client = &self.client;
        self.rt
            .as_ref()
            .unwrap()
            .block_on(futures_util::future::join_all(reqs.iter().map(|r| {
                client.update_containers(ttrpc::context::with_duration(Duration::from_secs(60)), r)
            })))
    }

    /// Lets a blocked event return.
    pub fn release(&self) {
        self.release.notify_one();
    }
}
