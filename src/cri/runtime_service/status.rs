//! `RuntimeService`, the runtime itself: Version, Status, RuntimeConfig, UpdateRuntimeConfig.

use tonic::{Request, Response, Status};

use crate::api::v1 as cri;
use crate::cri::{health, CriService};

pub(super) async fn version(
    _: &CriService,
    _: Request<cri::VersionRequest>,
) -> Result<Response<cri::VersionResponse>, Status> {
    Ok(Response::new(cri::VersionResponse {
        version: "0.1.0".into(),
        runtime_name: "sandboxd".into(),
        runtime_version: env!("CARGO_PKG_VERSION").into(),
        runtime_api_version: "v1".into(),
    }))
}

pub(super) async fn update_runtime_config(
    _: &CriService,
    _: Request<cri::UpdateRuntimeConfigRequest>,
) -> Result<Response<cri::UpdateRuntimeConfigResponse>, Status> {
    // The pod CIDR comes from the CNI config; nothing else is runtime-tunable.
    Ok(Response::new(cri::UpdateRuntimeConfigResponse {}))
}

pub(super) async fn status(
    svc: &CriService,
    req: Request<cri::StatusRequest>,
) -> Result<Response<cri::StatusResponse>, Status> {
    let verbose = req.get_ref().verbose;
    let health = svc.call("Status", "", |rt| Ok(rt.health())).await?;
    let mut resp = health::status_to_cri(health, svc.rt.config(), verbose);
    if verbose {
        // The CDI devices containers can ask for, and the spec files not used (why).
        let (devices, errors) = svc.call("Status", "", |rt| Ok(rt.cdi_devices())).await?;
        resp.info.insert(
            "cdi".to_string(),
            serde_json::json!({"devices": devices, "brokenSpecFiles": errors}).to_string(),
        );
        // The NRI plugins connected, in call order.
        let nri = &svc.rt.config().nri;
        resp.info.insert(
            "nri".to_string(),
            serde_json::json!({
                "enabled": nri.enable,
                "socket": (nri.enable && !nri.disable_connections).then_some(&nri.socket_path),
                "plugins": svc.rt.nri_plugins(),
            })
            .to_string(),
        );
    }
    Ok(Response::new(resp))
}

pub(super) async fn runtime_config(
    svc: &CriService,
    _: Request<cri::RuntimeConfigRequest>,
) -> Result<Response<cri::RuntimeConfigResponse>, Status> {
    Ok(Response::new(cri::RuntimeConfigResponse {
        linux: Some(cri::LinuxRuntimeConfiguration {
            cgroup_driver: match svc.rt.cgroup_driver() {
                crate::cgroups::Driver::Systemd => cri::CgroupDriver::Systemd,
                crate::cgroups::Driver::Cgroupfs => cri::CgroupDriver::Cgroupfs,
            } as i32,
        }),
    }))
}
