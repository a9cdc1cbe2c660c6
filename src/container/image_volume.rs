//! Image volumes (CRI `Mount.image`, KEP-4639): an image's layers mounted read-only (nosuid,
//! nodev; not noexec: the contract runs binaries from them, as the peers allow) as a volume,
//! or only one path of it (`image_sub_path`). The path is resolved by us, below the image and
//! through no symlink (an image is hostile: a link to `/etc` must not become a bind of the
//! node's `/etc`), and the resolved dir or file is cloned as a mount by fd, so the runtime
//! binds exactly what was checked.

use std::os::fd::AsFd;
use std::path::{Component, Path, PathBuf};

use crate::error::{Error, HostError, Result};
use crate::image::ImageStore;
use crate::model::container::BindMount;
use crate::mounts;

/// Resolves each image volume of `mounts` against the store (absent: NotFound), recording its
/// reference (the image id PullImage answered, `sha256:…`) and layers in it; returns every
/// layer they use. A volume not asked read-only is refused: an image volume is never
/// writable.
pub(crate) fn resolve(images: &ImageStore, mounts: &mut [BindMount]) -> Result<Vec<String>> {
    let mut layers = Vec::new();
    for m in mounts {
        let Some(v) = &mut m.image else { continue };
        if !m.readonly {
            return Err(Error::InvalidArgument(format!(
                "mounts ({}): an image volume is read-only; readonly must be true",
                m.container_path
            )));
        }
        check_sub_path(&m.container_path, &v.sub_path)?;
        let img = images.get(&v.image).ok_or_else(|| Error::NotFound {
            kind: "image (of an image volume)",
            id: v.image.clone(),
        })?;
        v.image_ref = img.id.clone();
        v.layers = img.layers.clone();
        v.artifact = img.artifact;
        layers.extend(img.layers);
    }
    Ok(layers)
}

/// Mounts image volume `m` (resolved) at `at` and turns `m` into the bind the runtime makes of
/// it: read-only, with the flags the mount has (the runtime's bind remount sets exactly the
/// flags it is given).
pub(crate) fn stage(
    images: &ImageStore,
    id: &str,
    m: &mut BindMount,
    at: &Path,
    idmap: Option<std::os::fd::BorrowedFd<'_>>,
) -> Result<()> {
    let Some(v) = &m.image else { return Ok(()) };
    let lower = v
        .layers
        .iter()
        .rev()
        .map(|l| images.mount_dir(l, v.artifact))
        .collect::<Result<Vec<_>>>()?;
    let scratch = at.with_extension("image");
    mount(id, &lower, &scratch, at, &v.sub_path, idmap)?;
    m.readonly = true;
    for o in ["nosuid", "nodev"] {
        if !m.mount_options.iter().any(|x| x == o) {
            m.mount_options.push(o.into());
        }
    }
    m.host_path = at.to_string_lossy().into_owned();
    Ok(())
}

/// Checks `image_sub_path` before anything is mounted: relative, no `..`.
fn check_sub_path(container_path: &str, sub: &str) -> Result<()> {
    let p = Path::new(sub);
    if sub.contains('\0')
        || p.is_absolute()
        || p.components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(Error::InvalidArgument(format!(
            "mounts.image_sub_path ({container_path}): {sub:?} must be a relative path inside the image, without \"..\""
        )));
    }
    Ok(())
}

/// Mounts the image whose layer dirs are `lower` (top first) at `at`: all of it, or its
/// `sub` path (checked by [`check_sub_path`]). `scratch` holds the whole image's mount while
/// the part is cut out (gone after). With `idmap`, the mount is idmapped with that user
/// namespace's maps (a pod with its own user namespace).
pub(crate) fn mount(
    id: &str,
    lower: &[PathBuf],
    scratch: &Path,
    at: &Path,
    sub: &str,
    idmap: Option<std::os::fd::BorrowedFd<'_>>,
) -> Result<()> {
    let step = |e| Error::step("mount an image volume", id, e);
    match lower {
        [] => return Err(step(HostError::Other("the image has no layers".into()))),
        [only] => mounts::mount_tree_copy(only, scratch, true, None).map_err(step)?,
        _ => mounts::overlay_read_only(lower, scratch).map_err(step)?,
    }
    let r = cut(id, scratch, at, sub, idmap);
    let _ = mounts::unmount_all(scratch);
    let _ = std::fs::remove_dir(scratch);
    r
}

fn cut(
    id: &str,
    whole: &Path,
    at: &Path,
    sub: &str,
    idmap: Option<std::os::fd::BorrowedFd<'_>>,
) -> Result<()> {
    use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
    let step = |e| Error::step("mount an image volume", id, e);
    let refused =
        |why: String| Error::InvalidArgument(format!("mounts.image_sub_path {sub:?}: {why}"));
    let root = nix::fcntl::open(
        whole,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| step(HostError::sys("open", whole, e)))?;
    let rel = match sub.trim_matches('/') {
        "" => ".",
        s => s,
    };
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS
                | ResolveFlag::RESOLVE_NO_XDEV,
        );
    let part = openat2(root.as_fd(), rel, how).map_err(|e| match e {
        nix::errno::Errno::ENOENT => refused("does not exist in the image".into()),
        nix::errno::Errno::ELOOP => refused("passes through a symlink in the image".into()),
        nix::errno::Errno::EXDEV => refused("leaves the image".into()),
        e => step(HostError::sys("resolve", whole.join(rel), e)),
    })?;
    let meta = std::fs::File::from(
        part.try_clone()
            .map_err(|e| step(HostError::io("dup", whole, e)))?,
    )
    .metadata()
    .map_err(|e| step(HostError::io("stat", whole.join(rel), e)))?;
    if !meta.is_dir() && !meta.is_file() {
        return Err(refused("is neither a directory nor a regular file".into()));
    }
    let tree = mounts::clone_tree_of(part.as_fd()).map_err(step)?;
    // Not noexec (binaries in an image volume run, as the contract expects); the runtime's
    // bind remount carries exactly these flags, and in a user-namespace pod it may not clear
    // one that is set here.
    let mut attrs =
        mounts::MOUNT_ATTR_RDONLY | mounts::MOUNT_ATTR_NOSUID | mounts::MOUNT_ATTR_NODEV;
    if idmap.is_some() {
        attrs |= mounts::MOUNT_ATTR_IDMAP;
    }
    mounts::set_attrs(&tree, attrs, idmap, true).map_err(step)?;
    if meta.is_dir() {
        crate::state::files::private_dir_all(at).map_err(step)?;
    } else {
        if let Some(parent) = at.parent() {
            crate::state::files::private_dir_all(parent).map_err(step)?;
        }
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(at)
            .map_err(|e| step(HostError::io("create", at, e)))?;
    }
    mounts::attach(&tree, at).map_err(step)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_paths_stay_inside() {
        for ok in ["", "a", "a/b", "./a", "a/"] {
            check_sub_path("/v", ok).unwrap();
        }
        for bad in ["/etc", "../x", "a/../../b", "a\0b"] {
            assert!(check_sub_path("/v", bad).is_err(), "{bad:?}");
        }
    }
}
