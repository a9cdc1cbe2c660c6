//! Linux security modules a pod may ask for: AppArmor profiles and SELinux labels. What the
//! node cannot honour is refused with the field named (a profile that is not loaded), never
//! silently dropped. The exceptions, reported in the log, are the peers': AppArmor's
//! `RuntimeDefault` on a node with AppArmor but no `sandboxd-default` profile loaded runs the
//! container unconfined (kubelet asks for it on every AppArmor node), and SELinux options on
//! a node without SELinux are ignored (kubelet sends the pod's on every node).

use crate::error::{Error, Result};

pub use crate::model::container::AppArmor;

/// The profile the runtime's default stands for, when an operator loads one.
pub const DEFAULT_APPARMOR_PROFILE: &str = "sandboxd-default";

pub fn apparmor_enabled() -> bool {
    std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
        .is_ok_and(|s| s.trim() == "Y")
}

/// Is an AppArmor profile of this name loaded?
pub fn apparmor_loaded(name: &str) -> bool {
    crate::untrusted_fs::read_file(
        std::path::Path::new("/sys/kernel/security/apparmor/profiles"),
        16 << 20,
    )
    .map(|d| {
        String::from_utf8_lossy(&d)
            .lines()
            .any(|l| l.rsplit_once(" (").is_some_and(|(n, _)| n == name))
    })
    .unwrap_or(false)
}

pub fn selinux_enabled() -> bool {
    std::path::Path::new("/sys/fs/selinux/enforce").exists()
}

/// The AppArmor profile to put in the spec, or an error naming `field` when it cannot be
/// honoured on this node.
pub fn apparmor_profile(a: &AppArmor, field: &str) -> Result<Option<String>> {
    match a {
        AppArmor::Unset | AppArmor::Unconfined => Ok(None),
        AppArmor::RuntimeDefault => {
            if !apparmor_enabled() {
                return Ok(None);
            }
            if apparmor_loaded(DEFAULT_APPARMOR_PROFILE) {
                return Ok(Some(DEFAULT_APPARMOR_PROFILE.into()));
            }
            tracing::warn!(
                "{field}: RuntimeDefault asked, but no {DEFAULT_APPARMOR_PROFILE} AppArmor profile is loaded on this node; running unconfined"
            );
            Ok(None)
        }
        AppArmor::Localhost(name) => {
            let name = profile_name(name);
            if name.is_empty() || name.len() > 255 || name.contains(['\n', '\0']) {
                return Err(Error::InvalidArgument(format!(
                    "{field}: {name:?} is not a profile name"
                )));
            }
            if !apparmor_enabled() {
                return Err(Error::InvalidArgument(format!(
                    "{field}: AppArmor is not enabled on this node; profile {name:?} cannot be applied"
                )));
            }
            if !apparmor_loaded(name) {
                return Err(Error::InvalidArgument(format!(
                    "{field}: AppArmor profile {name:?} is not loaded on this node"
                )));
            }
            Ok(Some(name.to_string()))
        }
    }
}

/// The AppArmor profile a `Localhost` reference names: kubelet's references read
/// `localhost/NAME`, and the profile is NAME (the peers strip the prefix too).
fn profile_name(reference: &str) -> &str {
    reference.strip_prefix("localhost/").unwrap_or(reference)
}

/// `user:role:type:level` from CRI `SELinuxOption` fields (all empty = none); ignored (logged
/// once) on a node without SELinux, as the peers do; refused when malformed, or when only some
/// are given on a node with SELinux.
pub fn selinux_label(fields: [&str; 4], field: &str) -> Result<Option<String>> {
    if fields.iter().all(|f| f.is_empty()) {
        return Ok(None);
    }
    // The level may hold ':' (`s0:c1,c2`); the others may not.
    if fields[..3].iter().any(|f| f.contains(':'))
        || fields
            .iter()
            .any(|f| f.contains(['\n', '\0']) || f.len() > 255)
    {
        return Err(Error::InvalidArgument(format!(
            "{field}: {fields:?} is not an SELinux label"
        )));
    }
    if !selinux_enabled() {
        // Both peers ignore SELinux options on a node without SELinux (kubelet sends the
        // pod's everywhere): said once, not refused.
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            tracing::info!(
                "{field}: SELinux is not enabled on this node; SELinux options ({}) are ignored",
                fields.join(":")
            )
        });
        return Ok(None);
    }
    if fields.iter().any(|f| f.is_empty()) {
        return Err(Error::InvalidArgument(format!(
            "{field}: user, role, type and level are all needed ({fields:?})"
        )));
    }
    Ok(Some(fields.join(":")))
}

#[cfg(test)]
mod tests {
    #[test]
    fn localhost_references_name_the_profile() {
        assert_eq!(
            super::profile_name("localhost/cri-test-deny"),
            "cri-test-deny"
        );
        assert_eq!(super::profile_name("cri-test-deny"), "cri-test-deny");
        assert_eq!(super::profile_name("localhost/"), "");
    }
}
