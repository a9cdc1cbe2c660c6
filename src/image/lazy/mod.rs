//! Lazy layers: an eStargz layer (`../estargz.rs`) or a zstd:chunked one
//! (`../zstd_chunked.rs`) mounted from a FUSE filesystem of ours instead of downloaded first,
//! so a container of a big image starts once the TOCs are read.
//!
//! The pull (daemon side, here) asks the registry for the layer's TOC by range request
//! (eStargz: the footer, then the TOC it points at; zstd:chunked: the range the manifest's
//! position annotation names), checks it against the digest the manifest's layer annotation
//! names (the manifest is checked against its own digest), reads it into a tree within the store's
//! layer limits, and starts the layer's server: `sandboxd lazyfs` (`helper.rs`), one process
//! per layer, in a session of its own so that it outlives daemon restarts as the pods'
//! monitors do. The server mounts `images/lazy/<diff id>/mnt` (`fuse.sandboxd-lazy`,
//! read-only, nosuid, nodev, allow_other with the kernel checking permissions), answers
//! lookups and listings from the tree at once, fetches a file's chunks by range request on
//! first read into a sparse copy of the blob (`blob.rs`: 1 MiB blocks, each fetched once,
//! bounded in time; each chunk decompressed once and checked; a chunk that fails its digest is
//! fetched again once, then the read fails with EIO and a log line naming the layer and file),
//! fetches the files before the image's prefetch landmark at once, and in the background pulls
//! the layer whole as a pull does (`fetch.rs`: digest and diff id checked) into `layers/<diff
//! id>`, at the lowest priority and giving way to reads. The containers created after that
//! stack the unpacked layer, and the mount's reads of what it never fetched come from it; the
//! mount serves the containers made before until the image goes. A pod with its own user namespace stacks the mount idmapped, as any layer (the
//! server asks for FUSE's idmapped mounts, which the kernel offers from 6.12).
//!
//! Removing the image (collection) unmounts the layer (detached: a container still using it
//! keeps its view), which ends its server. A layer whose server is gone (a reboot) is
//! removed at start, and the images that named it are dropped: kubelet pulls them again.

mod blob;
mod fs;
pub mod helper;

use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use reqwest::StatusCode;
use serde::{Deserialize, Serialize};

use super::endpoints::Endpoint;
use super::estargz::{self, Tree};
use super::lazy_dirs::{dir, is_ready, mount_point, remove, server_lives};
use super::registry::{Creds, Registry, RegistryError};
use super::store::ImageStore;
use crate::error::{Error, HostError};

/// The filesystem type a lazy layer's mount shows in mountinfo (`fuse.<subtype>`).
pub const SUBTYPE: &str = "sandboxd-lazy";
/// How long the daemon waits for a server to say it serves.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// What a layer's server is started with (JSON on its stdin; the credentials never touch
/// the disk).
#[derive(Debug, Serialize, Deserialize)]
pub struct Spec {
    pub endpoint: Endpoint,
    pub creds: Option<Creds>,
    /// The layer blob's digest and size.
    pub digest: String,
    pub size: u64,
    pub diff_id: String,
    /// Where the TOC begins (its JSON is `toc.json` in the layer's dir).
    pub toc_offset: u64,
    /// The layer's format (how its chunks are compressed; which names are its own).
    #[serde(default)]
    pub format: estargz::Format,
    /// The image store's dir and settings (the completed layer is unpacked into it).
    pub store: PathBuf,
    pub store_cfg: crate::config::StoreConfig,
}

/// Bytes `start..end` of blob `digest` of `size` bytes by one range request: `None` when the
/// registry answers with the whole blob instead (it ignores `Range`; the answer is dropped
/// unread).
pub(crate) async fn fetch_range(
    reg: &Registry,
    digest: &str,
    size: u64,
    start: u64,
    end: u64,
) -> Result<Option<Bytes>, RegistryError> {
    let resp = reg.blob_range(digest, start, end - 1).await?;
    if resp.status() == StatusCode::OK {
        return Ok(None);
    }
    if resp.status() != StatusCode::PARTIAL_CONTENT {
        return Err(RegistryError::Invalid(format!(
            "layer {digest}: a range request answered {}",
            resp.status()
        )));
    }
    super::ranged::check_range(&resp, digest, start, end - 1, size)?;
    let len = (end - start) as usize;
    let body = super::registry::read_capped(resp, len, digest).await?;
    if body.len() != len {
        return Err(RegistryError::Invalid(format!(
            "layer {digest}: a range of {len} bytes came with {}",
            body.len()
        )));
    }
    Ok(Some(body))
}

/// Where a layer's TOC is and what it must hash to, as its manifest entry says: the layers
/// that can be served lazily.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TocRef {
    /// eStargz (a gzip layer): the TOC JSON's digest; the blob's footer says where it is.
    Estargz { toc_digest: String },
    /// zstd:chunked (a zstd layer): the compressed TOC's digest and its position.
    ZstdChunked { checksum: String, position: String },
}

impl TocRef {
    /// The TOC a manifest's layer entry (`media_type`, `annotations`) names, if any.
    pub fn of(media_type: &str, annotations: &serde_json::Value) -> Option<TocRef> {
        let a = |k: &str| annotations[k].as_str().map(str::to_string);
        use super::zstd_chunked as z;
        if media_type.contains("zstd") {
            return Some(TocRef::ZstdChunked {
                checksum: a(z::MANIFEST_CHECKSUM_ANNOTATION)?,
                position: a(z::MANIFEST_POSITION_ANNOTATION)?,
            });
        }
        if media_type.contains("gzip") {
            return Some(TocRef::Estargz {
                toc_digest: a(estargz::TOC_DIGEST_ANNOTATION)?,
            });
        }
        None
    }

    fn format(&self) -> estargz::Format {
        match self {
            TocRef::Estargz { .. } => estargz::Format::Estargz,
            TocRef::ZstdChunked { .. } => estargz::Format::ZstdChunked,
        }
    }
}

/// What [`mount`] did.
pub enum Mounted {
    /// The layer is served lazily.
    Yes,
    /// It cannot be (the reason): pull it whole.
    No(String),
}

fn invalid(layer: &str, m: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("image: layer {layer}: {m}"))
}

/// What a TOC read by range came to: its JSON and where it begins, or why the layer is
/// pulled whole instead.
type TocRead = std::result::Result<(Vec<u8>, u64), Mounted>;

/// The eStargz TOC of blob `digest`: the footer read first, then the TOC member it names.
async fn estargz_toc(
    reg: &Registry,
    digest: &str,
    size: u64,
    toc_digest: &str,
) -> crate::error::Result<TocRead> {
    // A registry that fails a range request gets the full pull, which says what it answers.
    let not_lazy = |e: RegistryError| Err(Mounted::No(format!("a range request failed: {e}")));
    let ignores = || Err(Mounted::No("the registry ignores range requests".into()));
    if size <= estargz::FOOTER_SIZE {
        return Ok(Err(Mounted::No("smaller than an eStargz footer".into())));
    }
    let foot = match fetch_range(reg, digest, size, size - estargz::FOOTER_SIZE, size).await {
        Ok(Some(f)) => f,
        Ok(None) => return Ok(ignores()),
        Err(e) => return Ok(not_lazy(e)),
    };
    let toc_offset = match estargz::parse_footer(&foot) {
        Ok(o) => o,
        Err(m) => return Ok(Err(Mounted::No(m))),
    };
    let toc_end = size - estargz::FOOTER_SIZE;
    if toc_offset >= toc_end || toc_end - toc_offset > estargz::MAX_TOC_BYTES {
        return Err(invalid(
            digest,
            format!("the footer puts the TOC at {toc_offset}, outside the blob's {toc_end} bytes before it or over {} bytes", estargz::MAX_TOC_BYTES),
        ));
    }
    let member = match fetch_range(reg, digest, size, toc_offset, toc_end).await {
        Ok(Some(m)) => m,
        Ok(None) => return Ok(ignores()),
        Err(e) => return Ok(not_lazy(e)),
    };
    let json = estargz::toc_json(&member).map_err(|m| invalid(digest, m))?;
    let got = super::store::sha256_of(&json);
    if got != toc_digest {
        return Err(invalid(
            digest,
            format!("its TOC is {got}, the manifest's annotation says {toc_digest}"),
        ));
    }
    Ok(Ok((json, toc_offset)))
}

/// The zstd:chunked TOC of blob `digest`: the compressed bytes its position annotation names
/// (inside the blob, checked against the checksum annotation), decompressed within bounds.
async fn zstd_chunked_toc(
    reg: &Registry,
    digest: &str,
    size: u64,
    checksum: &str,
    position: &str,
) -> crate::error::Result<TocRead> {
    use super::zstd_chunked as z;
    let pos = z::Position::parse(position, size).map_err(|m| invalid(digest, m))?;
    let compressed = match fetch_range(reg, digest, size, pos.offset, pos.offset + pos.length).await
    {
        Ok(Some(m)) => m,
        Ok(None) => {
            return Ok(Err(Mounted::No(
                "the registry ignores range requests".into(),
            )))
        }
        Err(e) => return Ok(Err(Mounted::No(format!("a range request failed: {e}")))),
    };
    let got = super::store::sha256_of(&compressed);
    if got != checksum {
        return Err(invalid(
            digest,
            format!("its TOC is {got}, the manifest's annotation says {checksum}"),
        ));
    }
    let json = z::toc_json(&compressed, pos.uncompressed).map_err(|m| invalid(digest, m))?;
    Ok(Ok((json, pos.frame_start())))
}

/// Mounts the layer `digest` (`size` bytes, its TOC as `toc` says) of diff id `diff_id` from
/// `reg` lazily. A registry that ignores range requests, or an eStargz blob that is no
/// eStargz after all, is [`Mounted::No`]; a TOC that does not match its digest, lies outside
/// the blob or breaks a bound is the image's error.
pub async fn mount(
    store: &ImageStore,
    reg: &Registry,
    digest: &str,
    size: u64,
    diff_id: &str,
    toc: &TocRef,
) -> crate::error::Result<Mounted> {
    let started = std::time::Instant::now();
    let read = match toc {
        TocRef::Estargz { toc_digest } => estargz_toc(reg, digest, size, toc_digest).await?,
        TocRef::ZstdChunked { checksum, position } => {
            zstd_chunked_toc(reg, digest, size, checksum, position).await?
        }
    };
    let (json, toc_offset) = match read {
        Ok(r) => r,
        Err(no) => return Ok(no),
    };
    let format = toc.format();
    let limits = estargz::TocLimits {
        max_entries: store.cfg.max_layer_entries,
        max_bytes: store.cfg.max_layer_bytes,
    };
    let tree = Tree::parse_as(format, &json, toc_offset, limits).map_err(|m| invalid(digest, m))?;
    let d = dir(&store.dir, super::store::digest_hex(diff_id)?);
    if is_ready(&d) && server_lives(&d) {
        return Ok(Mounted::Yes);
    }
    remove(&d).map_err(Error::Host)?;
    crate::state::files::private_dir_all(&mount_point(&d)).map_err(Error::Host)?;
    crate::state::files::write_private(&d.join("toc.json"), &json).map_err(Error::Host)?;
    let spec = Spec {
        endpoint: reg.endpoint().clone(),
        creds: reg.creds().cloned(),
        digest: digest.to_string(),
        size,
        diff_id: diff_id.to_string(),
        toc_offset,
        format,
        store: store.dir.clone(),
        store_cfg: store.cfg.clone(),
    };
    let helper = crate::config::Config::helper_path(&store.cfg.lazy_helper, "sandboxd")
        .ok_or_else(|| {
            Error::FailedPrecondition(
                "lazy pulls need the sandboxd binary (set [images] lazy_helper)".into(),
            )
        })?;
    let served = {
        let d = d.clone();
        tokio::task::spawn_blocking(move || start_server(&helper, &d, &spec))
            .await
            .map_err(|e| Error::Host(HostError::Other(e.to_string())))?
    };
    if let Err(e) = served {
        let _ = remove(&d);
        return Err(Error::step("start lazy layer server", digest, e));
    }
    crate::state::files::write_private(&d.join("ready"), b"").map_err(Error::Host)?;
    tracing::info!(
        layer = digest,
        diff_id,
        format = format.name(),
        files = tree.nodes.len(),
        bytes = tree.bytes,
        toc_bytes = json.len(),
        seconds = started.elapsed().as_secs_f64(),
        "lazy layer mounted"
    );
    Ok(Mounted::Yes)
}

/// Starts `helper lazyfs --dir D` with `spec` on its stdin and waits for its `ready` line.
fn start_server(helper: &Path, d: &Path, spec: &Spec) -> Result<(), HostError> {
    use std::process::{Command, Stdio};
    let mut child = Command::new(helper)
        .arg("lazyfs")
        .arg("--dir")
        .arg(d)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| HostError::io("run", helper, e))?;
    let body = serde_json::to_vec(spec).map_err(|e| HostError::Other(e.to_string()));
    let written = body.and_then(|b| match child.stdin.take() {
        // (Dropped after the write: the server reads its spec to the end.)
        Some(mut i) => i
            .write_all(&b)
            .map_err(|e| HostError::io("write the spec to", helper, e)),
        None => Ok(()),
    });
    let line = match (written, child.stdout.take()) {
        (Err(e), _) => Err(e),
        (Ok(()), None) => Err(HostError::Other(
            "no stdout from the lazy layer server".into(),
        )),
        (Ok(()), Some(out)) => {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let mut line = String::new();
                let _ = std::io::BufReader::new(out.take(4096)).read_line(&mut line);
                let _ = tx.send(line);
            });
            Ok(rx.recv_timeout(READY_TIMEOUT))
        }
    };
    // The first process forks the server and exits at once (reaped here: the server is no
    // child of the daemon's); one that has not said anything in time is killed first.
    if !matches!(line, Ok(Ok(_))) {
        let _ = child.kill();
    }
    let _ = child.wait();
    match line? {
        Ok(l) if l.trim() == "ready" => Ok(()),
        Ok(l) if l.is_empty() => Err(HostError::Other(
            "the lazy layer server exited before it served (its log says why)".into(),
        )),
        Ok(l) => Err(HostError::Other(l.trim().to_string())),
        Err(_) => Err(HostError::Other(format!(
            "the lazy layer server did not serve within {} s",
            READY_TIMEOUT.as_secs()
        ))),
    }
}
