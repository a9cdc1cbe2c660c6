//! The daemon tests' pods: a config (namespace `e2e`, optionally sharing the PID namespace),
//! and the calls they repeat, for tests that drive a tonic client from their own tasks.

use sandboxd::api::v1 as cri;
use sandboxd::api::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

pub fn pod_config(name: &str, uid: &str, share_pid: bool) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            namespace: "e2e".into(),
            uid: uid.into(),
            attempt: 0,
        }),
        linux: Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    pid: if share_pid {
                        cri::NamespaceMode::Pod
                    } else {
                        cri::NamespaceMode::Container
                    } as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn run_req(c: cri::PodSandboxConfig) -> cri::RunPodSandboxRequest {
    cri::RunPodSandboxRequest {
        config: Some(c),
        runtime_handler: String::new(),
    }
}

pub async fn list(c: &mut RuntimeServiceClient<Channel>) -> Vec<cri::PodSandbox> {
    c.list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .items
}

pub async fn status(
    c: &mut RuntimeServiceClient<Channel>,
    id: &str,
) -> Result<cri::PodSandboxStatus, tonic::Status> {
    c.pod_sandbox_status(cri::PodSandboxStatusRequest {
        pod_sandbox_id: id.into(),
        verbose: false,
    })
    .await
    .map(|r| r.into_inner().status.unwrap())
}
