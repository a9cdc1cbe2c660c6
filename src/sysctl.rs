//! Pod sysctls (CRI `linux.sysctls`): only namespaced ones are accepted, each in a namespace
//! the pod owns (net.* needs the pod's own network namespace, IPC ones its own IPC
//! namespace, the UTS ones its own UTS namespace); anything else is refused naming the
//! sysctl. Names are normalized as kubelet does (`net/ipv4/ip_forward` = `net.ipv4.ip_forward`).

use std::collections::BTreeMap;

use crate::error::{Error, Result};

/// The namespace a sysctl belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ns {
    Net,
    Ipc,
    Uts,
}

/// Most sysctls a pod may set, and the longest value.
const MAX_SYSCTLS: usize = 256;
const MAX_VALUE: usize = 4096;

/// `a/b.c/d` (slash-separated, dots inside names) → `a.b/c.d`, as kubelet normalizes.
pub fn normalize(name: &str) -> String {
    let first = name.find(['.', '/']);
    if first.is_some_and(|i| name.as_bytes()[i] == b'/') {
        name.chars()
            .map(|c| match c {
                '/' => '.',
                '.' => '/',
                c => c,
            })
            .collect()
    } else {
        name.to_string()
    }
}

/// The namespace of a (normalized) sysctl, if it is namespaced (kubelet's list).
pub fn namespace_of(name: &str) -> Option<Ns> {
    if name.starts_with("net.") {
        return Some(Ns::Net);
    }
    if matches!(name, "kernel.hostname" | "kernel.domainname") {
        return Some(Ns::Uts);
    }
    if name.starts_with("fs.mqueue.")
        || name.starts_with("kernel.shm")
        || name.starts_with("kernel.msg")
        || name == "kernel.sem"
    {
        return Some(Ns::Ipc);
    }
    None
}

/// Checks a pod's sysctls against its namespace options; returns them normalized with their
/// namespaces.
pub fn validate(
    sysctls: &BTreeMap<String, String>,
    host_network: bool,
    host_ipc: bool,
) -> Result<Vec<(String, String, Ns)>> {
    if sysctls.len() > MAX_SYSCTLS {
        return Err(Error::InvalidArgument(format!(
            "linux.sysctls: at most {MAX_SYSCTLS} are accepted"
        )));
    }
    let mut out = Vec::new();
    for (raw, value) in sysctls {
        let name = normalize(raw);
        let bad = |why: &str| Error::InvalidArgument(format!("linux.sysctls: {raw:?} {why}"));
        if name.is_empty()
            || name.len() > 255
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            || name.split('.').any(|p| p.is_empty())
        {
            return Err(bad("is not a sysctl name"));
        }
        if value.len() > MAX_VALUE || value.contains(['\n', '\0']) {
            return Err(bad("has a value with a newline, a NUL or over 4096 bytes"));
        }
        let ns = namespace_of(&name).ok_or_else(|| {
            bad("is not namespaced: it would change the whole node, which a pod may not")
        })?;
        match ns {
            Ns::Net if host_network => {
                return Err(bad(
                    "is a network sysctl and the pod uses the host's network",
                ))
            }
            Ns::Uts if host_network => {
                return Err(bad(
                    "is a UTS sysctl and the pod uses the host's UTS namespace",
                ))
            }
            Ns::Ipc if host_ipc => {
                return Err(bad(
                    "is an IPC sysctl and the pod uses the host's IPC namespace",
                ))
            }
            _ => {}
        }
        out.push((name, value.clone(), ns));
    }
    Ok(out)
}

/// `/proc/sys/...` of a normalized name.
pub fn proc_path(name: &str) -> std::path::PathBuf {
    std::path::PathBuf::from("/proc/sys").join(name.replace('.', "/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_namespaces() {
        assert_eq!(normalize("net/ipv4/ip_forward"), "net.ipv4.ip_forward");
        assert_eq!(
            normalize("net/ipv4/conf/eth0.100/forwarding"),
            "net.ipv4.conf.eth0/100.forwarding"
        );
        assert_eq!(normalize("net.ipv4.ip_forward"), "net.ipv4.ip_forward");
        assert_eq!(
            namespace_of("net.ipv4.ip_unprivileged_port_start"),
            Some(Ns::Net)
        );
        assert_eq!(namespace_of("kernel.shm_rmid_forced"), Some(Ns::Ipc));
        assert_eq!(namespace_of("kernel.panic"), None);
        let m = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        assert!(validate(&m("kernel.panic", "1"), false, false)
            .unwrap_err()
            .to_string()
            .contains("kernel.panic"));
        assert!(validate(&m("net.ipv4.ip_forward", "1"), true, false).is_err());
        assert!(validate(&m("kernel.msgmax", "1"), false, true).is_err());
        assert!(validate(&m("net.ipv4.x", "1\n2"), false, false).is_err());
        assert!(validate(&m("net..x", "1"), false, false).is_err());
        assert_eq!(
            validate(&m("net/ipv4/ping_group_range", "0 1"), false, false).unwrap(),
            vec![("net.ipv4.ping_group_range".into(), "0 1".into(), Ns::Net)]
        );
    }
}
