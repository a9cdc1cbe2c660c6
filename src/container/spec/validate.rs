//! Checks of a CRI container config before anything on the host is touched; every message
//! names the field.

use std::path::{Component, Path};
use std::str::FromStr;

use super::super::{ContainerConfig, Seccomp};
use crate::error::{Error, Result};

pub(super) fn invalid(msg: String) -> Error {
    Error::InvalidArgument(msg)
}

pub(crate) fn clean_abs(field: &str, p: &str) -> Result<()> {
    let path = Path::new(p);
    if !path.is_absolute()
        || path
            .components()
            .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
        || p.contains('\0')
    {
        return Err(invalid(format!(
            "{field} {p:?} must be an absolute path without \".\" or \"..\""
        )));
    }
    Ok(())
}

/// Parses a capability name as CRI carries it (`NET_RAW` or `CAP_NET_RAW`, any case).
pub fn parse_capability(field: &str, name: &str) -> Result<caps::Capability> {
    let upper = name.to_ascii_uppercase();
    let full = if upper.starts_with("CAP_") {
        upper
    } else {
        format!("CAP_{upper}")
    };
    caps::Capability::from_str(&full)
        .map_err(|_| invalid(format!("{field}: unknown capability {name:?}")))
}

/// Checks the whole config before anything on the host is touched; every message names the
/// field.
pub fn validate(c: &ContainerConfig) -> Result<()> {
    crate::validate::name("metadata.name", &c.metadata.name)?;
    crate::validate::labels_and_annotations(&c.labels, &c.annotations)?;
    if c.image.is_empty() {
        return Err(invalid("image.image must not be empty".into()));
    }
    if !c.working_dir.is_empty() {
        clean_abs("working_dir", &c.working_dir)?;
    }
    for (k, _) in &c.envs {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(invalid(format!("envs: bad variable name {k:?}")));
        }
    }
    for m in &c.mounts {
        clean_abs("mounts.container_path", &m.container_path)?;
        if m.image.is_some() {
            if m.propagation != super::super::Propagation::Private || m.idmap.is_some() {
                return Err(invalid(format!(
                    "mounts.image ({}): an image volume is private and takes no id map of its own",
                    m.container_path
                )));
            }
            continue;
        }
        clean_abs("mounts.host_path", &m.host_path)?;
        if m.recursive_read_only
            && (!m.readonly || m.propagation != super::super::Propagation::Private)
        {
            return Err(invalid(format!(
                "mounts.recursive_read_only ({}): needs readonly and private propagation",
                m.container_path
            )));
        }
    }
    for d in &c.devices {
        clean_abs("devices.container_path", &d.container_path)?;
        clean_abs("devices.host_path", &d.host_path)?;
        if d.permissions.is_empty() || !d.permissions.chars().all(|p| "rwm".contains(p)) {
            return Err(invalid(format!(
                "devices.permissions {:?} must be made of r, w and m",
                d.permissions
            )));
        }
    }
    if !c.log_path.is_empty() {
        let p = Path::new(&c.log_path);
        if p.is_absolute() || p.components().any(|c| !matches!(c, Component::Normal(_))) {
            return Err(invalid(format!(
                "log_path {:?} must be relative to the pod's log directory, without \"..\"",
                c.log_path
            )));
        }
    }
    let s = &c.security;
    for n in &s.add_capabilities {
        if !n.eq_ignore_ascii_case("ALL") {
            parse_capability("security_context.capabilities.add_capabilities", n)?;
        }
    }
    for n in &s.drop_capabilities {
        if !n.eq_ignore_ascii_case("ALL") {
            parse_capability("security_context.capabilities.drop_capabilities", n)?;
        }
    }
    if s.run_as_user
        .is_some_and(|u| !(0..=u32::MAX as i64).contains(&u))
        || s.run_as_group
            .is_some_and(|g| !(0..=u32::MAX as i64).contains(&g))
        || s.supplemental_groups
            .iter()
            .any(|g| !(0..=u32::MAX as i64).contains(g))
    {
        return Err(invalid(
            "security_context: user and group ids must be in 0..=4294967295".into(),
        ));
    }
    if s.run_as_user.is_some() && !s.run_as_username.is_empty() {
        return Err(invalid(
            "security_context: run_as_user and run_as_username are mutually exclusive".into(),
        ));
    }
    if s.run_as_group.is_some() && s.run_as_user.is_none() && s.run_as_username.is_empty() {
        return Err(invalid(
            "security_context.run_as_group needs run_as_user or run_as_username".into(),
        ));
    }
    if s.pid == crate::model::sandbox::NamespaceMode::Target && s.target_id.is_empty() {
        return Err(invalid(
            "security_context.namespace_options: pid TARGET needs target_id".into(),
        ));
    }
    if let Seccomp::Localhost(p) = &s.seccomp {
        clean_abs("security_context.seccomp.localhost_ref", p)?;
    }
    validate_resources(&c.resources)
}

/// Checks resource limits (CreateContainer and UpdateContainerResources).
pub fn validate_resources(r: &crate::container::Resources) -> Result<()> {
    if r.cpu_period < 0 || r.cpu_shares < 0 || r.memory_limit_in_bytes < 0 {
        return Err(invalid(
            "resources: cpu_period, cpu_shares and memory_limit_in_bytes must not be negative"
                .into(),
        ));
    }
    if r.cpu_quota > 0 && r.cpu_quota < 1000 {
        return Err(invalid(format!(
            "resources.cpu_quota {} is below the kernel's minimum of 1000",
            r.cpu_quota
        )));
    }
    if !(-1000..=1000).contains(&r.oom_score_adj) {
        return Err(invalid(format!(
            "resources.oom_score_adj {} is outside -1000..=1000",
            r.oom_score_adj
        )));
    }
    if r.memory_swap_limit_in_bytes > 0
        && r.memory_limit_in_bytes > 0
        && r.memory_swap_limit_in_bytes < r.memory_limit_in_bytes
    {
        return Err(invalid(format!(
            "resources.memory_swap_limit_in_bytes {} is below memory_limit_in_bytes {} (it counts memory plus swap)",
            r.memory_swap_limit_in_bytes, r.memory_limit_in_bytes
        )));
    }
    r.check(crate::oci::spec::cgroup_v2_only())
        .map_err(|e| invalid(format!("resources.{e}")))
}

/// Checks a pod's resources and overhead (RunPodSandbox, UpdatePodSandboxResources) as a
/// container's are checked, and what the pod's own cgroup gets of their sum, before anything
/// is written or recorded.
pub fn validate_pod_resources(
    resources: Option<&crate::container::Resources>,
    overhead: Option<&crate::container::Resources>,
) -> Result<()> {
    for (what, r) in [("resources", resources), ("overhead", overhead)] {
        if let Some(r) = r {
            validate_resources(r).map_err(|e| match e {
                Error::InvalidArgument(m) => invalid(format!("linux.{what}: {m}")),
                other => other,
            })?;
        }
    }
    let sum = crate::cgroups::PodLimits::of(resources, overhead);
    if sum.cpu_quota > crate::model::resources::MAX_CPU_QUOTA {
        return Err(invalid(format!(
            "linux.resources and overhead: a CPU quota of {} µs in all is above the kernel's {} µs",
            sum.cpu_quota,
            crate::model::resources::MAX_CPU_QUOTA
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_paths() {
        let mut c = ContainerConfig {
            image: "x".into(),
            ..Default::default()
        };
        c.metadata.name = "n".into();
        c.log_path = "../x.log".into();
        assert!(validate(&c).unwrap_err().to_string().contains("log_path"));
        c.log_path = "n/0.log".into();
        c.mounts = vec![crate::model::container::BindMount {
            container_path: "/a/../etc".into(),
            host_path: "/tmp".into(),
            ..Default::default()
        }];
        assert!(validate(&c)
            .unwrap_err()
            .to_string()
            .contains("mounts.container_path"));
    }
}
