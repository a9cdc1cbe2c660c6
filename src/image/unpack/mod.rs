//! Applies one layer tar (plain, gzip or zstd) into its own directory in overlayfs format:
//! whiteouts `.wh.<name>` become 0:0 character devices, opaque markers `.wh..wh..opq` the
//! `trusted.overlay.opaque` xattr, so the layer dirs stack as overlay lowerdirs. No entry can
//! escape the layer dir: absolute paths are made relative, `..` is refused, and no path is
//! created through a symlink (every parent is checked with lstat; the dir is private to us).
//! Ownership, modes and hardlinks are kept; device nodes are skipped.

mod fs;
mod read_ahead;
#[cfg(test)]
mod tests;

use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::error::HostError;
use fs::{clean, filetime, lchown, opaque, remove_any, safe_parent, whiteout};

/// Why a layer could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    /// The bytes are not a well-formed (compressed) tar.
    #[error("malformed layer: {0}")]
    Malformed(String),
    /// An entry that would reach outside the layer, through a link, or is no name at all.
    #[error("refused layer entry {entry}: {reason}")]
    Hostile { entry: String, reason: String },
    /// Bigger than this node takes: uncompressed bytes, entries, or the free-space reserve.
    #[error("{0}")]
    OverLimit(String),
    #[error("{0}")]
    Host(#[source] HostError),
}

impl From<HostError> for LayerError {
    fn from(e: HostError) -> Self {
        LayerError::Host(e)
    }
}

fn malformed(what: &str, e: impl std::fmt::Display) -> LayerError {
    LayerError::Malformed(format!("{what}: {e}"))
}

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
    /// The config's defaults (`[images]`).
    fn default() -> Self {
        let c = crate::config::StoreConfig::default();
        Limits {
            max_bytes: c.max_layer_bytes,
            max_entries: c.max_layer_entries,
            min_free_bytes: c.min_free_bytes,
        }
    }
}

/// Free bytes (for unprivileged users too: root's reserve is not ours to fill) where `p` is.
pub fn free_bytes(p: &Path) -> Option<u64> {
    nix::sys::statvfs::statvfs(p)
        .ok()
        .map(|s| s.blocks_available().saturating_mul(s.fragment_size()))
}

/// The largest zstd window a layer may ask for (2^27 = 128 MiB, libzstd's default limit).
const ZSTD_WINDOW_LOG_MAX: u32 = 27;

/// Wraps `raw` in the right decompressor, by magic number.
pub fn decompress<'a>(
    raw: Box<dyn Read + Send + 'a>,
) -> Result<Box<dyn Read + Send + 'a>, LayerError> {
    decoder(raw).map(|(r, _)| r)
}

/// Wraps `raw` in the right decompressor, by magic number; says whether it is compressed.
fn decoder<'a>(
    mut raw: Box<dyn Read + Send + 'a>,
) -> Result<(Box<dyn Read + Send + 'a>, bool), LayerError> {
    let mut magic = [0u8; 4];
    let mut n = 0;
    while n < 4 {
        match raw.read(&mut magic[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) => return Err(malformed("read layer", e)),
        }
    }
    let head = std::io::Cursor::new(magic[..n].to_vec());
    let chained: Box<dyn Read + Send + 'a> = Box::new(head.chain(raw));
    let zstd_frame = magic == [0x28, 0xb5, 0x2f, 0xfd];
    let skippable_frame = magic[0] & 0xf0 == 0x50 && magic[1..] == [0x2a, 0x4d, 0x18];
    // Every member of a gzip file and every frame of a zstd stream, as `gzip -d` and
    // `zstd -d` read them (zstd:chunked layers carry their table of contents in skippable
    // frames).
    Ok(if n >= 2 && magic[..2] == [0x1f, 0x8b] {
        (Box::new(flate2::read::MultiGzDecoder::new(chained)), true)
    } else if n == 4 && (zstd_frame || skippable_frame) {
        // libzstd: every frame, skippable ones skipped; a window up to what `zstd -d` takes
        // without `--memory` (the decoder's buffer is the frame's window, not more).
        let mut d =
            zstd::stream::read::Decoder::new(chained).map_err(|e| malformed("zstd layer", e))?;
        d.window_log_max(ZSTD_WINDOW_LOG_MAX)
            .map_err(|e| malformed("zstd layer", e))?;
        (Box::new(d), true)
    } else {
        (chained, false)
    })
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
            return Err(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                format!(
                    "the uncompressed layer is larger than the limit of {} bytes",
                    self.max
                ),
            ));
        }
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// Applies the (possibly compressed) layer tar `raw` into the empty directory `root` within
/// `limits` and returns what it did with the uncompressed tar's digest (`sha256:<hex>`, the
/// diff id).
pub fn apply_layer(
    raw: Box<dyn Read + Send + '_>,
    root: &Path,
    limits: &Limits,
) -> Result<(Applied, String), LayerError> {
    let (decoded, compressed) = decoder(raw)?;
    if !compressed {
        return apply_decoded(decoded, root, limits);
    }
    // Decoded on a thread of its own, ahead of the tar reader.
    std::thread::scope(|s| {
        let ahead = read_ahead::spawn(s, decoded).map_err(|e| {
            LayerError::Host(HostError::Other(format!(
                "cannot start the layer's decompression thread: {e}"
            )))
        })?;
        apply_decoded(Box::new(ahead), root, limits)
    })
}

/// [`apply_layer`] of the decompressed stream `decoded`.
fn apply_decoded(
    decoded: Box<dyn Read + '_>,
    root: &Path,
    limits: &Limits,
) -> Result<(Applied, String), LayerError> {
    use sha2::Digest;
    let mut hashing = Hashing {
        inner: decoded,
        hash: sha2::Sha256::new(),
        read: 0,
        max: limits.max_bytes,
    };
    let applied = apply_plain(&mut hashing, root, limits)?;
    // What follows the tar's end still counts for the diff id (and against the limit).
    std::io::copy(&mut hashing, &mut std::io::sink()).map_err(read_error)?;
    let digest = format!("sha256:{}", hex(&hashing.hash.finalize()));
    Ok((applied, digest))
}

/// A read error of the layer stream: over the size limit (the hashing reader says so), or a
/// malformed stream.
fn read_error(e: std::io::Error) -> LayerError {
    if e.kind() == std::io::ErrorKind::FileTooLarge {
        LayerError::OverLimit(e.to_string())
    } else {
        malformed("layer tar", e)
    }
}

/// Lowercase hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Applies the (possibly compressed) layer tar `raw` into the empty directory `root`.
pub fn apply(raw: Box<dyn Read + Send + '_>, root: &Path) -> Result<Applied, LayerError> {
    apply_layer(raw, root, &Limits::default()).map(|(a, _)| a)
}

/// A file's bytes go from the tar to the disk this many at a time (a multi-GB layer is a
/// few thousand reads and writes, not a million).
const COPY_BUF: usize = 256 << 10;

/// Copies the rest of a tar entry to `f` through `buf`: a read error is the layer's (over
/// its limit, or malformed), a write error the host's.
fn copy_file(
    entry: &mut impl Read,
    f: &mut std::fs::File,
    buf: &mut [u8],
    dest: &Path,
) -> Result<u64, LayerError> {
    let mut n = 0u64;
    loop {
        let k = match entry.read(buf) {
            Ok(0) => return Ok(n),
            Ok(k) => k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(read_error(e)),
        };
        std::io::Write::write_all(f, &buf[..k]).map_err(|e| HostError::io("write", dest, e))?;
        n += k as u64;
    }
}

/// Every this many bytes written, the free space is checked again.
const FREE_CHECK_EVERY: u64 = 64 << 20;

fn apply_plain(reader: &mut dyn Read, root: &Path, limits: &Limits) -> Result<Applied, LayerError> {
    let check_free = || {
        match free_bytes(root) {
        Some(free) if free < limits.min_free_bytes => Err(LayerError::OverLimit(format!(
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
    let entries = archive.entries().map_err(read_error)?;
    let mut buf = vec![0u8; COPY_BUF];
    let mut dir_times = Vec::new();
    for entry in entries {
        let mut entry = entry.map_err(read_error)?;
        let raw_path = entry
            .path()
            .map_err(|e| malformed("layer tar path", e))?
            .into_owned();
        let Some(rel) = clean(&raw_path)? else {
            continue;
        };
        applied.entries += 1;
        if applied.entries as u64 > limits.max_entries {
            return Err(LayerError::OverLimit(format!(
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
                return Err(LayerError::Hostile {
                    entry: rel.display().to_string(),
                    reason: format!(
                        "a whiteout of {:?}, which is not a name",
                        String::from_utf8_lossy(hidden)
                    ),
                });
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
                applied.bytes += copy_file(&mut entry, &mut f, &mut buf, &dest)?;
                fs::start_writeback(&f);
                if applied.bytes >= next_check {
                    check_free()?;
                    next_check = applied.bytes + FREE_CHECK_EVERY;
                }
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(|e| malformed("symlink target", e))?
                    .ok_or_else(|| malformed("symlink without a target", rel.display()))?;
                std::os::unix::fs::symlink(&target, &dest)
                    .map_err(|e| HostError::io("symlink", &dest, e))?;
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name()
                    .map_err(|e| malformed("hardlink target", e))?
                    .ok_or_else(|| malformed("hardlink without a target", rel.display()))?;
                let target = clean(&target)?.ok_or_else(|| LayerError::Hostile {
                    entry: rel.display().to_string(),
                    reason: "a hardlink to the layer's root".into(),
                })?;
                let src = safe_parent(root, &target)?;
                match std::fs::symlink_metadata(&src) {
                    Ok(m) if m.is_file() => {}
                    _ => {
                        return Err(LayerError::Hostile {
                            entry: rel.display().to_string(),
                            reason: format!(
                                "a hardlink to {}, which is not a regular file of this layer",
                                target.display()
                            ),
                        })
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
