//! CheckpointContainer: CRIU (through the runtime's `checkpoint`) dumps a running container,
//! which keeps running, into an archive laid out as CRI-O writes it, so it can be restored
//! as an image later: `checkpoint/` (CRIU's images), `config.dump` (the container's record),
//! `spec.dump` (its OCI config) and `rootfs-diff.tar` (what it wrote to its rootfs).
//!
//! CRIU works on few hosts as shipped (it must know the kernel's vDSO layout, among other
//! things), so whether it works is probed once with `criu check`; where it does not, the
//! call answers `Unimplemented` with CRIU's own reason.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use crate::error::{Error, HostError, Result};
use crate::model::container::ContainerState;
use crate::runtime::Runtime;
use crate::state::lock;

/// `criu check`: `Ok(version)` where CRIU works, else why not.
pub fn criu_probe() -> &'static std::result::Result<String, String> {
    static PROBE: OnceLock<std::result::Result<String, String>> = OnceLock::new();
    PROBE.get_or_init(|| {
        let limit = Duration::from_secs(30);
        let mut c = std::process::Command::new("criu");
        c.arg("check");
        let check = match crate::process::run(c, b"", limit) {
            Ok(out) => out,
            Err(crate::process::RunError::Spawn { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Err("criu is not installed".into())
            }
            Err(e) => return Err(format!("criu check: {e}")),
        };
        if !check.status.success() {
            let text = String::from_utf8_lossy(&check.stderr).into_owned()
                + &String::from_utf8_lossy(&check.stdout);
            let first = text
                .lines()
                .find(|l| l.starts_with("Error"))
                .or_else(|| text.lines().next())
                .unwrap_or("no output")
                .trim()
                .to_string();
            return Err(format!("criu check failed: {first}"));
        }
        let mut v = std::process::Command::new("criu");
        v.arg("--version");
        let version = crate::process::run(v, b"", limit)
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string()
            })
            .unwrap_or_default();
        Ok(version)
    })
}

/// Checkpoints running container `id` into the archive `location` (a new file; its dir must
/// exist).
pub(crate) fn checkpoint(rt: &Runtime, id: &str, location: &Path) -> Result<()> {
    if let Err(why) = criu_probe() {
        return Err(Error::Unimplemented(format!(
            "checkpointing needs CRIU, which does not work on this host: {why}"
        )));
    }
    if !location.is_absolute() || location.file_name().is_none() {
        return Err(Error::InvalidArgument(format!(
            "checkpoint location {location:?} must be an absolute file path"
        )));
    }
    if location.exists() {
        return Err(Error::InvalidArgument(format!(
            "checkpoint location {} exists already",
            location.display()
        )));
    }
    let entry = rt.container_entry(id)?;
    let _op = lock(&entry.op);
    let rec = super::status::refresh(rt, &entry);
    if rec.state != ContainerState::Running {
        return Err(Error::FailedPrecondition(format!(
            "container {} is {:?}; only a running container can be checkpointed",
            rec.id, rec.state
        )));
    }
    let runtime = rt.handler(&rec.runtime_handler)?;
    let work = rec.dir.join("checkpoint.tmp");
    let _ = std::fs::remove_dir_all(&work);
    let result = (|| -> Result<()> {
        let host = |what: &'static str, p: &Path, e: std::io::Error| {
            Error::step("checkpoint container", &rec.id, HostError::io(what, p, e))
        };
        for d in [work.join("checkpoint"), work.join("criu")] {
            crate::state::files::private_dir_all(&d)
                .map_err(|e| Error::step("checkpoint container", &rec.id, e))?;
        }
        runtime
            .checkpoint(
                &rec.id,
                &work.join("checkpoint"),
                &work.join("criu"),
                true,
                &rec.files().runtime_log,
            )
            .map_err(|e| Error::step("checkpoint container", &rec.id, e))?;
        let config = serde_json::to_vec_pretty(&rec).map_err(|e| {
            Error::step(
                "checkpoint container",
                &rec.id,
                HostError::Other(e.to_string()),
            )
        })?;
        let p = work.join("config.dump");
        std::fs::write(&p, config).map_err(|e| host("write", &p, e))?;
        let p = work.join("spec.dump");
        std::fs::copy(rec.dir.join("config.json"), &p).map_err(|e| host("copy", &p, e))?;
        // What the container wrote: its overlay upper dir, walked fd-relative (the
        // container runs and may swap any path for a link meanwhile), bounded; what it
        // deleted from the image, as CRI-O lists it.
        let p = work.join("rootfs-diff.tar");
        let diff = super::rootfs_diff::write(
            &rec.upper_dir(),
            &p,
            &super::rootfs_diff::Bounds::checkpoint(),
        )
        .map_err(|e| host("write", &p, e))?;
        if !diff.skipped.is_empty() {
            tracing::info!(container_id = %rec.id, skipped = ?diff.skipped, "not archived: sockets, FIFOs and devices");
        }
        let p = work.join("deleted.files");
        let deleted: Vec<String> = diff
            .deleted
            .iter()
            .map(|d| format!("/{}", d.display()))
            .collect();
        std::fs::write(&p, serde_json::to_vec(&deleted).unwrap_or_default())
            .map_err(|e| host("write", &p, e))?;
        // The archive itself: written beside its place and renamed in, so a failure leaves
        // no half archive.
        let tmp = PathBuf::from(format!("{}.tmp-{}", location.display(), std::process::id()));
        let r = tar_dir(&work, &tmp, ".").and_then(|()| std::fs::rename(&tmp, location));
        if let Err(e) = r {
            let _ = std::fs::remove_file(&tmp);
            return Err(host("write checkpoint archive", location, e));
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&work);
    if result.is_ok() {
        tracing::info!(container_id = %rec.id, location = %location.display(), "container checkpointed");
    }
    result
}

/// Writes `dir`'s tree into a new tar file `out` (mode 0600) under `prefix`; symlinks are
/// stored, never followed.
fn tar_dir(dir: &Path, out: &Path, prefix: &str) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)?;
    let mut b = tar::Builder::new(std::io::BufWriter::new(f));
    b.follow_symlinks(false);
    b.append_dir_all(prefix, dir)?;
    b.into_inner()?
        .into_inner()
        .map_err(|e| e.into_error())?
        .sync_all()
}
