//! A container's device nodes: the ones it asks for, looked up on the host, and for a
//! privileged container every char and block device of the host's /dev (as containerd and
//! CRI-O give it), its own requests winning.

use super::spec;
use crate::error::{Error, Result};
use crate::model::container::ContainerConfig;

/// Looks each requested device up on the host; a privileged container also gets every
/// device node of the host's /dev (as containerd and CRI-O do), its own requests winning.
pub(super) fn devices(c: &ContainerConfig) -> Result<Vec<spec::DeviceNode>> {
    let mut out = Vec::new();
    if c.security.privileged {
        host_devices(std::path::Path::new("/dev"), &mut out);
        out.retain(|d| {
            !c.devices
                .iter()
                .any(|r| r.container_path == d.container_path)
        });
    }
    for d in &c.devices {
        let m = std::fs::metadata(&d.host_path).map_err(|e| {
            Error::InvalidArgument(format!("devices.host_path {}: {e}", d.host_path))
        })?;
        let node =
            device_node(d.container_path.clone(), &m, d.permissions.clone()).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "devices.host_path {} is not a device node",
                    d.host_path
                ))
            })?;
        out.push(node);
    }
    Ok(out)
}

/// Every char and block device below `dir`, skipping the directories a container gets its
/// own of (pts, shm, mqueue) and never following symlinks.
fn host_devices(dir: &std::path::Path, out: &mut Vec<spec::DeviceNode>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if m.file_type().is_dir() {
            if !matches!(
                e.file_name().to_str(),
                Some("pts" | "shm" | "mqueue" | ".lxc" | ".udev")
            ) {
                host_devices(&p, out);
            }
            continue;
        }
        // /dev/console is the container's own terminal, /dev/ptmx comes with devpts.
        if p == std::path::Path::new("/dev/console") || p == std::path::Path::new("/dev/ptmx") {
            continue;
        }
        out.extend(device_node(
            p.to_string_lossy().into_owned(),
            &m,
            "rwm".into(),
        ));
    }
}

/// The device node `m` describes, as `container_path` with cgroup `permissions`; `None` if
/// it is not a char or block device.
fn device_node(
    container_path: String,
    m: &std::fs::Metadata,
    permissions: String,
) -> Option<spec::DeviceNode> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let typ = if m.file_type().is_char_device() {
        "c"
    } else if m.file_type().is_block_device() {
        "b"
    } else {
        return None;
    };
    let rdev = m.rdev();
    Some(spec::DeviceNode {
        container_path,
        typ: typ.to_string(),
        major: nix::sys::stat::major(rdev) as i64,
        minor: nix::sys::stat::minor(rdev) as i64,
        mode: m.mode() & 0o7777,
        permissions,
    })
}
