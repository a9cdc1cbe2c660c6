//! CRI calls through the daemon's gRPC socket, as the conformance-style tests make them:
//! pod and container configs from crictl-style JSON, and the common calls, each panicking
//! with the daemon's answer on failure.

use sandboxd::api::v1 as cri;
use sandboxd::api::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

use super::busybox;
use super::daemon::{client, rt, Daemon};
use super::Env;

pub const IMAGE: &str = "sandboxd.test/busybox:conf";

pub type Client = RuntimeServiceClient<Channel>;

/// A daemon with the busybox image imported, and a client.
pub fn daemon(env: &Env) -> (Daemon, tokio::runtime::Runtime, Client) {
    daemon_with(env, &env.cfg)
}

/// [`daemon`] with the test's config changed.
pub fn daemon_with(env: &Env, cfg: &sandboxd::Config) -> (Daemon, tokio::runtime::Runtime, Client) {
    sandboxd::image::ImageStore::new(env.cfg.root.join("images"))
        .unwrap()
        .import(&busybox::oci_layout(&env.base, IMAGE), None)
        .unwrap();
    let d = Daemon::start_with(env, cfg);
    let rt = rt();
    let c = rt.block_on(client(&d.socket));
    (d, rt, c)
}

pub fn pod(name: &str, extra: serde_json::Value) -> cri::PodSandboxConfig {
    let mut v = serde_json::json!({"metadata": {"name": name, "namespace": "conf", "uid": format!("uid-{name}")}});
    merge(&mut v, extra);
    sandboxd::cri::crictl_json::pod_config(v.to_string().as_bytes()).unwrap()
}

pub fn ctr(name: &str, cmd: &[&str], extra: serde_json::Value) -> cri::ContainerConfig {
    let mut v =
        serde_json::json!({"metadata": {"name": name}, "image": {"image": IMAGE}, "command": cmd});
    merge(&mut v, extra);
    sandboxd::cri::crictl_json::container_config(v.to_string().as_bytes()).unwrap()
}

pub fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
    if let (Some(a), serde_json::Value::Object(b)) = (a.as_object_mut(), b) {
        for (k, v) in b {
            match a.get_mut(&k) {
                Some(x) if x.is_object() && v.is_object() => merge(x, v),
                _ => {
                    a.insert(k, v);
                }
            }
        }
    }
}

pub fn run_pod(rt: &tokio::runtime::Runtime, c: &mut Client, p: &cri::PodSandboxConfig) -> String {
    rt.block_on(c.run_pod_sandbox(cri::RunPodSandboxRequest {
        config: Some(p.clone()),
        runtime_handler: String::new(),
    }))
    .unwrap()
    .into_inner()
    .pod_sandbox_id
}

pub fn create(
    rt: &tokio::runtime::Runtime,
    c: &mut Client,
    sb: &str,
    p: &cri::PodSandboxConfig,
    cfg: cri::ContainerConfig,
) -> Result<String, tonic::Status> {
    rt.block_on(c.create_container(cri::CreateContainerRequest {
        pod_sandbox_id: sb.into(),
        config: Some(cfg),
        sandbox_config: Some(p.clone()),
    }))
    .map(|r| r.into_inner().container_id)
}

/// A started `sleep 1000` container named `name` in pod `sb` (config `p`).
pub fn sleeper(
    rt: &tokio::runtime::Runtime,
    c: &mut Client,
    sb: &str,
    p: &cri::PodSandboxConfig,
    name: &str,
) -> String {
    let id = create(
        rt,
        c,
        sb,
        p,
        ctr(name, &["sleep", "1000"], serde_json::json!({})),
    )
    .unwrap();
    start(rt, c, &id);
    id
}

pub fn start(rt: &tokio::runtime::Runtime, c: &mut Client, id: &str) {
    rt.block_on(c.start_container(cri::StartContainerRequest {
        container_id: id.into(),
    }))
    .unwrap();
}

pub fn exec(rt: &tokio::runtime::Runtime, c: &mut Client, id: &str, script: &str) -> String {
    let r = rt
        .block_on(c.exec_sync(cri::ExecSyncRequest {
            container_id: id.into(),
            cmd: vec!["sh".into(), "-c".into(), script.into()],
            timeout: 10,
        }))
        .unwrap()
        .into_inner();
    String::from_utf8_lossy(&r.stdout).into_owned() + &String::from_utf8_lossy(&r.stderr)
}

pub fn remove_pod(rt: &tokio::runtime::Runtime, c: &mut Client, sb: &str) {
    rt.block_on(c.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: sb.into(),
    }))
    .unwrap();
}

/// `Status` (not verbose).
pub fn runtime_status(rt: &tokio::runtime::Runtime, c: &mut Client) -> cri::StatusResponse {
    rt.block_on(c.status(cri::StatusRequest { verbose: false }))
        .unwrap()
        .into_inner()
}

/// An `ImageService` client on the daemon's socket.
pub fn image_client(
    rt: &tokio::runtime::Runtime,
    d: &Daemon,
) -> sandboxd::api::v1::image_service_client::ImageServiceClient<Channel> {
    rt.block_on(async {
        sandboxd::api::v1::image_service_client::ImageServiceClient::new(
            super::daemon::channel(&d.socket).await,
        )
    })
}

/// An image volume: `image` (or its `sub` path) at `path`.
pub fn image_mount(path: &str, image: &str, sub: &str) -> cri::Mount {
    cri::Mount {
        container_path: path.into(),
        image: Some(cri::ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        image_sub_path: sub.into(),
        readonly: true,
        ..Default::default()
    }
}

/// `PodSandboxStatus` (not verbose).
pub fn pod_status(rt: &tokio::runtime::Runtime, c: &mut Client, sb: &str) -> cri::PodSandboxStatus {
    rt.block_on(c.pod_sandbox_status(cri::PodSandboxStatusRequest {
        pod_sandbox_id: sb.into(),
        verbose: false,
    }))
    .unwrap()
    .into_inner()
    .status
    .unwrap()
}

/// `ContainerStatus` (not verbose).
pub fn container_status(
    rt: &tokio::runtime::Runtime,
    c: &mut Client,
    id: &str,
) -> cri::ContainerStatus {
    rt.block_on(c.container_status(cri::ContainerStatusRequest {
        container_id: id.into(),
        verbose: false,
    }))
    .unwrap()
    .into_inner()
    .status
    .unwrap()
}
