//! What a pod's network is to CNI, as data: the network list ADD and DEL run, the pod's
//! attachment, the port mappings, and the entry kept per pod (in its record and in the CNI
//! cache). Parsing and running them is `cni/`'s.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A network config list: the unit of ADD and DEL.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetworkList {
    /// The network's name (each plugin's config carries it).
    pub name: String,
    /// The CNI spec version the list declares.
    pub cni_version: String,
    /// The plugin configs, each a JSON object with at least `type`.
    pub plugins: Vec<Value>,
    /// Where it came from: a file path or `embedded`.
    pub source: String,
}

/// A port the pod exposes on the host (CNI `portMappings` capability).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortMapping {
    /// The port on the node.
    pub host_port: u16,
    /// The port in the pod.
    pub container_port: u16,
    /// `tcp`, `udp` or `sctp`.
    pub protocol: String,
    /// The node address to bind; empty: all of them.
    #[serde(default, rename = "hostIP", skip_serializing_if = "String::is_empty")]
    pub host_ip: String,
}

/// The pod as CNI sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attachment {
    /// `CNI_CONTAINERID`: the sandbox id.
    pub container_id: String,
    /// `CNI_NETNS`; `None` passes an empty value (the netns is gone: plugins clean up what
    /// they can without it, as the spec allows for DEL).
    pub netns: Option<PathBuf>,
    /// `CNI_IFNAME`: the pod's interface (`eth0`).
    pub ifname: String,
    /// The pod's name, namespace and uid (`K8S_POD_*` in `CNI_ARGS`).
    pub pod_name: String,
    /// See `pod_name`.
    pub pod_namespace: String,
    /// See `pod_name`.
    pub pod_uid: String,
    /// The `portMappings` capability's argument.
    pub port_mappings: Vec<PortMapping>,
}

impl Attachment {
    /// `CNI_ARGS` for this pod, with the `K8S_POD_*` keys kubelet's runtimes pass.
    pub fn cni_args(&self) -> String {
        format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={}",
            self.pod_namespace, self.pod_name, self.container_id, self.pod_uid
        )
    }
}

/// What is cached per sandbox: the exact list used for ADD and, once ADD succeeded, its result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheEntry {
    /// The list ADD ran (DEL runs the same, even if the conf dir changed since).
    pub list: NetworkList,
    /// The pod as ADD saw it (its `netns` left empty: the record's is the one).
    pub attachment: Attachment,
    /// ADD's result, once it succeeded (DEL's `prevResult`).
    #[serde(default)]
    pub result: Option<Value>,
}
