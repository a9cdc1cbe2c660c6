//! Seccomp profiles. `RuntimeDefault` is the allow-list profile Docker, containerd and CRI-O
//! use (moby's `profiles/seccomp/default.json`, kept unmodified next to this file; its
//! provenance is in `SECCOMP_PROVENANCE.md`): everything not listed fails with EPERM, `clone`
//! is allowed only without namespace flags and `clone3` fails with ENOSYS (so libc falls back
//! to `clone`) unless the container has CAP_SYS_ADMIN, and capability-gated syscalls are
//! allowed only to containers that hold the capability. Such a profile is turned into the OCI
//! form for this host (its architecture, its kernel) and the container's capabilities the way
//! moby does it; `Localhost` profiles in the same format get the same treatment, plain OCI
//! ones pass through.

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};

use super::validate::invalid;
use crate::error::Result;

/// moby's default profile, as data.
const DEFAULT_PROFILE: &str = include_str!("seccomp_default.json");

/// Largest `Localhost` profile read.
const MAX_PROFILE: u64 = 1 << 20;

/// What a profile's conditions are checked against.
#[derive(Debug, Clone)]
pub struct Host {
    /// The architecture as profiles name it in `includes`/`excludes` (`amd64`, `arm64`…).
    pub arch: &'static str,
    /// The libseccomp name of the native architecture (`SCMP_ARCH_X86_64`…).
    pub scmp_arch: &'static str,
    /// Kernel version (major, minor).
    pub kernel: (u32, u32),
}

impl Host {
    /// This machine.
    pub fn current() -> Host {
        let (arch, scmp_arch) = match std::env::consts::ARCH {
            "x86_64" => ("amd64", "SCMP_ARCH_X86_64"),
            "aarch64" => ("arm64", "SCMP_ARCH_AARCH64"),
            "x86" => ("x86", "SCMP_ARCH_X86"),
            "arm" => ("arm", "SCMP_ARCH_ARM"),
            "powerpc64" => ("ppc64le", "SCMP_ARCH_PPC64LE"),
            "s390x" => ("s390x", "SCMP_ARCH_S390X"),
            "riscv64" => ("riscv64", "SCMP_ARCH_RISCV64"),
            other => (other, "SCMP_ARCH_NATIVE"),
        };
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        Host {
            arch,
            scmp_arch,
            kernel: parse_version(&release).unwrap_or((0, 0)),
        }
    }
}

/// `"6.18.0-1-amd64"` → `(6, 18)`.
fn parse_version(s: &str) -> Option<(u32, u32)> {
    let mut it = s.trim().split(['.', '-']);
    let major = it.next()?.parse().ok()?;
    let minor = it.next().and_then(|m| m.parse().ok()).unwrap_or(0);
    Some((major, minor))
}

/// The RuntimeDefault profile for a container with capability set `caps` (OCI names,
/// `CAP_…`) on this host.
pub fn runtime_default_seccomp(caps: &BTreeSet<String>) -> Result<Value> {
    let profile: Value = serde_json::from_str(DEFAULT_PROFILE)
        .map_err(|e| invalid(format!("built-in seccomp profile: {e}")))?;
    convert(&profile, caps, &Host::current())
}

/// Loads a `Localhost` profile (an OCI seccomp object, or a profile in Docker's format,
/// converted as the default one is).
pub fn localhost_seccomp(path: &str, caps: &BTreeSet<String>) -> Result<Value> {
    let bad = |what: String| invalid(format!("security_context.seccomp: profile {path}: {what}"));
    let data = crate::untrusted_fs::read_file(std::path::Path::new(path), MAX_PROFILE)
        .map_err(|e| bad(e.to_string()))?;
    let v: Value = serde_json::from_slice(&data).map_err(|e| bad(format!("not JSON: {e}")))?;
    let out = convert(&v, caps, &Host::current())
        .map_err(|e| bad(format!("not a seccomp profile: {e}")))?;
    serde_json::from_value::<oci_spec::runtime::LinuxSeccomp>(out.clone())
        .map_err(|e| bad(format!("not a seccomp profile: {e}")))?;
    Ok(out)
}

/// Does a condition object (`includes` or `excludes`) hold? `all` for includes (every listed
/// capability present), any for excludes.
fn holds(cond: &Value, caps: &BTreeSet<String>, host: &Host, includes: bool) -> bool {
    let strings = |k: &str| -> Vec<&str> {
        cond.get(k)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default()
    };
    let arches = strings("arches");
    let want_caps = strings("caps");
    let min_kernel = cond
        .get("minKernel")
        .and_then(Value::as_str)
        .and_then(parse_version);
    if includes {
        (arches.is_empty() || arches.contains(&host.arch))
            && want_caps.iter().all(|c| caps.contains(*c))
            && min_kernel.is_none_or(|k| host.kernel >= k)
    } else {
        arches.contains(&host.arch)
            || want_caps.iter().any(|c| caps.contains(*c))
            || min_kernel.is_some_and(|k| host.kernel >= k)
    }
}

/// A profile in Docker's format → the OCI `LinuxSeccomp` for `caps` on `host`: the native
/// architecture and its sub-architectures from `archMap`, and only the entries whose
/// `includes` all hold and whose `excludes` do not.
pub fn convert(profile: &Value, caps: &BTreeSet<String>, host: &Host) -> Result<Value> {
    let p = profile
        .as_object()
        .ok_or_else(|| invalid("seccomp profile is not a JSON object".into()))?;
    let default = p
        .get("defaultAction")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("seccomp profile has no defaultAction".into()))?;
    let mut out = Map::new();
    out.insert("defaultAction".into(), json!(default));
    if let Some(e) = p.get("defaultErrnoRet").filter(|e| e.is_u64()) {
        out.insert("defaultErrnoRet".into(), e.clone());
    }
    let arches: Vec<Value> = match p.get("archMap").and_then(Value::as_array) {
        Some(map) => map
            .iter()
            .filter(|m| m["architecture"] == host.scmp_arch)
            .flat_map(|m| {
                std::iter::once(m["architecture"].clone()).chain(
                    m["subArchitectures"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default(),
                )
            })
            .collect(),
        None => p
            .get("architectures")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
    };
    if !arches.is_empty() {
        out.insert("architectures".into(), Value::Array(arches));
    }
    for k in ["flags", "listenerPath", "listenerMetadata"] {
        if let Some(v) = p.get(k).filter(|v| !v.is_null()) {
            out.insert(k.into(), v.clone());
        }
    }
    let mut rules = Vec::new();
    for call in p
        .get("syscalls")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let none = Value::Null;
        if !holds(call.get("includes").unwrap_or(&none), caps, host, true)
            || holds(call.get("excludes").unwrap_or(&none), caps, host, false)
        {
            continue;
        }
        let mut names: Vec<Value> = call
            .get("names")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if let Some(n) = call.get("name").filter(|n| n.is_string()) {
            names.push(n.clone());
        }
        if names.is_empty() {
            continue;
        }
        let mut rule = Map::new();
        rule.insert("names".into(), Value::Array(names));
        rule.insert(
            "action".into(),
            call.get("action")
                .cloned()
                .ok_or_else(|| invalid("seccomp rule without an action".into()))?,
        );
        if let Some(e) = call.get("errnoRet").filter(|e| e.is_u64()) {
            rule.insert("errnoRet".into(), e.clone());
        }
        if let Some(args) = call.get("args").and_then(Value::as_array) {
            let args: Vec<Value> = args
                .iter()
                .map(|a| {
                    json!({
                        "index": a["index"],
                        "value": a["value"],
                        "valueTwo": a.get("valueTwo").cloned().unwrap_or(json!(0)),
                        "op": a["op"],
                    })
                })
                .collect();
            if !args.is_empty() {
                rule.insert("args".into(), Value::Array(args));
            }
        }
        rules.push(Value::Object(rule));
    }
    out.insert("syscalls".into(), Value::Array(rules));
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn amd64() -> Host {
        Host {
            arch: "amd64",
            scmp_arch: "SCMP_ARCH_X86_64",
            kernel: (6, 18),
        }
    }

    fn rules_for<'a>(v: &'a Value, name: &str) -> Vec<&'a Value> {
        v["syscalls"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["names"].as_array().unwrap().iter().any(|n| n == name))
            .collect()
    }

    #[test]
    fn default_profile_for_a_default_container() {
        let caps: BTreeSet<String> = crate::oci::spec::DEFAULT_CAPABILITIES
            .iter()
            .map(|c| c.to_string())
            .collect();
        let profile: Value = serde_json::from_str(DEFAULT_PROFILE).unwrap();
        let v = convert(&profile, &caps, &amd64()).unwrap();
        assert_eq!(v["defaultAction"], "SCMP_ACT_ERRNO");
        assert_eq!(v["defaultErrnoRet"], 1);
        assert_eq!(
            v["architectures"],
            json!(["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"])
        );
        // clone only without namespace flags; clone3 ENOSYS; no namespace syscalls.
        let clone = rules_for(&v, "clone");
        assert_eq!(clone.len(), 1, "{clone:?}");
        assert_eq!(
            clone[0]["args"],
            json!([{"index": 0, "value": 2114060288u64, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}])
        );
        let clone3 = rules_for(&v, "clone3");
        assert_eq!(clone3.len(), 1);
        assert_eq!(
            (&clone3[0]["action"], &clone3[0]["errnoRet"]),
            (&json!("SCMP_ACT_ERRNO"), &json!(38))
        );
        for denied in [
            "unshare",
            "setns",
            "mount",
            "bpf",
            "keyctl",
            "reboot",
            "init_module",
        ] {
            assert!(rules_for(&v, denied).is_empty(), "{denied} allowed");
        }
        assert!(
            !rules_for(&v, "arch_prctl").is_empty(),
            "amd64-only call missing"
        );
        assert!(rules_for(&v, "s390_runtime_instr").is_empty());
        // ptrace is allowed from kernel 4.8 on, not before.
        assert!(!rules_for(&v, "ptrace").is_empty());
        let old = Host {
            kernel: (4, 4),
            ..amd64()
        };
        assert!(rules_for(&convert(&profile, &caps, &old).unwrap(), "ptrace").is_empty());
        // CAP_SYS_ADMIN opens the namespace calls and clone3.
        let mut admin = caps.clone();
        admin.insert("CAP_SYS_ADMIN".into());
        let v = convert(&profile, &admin, &amd64()).unwrap();
        assert!(!rules_for(&v, "unshare").is_empty());
        assert!(rules_for(&v, "clone3")
            .iter()
            .all(|r| r["action"] == "SCMP_ACT_ALLOW"));
    }

    #[test]
    fn kernel_versions() {
        assert_eq!(parse_version("6.18.0-1-amd64\n"), Some((6, 18)));
        assert_eq!(parse_version("5"), Some((5, 0)));
        assert_eq!(parse_version("x"), None);
    }
}
