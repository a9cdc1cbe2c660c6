//! Runtime families: how one kind of OCI runtime differs from another, stated once.
//!
//! A handler (`[runtimes.NAME]` in the config, CRI's `runtime_handler`) is a binary, its
//! flags and its state dir, plus the family it belongs to. The verbs never ask which family
//! a handler is; they ask the family what they need to know:
//!
//! - [`Family::sandbox_process`]: every pod of the handler gets a sandbox (infra) process,
//!   which the runtime turns into its sandbox or VM; the pod's netns is handed to it by path.
//! - [`Family::node_kernel`]: containers run on the node's kernel, so the daemon gives them
//!   pod user namespaces, idmapped mounts, the runtime mount namespace, and detaches staged
//!   mounts after `create`. A sandboxed or VM runtime brings its own kernel and reads staged
//!   mounts by path for as long as the container lives.
//! - [`Family::host_args`]: flags this runtime needs on this host, found at start (`probe`).
//!
//! What the monitor must know (who reaps the container's process, whether stdio is taken at
//! `start`) it learns by looking: a pid that is not its child is waited for with the
//! runtime's `wait`, and its stdio ends are published for `start`.
//!
//! Adding a family is one file here implementing [`Family`] plus its line in [`FAMILIES`];
//! a handler picks it with `family = "NAME"` in the config (or by its binary's name).

use std::path::Path;

mod crun;
mod runc;
pub mod runsc;
mod vm;

/// How one kind of runtime differs. Every method has the runc-like answer as its default.
pub trait Family: Send + Sync + std::fmt::Debug + 'static {
    /// The name `family = "…"` selects it by.
    fn name(&self) -> &'static str;

    /// Whether a handler whose binary is called `file_name` is of this family when the config
    /// does not say.
    fn claims_binary(&self, _file_name: &str) -> bool {
        false
    }

    /// Every pod gets a sandbox process, which the runtime makes its sandbox (or VM) of.
    fn sandbox_process(&self) -> bool {
        false
    }

    /// Containers run on the node's kernel (see the module's text).
    fn node_kernel(&self) -> bool {
        true
    }

    /// The highest capability number the runtime knows, when it knows fewer than the kernel:
    /// a process spec naming a later one fails to start, so "ALL" (and privileged) stop there.
    /// `None`: what the host's bounding set holds.
    fn last_capability(&self) -> Option<u8> {
        None
    }

    /// A read-only bind is read-only all through, submounts included (gVisor's gofer): a
    /// recursively read-only mount needs no staged copy then. (A staged copy held in the
    /// node's mount namespace for the container's life would keep the host path's submounts
    /// busy: the owner could not remove them.)
    fn ro_binds_recursive(&self) -> bool {
        false
    }

    /// An exec'd process runs inside the runtime's own sandbox, where a host pid cannot reach
    /// it: `exec --internal-pid-file` records its pid there, and `kill --pid` signals it.
    fn exec_pid_inside(&self) -> bool {
        false
    }

    /// Flags this runtime needs on this host before the configured ones; probed once at start
    /// (a process call with a time limit).
    fn host_args(&self, _binary: &Path) -> Vec<String> {
        Vec::new()
    }
}

/// Every family, in the order a binary's name is matched.
pub static FAMILIES: &[&dyn Family] = &[&runc::Runc, &crun::Crun, &runsc::Runsc, &vm::Vm];

/// The family a handler belongs to: the one it names, else the one claiming its binary's
/// name, else runc-like. `needs_sandbox_process = true` without a family (the older way to
/// configure a VM runtime) is the `vm` family.
pub fn family_of(h: &crate::config::RuntimeHandler) -> Result<&'static dyn Family, String> {
    if let Some(name) = &h.family {
        return FAMILIES
            .iter()
            .find(|f| f.name() == name)
            .copied()
            .ok_or_else(|| {
                format!(
                    "unknown runtime family {name:?} (known: {})",
                    FAMILIES
                        .iter()
                        .map(|f| f.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            });
    }
    if h.needs_sandbox_process {
        return Ok(&vm::Vm);
    }
    let file = h.path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    Ok(FAMILIES
        .iter()
        .find(|f| f.claims_binary(file))
        .copied()
        .unwrap_or(&runc::Runc))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RuntimeHandler;

    fn handler(path: &str) -> RuntimeHandler {
        RuntimeHandler {
            path: path.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_family_comes_from_the_config_then_the_binary() {
        assert_eq!(
            family_of(&handler("/usr/sbin/runc")).unwrap().name(),
            "runc"
        );
        assert_eq!(family_of(&handler("crun")).unwrap().name(), "crun");
        assert_eq!(
            family_of(&handler("/usr/bin/runsc")).unwrap().name(),
            "runsc"
        );
        assert_eq!(family_of(&handler("/opt/youki")).unwrap().name(), "runc");
        let mut h = handler("/opt/kata-like");
        h.needs_sandbox_process = true;
        assert_eq!(family_of(&h).unwrap().name(), "vm");
        let mut h = handler("/usr/bin/runsc");
        h.family = Some("runc".into());
        assert_eq!(family_of(&h).unwrap().name(), "runc");
        h.family = Some("kata".into());
        assert!(family_of(&h)
            .unwrap_err()
            .contains("unknown runtime family \"kata\""));
    }

    #[test]
    fn families_state_their_differences() {
        for f in FAMILIES {
            let own_kernel = matches!(f.name(), "runsc" | "vm");
            assert_eq!(f.sandbox_process(), own_kernel, "{}", f.name());
            assert_eq!(f.node_kernel(), !own_kernel, "{}", f.name());
        }
    }
}
