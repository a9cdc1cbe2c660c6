//! `RuntimeService`, streaming: Exec, Attach and PortForward answer with a one-time URL on the
//! streaming server.

use tonic::{Request, Response, Status};

use crate::api::v1 as cri;
use crate::cri::CriService;

pub(super) async fn exec(
    svc: &CriService,
    req: Request<cri::ExecRequest>,
) -> Result<Response<cri::ExecResponse>, Status> {
    let r = req.into_inner();
    let id = r.container_id.clone();
    let url = svc
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

pub(super) async fn attach(
    svc: &CriService,
    req: Request<cri::AttachRequest>,
) -> Result<Response<cri::AttachResponse>, Status> {
    let r = req.into_inner();
    let id = r.container_id.clone();
    let url = svc
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

pub(super) async fn port_forward(
    svc: &CriService,
    req: Request<cri::PortForwardRequest>,
) -> Result<Response<cri::PortForwardResponse>, Status> {
    let r = req.into_inner();
    let id = r.pod_sandbox_id.clone();
    let mut ports = Vec::new();
    for p in &r.port {
        ports.push(
            u16::try_from(*p)
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| Status::invalid_argument(format!("port {p} is not a TCP port")))?,
        );
    }
    let url = svc
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
