//! `version` and `info`: what the runtime says about itself.

use sandboxd::api::v1 as cri;

use crate::{grpc_err, Runtime};

pub async fn version(c: &mut Runtime, json: bool) -> Result<(), String> {
    let v = c
        .version(cri::VersionRequest {
            version: "v1".into(),
        })
        .await
        .map_err(|s| grpc_err("Version", s))?
        .into_inner();
    if json {
        println!("{}", serde_json::to_string_pretty(&v).unwrap());
    } else {
        println!(
            "Version:  {}\nRuntimeName:  {}\nRuntimeVersion:  {}\nRuntimeApiVersion:  {}\nClient:  sandboxctl {}",
            v.version,
            v.runtime_name,
            v.runtime_version,
            v.runtime_api_version,
            crate::version_text()
        );
    }
    Ok(())
}

pub async fn info(c: &mut Runtime) -> Result<(), String> {
    let s = c
        .status(cri::StatusRequest { verbose: true })
        .await
        .map_err(|s| grpc_err("Status", s))?
        .into_inner();
    println!("{}", serde_json::to_string_pretty(&s).unwrap());
    Ok(())
}
