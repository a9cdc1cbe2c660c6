//! What the node's self-audit reports (`audit` finds and removes): the kinds of host object
//! the daemon makes, each orphan found, and the report.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

/// A kind of host object the daemon makes, in the order the audit's fix removes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A container in one of our OCI runtimes' state roots.
    RuntimeContainer,
    /// A CNI cache entry: the pod's attachment (and so its IPAM reservation) was never DELeted.
    CniCache,
    /// A host-local IPAM reservation in a network's dir under the state root that no record
    /// and no CNI cache names (a plugin killed mid-ADD): released by CNI DEL with today's
    /// config.
    IpamReservation,
    /// A mount under the state root's pod or container dirs (shm, rootfs).
    Mount,
    /// A namespace file carrying this root's tag (netns, ipc, uts, user).
    Namespace,
    /// `<root>/sandboxes/<id>`.
    SandboxDir,
    /// `<root>/containers/<id>`.
    ContainerDir,
    /// `<root>/userns/<id>`.
    UsernsDir,
    /// An attach socket or exec console under `<root>/attach` and `<root>/exec`.
    Socket,
    /// An image store `tmp/` entry whose pull or import is gone (a half-unpacked layer).
    PartialPull,
    /// A layer dir or blob in the image store that no image, container or pull references.
    UnusedImageContent,
    /// A pod cgroup this daemon made and wrote down under `<root>/cgroups/` (last: its
    /// processes must be gone first). One merely found under the parent is never listed.
    Cgroup,
}

impl Kind {
    /// Every kind, in removal order.
    pub const ALL: [Kind; 12] = [
        Kind::RuntimeContainer,
        Kind::CniCache,
        Kind::IpamReservation,
        Kind::Mount,
        Kind::Namespace,
        Kind::SandboxDir,
        Kind::ContainerDir,
        Kind::UsernsDir,
        Kind::Socket,
        Kind::PartialPull,
        Kind::UnusedImageContent,
        Kind::Cgroup,
    ];

    /// The kind's name in metrics and `sandboxctl doctor`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::RuntimeContainer => "runtime_container",
            Kind::CniCache => "cni_cache",
            Kind::IpamReservation => "ipam_reservation",
            Kind::Mount => "mount",
            Kind::Namespace => "namespace",
            Kind::SandboxDir => "sandbox_dir",
            Kind::ContainerDir => "container_dir",
            Kind::UsernsDir => "userns_dir",
            Kind::Socket => "socket",
            Kind::PartialPull => "partial_pull",
            Kind::UnusedImageContent => "unused_image_content",
            Kind::Cgroup => "cgroup",
        }
    }
}

/// One host object no record owns.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Orphan {
    /// What it is.
    pub kind: Kind,
    /// The pod or container id it was made for, where its name tells.
    pub owner: String,
    /// Where it is on the host.
    pub path: PathBuf,
    /// Since it last changed (the path's mtime), where the host tells.
    pub age: Option<Duration>,
    /// After a fix: removed, or why not.
    pub fixed: Option<std::result::Result<(), String>>,
}

/// What one audit found.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Report {
    /// Each orphan found, by kind in removal order.
    pub orphans: Vec<Orphan>,
    /// How long the audit took.
    pub took: Duration,
    /// When it ended.
    pub at: Option<SystemTime>,
}

impl Report {
    /// Orphans of each kind (every kind present, zero included).
    pub fn counts(&self) -> Vec<(Kind, usize)> {
        Kind::ALL
            .iter()
            .map(|k| (*k, self.orphans.iter().filter(|o| o.kind == *k).count()))
            .collect()
    }
}
