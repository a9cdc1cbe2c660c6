//! gVisor (`runsc`): every pod is a sandbox (the infra process becomes gVisor's sandbox, its
//! containers run on gVisor's kernel), and the flags it needs on this host, probed at start.
//!
//! The platform is `ptrace` (KVM needs nested virtualisation, which many hosts lack). gVisor's
//! own network stack (`--network=sandbox`) takes the pod's interfaces over from the
//! pre-created netns, but runsc releases before 2024-08 decide that a netns is the host's by
//! finding `/proc/sys/net/core/rmem_default` in it — which newer kernels show in every netns,
//! so such a runsc refuses every pod ("cannot run with network enabled in root network
//! namespace"). There the handler uses `--network=host`: the sandbox still runs in the pod's
//! netns, with its CNI interface, but its sockets go to the kernel's stack of that netns.
//! `--oci-seccomp` (where the release has it) makes gVisor apply the spec's seccomp profile
//! inside the sandbox; without it a RuntimeDefault or localhost profile would be ignored.

use std::path::Path;

use super::Family;

/// The first runsc release whose netns check works on kernels that show
/// `net.core.rmem_default` per netns.
const NETSTACK_FIXED: u32 = 20240801;

/// `CAP_AUDIT_READ`: the last capability every runsc release knows.
const LAST_KNOWN_CAPABILITY: u8 = 37;

#[derive(Debug)]
pub struct Runsc;

impl Family for Runsc {
    fn name(&self) -> &'static str {
        "runsc"
    }

    fn claims_binary(&self, file_name: &str) -> bool {
        file_name == "runsc"
    }

    fn sandbox_process(&self) -> bool {
        true
    }

    fn node_kernel(&self) -> bool {
        false
    }

    fn exec_pid_inside(&self) -> bool {
        true
    }

    fn ro_binds_recursive(&self) -> bool {
        true
    }

    /// gVisor's capability table ends at `CAP_AUDIT_READ` (37) in the releases Debian ships
    /// (20221219): `CAP_PERFMON`, `CAP_BPF` and `CAP_CHECKPOINT_RESTORE` are refused as
    /// unknown ("unknown capability"), so a container asking for ALL could not start.
    fn last_capability(&self) -> Option<u8> {
        Some(LAST_KNOWN_CAPABILITY)
    }

    fn host_args(&self, binary: &Path) -> Vec<String> {
        let mut args = Vec::new();
        if !netstack_usable(binary) {
            args.push("--network=host".into());
        }
        // Without it gVisor ignores the spec's seccomp profile (RuntimeDefault, a localhost
        // profile): the container would run unfiltered inside the sandbox where the user
        // asked for a filter, as the CRI validation suite's seccomp specs show.
        if has_flag(binary, "oci-seccomp") {
            args.push("--oci-seccomp".into());
        }
        args
    }
}

/// The release date in `runsc --version` (`release-20240801.0` or Debian's
/// `0.0~20221219.0`).
pub fn release_date(version: &str) -> Option<u32> {
    let line = version.lines().next()?;
    let digits: String = line
        .split(|c: char| !c.is_ascii_digit())
        .find(|w| w.len() == 8)?
        .to_string();
    digits.parse().ok()
}

fn netstack_usable(runsc: &Path) -> bool {
    let mut c = std::process::Command::new(runsc);
    c.arg("--version");
    let out = crate::process::run(c, b"", std::time::Duration::from_secs(10));
    let date = out
        .ok()
        .and_then(|o| release_date(&String::from_utf8_lossy(&o.stdout)));
    match date {
        Some(d) if d >= NETSTACK_FIXED => true,
        // Old (or unknown) release: usable only where a new netns hides rmem_default.
        _ => {
            let shown = rmem_default_in_new_netns().unwrap_or(true);
            if shown {
                tracing::warn!(
                    runsc = %runsc.display(),
                    release = ?date,
                    "this runsc cannot use its own network stack on this kernel; the runsc handler uses --network=host in the pod's netns"
                );
            }
            !shown
        }
    }
}

/// Does `runsc flags` list `-NAME`?
fn has_flag(runsc: &Path, name: &str) -> bool {
    let mut c = std::process::Command::new(runsc);
    c.arg("flags");
    crate::process::run(c, b"", std::time::Duration::from_secs(10)).is_ok_and(|o| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .chain(String::from_utf8_lossy(&o.stderr).lines())
            .any(|l| l.split_whitespace().next() == Some(&format!("-{name}")))
    })
}

/// Does a fresh network namespace show `net.core.rmem_default`?
fn rmem_default_in_new_netns() -> Option<bool> {
    std::thread::spawn(|| {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).ok()?;
        // /proc/sys/net shows the netns of the task that opens it: this thread's new one.
        Some(std::fs::File::open("/proc/sys/net/core/rmem_default").is_ok())
    })
    .join()
    .ok()
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_release_dates() {
        assert_eq!(
            release_date("runsc version 0.0~20221219.0\nspec: 1.0.2-dev"),
            Some(20221219)
        );
        assert_eq!(
            release_date("runsc version release-20240801.0\n"),
            Some(20240801)
        );
        assert_eq!(release_date("runsc version"), None);
    }
}
