//! Container messages: CreateContainer's config in; statuses, listings, filters, stats and
//! resources out.

use crate::api::v1 as cri;

use super::pod::{sorted, unsorted};
use crate::cgroups::Usage;
use crate::container::{
    BindMount, ContainerConfig, ContainerFilter, ContainerMetadata, ContainerRecord,
    ContainerState, Device, Propagation, Seccomp, SecurityContext,
};
use crate::error::Error;
use crate::lsm::AppArmor;

/// `ContainerConfig` → core config.
pub fn container_config(c: &cri::ContainerConfig) -> Result<ContainerConfig, Error> {
    let m = c
        .metadata
        .as_ref()
        .ok_or_else(|| Error::InvalidArgument("config.metadata is required".into()))?;
    let image = c
        .image
        .as_ref()
        .map(|i| i.image.clone())
        .unwrap_or_default();
    let mut mounts = Vec::new();
    for mt in &c.mounts {
        let image = mt.image.as_ref().filter(|i| !i.image.is_empty()).map(|i| {
            crate::model::container::ImageVolume {
                image: i.image.clone(),
                sub_path: mt.image_sub_path.clone(),
                ..Default::default()
            }
        });
        if image.is_none() && !mt.image_sub_path.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "mounts.image_sub_path ({}): only for an image volume (mounts.image)",
                mt.container_path
            )));
        }
        let idmap = (!mt.uid_mappings.is_empty() || !mt.gid_mappings.is_empty()).then(|| {
            crate::sandbox::IdMap {
                uids: super::pod::id_mappings(&mt.uid_mappings),
                gids: super::pod::id_mappings(&mt.gid_mappings),
            }
        });
        let propagation = match cri::MountPropagation::try_from(mt.propagation) {
            Ok(cri::MountPropagation::PropagationPrivate) => Propagation::Private,
            Ok(cri::MountPropagation::PropagationHostToContainer) => Propagation::HostToContainer,
            Ok(cri::MountPropagation::PropagationBidirectional) => Propagation::Bidirectional,
            Err(_) => {
                return Err(Error::InvalidArgument(format!(
                    "mounts.propagation: unknown value {}",
                    mt.propagation
                )))
            }
        };
        for o in &mt.mount_options {
            if !MOUNT_OPTIONS.contains(&o.as_str()) {
                return Err(Error::InvalidArgument(format!(
                    "mounts.mount_options ({}): {o:?} is not one of {MOUNT_OPTIONS:?}",
                    mt.container_path
                )));
            }
        }
        mounts.push(BindMount {
            container_path: mt.container_path.clone(),
            host_path: mt.host_path.clone(),
            readonly: mt.readonly,
            propagation,
            recursive_read_only: mt.recursive_read_only,
            idmap,
            mount_options: mt.mount_options.clone(),
            image,
        });
    }
    let linux = c.linux.clone().unwrap_or_default();
    let r = linux.resources.unwrap_or_default();
    let s = linux.security_context.unwrap_or_default();
    let caps = s.capabilities.clone().unwrap_or_default();
    if !caps.add_ambient_capabilities.is_empty() {
        return Err(Error::InvalidArgument(
            "security_context.capabilities.add_ambient_capabilities is not supported".into(),
        ));
    }
    let seccomp = match &s.seccomp {
        // Absent: unconfined (kubelet always sends the field; the deprecated
        // seccomp_profile_path it replaced is ignored).
        None => Seccomp::Unconfined,
        Some(p) => match cri::security_profile::ProfileType::try_from(p.profile_type) {
            Ok(cri::security_profile::ProfileType::RuntimeDefault) => Seccomp::RuntimeDefault,
            Ok(cri::security_profile::ProfileType::Unconfined) => Seccomp::Unconfined,
            Ok(cri::security_profile::ProfileType::Localhost) => {
                Seccomp::Localhost(p.localhost_ref.clone())
            }
            Err(_) => {
                return Err(Error::InvalidArgument(format!(
                    "security_context.seccomp.profile_type: unknown value {}",
                    p.profile_type
                )))
            }
        },
    };
    #[allow(deprecated)] // the old string field, still sent by older kubelets
    let old_apparmor = s.apparmor_profile.as_str();
    let apparmor = match (&s.apparmor, old_apparmor) {
        (Some(p), _) => match cri::security_profile::ProfileType::try_from(p.profile_type) {
            Ok(cri::security_profile::ProfileType::RuntimeDefault) => AppArmor::RuntimeDefault,
            Ok(cri::security_profile::ProfileType::Unconfined) => AppArmor::Unconfined,
            Ok(cri::security_profile::ProfileType::Localhost) => {
                AppArmor::Localhost(p.localhost_ref.clone())
            }
            Err(_) => {
                return Err(Error::InvalidArgument(format!(
                    "security_context.apparmor.profile_type: unknown value {}",
                    p.profile_type
                )))
            }
        },
        // The deprecated string form.
        (None, "") => AppArmor::Unset,
        (None, "runtime/default") => AppArmor::RuntimeDefault,
        (None, "unconfined") => AppArmor::Unconfined,
        (None, p) => match p.strip_prefix("localhost/") {
            Some(name) => AppArmor::Localhost(name.to_string()),
            None => {
                return Err(Error::InvalidArgument(format!(
                    "security_context.apparmor_profile: {p:?} is not runtime/default, unconfined or localhost/<name>"
                )))
            }
        },
    };
    let se = s.selinux_options.clone().unwrap_or_default();
    let ns = s.namespace_options.clone().unwrap_or_default();
    Ok(ContainerConfig {
        metadata: ContainerMetadata {
            name: m.name.clone(),
            attempt: m.attempt,
        },
        image,
        command: c.command.clone(),
        args: c.args.clone(),
        working_dir: c.working_dir.clone(),
        envs: c
            .envs
            .iter()
            .map(|kv| (kv.key.clone(), kv.value.clone()))
            .collect(),
        mounts,
        devices: c
            .devices
            .iter()
            .map(|d| Device {
                container_path: d.container_path.clone(),
                host_path: d.host_path.clone(),
                permissions: d.permissions.clone(),
            })
            .collect(),
        cdi_devices: c.cdi_devices.iter().map(|d| d.name.clone()).collect(),
        labels: sorted(&c.labels),
        annotations: sorted(&c.annotations),
        log_path: c.log_path.clone(),
        stdin: c.stdin,
        stdin_once: c.stdin_once,
        tty: c.tty,
        resources: super::resources(&r),
        stop_signal: stop_signal(c.stop_signal)?,
        security: SecurityContext {
            privileged: s.privileged,
            add_capabilities: caps.add_capabilities,
            drop_capabilities: caps.drop_capabilities,
            readonly_rootfs: s.readonly_rootfs,
            run_as_user: s.run_as_user.map(|v| v.value),
            run_as_group: s.run_as_group.map(|v| v.value),
            run_as_username: s.run_as_username.clone(),
            supplemental_groups: s.supplemental_groups.clone(),
            supplemental_groups_policy: match s.supplemental_groups_policy {
                0 => crate::container::GroupsPolicy::Merge,
                1 => crate::container::GroupsPolicy::Strict,
                v => {
                    return Err(Error::InvalidArgument(format!(
                        "security_context.supplemental_groups_policy: unknown value {v}"
                    )))
                }
            },
            no_new_privs: s.no_new_privs,
            pid: super::pod::mode(ns.pid, "security_context.namespace_options.pid")?,
            target_id: ns.target_id.clone(),
            masked_paths: (!s.masked_paths.is_empty()).then(|| s.masked_paths.clone()),
            readonly_paths: (!s.readonly_paths.is_empty()).then(|| s.readonly_paths.clone()),
            seccomp,
            apparmor,
            selinux: [se.user, se.role, se.r#type, se.level],
            user_namespace: super::pod::user_namespace(
                ns.userns_options.as_ref(),
                "security_context.namespace_options.userns_options",
            )?,
        },
    })
}

pub fn state_to_cri(s: ContainerState) -> i32 {
    (match s {
        ContainerState::Created => cri::ContainerState::ContainerCreated,
        ContainerState::Running => cri::ContainerState::ContainerRunning,
        ContainerState::Exited => cri::ContainerState::ContainerExited,
        ContainerState::Creating | ContainerState::Unknown => cri::ContainerState::ContainerUnknown,
    }) as i32
}

fn metadata(r: &ContainerRecord) -> cri::ContainerMetadata {
    cri::ContainerMetadata {
        name: r.config.metadata.name.clone(),
        attempt: r.config.metadata.attempt,
    }
}

fn image_spec(r: &ContainerRecord) -> cri::ImageSpec {
    cri::ImageSpec {
        image: r.config.image.clone(),
        user_specified_image: r.config.image.clone(),
        ..Default::default()
    }
}

pub fn container_to_cri(r: &ContainerRecord) -> cri::Container {
    cri::Container {
        id: r.id.clone(),
        pod_sandbox_id: r.sandbox_id.clone(),
        metadata: Some(metadata(r)),
        image: Some(image_spec(r)),
        image_ref: r.image_ref.clone(),
        state: state_to_cri(r.cri_state()),
        created_at: r.created_at,
        labels: unsorted(&r.config.labels),
        annotations: unsorted(&r.config.annotations),
        image_id: r.image_id.clone(),
    }
}

pub fn status_to_cri(r: &ContainerRecord) -> cri::ContainerStatus {
    let res = &r.config.resources;
    cri::ContainerStatus {
        stop_signal: cri::Signal::from_str_name(&crate::signals::cri_name(&r.stop_signal))
            .map_or(0, |s| s as i32),
        id: r.id.clone(),
        metadata: Some(metadata(r)),
        state: state_to_cri(r.cri_state()),
        created_at: r.created_at,
        started_at: r.started_at,
        finished_at: r.finished_at,
        exit_code: r.exit_code,
        image: Some(image_spec(r)),
        image_ref: r.image_ref.clone(),
        reason: r.reason.clone(),
        message: r.message.clone(),
        labels: unsorted(&r.config.labels),
        annotations: unsorted(&r.config.annotations),
        mounts: r
            .config
            .mounts
            .iter()
            .map(|m| cri::Mount {
                container_path: m.container_path.clone(),
                host_path: m.host_path.clone(),
                readonly: m.readonly || m.image.is_some(),
                propagation: match m.propagation {
                    Propagation::Private => 0,
                    Propagation::HostToContainer => 1,
                    Propagation::Bidirectional => 2,
                },
                recursive_read_only: m.recursive_read_only,
                mount_options: m.mount_options.clone(),
                image: m.image.as_ref().map(|v| cri::ImageSpec {
                    image: v.image.clone(),
                    image_ref: v.image_ref.clone(),
                    user_specified_image: v.image.clone(),
                    ..Default::default()
                }),
                image_sub_path: m
                    .image
                    .as_ref()
                    .map(|v| v.sub_path.clone())
                    .unwrap_or_default(),
                ..Default::default()
            })
            .collect(),
        user: r.user.as_ref().map(|u| cri::ContainerUser {
            linux: Some(cri::LinuxContainerUser {
                uid: u.uid.into(),
                gid: u.gid.into(),
                supplemental_groups: u
                    .supplemental_groups
                    .iter()
                    .map(|g| i64::from(*g))
                    .collect(),
            }),
        }),
        log_path: r
            .log_path
            .as_ref()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default(),
        resources: Some(cri::ContainerResources {
            linux: Some(cri::LinuxContainerResources {
                cpu_period: res.cpu_period,
                cpu_quota: res.cpu_quota,
                cpu_shares: res.cpu_shares,
                memory_limit_in_bytes: res.memory_limit_in_bytes,
                oom_score_adj: res.oom_score_adj,
                cpuset_cpus: res.cpuset_cpus.clone(),
                cpuset_mems: res.cpuset_mems.clone(),
                memory_swap_limit_in_bytes: res.memory_swap_limit_in_bytes,
                hugepage_limits: res
                    .hugepage_limits
                    .iter()
                    .map(|(page_size, limit)| cri::HugepageLimit {
                        page_size: page_size.clone(),
                        limit: *limit,
                    })
                    .collect(),
                unified: res
                    .unified
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            }),
            ..Default::default()
        }),
        image_id: r.image_id.clone(),
    }
}

pub fn container_filter(
    f: Option<&cri::ContainerFilter>,
) -> Result<Option<ContainerFilter>, Error> {
    let Some(f) = f else {
        return Ok(Some(ContainerFilter::default()));
    };
    let prefix = |s: &str| -> Result<Option<Option<String>>, Error> {
        if s.is_empty() {
            Ok(Some(None))
        } else if crate::validate::id_prefix(s).is_ok() {
            Ok(Some(Some(s.to_ascii_lowercase())))
        } else {
            Ok(None) // matches nothing
        }
    };
    let (Some(id_prefix), Some(sandbox_id)) = (prefix(&f.id)?, prefix(&f.pod_sandbox_id)?) else {
        return Ok(None);
    };
    let state = match f
        .state
        .as_ref()
        .map(|s| cri::ContainerState::try_from(s.state))
    {
        None => None,
        Some(Ok(cri::ContainerState::ContainerCreated)) => Some(ContainerState::Created),
        Some(Ok(cri::ContainerState::ContainerRunning)) => Some(ContainerState::Running),
        Some(Ok(cri::ContainerState::ContainerExited)) => Some(ContainerState::Exited),
        Some(Ok(cri::ContainerState::ContainerUnknown)) => Some(ContainerState::Unknown),
        Some(Err(_)) => return Err(Error::InvalidArgument("filter.state: unknown state".into())),
    };
    Ok(Some(ContainerFilter {
        id_prefix,
        state,
        sandbox_id,
        labels: sorted(&f.label_selector),
    }))
}

/// CPU and memory usage messages of a cgroup's usage, with pressure stall information
/// where the kernel keeps it (absent, never zero, where it does not).
pub fn usage_to_cri(u: &Usage, now: i64) -> (cri::CpuUsage, cri::MemoryUsage) {
    let v = |x: Option<u64>| x.map(|value| cri::UInt64Value { value });
    (
        cri::CpuUsage {
            timestamp: now,
            usage_core_nano_seconds: v(u.cpu_nanos),
            usage_nano_cores: None,
            psi: u.psi.cpu.map(psi_to_cri),
        },
        cri::MemoryUsage {
            timestamp: now,
            working_set_bytes: v(u.working_set_bytes),
            usage_bytes: v(u.memory_bytes),
            psi: u.psi.memory.map(psi_to_cri),
            ..Default::default()
        },
    )
}

/// I/O usage: only pressure stall information so far (CRI `IoUsage`), where kept.
pub fn io_to_cri(u: &Usage, now: i64) -> Option<cri::IoUsage> {
    u.psi.io.map(|p| cri::IoUsage {
        timestamp: now,
        psi: Some(psi_to_cri(p)),
    })
}

/// CRI `PsiStats` of a cgroup's `<resource>.pressure` (totals in microseconds).
fn psi_to_cri(p: crate::cgroups::Pressure) -> cri::PsiStats {
    cri::PsiStats {
        some: Some(cri::PsiData {
            total: p.some_total_us,
            avg10: p.some_avg[0],
            avg60: p.some_avg[1],
            avg300: p.some_avg[2],
        }),
        full: p.full_total_us.map(|total| cri::PsiData {
            total,
            avg10: p.full_avg[0],
            avg60: p.full_avg[1],
            avg300: p.full_avg[2],
        }),
    }
}

fn stats_with(
    r: &ContainerRecord,
    u: &Usage,
    now: i64,
    used: Option<crate::metrics::Measured>,
) -> cri::ContainerStats {
    let (cpu, memory) = usage_to_cri(u, now);
    cri::ContainerStats {
        attributes: Some(cri::ContainerAttributes {
            id: r.id.clone(),
            metadata: Some(metadata(r)),
            labels: unsorted(&r.config.labels),
            annotations: unsorted(&r.config.annotations),
        }),
        cpu: Some(cpu),
        memory: Some(memory),
        io: io_to_cri(u, now),
        // Not measured yet (just after a daemon restart): absent, as kubelet allows.
        writable_layer: used.map(|m| writable_layer(r, m)),
        swap: None,
    }
}

/// Container stats from use already read (for pod stats).
pub fn stats_of(c: &crate::metrics::ContainerUsage, now: i64) -> cri::ContainerStats {
    stats_with(&c.record, &c.cgroup.usage(), now, c.writable)
}

/// What the container wrote to its rootfs: its overlay upper dir.
fn writable_layer(r: &ContainerRecord, m: crate::metrics::Measured) -> cri::FilesystemUsage {
    let upper = r.upper_dir();
    cri::FilesystemUsage {
        timestamp: m.at,
        fs_id: Some(cri::FilesystemIdentifier {
            mountpoint: upper.to_string_lossy().into_owned(),
        }),
        used_bytes: Some(cri::UInt64Value { value: m.bytes }),
        inodes_used: Some(cri::UInt64Value { value: m.inodes }),
    }
}

/// The flags a mount may ask for (CRI `Mount.mount_options`, KEP-5855).
pub const MOUNT_OPTIONS: &[&str] = &["noexec", "nodev", "nosuid"];

/// CRI `ContainerConfig.stop_signal` as a canonical name; empty for the runtime's default.
fn stop_signal(v: i32) -> Result<String, Error> {
    match cri::Signal::try_from(v) {
        Ok(cri::Signal::RuntimeDefault) => Ok(String::new()),
        Ok(s) => crate::signals::from_cri_name(s.as_str_name()).ok_or_else(|| {
            Error::InvalidArgument(format!("stop_signal: {} is not a signal", s.as_str_name()))
        }),
        Err(_) => Err(Error::InvalidArgument(format!(
            "stop_signal: unknown value {v}"
        ))),
    }
}

/// Verbose ContainerStatus `info`: the record as JSON, with what node tools (crictl inspect)
/// read from both peers: `sandboxID`, `pid` and the OCI `runtimeSpec`.
pub fn verbose_info(
    verbose: bool,
    r: &ContainerRecord,
    spec: Option<serde_json::Value>,
) -> std::collections::HashMap<String, String> {
    if !verbose {
        return Default::default();
    }
    let mut v = serde_json::to_value(r).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("sandboxID".into(), r.sandbox_id.clone().into());
        o.insert("pid".into(), r.pid.into());
        if let Some(spec) = spec {
            o.insert("runtimeSpec".into(), spec);
        }
    }
    [("info".to_string(), v.to_string())].into_iter().collect()
}
