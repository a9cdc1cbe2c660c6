//! Pod sandbox messages: RunPodSandbox's config in, statuses, listings and filters out.

use std::collections::{BTreeMap, HashMap};

use crate::api::v1 as cri;

use crate::cni::PortMapping;
use crate::error::Error;
use crate::sandbox::{
    DnsConfig, IdMap, IdMapping, NamespaceMode, NamespaceOptions, PodSandboxConfig,
    PodSandboxMetadata, SandboxFilter, SandboxState, SandboxStatus,
};

pub(crate) fn mode(v: i32, field: &str) -> Result<NamespaceMode, Error> {
    match cri::NamespaceMode::try_from(v) {
        Ok(cri::NamespaceMode::Pod) => Ok(NamespaceMode::Pod),
        Ok(cri::NamespaceMode::Container) => Ok(NamespaceMode::Container),
        Ok(cri::NamespaceMode::Node) => Ok(NamespaceMode::Node),
        Ok(cri::NamespaceMode::Target) => Ok(NamespaceMode::Target),
        Err(_) => Err(Error::InvalidArgument(format!(
            "{field}: unknown namespace mode {v}"
        ))),
    }
}

fn mode_to_cri(m: NamespaceMode) -> i32 {
    match m {
        NamespaceMode::Pod => cri::NamespaceMode::Pod as i32,
        NamespaceMode::Container => cri::NamespaceMode::Container as i32,
        NamespaceMode::Node => cri::NamespaceMode::Node as i32,
        NamespaceMode::Target => cri::NamespaceMode::Target as i32,
    }
}

pub(crate) fn sorted(m: &HashMap<String, String>) -> BTreeMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

pub(crate) fn unsorted(m: &BTreeMap<String, String>) -> HashMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// `RunPodSandboxRequest` → core config.
pub fn pod_config(req: &cri::RunPodSandboxRequest) -> Result<PodSandboxConfig, Error> {
    let c = req
        .config
        .as_ref()
        .ok_or_else(|| Error::InvalidArgument("config is required".into()))?;
    let m = c
        .metadata
        .as_ref()
        .ok_or_else(|| Error::InvalidArgument("config.metadata is required".into()))?;
    let attempt = m.attempt;
    let mut port_mappings = Vec::new();
    for (i, p) in c.port_mappings.iter().enumerate() {
        let protocol = match cri::Protocol::try_from(p.protocol) {
            Ok(cri::Protocol::Tcp) => "tcp",
            Ok(cri::Protocol::Udp) => "udp",
            Ok(cri::Protocol::Sctp) => "sctp",
            Err(_) => {
                return Err(Error::InvalidArgument(format!(
                    "config.port_mappings[{i}].protocol: unknown protocol {}",
                    p.protocol
                )))
            }
        };
        let port = |v: i32, f: &str| {
            u16::try_from(v).map_err(|_| {
                Error::InvalidArgument(format!("config.port_mappings[{i}].{f}: {v} is not a port"))
            })
        };
        if p.host_port == 0 {
            continue; // no host port: nothing for portmap to do (kubelet sends these too)
        }
        port_mappings.push(PortMapping {
            host_port: port(p.host_port, "host_port")?,
            container_port: port(p.container_port, "container_port")?,
            protocol: protocol.into(),
            host_ip: p.host_ip.clone(),
        });
    }
    let sysctls = c
        .linux
        .as_ref()
        .map(|l| sorted(&l.sysctls))
        .unwrap_or_default();
    let se = c
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.selinux_options.clone())
        .unwrap_or_default();
    let options = c
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref());
    let ns = match options {
        Some(o) => NamespaceOptions {
            network: mode(o.network, "namespace_options.network")?,
            pid: mode(o.pid, "namespace_options.pid")?,
            ipc: mode(o.ipc, "namespace_options.ipc")?,
        },
        None => NamespaceOptions::default(),
    };
    let user_namespace = user_namespace(
        options.and_then(|o| o.userns_options.as_ref()),
        "namespace_options.userns_options",
    )?;
    let cgroup_parent = c
        .linux
        .as_ref()
        .map(|l| l.cgroup_parent.clone())
        .unwrap_or_default();
    Ok(PodSandboxConfig {
        metadata: PodSandboxMetadata {
            name: m.name.clone(),
            namespace: m.namespace.clone(),
            uid: m.uid.clone(),
            attempt,
        },
        hostname: c.hostname.clone(),
        log_directory: c.log_directory.clone(),
        dns: c.dns_config.as_ref().map(|d| DnsConfig {
            servers: d.servers.clone(),
            searches: d.searches.clone(),
            options: d.options.clone(),
        }),
        port_mappings,
        labels: sorted(&c.labels),
        annotations: sorted(&c.annotations),
        namespace_options: ns,
        runtime_handler: req.runtime_handler.clone(),
        cgroup_parent,
        sysctls,
        selinux: [se.user, se.role, se.r#type, se.level],
        privileged: c
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .is_some_and(|s| s.privileged),
        user_namespace,
        resources: c
            .linux
            .as_ref()
            .and_then(|l| l.resources.as_ref())
            .map(super::resources),
        overhead: c
            .linux
            .as_ref()
            .and_then(|l| l.overhead.as_ref())
            .map(super::resources),
    })
}

/// CRI `IDMapping`s → core ranges.
pub(crate) fn id_mappings(m: &[cri::IdMapping]) -> Vec<IdMapping> {
    m.iter()
        .map(|r| IdMapping {
            container_id: r.container_id,
            host_id: r.host_id,
            length: r.length,
        })
        .collect()
}

fn id_mappings_to_cri(m: &[IdMapping]) -> Vec<cri::IdMapping> {
    m.iter()
        .map(|r| cri::IdMapping {
            container_id: r.container_id,
            host_id: r.host_id,
            length: r.length,
        })
        .collect()
}

/// CRI `UserNamespace` → the pod's own user namespace (POD mode) or none (NODE, or unset).
/// CONTAINER and TARGET are not modes a user namespace can have; the maps themselves are
/// checked by the core.
pub(crate) fn user_namespace(
    u: Option<&cri::UserNamespace>,
    field: &str,
) -> Result<Option<IdMap>, Error> {
    let Some(u) = u else {
        return Ok(None);
    };
    match mode(u.mode, &format!("{field}.mode"))? {
        NamespaceMode::Node => {
            if !u.uids.is_empty() || !u.gids.is_empty() {
                return Err(Error::InvalidArgument(format!(
                    "{field}: mode NODE takes no uid or gid mappings"
                )));
            }
            Ok(None)
        }
        NamespaceMode::Pod => Ok(Some(IdMap {
            uids: id_mappings(&u.uids),
            gids: id_mappings(&u.gids),
        })),
        m => Err(Error::InvalidArgument(format!(
            "{field}.mode: {m:?} is not supported for user namespaces (only POD and NODE)"
        ))),
    }
}

/// The pod's user namespace as CRI reports it back.
fn user_namespace_to_cri(u: Option<&IdMap>) -> Option<cri::UserNamespace> {
    Some(match u {
        Some(m) => cri::UserNamespace {
            mode: cri::NamespaceMode::Pod as i32,
            uids: id_mappings_to_cri(&m.uids),
            gids: id_mappings_to_cri(&m.gids),
        },
        None => cri::UserNamespace {
            mode: cri::NamespaceMode::Node as i32,
            ..Default::default()
        },
    })
}

fn state_to_cri(s: SandboxState) -> i32 {
    match s {
        SandboxState::Ready => cri::PodSandboxState::SandboxReady as i32,
        SandboxState::Creating | SandboxState::NotReady => {
            cri::PodSandboxState::SandboxNotready as i32
        }
    }
}

pub(crate) fn metadata_to_cri(m: &PodSandboxMetadata) -> cri::PodSandboxMetadata {
    cri::PodSandboxMetadata {
        name: m.name.clone(),
        namespace: m.namespace.clone(),
        uid: m.uid.clone(),
        attempt: m.attempt,
    }
}

/// Core status → CRI `PodSandboxStatus`.
pub fn status_to_cri(s: &SandboxStatus) -> cri::PodSandboxStatus {
    let mut ips = s.ips.iter();
    cri::PodSandboxStatus {
        id: s.id.clone(),
        metadata: Some(metadata_to_cri(&s.metadata)),
        state: state_to_cri(s.state),
        created_at: s.created_at,
        network: Some(cri::PodSandboxNetworkStatus {
            ip: ips.next().cloned().unwrap_or_default(),
            additional_ips: ips.map(|ip| cri::PodIp { ip: ip.clone() }).collect(),
        }),
        linux: Some(cri::LinuxPodSandboxStatus {
            namespaces: Some(cri::Namespace {
                options: Some(cri::NamespaceOption {
                    network: mode_to_cri(s.namespace_options.network),
                    pid: mode_to_cri(s.namespace_options.pid),
                    ipc: mode_to_cri(s.namespace_options.ipc),
                    userns_options: user_namespace_to_cri(s.user_namespace.as_ref()),
                    ..Default::default()
                }),
            }),
        }),
        labels: unsorted(&s.labels),
        annotations: unsorted(&s.annotations),
        runtime_handler: s.runtime_handler.clone(),
    }
}

/// Core status → CRI `PodSandbox` (list entry).
pub fn sandbox_to_cri(s: &SandboxStatus) -> cri::PodSandbox {
    cri::PodSandbox {
        id: s.id.clone(),
        metadata: Some(metadata_to_cri(&s.metadata)),
        state: state_to_cri(s.state),
        created_at: s.created_at,
        labels: unsorted(&s.labels),
        annotations: unsorted(&s.annotations),
        runtime_handler: s.runtime_handler.clone(),
    }
}

/// CRI filter → core filter. An id that is not hex matches nothing, as kubelet expects.
pub fn filter(f: Option<&cri::PodSandboxFilter>) -> Result<Option<SandboxFilter>, Error> {
    let Some(f) = f else {
        return Ok(Some(SandboxFilter::default()));
    };
    let id_prefix = if f.id.is_empty() {
        None
    } else if crate::validate::id_prefix(&f.id).is_ok() {
        Some(f.id.to_ascii_lowercase())
    } else {
        return Ok(None);
    };
    let state = match f
        .state
        .as_ref()
        .map(|s| cri::PodSandboxState::try_from(s.state))
    {
        None => None,
        Some(Ok(cri::PodSandboxState::SandboxReady)) => Some(SandboxState::Ready),
        Some(Ok(cri::PodSandboxState::SandboxNotready)) => Some(SandboxState::NotReady),
        Some(Err(_)) => return Err(Error::InvalidArgument("filter.state: unknown state".into())),
    };
    Ok(Some(SandboxFilter {
        id_prefix,
        state,
        labels: sorted(&f.label_selector),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> cri::RunPodSandboxRequest {
        cri::RunPodSandboxRequest {
            config: Some(cri::PodSandboxConfig {
                metadata: Some(cri::PodSandboxMetadata {
                    name: "p".into(),
                    namespace: "ns".into(),
                    uid: "u".into(),
                    attempt: 1,
                }),
                port_mappings: vec![cri::PortMapping {
                    protocol: cri::Protocol::Udp as i32,
                    container_port: 53,
                    host_port: 5353,
                    host_ip: String::new(),
                }],
                linux: Some(cri::LinuxPodSandboxConfig {
                    security_context: Some(cri::LinuxSandboxSecurityContext {
                        namespace_options: Some(cri::NamespaceOption {
                            network: cri::NamespaceMode::Node as i32,
                            pid: cri::NamespaceMode::Container as i32,
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            runtime_handler: "runc".into(),
        }
    }

    #[test]
    fn converts_requests() {
        let c = pod_config(&req()).unwrap();
        assert_eq!(c.metadata.attempt, 1);
        assert_eq!(c.port_mappings[0].protocol, "udp");
        assert_eq!(c.namespace_options.network, NamespaceMode::Node);
        assert_eq!(c.namespace_options.pid, NamespaceMode::Container);
        assert_eq!(c.namespace_options.ipc, NamespaceMode::Pod);
        let mut r = req();
        r.config.as_mut().unwrap().metadata = None;
        assert!(pod_config(&r)
            .unwrap_err()
            .to_string()
            .contains("config.metadata"));
    }
}
