//! `sandboxd-nri-logger`: a small NRI plugin (as NRI's own sample "logger") that records every
//! event it is sent, one line each (`EVENT name`: the container's name for container events,
//! the pod's for pod events), and can set environment variables in every container created.
//! It checks a node's NRI setup, serves as the no-op plugin of the lifecycle benchmark and
//! as the pre-installed plugin of the tests.
//!
//! Started by a runtime from its plugin dir (`NN-logger`), it speaks over fd
//! `$NRI_PLUGIN_SOCKET`; started by hand, it connects to `--socket` (default
//! `/var/run/nri/nri.sock`) as `--idx`-`--name`. Its configuration (the runtime's config file
//! for it) is JSON: `{"events_file": PATH, "env": {"K": "V"}}`, both optional;
//! without `events_file` the lines go to stderr.

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::FromRawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandboxd_nri_api::api;
use sandboxd_nri_api::ttrpc;
use sandboxd_nri_api::ttrpc::asynchronous::transport::{Listener, Socket};

#[derive(Default, serde::Deserialize)]
struct Settings {
    events_file: Option<std::path::PathBuf>,
    #[serde(default)]
    env: HashMap<String, String>,
}

struct Logger {
    settings: Mutex<Settings>,
    out: Mutex<Option<std::fs::File>>,
}

impl Logger {
    fn line(&self, l: String) {
        match &mut *self.out.lock().unwrap() {
            Some(f) => {
                let _ = writeln!(f, "{l}");
            }
            None => eprintln!("{l}"),
        }
    }
}

fn who(pod: &Option<api::PodSandbox>, c: &Option<api::Container>) -> String {
    match c {
        Some(c) => c.name.clone(),
        None => pod.as_ref().map(|p| p.name.clone()).unwrap_or_default(),
    }
}

#[sandboxd_nri_api::async_trait]
impl sandboxd_nri_api::PluginService for Logger {
    async fn configure(
        &self,
        _: &ttrpc::asynchronous::TtrpcContext,
        req: api::ConfigureRequest,
    ) -> ttrpc::Result<api::ConfigureResponse> {
        let cfg = if req.config.trim().is_empty() {
            Settings::default()
        } else {
            serde_json::from_str(&req.config).map_err(|e| {
                ttrpc::Error::RpcStatus(ttrpc::get_status(
                    ttrpc::Code::INVALID_ARGUMENT,
                    format!("config: {e}"),
                ))
            })?
        };
        if let Some(p) = &cfg.events_file {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(|e| {
                    ttrpc::Error::RpcStatus(ttrpc::get_status(
                        ttrpc::Code::INVALID_ARGUMENT,
                        format!("{}: {e}", p.display()),
                    ))
                })?;
            *self.out.lock().unwrap() = Some(f);
        }
        *self.settings.lock().unwrap() = cfg;
        self.line(format!(
            "CONFIGURE {} {}",
            req.runtime_name, req.runtime_version
        ));
        Ok(api::ConfigureResponse::default())
    }

    async fn synchronize(
        &self,
        _: &ttrpc::asynchronous::TtrpcContext,
        req: api::SynchronizeRequest,
    ) -> ttrpc::Result<api::SynchronizeResponse> {
        self.line(format!(
            "SYNCHRONIZE {} pods {} containers",
            req.pods.len(),
            req.containers.len()
        ));
        Ok(api::SynchronizeResponse {
            update: vec![],
            more: req.more,
        })
    }

    async fn create_container(
        &self,
        _: &ttrpc::asynchronous::TtrpcContext,
        req: api::CreateContainerRequest,
    ) -> ttrpc::Result<api::CreateContainerResponse> {
        self.line(format!(
            "CREATE_CONTAINER {}",
            who(&req.pod, &req.container)
        ));
        let env = &self.settings.lock().unwrap().env;
        let adjust = (!env.is_empty()).then(|| api::ContainerAdjustment {
            env: env
                .iter()
                .map(|(k, v)| api::KeyValue {
                    key: k.clone(),
                    value: v.clone(),
                })
                .collect(),
            ..Default::default()
        });
        Ok(api::CreateContainerResponse {
            adjust,
            ..Default::default()
        })
    }

    async fn update_container(
        &self,
        _: &ttrpc::asynchronous::TtrpcContext,
        req: api::UpdateContainerRequest,
    ) -> ttrpc::Result<api::UpdateContainerResponse> {
        self.line(format!(
            "UPDATE_CONTAINER {}",
            who(&req.pod, &req.container)
        ));
        Ok(api::UpdateContainerResponse::default())
    }

    async fn stop_container(
        &self,
        _: &ttrpc::asynchronous::TtrpcContext,
        req: api::StopContainerRequest,
    ) -> ttrpc::Result<api::StopContainerResponse> {
        self.line(format!("STOP_CONTAINER {}", who(&req.pod, &req.container)));
        Ok(api::StopContainerResponse::default())
    }

    async fn update_pod_sandbox(
        &self,
        _: &ttrpc::asynchronous::TtrpcContext,
        req: api::UpdatePodSandboxRequest,
    ) -> ttrpc::Result<api::UpdatePodSandboxResponse> {
        self.line(format!("UPDATE_POD_SANDBOX {}", who(&req.pod, &None)));
        Ok(api::UpdatePodSandboxResponse {})
    }

    async fn state_change(
        &self,
        _: &ttrpc::asynchronous::TtrpcContext,
        req: api::StateChangeEvent,
    ) -> ttrpc::Result<api::Empty> {
        let event = api::Event::try_from(req.event)
            .map(|e| e.as_str_name())
            .unwrap_or("UNKNOWN");
        self.line(format!("{event} {}", who(&req.pod, &req.container)));
        Ok(api::Empty {})
    }
}

fn arg(args: &[String], flag: &str) -> Option<String> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!(
            "usage: sandboxd-nri-logger [--socket PATH] [--name NAME] [--idx NN]\n\
             (as a pre-installed plugin: no arguments; the runtime passes NRI_PLUGIN_SOCKET)"
        );
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio");
    let code = rt.block_on(run(args));
    std::process::exit(code);
}

async fn run(args: Vec<String>) -> i32 {
    let preinstalled = std::env::var("NRI_PLUGIN_SOCKET").ok();
    let sock = match &preinstalled {
        Some(fd) => {
            let Ok(fd) = fd.parse::<i32>() else {
                eprintln!("NRI_PLUGIN_SOCKET={fd}: not a file descriptor");
                return 2;
            };
            // SAFETY: the runtime passed this descriptor to us alone; nothing else owns it.
            let s = unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) };
            s.set_nonblocking(true).expect("nonblocking");
            tokio::net::UnixStream::from_std(s).expect("socket")
        }
        None => {
            let path =
                arg(&args, "--socket").unwrap_or_else(|| "/var/run/nri/nri.sock".to_string());
            match tokio::net::UnixStream::connect(&path).await {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("connect {path}: {e}");
                    return 1;
                }
            }
        }
    };
    let name = std::env::var("NRI_PLUGIN_NAME")
        .ok()
        .or_else(|| arg(&args, "--name"))
        .unwrap_or_else(|| "logger".into());
    let idx = std::env::var("NRI_PLUGIN_IDX")
        .ok()
        .or_else(|| arg(&args, "--idx"))
        .unwrap_or_else(|| "50".into());
    let logger = Arc::new(Logger {
        settings: Mutex::new(Settings::default()),
        out: Mutex::new(None),
    });
    let trunk = sandboxd_nri_api::mux::split(sock);
    let one = futures_util::stream::iter([Ok::<_, std::io::Error>(trunk.plugin_service)]);
    let mut server = ttrpc::asynchronous::Server::new()
        .register_service(sandboxd_nri_api::create_plugin(logger))
        .add_listener(Listener::new(one));
    if let Err(e) = server.start().await {
        eprintln!("serve: {e}");
        return 1;
    }
    let client = sandboxd_nri_api::RuntimeClient::new(ttrpc::asynchronous::Client::new(
        Socket::new(trunk.runtime_service),
    ));
    if let Err(e) = client
        .register_plugin(
            ttrpc::context::with_duration(Duration::from_secs(5)),
            &api::RegisterPluginRequest {
                plugin_name: name.clone(),
                plugin_idx: idx.clone(),
                nri_version: String::new(),
            },
        )
        .await
    {
        eprintln!("register {idx}-{name}: {e}");
        return 1;
    }
    // Serve until the runtime closes the socket.
    let _ = trunk.task.await;
    0
}
