//! Applies one layer tar (plain, gzip or zstd) into its own directory in overlayfs format:
//! whiteouts `.wh.<name>` become 0:0 character devices, opaque markers `.wh..wh..opq` the
//! `trusted.overlay.opaque` xattr, so the layer dirs stack as overlay lowerdirs. No entry can
//! escape the layer dir: absolute paths are made relative, `..` is refused, and no path is
//! created through a symlink (every parent is checked with lstat; the dir is private to us).
//! Ownership, modes and hardlinks are kept; device nodes are skipped.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use crate::error::HostError;

/// What applying a layer did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Applied {
    pub entries: usize,
    pub whiteouts: usize,
    pub skipped_devices: usize,
    /// Bytes of file content written.
    pub bytes: u64,
}

/// Bounds on what one layer may cost: a hostile image is a decompression bomb, a million tiny
/// files, or a disk filler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most bytes of uncompressed layer (the tar stream, headers included).
    pub max_bytes: u64,
    /// Most entries in the layer.
    pub max_entries: u64,
    /// Unpacking stops once the store's filesystem has less than this free.
    pub min_free_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: 20 << 30,
            max_entries: 1_000_000,
            min_free_bytes: 256 << 20,
        }
    }
}

/// Free bytes (for unprivileged users too: root's reserve is not ours to fill) where `p` is.
pub fn free_bytes(p: &Path) -> Option<u64> {
    nix::sys::statvfs::statvfs(p)
        .ok()
        .map(|s| s.blocks_available().saturating_mul(s.fragment_size()))
}

/// Wraps `raw` in the right decompressor, by magic number.
pub fn decompress<'a>(mut raw: Box<dyn Read + 'a>) -> Result<Box<dyn Read + 'a>, HostError> {
    let mut magic = [0u8; 4];
    let mut n = 0;
    while n < 4 {
        match raw.read(&mut magic[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) => return Err(HostError::Other(format!("read layer: {e}"))),
        }
    }
    let head = std::io::Cursor::new(magic[..n].to_vec());
    let chained: Box<dyn Read + 'a> = Box::new(head.chain(raw));
    Ok(if n >= 2 && magic[..2] == [0x1f, 0x8b] {
        Box::new(flate2::read::GzDecoder::new(chained))
    } else if n == 4 && magic == [0x28, 0xb5, 0x2f, 0xfd] {
        Box::new(
            ruzstd::decoding::StreamingDecoder::new(chained)
                .map_err(|e| HostError::Other(format!("zstd layer: {e}")))?,
        )
    } else {
        chained
    })
}

/// Makes a tar path relative and free of `..`; `None` for the root itself.
fn clean(path: &Path) -> Result<Option<PathBuf>, HostError> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(HostError::Other(format!(
                    "layer entry {} escapes the layer (\"..\")",
                    path.display()
                )))
            }
        }
    }
    Ok(if out.as_os_str().is_empty() {
        None
    } else {
        Some(out)
    })
}

/// Creates the parents of `rel` under `root`, refusing any existing parent that is not a
/// real directory (a symlink planted by an earlier entry could otherwise redirect us).
fn safe_parent(root: &Path, rel: &Path) -> Result<PathBuf, HostError> {
    let mut cur = root.to_path_buf();
    if let Some(parent) = rel.parent() {
        for c in parent.components() {
            cur.push(c);
            match std::fs::symlink_metadata(&cur) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(HostError::Other(format!(
                        "layer entry {} has a parent that is not a directory (symlink?)",
                        rel.display()
                    )))
                }
                Err(_) => {
                    std::fs::create_dir(&cur).map_err(|e| HostError::io("create", &cur, e))?;
                }
            }
        }
    }
    Ok(root.join(rel))
}

fn remove_any(p: &Path) {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => {
            let _ = std::fs::remove_dir_all(p);
        }
        Ok(_) => {
            let _ = std::fs::remove_file(p);
        }
        Err(_) => {}
    }
}

fn cstr(p: &Path) -> Result<CString, HostError> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| HostError::Other(format!("{} contains NUL", p.display())))
}

fn lchown(p: &Path, uid: u64, gid: u64) -> Result<(), HostError> {
    let c = cstr(p)?;
    // SAFETY: lchown with a valid NUL-terminated path; it does not follow symlinks.
    if unsafe { libc::lchown(c.as_ptr(), uid as libc::uid_t, gid as libc::gid_t) } != 0 {
        return Err(HostError::io("chown", p, std::io::Error::last_os_error()));
    }
    Ok(())
}

fn whiteout(p: &Path) -> Result<(), HostError> {
    let c = cstr(p)?;
    // SAFETY: mknod with a valid path, a char-device mode and device 0:0 (overlay's whiteout).
    if unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR, 0) } != 0 {
        return Err(HostError::io(
            "create whiteout",
            p,
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

fn opaque(dir: &Path) -> Result<(), HostError> {
    let c = cstr(dir)?;
    let name = c"trusted.overlay.opaque";
    // SAFETY: lsetxattr with valid NUL-terminated strings and a 1-byte value buffer.
    if unsafe { libc::lsetxattr(c.as_ptr(), name.as_ptr(), b"y".as_ptr().cast(), 1, 0) } != 0 {
        return Err(HostError::io(
            "mark opaque",
            dir,
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// A reader that hashes what passes through it (to check a layer's diff id), refusing to
/// deliver more than `max` bytes.
struct Hashing<R> {
    inner: R,
    hash: sha2::Sha256,
    read: u64,
    max: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use sha2::Digest;
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read > self.max {
            return Err(std::io::Error::other(format!(
                "the uncompressed layer is larger than the limit of {} bytes",
                self.max
            )));
        }
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// Applies the (possibly compressed) layer tar `raw` into the empty directory `root` within
/// `limits` and returns what it did with the uncompressed tar's digest (`sha256:<hex>`, the
/// diff id).
pub fn apply_layer(
    raw: Box<dyn Read + '_>,
    root: &Path,
    limits: &Limits,
) -> Result<(Applied, String), HostError> {
    use sha2::Digest;
    let mut hashing = Hashing {
        inner: decompress(raw)?,
        hash: sha2::Sha256::new(),
        read: 0,
        max: limits.max_bytes,
    };
    let applied = apply_plain(&mut hashing, root, limits)?;
    // What follows the tar's end still counts for the diff id (and against the limit).
    std::io::copy(&mut hashing, &mut std::io::sink())
        .map_err(|e| HostError::Other(format!("read layer: {e}")))?;
    let digest = format!("sha256:{}", hex(&hashing.hash.finalize()));
    Ok((applied, digest))
}

/// Lowercase hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Applies the (possibly compressed) layer tar `raw` into the empty directory `root`.
pub fn apply(raw: Box<dyn Read + '_>, root: &Path) -> Result<Applied, HostError> {
    apply_layer(raw, root, &Limits::default()).map(|(a, _)| a)
}

/// Every this many bytes written, the free space is checked again.
const FREE_CHECK_EVERY: u64 = 64 << 20;

fn apply_plain(reader: &mut dyn Read, root: &Path, limits: &Limits) -> Result<Applied, HostError> {
    let check_free = || {
        match free_bytes(root) {
        Some(free) if free < limits.min_free_bytes => Err(HostError::Other(format!(
            "only {free} bytes are free where layers are unpacked ({}); stopping (the reserve is {})",
            root.display(),
            limits.min_free_bytes
        ))),
        _ => Ok(()),
    }
    };
    check_free()?;
    let mut next_check = FREE_CHECK_EVERY;
    let mut applied = Applied::default();
    let mut archive = tar::Archive::new(reader);
    let entries = archive
        .entries()
        .map_err(|e| HostError::Other(format!("layer tar: {e}")))?;
    let mut dir_times = Vec::new();
    for entry in entries {
        let mut entry = entry.map_err(|e| HostError::Other(format!("layer tar: {e}")))?;
        let raw_path = entry
            .path()
            .map_err(|e| HostError::Other(format!("layer tar path: {e}")))?
            .into_owned();
        let Some(rel) = clean(&raw_path)? else {
            continue;
        };
        applied.entries += 1;
        if applied.entries as u64 > limits.max_entries {
            return Err(HostError::Other(format!(
                "the layer has more than {} entries",
                limits.max_entries
            )));
        }
        let name = rel
            .file_name()
            .map(|n| n.as_bytes().to_vec())
            .unwrap_or_default();
        if name == b".wh..wh..opq" {
            let dir = safe_parent(root, &rel)?;
            let dir = dir.parent().unwrap_or(root).to_path_buf();
            opaque(&dir)?;
            applied.whiteouts += 1;
            continue;
        }
        if let Some(hidden) = name.strip_prefix(b".wh.") {
            // The whited-out name is an entry name like any other: `.wh...` would name the
            // parent directory and `.wh..` this one.
            if hidden.is_empty() || hidden == b"." || hidden == b".." || hidden.contains(&b'/') {
                return Err(HostError::Other(format!(
                    "layer entry {} is a whiteout of {:?}, which is not a name",
                    rel.display(),
                    String::from_utf8_lossy(hidden)
                )));
            }
            let target =
                safe_parent(root, &rel)?.with_file_name(std::ffi::OsStr::from_bytes(hidden));
            remove_any(&target);
            whiteout(&target)?;
            applied.whiteouts += 1;
            continue;
        }
        let dest = safe_parent(root, &rel)?;
        let header = entry.header().clone();
        let mode = header.mode().unwrap_or(0o644) & 0o7777;
        let (uid, gid) = (header.uid().unwrap_or(0), header.gid().unwrap_or(0));
        let kind = header.entry_type();
        if !kind.is_dir() {
            remove_any(&dest);
        }
        match kind {
            tar::EntryType::Directory => {
                match std::fs::symlink_metadata(&dest) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => {
                        remove_any(&dest);
                        std::fs::create_dir(&dest)
                            .map_err(|e| HostError::io("create", &dest, e))?;
                    }
                    Err(_) => {
                        std::fs::create_dir(&dest).map_err(|e| HostError::io("create", &dest, e))?
                    }
                }
                dir_times.push((dest.clone(), header.mtime().unwrap_or(0)));
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&dest)
                    .map_err(|e| HostError::io("create", &dest, e))?;
                applied.bytes += std::io::copy(&mut entry, &mut f)
                    .map_err(|e| HostError::io("write", &dest, e))?;
                if applied.bytes >= next_check {
                    check_free()?;
                    next_check = applied.bytes + FREE_CHECK_EVERY;
                }
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(|e| HostError::Other(format!("symlink target: {e}")))?
                    .ok_or_else(|| {
                        HostError::Other(format!("symlink {} has no target", rel.display()))
                    })?;
                std::os::unix::fs::symlink(&target, &dest)
                    .map_err(|e| HostError::io("symlink", &dest, e))?;
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name()
                    .map_err(|e| HostError::Other(format!("hardlink target: {e}")))?
                    .ok_or_else(|| {
                        HostError::Other(format!("hardlink {} has no target", rel.display()))
                    })?;
                let target = clean(&target)?.ok_or_else(|| {
                    HostError::Other(format!("hardlink {} to the root", rel.display()))
                })?;
                let src = safe_parent(root, &target)?;
                match std::fs::symlink_metadata(&src) {
                    Ok(m) if m.is_file() => {}
                    _ => {
                        return Err(HostError::Other(format!(
                            "hardlink {} → {}: target is not a regular file of this layer",
                            rel.display(),
                            target.display()
                        )))
                    }
                }
                std::fs::hard_link(&src, &dest).map_err(|e| HostError::io("hardlink", &dest, e))?;
                continue; // shares the target's owner and mode
            }
            tar::EntryType::Fifo => {
                nix::unistd::mkfifo(&dest, nix::sys::stat::Mode::from_bits_truncate(mode))
                    .map_err(|e| HostError::sys("mkfifo", &dest, e))?;
            }
            tar::EntryType::Char | tar::EntryType::Block => {
                applied.skipped_devices += 1;
                continue;
            }
            _ => continue, // pax/gnu headers are consumed by the tar reader
        }
        lchown(&dest, uid, gid)?;
        if kind != tar::EntryType::Symlink {
            std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(mode))
                .map_err(|e| HostError::io("chmod", &dest, e))?;
        }
        if kind.is_file() {
            let t = filetime(header.mtime().unwrap_or(0));
            let _ = nix::sys::stat::utimensat(
                nix::fcntl::AT_FDCWD,
                &dest,
                &t,
                &t,
                nix::sys::stat::UtimensatFlags::NoFollowSymlink,
            );
        }
    }
    for (d, m) in dir_times.into_iter().rev() {
        let t = filetime(m);
        let _ = nix::sys::stat::utimensat(
            nix::fcntl::AT_FDCWD,
            &d,
            &t,
            &t,
            nix::sys::stat::UtimensatFlags::NoFollowSymlink,
        );
    }
    Ok(applied)
}

fn filetime(secs: u64) -> nix::sys::time::TimeSpec {
    nix::sys::time::TimeSpec::new(secs as i64, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_of(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        b.into_inner().unwrap()
    }

    fn header(kind: tar::EntryType, path: &str, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(0o755);
        h.set_uid(1000);
        h.set_gid(1001);
        let _ = h.set_path(path);
        h.set_cksum();
        h
    }

    fn raw_entry(
        b: &mut tar::Builder<Vec<u8>>,
        kind: tar::EntryType,
        name: &[u8],
        link: Option<&[u8]>,
        data: &[u8],
    ) {
        // Writes names verbatim (the builder refuses "..": hostile layers need raw headers).
        let mut h = tar::Header::new_old();
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        if let Some(l) = link {
            h.as_old_mut().linkname[..l.len()].copy_from_slice(l);
        }
        h.set_cksum();
        b.append(&h, data).unwrap();
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sandboxd-unpack-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn files_links_whiteouts_and_gzip() {
        let data = tar_of(|b| {
            b.append(&header(tar::EntryType::Directory, "etc/", 0), &[][..])
                .unwrap();
            b.append(
                &header(tar::EntryType::Regular, "etc/hello", 5),
                &b"hello"[..],
            )
            .unwrap();
            let mut l = header(tar::EntryType::Link, "etc/hello2", 0);
            l.set_link_name("etc/hello").unwrap();
            l.set_cksum();
            b.append(&l, &[][..]).unwrap();
            let mut s = header(tar::EntryType::Symlink, "bin", 0);
            s.set_link_name("/usr/bin").unwrap();
            s.set_cksum();
            b.append(&s, &[][..]).unwrap();
            b.append(&header(tar::EntryType::Regular, "etc/.wh.gone", 0), &[][..])
                .unwrap();
            b.append(
                &header(tar::EntryType::Regular, "var/.wh..wh..opq", 0),
                &[][..],
            )
            .unwrap();
            b.append(&header(tar::EntryType::Char, "dev/null", 0), &[][..])
                .unwrap();
        });
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &data).unwrap();
        let gz = gz.finish().unwrap();
        let root = tmp("ok");
        let a = apply(Box::new(&gz[..]), &root).unwrap();
        assert_eq!(a.whiteouts, 2);
        assert_eq!(a.skipped_devices, 1);
        assert_eq!(std::fs::read(root.join("etc/hello")).unwrap(), b"hello");
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(root.join("etc/hello")).unwrap();
        assert_eq!(
            (m.uid(), m.gid(), m.mode() & 0o7777, m.nlink()),
            (1000, 1001, 0o755, 2)
        );
        assert_eq!(
            std::fs::read_link(root.join("bin")).unwrap(),
            PathBuf::from("/usr/bin")
        );
        let wh = std::fs::symlink_metadata(root.join("etc/gone")).unwrap();
        use std::os::unix::fs::FileTypeExt;
        assert!(wh.file_type().is_char_device() && wh.rdev() == 0);
        assert!(!root.join("dev/null").exists());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn zstd_layer_and_its_diff_id() {
        let data = tar_of(|b| {
            b.append(&header(tar::EntryType::Directory, "opt/", 0), &[][..])
                .unwrap();
            b.append(&header(tar::EntryType::Regular, "opt/z", 4), &b"zstd"[..])
                .unwrap();
        });
        let z = ruzstd::encoding::compress_to_vec(
            &data[..],
            ruzstd::encoding::CompressionLevel::Fastest,
        );
        assert_eq!(&z[..4], b"\x28\xb5\x2f\xfd", "not a zstd frame");
        let root = tmp("zstd");
        let (_, diff_id) = apply_layer(Box::new(&z[..]), &root, &Limits::default()).unwrap();
        use sha2::Digest;
        assert_eq!(
            diff_id,
            format!("sha256:{}", hex(&sha2::Sha256::digest(&data)))
        );
        assert_eq!(std::fs::read(root.join("opt/z")).unwrap(), b"zstd");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn hostile_layers_cannot_escape() {
        let outside = tmp("outside");
        // 1. "../" in a path.
        let t = tar_of(|b| raw_entry(b, tar::EntryType::Regular, b"../../escape", None, b"x"));
        let root = tmp("h1");
        assert!(apply(Box::new(&t[..]), &root)
            .unwrap_err()
            .to_string()
            .contains(".."));
        // 2. An absolute path lands inside the layer.
        let abs = outside.join("abs");
        let t = tar_of(|b| {
            raw_entry(
                b,
                tar::EntryType::Regular,
                abs.to_str().unwrap().as_bytes(),
                None,
                b"x",
            )
        });
        let root = tmp("h2");
        apply(Box::new(&t[..]), &root).unwrap();
        assert!(!abs.exists());
        assert!(root.join(abs.strip_prefix("/").unwrap()).exists());
        // 3. A symlinked parent pointing outside, then a file through it.
        let t = tar_of(|b| {
            raw_entry(
                b,
                tar::EntryType::Symlink,
                b"link",
                Some(outside.to_str().unwrap().as_bytes()),
                b"",
            );
            raw_entry(b, tar::EntryType::Regular, b"link/pwned", None, b"x");
        });
        let root = tmp("h3");
        assert!(apply(Box::new(&t[..]), &root).is_err());
        assert!(!outside.join("pwned").exists());
        // 4. A hardlink to a file outside the layer.
        let secret = outside.join("secret");
        std::fs::write(&secret, "s").unwrap();
        let t = tar_of(|b| {
            raw_entry(
                b,
                tar::EntryType::Link,
                b"stolen",
                Some(b"../../../../../../../../tmp/x"),
                b"",
            )
        });
        let root = tmp("h4");
        assert!(apply(Box::new(&t[..]), &root).is_err());
        let t = tar_of(|b| {
            raw_entry(
                b,
                tar::EntryType::Link,
                b"stolen",
                Some(secret.to_str().unwrap().as_bytes()),
                b"",
            )
        });
        let root5 = tmp("h5");
        assert!(
            apply(Box::new(&t[..]), &root5).is_err(),
            "absolute hardlink target resolved outside"
        );
        // 5. A whiteout through a symlinked parent.
        let t = tar_of(|b| {
            raw_entry(
                b,
                tar::EntryType::Symlink,
                b"l2",
                Some(outside.to_str().unwrap().as_bytes()),
                b"",
            );
            raw_entry(b, tar::EntryType::Regular, b"l2/.wh.secret", None, b"");
        });
        let root6 = tmp("h6");
        assert!(apply(Box::new(&t[..]), &root6).is_err());
        assert!(secret.exists(), "whiteout removed a file outside the layer");
        // 6. A whiteout of ".." (`.wh...`) or "." would empty the layer's parent.
        let sibling = root6
            .parent()
            .unwrap()
            .join(format!("sandboxd-unpack-{}-sibling", std::process::id()));
        std::fs::create_dir_all(&sibling).unwrap();
        for name in [&b"dir/.wh..."[..], b"dir/.wh..", b".wh."] {
            let t = tar_of(|b| raw_entry(b, tar::EntryType::Regular, name, None, b""));
            let root7 = tmp("h7");
            assert!(
                apply(Box::new(&t[..]), &root7).is_err(),
                "{:?} accepted",
                String::from_utf8_lossy(name)
            );
            assert!(
                sibling.exists() && root7.exists(),
                "a whiteout removed the layer's parent"
            );
            let _ = std::fs::remove_dir_all(root7);
        }
        let _ = std::fs::remove_dir_all(&sibling);
        for d in [
            outside,
            root,
            root5,
            root6,
            tmp("h1"),
            tmp("h2"),
            tmp("h3"),
            tmp("h4"),
        ] {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}
