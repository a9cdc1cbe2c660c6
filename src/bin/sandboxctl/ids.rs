//! Ids as users type them: a unique prefix is resolved against the runtime's list, as crictl
//! does; an id that matches nothing is passed on unchanged (stop/remove of an unknown id is
//! success per CRI).

use sandboxd::api::v1 as cri;

use crate::{grpc_err, Runtime};

/// Resolves a pod sandbox id prefix against ListPodSandbox.
pub async fn pod(c: &mut Runtime, prefix: &str) -> Result<String, String> {
    let items = c
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .map_err(|s| grpc_err("ListPodSandbox", s))?
        .into_inner()
        .items;
    pick(items.into_iter().map(|p| p.id), prefix, "pods")
}

/// Resolves a container id prefix against ListContainers.
pub async fn container(c: &mut Runtime, prefix: &str) -> Result<String, String> {
    let items = c
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .map_err(|s| grpc_err("ListContainers", s))?
        .into_inner()
        .containers;
    pick(items.into_iter().map(|c| c.id), prefix, "containers")
}

/// The one id of `ids` starting with `prefix`; `prefix` itself when none does; an error naming
/// `kind` when several do.
fn pick(ids: impl IntoIterator<Item = String>, prefix: &str, kind: &str) -> Result<String, String> {
    let hits: Vec<String> = ids
        .into_iter()
        .filter(|id| id.starts_with(prefix))
        .collect();
    match hits.as_slice() {
        [] => Ok(prefix.to_string()),
        [one] => Ok(one.clone()),
        _ => Err(format!(
            "id prefix {prefix:?} is ambiguous ({} {kind})",
            hits.len()
        )),
    }
}
