//! Applies one layer tar (plain, gzip or zstd) into its own directory in overlayfs format:
//! whiteouts `.wh.<name>` become 0:0 character devices, opaque markers `.wh..wh..opq` the
//! `trusted.overlay.opaque` xattr, so the layer dirs stack as overlay lowerdirs. No entry can
//! escape the layer dir: absolute paths are made relative, `..` is refused, and nothing is
//! created through a symlink (every entry is made relative to its parent's descriptor, each
//! parent opened from the layer dir's one component at a time without following a link).
//! Ownership, modes and hardlinks are kept; device nodes are skipped.

mod fs;
mod read_ahead;
#[cfg(test)]
mod tests;

use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fchmod, futimens, mkdirat, mknodat, utimensat, Mode, SFlag, UtimensatFlags};
use nix::unistd::{fchown, linkat, mkfifoat, symlinkat, Gid, Uid};

use crate::error::HostError;
use fs::{clean, filetime, kind_at, opaque, own_at, Tree};

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

/// Files at least this big start their writeback as soon as they are written (see
/// [`fs::start_writeback`]); smaller ones are left to the layer's `syncfs`, which writes them
/// together: a write started per small file costs more than it overlaps.
const WRITEBACK_FROM: u64 = 256 << 10;

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
    let mut tree = Tree::open(root)?;
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
        let parent_rel = rel.parent().unwrap_or(Path::new(""));
        let name = rel.file_name().unwrap_or_default();
        let parent = tree.dir(&rel, parent_rel, true)?;
        let dest = || root.join(&rel);
        if name.as_bytes() == b".wh..wh..opq" {
            opaque(&parent, &root.join(parent_rel))?;
            applied.whiteouts += 1;
            continue;
        }
        if let Some(hidden) = name.as_bytes().strip_prefix(b".wh.") {
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
            let hidden = std::ffi::OsStr::from_bytes(hidden);
            tree.replace(&parent, parent_rel, hidden, || {
                mknodat(&*parent, hidden, SFlag::S_IFCHR, Mode::empty(), 0)
            })
            .map_err(|e| HostError::sys("create whiteout", dest(), e))?;
            applied.whiteouts += 1;
            continue;
        }
        let header = entry.header().clone();
        let mode = Mode::from_bits_truncate(header.mode().unwrap_or(0o644) & 0o7777);
        let owner = (
            Some(Uid::from_raw(header.uid().unwrap_or(0) as u32)),
            Some(Gid::from_raw(header.gid().unwrap_or(0) as u32)),
        );
        let kind = header.entry_type();
        match kind {
            tar::EntryType::Directory => {
                match mkdirat(&*parent, name, Mode::from_bits_truncate(0o700)) {
                    Err(Errno::EEXIST) if kind_at(&parent, name) == Some(SFlag::S_IFDIR) => Ok(()),
                    Err(Errno::EEXIST) => {
                        tree.remove(&parent, parent_rel, name);
                        mkdirat(&*parent, name, Mode::from_bits_truncate(0o700))
                    }
                    r => r,
                }
                .map_err(|e| HostError::sys("create", dest(), e))?;
                own_at(&parent, name, owner, Some(mode), &dest())?;
                dir_times.push((rel.clone(), header.mtime().unwrap_or(0)));
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let flags = OFlag::O_WRONLY
                    | OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC;
                let fd = tree
                    .replace(&parent, parent_rel, name, || {
                        openat(&*parent, name, flags, Mode::from_bits_truncate(0o600))
                    })
                    .map_err(|e| HostError::sys("create", dest(), e))?;
                let mut f = std::fs::File::from(fd);
                let n = copy_file(&mut entry, &mut f, &mut buf, &dest())?;
                applied.bytes += n;
                // Ownership before the mode: a chown clears set-user-ID and set-group-ID.
                fchown(&f, owner.0, owner.1).map_err(|e| HostError::sys("chown", dest(), e))?;
                fchmod(&f, mode).map_err(|e| HostError::sys("chmod", dest(), e))?;
                let t = filetime(header.mtime().unwrap_or(0));
                let _ = futimens(&f, &t, &t);
                if n >= WRITEBACK_FROM {
                    fs::start_writeback(&f);
                }
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
                tree.replace(&parent, parent_rel, name, || {
                    symlinkat(&*target, &*parent, name)
                })
                .map_err(|e| HostError::sys("symlink", dest(), e))?;
                own_at(&parent, name, owner, None, &dest())?;
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
                let not_ours = || LayerError::Hostile {
                    entry: rel.display().to_string(),
                    reason: format!(
                        "a hardlink to {}, which is not a regular file of this layer",
                        target.display()
                    ),
                };
                let target_name = target.file_name().unwrap_or_default();
                let from = tree
                    .dir(&rel, target.parent().unwrap_or(Path::new("")), false)
                    .map_err(|_| not_ours())?;
                if kind_at(&from, target_name) != Some(SFlag::S_IFREG) {
                    return Err(not_ours());
                }
                tree.replace(&parent, parent_rel, name, || {
                    linkat(&*from, target_name, &*parent, name, AtFlags::empty())
                })
                .map_err(|e| HostError::sys("hardlink", dest(), e))?;
                // It shares the target's owner and mode.
            }
            tar::EntryType::Fifo => {
                tree.replace(&parent, parent_rel, name, || mkfifoat(&*parent, name, mode))
                    .map_err(|e| HostError::sys("mkfifo", dest(), e))?;
                own_at(&parent, name, owner, Some(mode), &dest())?;
            }
            // Not created, but what the layer had at that name is gone all the same.
            tar::EntryType::Char | tar::EntryType::Block => {
                tree.remove(&parent, parent_rel, name);
                applied.skipped_devices += 1;
            }
            // pax and GNU headers are consumed by the tar reader; other kinds are not kept.
            _ => tree.remove(&parent, parent_rel, name),
        }
    }
    // Directories' times last (their entries changed them), each reached again from the root
    // without following a link: a later entry may have put a symlink where a parent was.
    for (rel, m) in dir_times.into_iter().rev() {
        let parent_rel = rel.parent().unwrap_or(Path::new(""));
        let Ok(parent) = tree.dir(&rel, parent_rel, false) else {
            continue;
        };
        let t = filetime(m);
        let _ = utimensat(
            &*parent,
            rel.file_name().unwrap_or_default(),
            &t,
            &t,
            UtimensatFlags::NoFollowSymlink,
        );
    }
    Ok(applied)
}
