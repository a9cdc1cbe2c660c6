//! The pod cgroups this daemon made, written down under its own state root
//! (`<root>/cgroups/<pod id>`, holding the cgroup's name) before the cgroup can exist and
//! erased once it is removed. The self-audit collects only cgroups written down here: a cgroup
//! merely found under the configured parent may be another daemon's (two daemons with their
//! own roots may share a parent), and removing it would take that daemon's pods.

use std::path::{Path, PathBuf};

use crate::error::HostError;

fn dir(root: &Path) -> PathBuf {
    root.join("cgroups")
}

/// Writes down that pod `id`'s cgroup `cgroup` is ours. No fsync: cgroups do not outlive
/// the node's memory, so the note need only outlive the daemon's process (the page cache
/// holds it), and RunPodSandbox pays no disk flush for it.
pub(crate) fn note(root: &Path, id: &str, cgroup: &str) -> Result<(), HostError> {
    let d = dir(root);
    crate::state::files::private_dir_all(&d)?;
    crate::state::files::write_private(&d.join(id), cgroup.as_bytes())
}

/// Erases the note of pod `id` (none: fine).
pub(crate) fn forget(root: &Path, id: &str) -> Result<(), HostError> {
    let p = dir(root).join(id);
    match std::fs::remove_file(&p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(HostError::io("remove", &p, e)),
        _ => Ok(()),
    }
}

/// The cgroup written down for pod `id`, if any.
pub(crate) fn of(root: &Path, id: &str) -> Option<String> {
    let raw = crate::untrusted_fs::read_file(&dir(root).join(id), 4096).ok()?;
    let cg = String::from_utf8(raw).ok()?;
    let plausible = !cg.is_empty()
        && !cg.contains(['\0', '\n'])
        && !cg.split('/').any(|s| s == "..")
        && cg.contains(id);
    plausible.then_some(cg)
}

/// Every pod with a note: (pod id, the note's path), the notes not read yet (the audit reads
/// only those of pods without a record).
pub(crate) fn noted(root: &Path) -> Vec<(String, PathBuf)> {
    let d = dir(root);
    crate::state::list_dir(&d)
        .into_iter()
        .filter(|n| crate::validate::full_id(n).is_ok())
        .map(|id| {
            let p = d.join(&id);
            (id, p)
        })
        .collect()
}
