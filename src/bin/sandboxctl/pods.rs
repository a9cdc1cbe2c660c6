//! Pod sandbox commands: `runp`, `stopp`, `rmp`, `pods`, `inspectp`.

use std::collections::HashMap;
use std::path::Path;

use sandboxd::api::v1 as cri;

use crate::config::load_pod_config;
use crate::output::{ago, pretty_verbose, print_list, short};
use crate::{grpc_err, ids, Runtime};

pub async fn run(c: &mut Runtime, config: &Path, runtime: Option<String>) -> Result<(), String> {
    let cfg = load_pod_config(config)?;
    let r = c
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(cfg),
            runtime_handler: runtime.unwrap_or_default(),
        })
        .await
        .map_err(|s| grpc_err("RunPodSandbox", s))?
        .into_inner();
    println!("{}", r.pod_sandbox_id);
    Ok(())
}

pub async fn stop(c: &mut Runtime, ids: Vec<String>) -> Result<(), String> {
    for id in ids {
        let id = ids::pod(c, &id).await?;
        c.stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: id.clone(),
        })
        .await
        .map_err(|s| grpc_err("StopPodSandbox", s))?;
        println!("Stopped sandbox {id}");
    }
    Ok(())
}

pub async fn remove(c: &mut Runtime, ids: Vec<String>) -> Result<(), String> {
    for id in ids {
        let id = ids::pod(c, &id).await?;
        c.remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.clone(),
        })
        .await
        .map_err(|s| grpc_err("RemovePodSandbox", s))?;
        println!("Removed sandbox {id}");
    }
    Ok(())
}

/// `pods`: the sandboxes in `state` with every `key=value` of `label`, whose id starts with
/// `id`.
pub async fn list(
    c: &mut Runtime,
    id: Option<String>,
    state: Option<String>,
    label: Vec<String>,
    quiet: bool,
    json: bool,
) -> Result<(), String> {
    let state = match state.as_deref() {
        None => None,
        Some("ready") => Some(cri::PodSandboxStateValue {
            state: cri::PodSandboxState::SandboxReady as i32,
        }),
        Some("notready") => Some(cri::PodSandboxStateValue {
            state: cri::PodSandboxState::SandboxNotready as i32,
        }),
        Some(s) => return Err(format!("--state {s:?}: expected ready or notready")),
    };
    let mut label_selector = HashMap::new();
    for l in label {
        let (k, v) = l
            .split_once('=')
            .ok_or_else(|| format!("--label {l:?}: expected key=value"))?;
        label_selector.insert(k.to_string(), v.to_string());
    }
    let items = c
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter {
                id: String::new(),
                state,
                label_selector,
            }),
        })
        .await
        .map_err(|s| grpc_err("ListPodSandbox", s))?
        .into_inner()
        .items;
    let items: Vec<_> = items
        .into_iter()
        .filter(|p| id.as_ref().is_none_or(|i| p.id.starts_with(i.as_str())))
        .collect();
    if json {
        print_list("items", &items);
    } else if quiet {
        items.iter().for_each(|p| println!("{}", p.id));
    } else {
        println!(
            "{:<13}  {:<20}  {:<10}  {:<24}  {:<16}  {:<7}  RUNTIME",
            "POD ID", "CREATED", "STATE", "NAME", "NAMESPACE", "ATTEMPT"
        );
        for p in items {
            let m = p.metadata.unwrap_or_default();
            let state = if p.state == cri::PodSandboxState::SandboxReady as i32 {
                "Ready"
            } else {
                "NotReady"
            };
            println!(
                "{:<13}  {:<20}  {:<10}  {:<24}  {:<16}  {:<7}  {}",
                short(&p.id),
                ago(p.created_at),
                state,
                m.name,
                m.namespace,
                m.attempt,
                if p.runtime_handler.is_empty() {
                    "(default)"
                } else {
                    &p.runtime_handler
                }
            );
        }
    }
    Ok(())
}

pub async fn inspect(c: &mut Runtime, id: &str) -> Result<(), String> {
    let id = ids::pod(c, id).await?;
    let s = c
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: id,
            verbose: true,
        })
        .await
        .map_err(|s| grpc_err("PodSandboxStatus", s))?
        .into_inner();
    println!("{}", pretty_verbose(&s));
    Ok(())
}
