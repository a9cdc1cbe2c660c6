//! The FUSE filesystem of a lazy layer: the TOC's tree answered from memory (lookups,
//! attributes, listings, links, the overlay opaque marker as `trusted.overlay.opaque`,
//! whiteouts as 0:0 character devices), file bytes from the blob's chunks (`blob.rs`) until
//! the layer is complete, then from the unpacked layer (opened beneath its dir, no symlink
//! followed; a file gone there — the layer collected while a container still uses this
//! view — is read from the chunks again). Read-only; the kernel checks permissions
//! (`default_permissions`). Inode numbers are the tree's indexes plus one (the root is 1).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyXattr, Request,
};

use super::super::estargz::{Kind, Node, Tree};
use super::blob::Blob;

/// Nothing in a layer changes: the kernel may keep what it was told.
const TTL: Duration = Duration::from_secs(24 * 3600);
const OPAQUE: &[u8] = b"trusted.overlay.opaque";

pub struct LazyFs {
    tree: Arc<Tree>,
    blob: Arc<Blob>,
    /// The unpacked layer's dir, once complete.
    unpacked: Arc<OnceLock<OwnedFd>>,
    /// Files of the unpacked layer open for reads, by node (at most [`OPEN_FILES`]).
    open: Mutex<HashMap<u32, Arc<File>>>,
    /// The node-wide marker of containers reading (`lazy_dirs::reads_marker`), and when it was
    /// touched last (ms since `born`).
    marker: std::path::PathBuf,
    born: std::time::Instant,
    touched: std::sync::atomic::AtomicU64,
}

/// Files of the unpacked layer kept open at once.
const OPEN_FILES: usize = 256;

impl LazyFs {
    pub fn new(
        tree: Arc<Tree>,
        blob: Arc<Blob>,
        unpacked: Arc<OnceLock<OwnedFd>>,
        marker: std::path::PathBuf,
    ) -> LazyFs {
        LazyFs {
            tree,
            blob,
            unpacked,
            open: Mutex::default(),
            marker,
            born: std::time::Instant::now(),
            touched: Default::default(),
        }
    }

    /// Bytes `off..off+size` of node `i` from the unpacked layer, if it is complete and has
    /// the file (as the TOC says it: a regular file of its size).
    fn unpacked_bytes(&self, i: u32, n: &Node, off: u64, size: u64) -> Option<Vec<u8>> {
        let dir = self.unpacked.get()?;
        let cached = crate::state::lock(&self.open).get(&i).cloned();
        let f = match cached {
            Some(f) => f,
            None => {
                use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
                let rel = path_of(&self.tree, i);
                let how = OpenHow::new()
                    .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
                    .resolve(
                        ResolveFlag::RESOLVE_BENEATH
                            | ResolveFlag::RESOLVE_NO_SYMLINKS
                            | ResolveFlag::RESOLVE_NO_MAGICLINKS
                            | ResolveFlag::RESOLVE_NO_XDEV,
                    );
                let fd = nix::fcntl::openat2(dir, rel.trim_start_matches('/'), how).ok()?;
                let f = File::from(fd);
                let m = f.metadata().ok()?;
                if !m.is_file() || m.len() != n.size {
                    return None;
                }
                let f = Arc::new(f);
                let mut open = crate::state::lock(&self.open);
                if open.len() >= OPEN_FILES {
                    open.clear();
                }
                open.insert(i, f.clone());
                f
            }
        };
        let end = off.saturating_add(size).min(n.size);
        let mut out = vec![0u8; end.saturating_sub(off) as usize];
        std::os::unix::fs::FileExt::read_exact_at(&*f, &mut out, off).ok()?;
        Some(out)
    }

    fn node(&self, ino: INodeNo) -> Option<&Node> {
        let i = ino.0.checked_sub(1)?;
        self.tree.nodes.get(usize::try_from(i).ok()?)
    }

    fn attr(&self, ino: u64, n: &Node) -> FileAttr {
        let t = if n.mtime >= 0 {
            UNIX_EPOCH + Duration::from_secs(n.mtime as u64)
        } else {
            UNIX_EPOCH
        };
        FileAttr {
            ino: INodeNo(ino),
            size: n.size,
            blocks: n.size.div_ceil(512),
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind: Self::file_type(n),
            perm: n.perm as u16,
            nlink: n.nlink,
            uid: n.uid,
            gid: n.gid,
            // (A whiteout is overlay's 0:0 character device.)
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    fn file_type(n: &Node) -> FileType {
        match n.kind {
            Kind::Dir => FileType::Directory,
            Kind::Reg => FileType::RegularFile,
            Kind::Symlink => FileType::Symlink,
            Kind::Whiteout => FileType::CharDevice,
            Kind::Fifo => FileType::NamedPipe,
        }
    }

    /// Bytes `off..off+size` of file `n`, from its chunks.
    fn bytes(&self, n: &Node, off: u64, size: u64) -> Result<Vec<u8>, String> {
        let end = off.saturating_add(size).min(n.size);
        let mut out = Vec::with_capacity(end.saturating_sub(off) as usize);
        let first = n.chunks.partition_point(|c| c.file_off + c.len <= off);
        for c in &n.chunks[first..] {
            if c.file_off >= end {
                break;
            }
            let data = self.blob.chunk(c)?;
            let a = off.max(c.file_off) - c.file_off;
            let b = end.min(c.file_off + c.len) - c.file_off;
            out.extend_from_slice(&data[a as usize..b as usize]);
        }
        Ok(out)
    }
}

/// The path of node `i` from the layer's root (`/a/b`), by its names up to the root.
fn path_of(tree: &Tree, mut i: u32) -> String {
    let mut parts = Vec::new();
    // (The tree is one: a parent was made before its children; the bound is a guard.)
    while i != 0 && parts.len() < 4096 {
        let n = &tree.nodes[i as usize];
        parts.push(String::from_utf8_lossy(&n.name).into_owned());
        i = n.parent;
    }
    parts.reverse();
    format!("/{}", parts.join("/"))
}

impl Filesystem for LazyFs {
    /// Idmapped mounts of the layer (a pod with its own user namespace stacks its layers
    /// idmapped) where the kernel offers them to FUSE (6.12 on): the kernel checks the
    /// modes, and nothing here is written.
    fn init(&mut self, _req: &Request, config: &mut fuser::KernelConfig) -> std::io::Result<()> {
        if config
            .add_capabilities(fuser::InitFlags::FUSE_ALLOW_IDMAP)
            .is_err()
        {
            tracing::debug!(layer = %self.blob.digest, "the kernel offers FUSE no idmapped mounts");
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let Some(p) = self.node(parent) else {
            return reply.error(Errno::ENOENT);
        };
        match p.children.get(name.as_bytes()) {
            Some(&c) => {
                let ino = u64::from(c) + 1;
                reply.entry(
                    &TTL,
                    &self.attr(ino, &self.tree.nodes[c as usize]),
                    Generation(0),
                )
            }
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.node(ino) {
            Some(n) => reply.attr(&TTL, &self.attr(ino.0, n)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.node(ino) {
            Some(n) if n.kind == Kind::Symlink => reply.data(&n.target),
            Some(_) => reply.error(Errno::EINVAL),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.0 & libc::O_ACCMODE != libc::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        match self.node(ino) {
            Some(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(n) = self.node(ino) else {
            return reply.error(Errno::ENOENT);
        };
        if n.kind != Kind::Reg {
            return reply.error(Errno::EINVAL);
        }
        super::super::lazy_dirs::touch_reads(&self.marker, self.born, &self.touched);
        if let Some(b) = self.unpacked_bytes((ino.0 - 1) as u32, n, offset, u64::from(size)) {
            return reply.data(&b);
        }
        match self.bytes(n, offset, u64::from(size)) {
            Ok(b) => reply.data(&b),
            Err(e) => {
                let file = path_of(&self.tree, (ino.0 - 1) as u32);
                tracing::error!(layer = %self.blob.digest, file, offset, error = %e, "lazy layer: read failed (EIO)");
                reply.error(Errno::EIO)
            }
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.node(ino) {
            Some(n) if n.kind == Kind::Dir => {
                reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE)
            }
            Some(_) => reply.error(Errno::ENOTDIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let Some(n) = self.node(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let parent = u64::from(n.parent) + 1;
        let dots = [
            (ino.0, FileType::Directory, OsStr::new(".")),
            (parent, FileType::Directory, OsStr::new("..")),
        ];
        let rest = n.children.iter().map(|(name, c)| {
            let child = &self.tree.nodes[*c as usize];
            (
                u64::from(*c) + 1,
                Self::file_type(child),
                OsStr::from_bytes(name),
            )
        });
        for (i, (ino, kind, name)) in dots
            .into_iter()
            .chain(rest)
            .enumerate()
            .skip(offset as usize)
        {
            if reply.add(INodeNo(ino), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok()
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let blocks = self.tree.bytes.div_ceil(4096);
        let files = self.tree.nodes.len() as u64;
        reply.statfs(blocks, 0, 0, files, 0, 4096, 255, 4096)
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match self.node(ino) {
            Some(n) if n.opaque && name.as_bytes() == OPAQUE => match size {
                0 => reply.size(1),
                _ => reply.data(b"y"),
            },
            Some(_) => reply.error(Errno::NO_XATTR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let Some(n) = self.node(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let mut list = Vec::new();
        if n.opaque {
            list.extend_from_slice(OPAQUE);
            list.push(0);
        }
        match size {
            0 => reply.size(list.len() as u32),
            s if s as usize >= list.len() => reply.data(&list),
            _ => reply.error(Errno::ERANGE),
        }
    }
}
