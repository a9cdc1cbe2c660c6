//! crictl's JSON config files (pod and container configs, as `crictl runp`/`create` read
//! them): snake_case like crictl's files, lowerCamel accepted too, enums as numbers or names.
//! Pure parsing into the CRI types (sandboxctl reads the files; the fuzzer feeds bytes).

use std::collections::HashMap;

use crate::api::v1 as cri;
use serde::Deserialize;

/// Namespace mode names, in CRI's order.
pub const MODES: &[&str] = &["POD", "CONTAINER", "NODE", "TARGET"];

/// A crictl-style pod config (snake_case like crictl's files; lowerCamel accepted too; enums
/// as numbers or names).
#[derive(Deserialize, Default)]
#[serde(default)]
struct PodJson {
    metadata: MetaJson,
    hostname: String,
    #[serde(alias = "logDirectory")]
    log_directory: String,
    #[serde(alias = "dnsConfig")]
    dns_config: Option<DnsJson>,
    #[serde(alias = "portMappings")]
    port_mappings: Vec<PortJson>,
    labels: HashMap<String, String>,
    annotations: HashMap<String, String>,
    linux: Option<LinuxJson>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct MetaJson {
    name: String,
    namespace: String,
    uid: String,
    attempt: u32,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct DnsJson {
    servers: Vec<String>,
    searches: Vec<String>,
    options: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct PortJson {
    protocol: EnumJson,
    #[serde(alias = "containerPort")]
    container_port: i32,
    #[serde(alias = "hostPort")]
    host_port: i32,
    #[serde(alias = "hostIp")]
    host_ip: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct LinuxJson {
    #[serde(alias = "cgroupParent")]
    cgroup_parent: String,
    #[serde(alias = "securityContext")]
    security_context: Option<SecJson>,
    sysctls: HashMap<String, String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct SecJson {
    #[serde(alias = "namespaceOptions")]
    namespace_options: Option<NsJson>,
    /// A privileged pod (it may hold privileged containers).
    privileged: bool,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct NsJson {
    network: EnumJson,
    pid: EnumJson,
    ipc: EnumJson,
    #[serde(alias = "usernsOptions")]
    userns_options: Option<UsernsJson>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct UsernsJson {
    mode: EnumJson,
    uids: Vec<IdMappingJson>,
    gids: Vec<IdMappingJson>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct IdMappingJson {
    #[serde(alias = "hostId")]
    host_id: u32,
    #[serde(alias = "containerId")]
    container_id: u32,
    length: u32,
}

fn id_mappings(m: &[IdMappingJson]) -> Vec<cri::IdMapping> {
    m.iter()
        .map(|m| cri::IdMapping {
            host_id: m.host_id,
            container_id: m.container_id,
            length: m.length,
        })
        .collect()
}

fn userns(u: &Option<UsernsJson>, field: &str) -> Result<Option<cri::UserNamespace>, String> {
    u.as_ref()
        .map(|u| {
            Ok(cri::UserNamespace {
                mode: u.mode.value(MODES, field)?,
                uids: id_mappings(&u.uids),
                gids: id_mappings(&u.gids),
            })
        })
        .transpose()
}

#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum EnumJson {
    Num(i32),
    Name(String),
}

impl Default for EnumJson {
    fn default() -> Self {
        EnumJson::Num(0)
    }
}

impl EnumJson {
    fn value(&self, names: &[&str], field: &str) -> Result<i32, String> {
        match self {
            EnumJson::Num(n) => Ok(*n),
            EnumJson::Name(s) => names
                .iter()
                .position(|n| n.eq_ignore_ascii_case(s))
                .map(|i| i as i32)
                .ok_or_else(|| format!("{field}: {s:?} is not one of {names:?}")),
        }
    }
}

/// A crictl-style pod config (JSON) → CRI `PodSandboxConfig`.
pub fn pod_config(json: &[u8]) -> Result<cri::PodSandboxConfig, String> {
    let p: PodJson = serde_json::from_slice(json).map_err(|e| e.to_string())?;
    const PROTOS: &[&str] = &["TCP", "UDP", "SCTP"];
    let mut ports = Vec::new();
    for pm in &p.port_mappings {
        ports.push(cri::PortMapping {
            protocol: pm.protocol.value(PROTOS, "port_mappings.protocol")?,
            container_port: pm.container_port,
            host_port: pm.host_port,
            host_ip: pm.host_ip.clone(),
        });
    }
    let linux = match &p.linux {
        None => None,
        Some(l) => {
            let ns = match l
                .security_context
                .as_ref()
                .and_then(|s| s.namespace_options.as_ref())
            {
                None => None,
                Some(n) => Some(cri::NamespaceOption {
                    network: n.network.value(MODES, "namespace_options.network")?,
                    pid: n.pid.value(MODES, "namespace_options.pid")?,
                    ipc: n.ipc.value(MODES, "namespace_options.ipc")?,
                    userns_options: userns(
                        &n.userns_options,
                        "namespace_options.userns_options.mode",
                    )?,
                    ..Default::default()
                }),
            };
            Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: l.cgroup_parent.clone(),
                sysctls: l.sysctls.clone(),
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: ns,
                    privileged: l.security_context.as_ref().is_some_and(|s| s.privileged),
                    ..Default::default()
                }),
                ..Default::default()
            })
        }
    };
    Ok(cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: p.metadata.name,
            namespace: p.metadata.namespace,
            uid: p.metadata.uid,
            attempt: p.metadata.attempt,
        }),
        hostname: p.hostname,
        log_directory: p.log_directory,
        dns_config: p.dns_config.map(|d| cri::DnsConfig {
            servers: d.servers,
            searches: d.searches,
            options: d.options,
        }),
        port_mappings: ports,
        labels: p.labels,
        annotations: p.annotations,
        linux,
        ..Default::default()
    })
}

/// A crictl-style container config (snake_case or lowerCamel; enums as numbers or names).
#[derive(Deserialize, Default)]
#[serde(default)]
struct CtrJson {
    metadata: CtrMeta,
    image: ImageJson,
    command: Vec<String>,
    args: Vec<String>,
    #[serde(alias = "workingDir")]
    working_dir: String,
    envs: Vec<KvJson>,
    mounts: Vec<MountJson>,
    devices: Vec<DeviceJson>,
    /// crictl's key (the field's proto name), or the JSON mapping's.
    #[serde(rename = "CDI_devices", alias = "CDIDevices", alias = "cdi_devices")]
    cdi_devices: Vec<CdiDeviceJson>,
    labels: HashMap<String, String>,
    annotations: HashMap<String, String>,
    #[serde(alias = "logPath")]
    log_path: String,
    stdin: bool,
    #[serde(alias = "stdinOnce")]
    stdin_once: bool,
    tty: bool,
    linux: Option<CtrLinux>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct CtrMeta {
    name: String,
    attempt: u32,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ImageJson {
    image: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct KvJson {
    key: String,
    value: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct MountJson {
    #[serde(alias = "containerPath")]
    container_path: String,
    #[serde(alias = "hostPath")]
    host_path: String,
    readonly: bool,
    propagation: EnumJson,
    #[serde(alias = "recursiveReadOnly")]
    recursive_read_only: bool,
    #[serde(alias = "uidMappings")]
    uid_mappings: Vec<IdMappingJson>,
    #[serde(alias = "gidMappings")]
    gid_mappings: Vec<IdMappingJson>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct CdiDeviceJson {
    name: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct DeviceJson {
    #[serde(alias = "containerPath")]
    container_path: String,
    #[serde(alias = "hostPath")]
    host_path: String,
    permissions: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct CtrLinux {
    resources: Option<ResJson>,
    #[serde(alias = "securityContext")]
    security_context: Option<CtrSec>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ResJson {
    #[serde(alias = "cpuPeriod")]
    cpu_period: i64,
    #[serde(alias = "cpuQuota")]
    cpu_quota: i64,
    #[serde(alias = "cpuShares")]
    cpu_shares: i64,
    #[serde(alias = "memoryLimitInBytes")]
    memory_limit_in_bytes: i64,
    #[serde(alias = "oomScoreAdj")]
    oom_score_adj: i64,
    #[serde(alias = "cpusetCpus")]
    cpuset_cpus: String,
    #[serde(alias = "cpusetMems")]
    cpuset_mems: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct CapsJson {
    #[serde(alias = "addCapabilities")]
    add_capabilities: Vec<String>,
    #[serde(alias = "dropCapabilities")]
    drop_capabilities: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ValJson {
    value: i64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ProfileJson {
    #[serde(alias = "profileType")]
    profile_type: EnumJson,
    #[serde(alias = "localhostRef")]
    localhost_ref: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct CtrSec {
    capabilities: Option<CapsJson>,
    privileged: bool,
    #[serde(alias = "namespaceOptions")]
    namespace_options: Option<CtrNs>,
    #[serde(alias = "runAsUser")]
    run_as_user: Option<ValJson>,
    #[serde(alias = "runAsGroup")]
    run_as_group: Option<ValJson>,
    #[serde(alias = "runAsUsername")]
    run_as_username: String,
    #[serde(alias = "readonlyRootfs")]
    readonly_rootfs: bool,
    #[serde(alias = "supplementalGroups")]
    supplemental_groups: Vec<i64>,
    #[serde(alias = "supplementalGroupsPolicy")]
    supplemental_groups_policy: EnumJson,
    #[serde(alias = "noNewPrivs")]
    no_new_privs: bool,
    seccomp: Option<ProfileJson>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct CtrNs {
    pid: EnumJson,
    #[serde(alias = "targetId")]
    target_id: String,
    #[serde(alias = "usernsOptions")]
    userns_options: Option<UsernsJson>,
}

/// A crictl-style container config (JSON) → CRI `ContainerConfig`.
pub fn container_config(json: &[u8]) -> Result<cri::ContainerConfig, String> {
    let c: CtrJson = serde_json::from_slice(json).map_err(|e| e.to_string())?;
    const PROPAGATION: &[&str] = &[
        "PROPAGATION_PRIVATE",
        "PROPAGATION_HOST_TO_CONTAINER",
        "PROPAGATION_BIDIRECTIONAL",
    ];
    const PROFILES: &[&str] = &["RuntimeDefault", "Unconfined", "Localhost"];
    let mut mounts = Vec::new();
    for m in &c.mounts {
        mounts.push(cri::Mount {
            container_path: m.container_path.clone(),
            host_path: m.host_path.clone(),
            readonly: m.readonly,
            propagation: m.propagation.value(PROPAGATION, "mounts.propagation")?,
            recursive_read_only: m.recursive_read_only,
            uid_mappings: id_mappings(&m.uid_mappings),
            gid_mappings: id_mappings(&m.gid_mappings),
            ..Default::default()
        });
    }
    let linux = match c.linux {
        None => None,
        Some(l) => {
            let security_context = match l.security_context {
                None => None,
                Some(s) => Some(cri::LinuxContainerSecurityContext {
                    capabilities: s.capabilities.map(|c| cri::Capability {
                        add_capabilities: c.add_capabilities,
                        drop_capabilities: c.drop_capabilities,
                        ..Default::default()
                    }),
                    privileged: s.privileged,
                    namespace_options: match s.namespace_options {
                        None => None,
                        Some(n) => Some(cri::NamespaceOption {
                            pid: n.pid.value(MODES, "namespace_options.pid")?,
                            target_id: n.target_id,
                            userns_options: userns(
                                &n.userns_options,
                                "namespace_options.userns_options.mode",
                            )?,
                            ..Default::default()
                        }),
                    },
                    run_as_user: s.run_as_user.map(|v| cri::Int64Value { value: v.value }),
                    run_as_group: s.run_as_group.map(|v| cri::Int64Value { value: v.value }),
                    run_as_username: s.run_as_username,
                    readonly_rootfs: s.readonly_rootfs,
                    supplemental_groups: s.supplemental_groups,
                    supplemental_groups_policy: s
                        .supplemental_groups_policy
                        .value(&["Merge", "Strict"], "supplemental_groups_policy")?,
                    no_new_privs: s.no_new_privs,
                    seccomp: match s.seccomp {
                        None => None,
                        Some(p) => Some(cri::SecurityProfile {
                            profile_type: p.profile_type.value(PROFILES, "seccomp.profile_type")?,
                            localhost_ref: p.localhost_ref,
                        }),
                    },
                    ..Default::default()
                }),
            };
            Some(cri::LinuxContainerConfig {
                resources: l.resources.map(|r| cri::LinuxContainerResources {
                    cpu_period: r.cpu_period,
                    cpu_quota: r.cpu_quota,
                    cpu_shares: r.cpu_shares,
                    memory_limit_in_bytes: r.memory_limit_in_bytes,
                    oom_score_adj: r.oom_score_adj,
                    cpuset_cpus: r.cpuset_cpus,
                    cpuset_mems: r.cpuset_mems,
                    ..Default::default()
                }),
                security_context,
            })
        }
    };
    Ok(cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: c.metadata.name,
            attempt: c.metadata.attempt,
        }),
        image: Some(cri::ImageSpec {
            image: c.image.image,
            ..Default::default()
        }),
        command: c.command,
        args: c.args,
        working_dir: c.working_dir,
        envs: c
            .envs
            .into_iter()
            .map(|kv| cri::KeyValue {
                key: kv.key,
                value: kv.value,
            })
            .collect(),
        mounts,
        devices: c
            .devices
            .into_iter()
            .map(|d| cri::Device {
                container_path: d.container_path,
                host_path: d.host_path,
                permissions: d.permissions,
            })
            .collect(),
        cdi_devices: c
            .cdi_devices
            .into_iter()
            .map(|d| cri::CdiDevice { name: d.name })
            .collect(),
        labels: c.labels,
        annotations: c.annotations,
        log_path: c.log_path,
        stdin: c.stdin,
        stdin_once: c.stdin_once,
        tty: c.tty,
        linux,
        ..Default::default()
    })
}
