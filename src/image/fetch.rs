//! One layer's bytes into the store, as a pull takes them: fetched once (one GET, or parallel
//! range requests: `ranged.rs`), each byte through the size and digest checks on its way to
//! the unpacker (decompression on a thread of its own, no temp copy), committed only once the
//! blob's digest and the diff id verified. PullImage fetches its missing layers this way
//! (`pull.rs`), and so does a lazy layer's background completion (`lazy/helper.rs`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use sha2::Digest;

use super::progress::LayerProgress;
use super::registry::{Registry, RegistryError};
use super::store::ImageStore;
use crate::error::{Error, HostError, Result};

/// Pieces of a layer's body (each what the connection read at once, up to ~400 KiB) held
/// between the download and the unpacker, per layer in flight.
const CHANNEL_DEPTH: usize = 4;

/// Bytes of a completion's local start read at a time.
const LOCAL_READ: u64 = 256 << 10;

/// The error a registry failure maps to (its code reaches kubelet).
pub(crate) fn to_error(image: &str, e: RegistryError) -> Error {
    match e {
        RegistryError::NotFound(m) => Error::NotFound {
            kind: "image",
            id: format!("{image} ({m})"),
        },
        RegistryError::Unauthenticated(m) => Error::Unauthenticated(m),
        RegistryError::Denied(m) => Error::PermissionDenied(m),
        e => Error::step("pull image", image, e),
    }
}

/// A pull from one endpoint failed: the endpoint (try the next) or this image/our store (stop).
#[derive(Debug, thiserror::Error)]
pub(crate) enum PullError {
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("{0}")]
    Local(Error),
}

impl PullError {
    pub(crate) fn into_error(self, image: &str) -> Error {
        match self {
            PullError::Registry(e) => to_error(image, e),
            PullError::Local(e) => e,
        }
    }
}

impl From<Error> for PullError {
    fn from(e: Error) -> Self {
        PullError::Local(e)
    }
}

/// A layer of a manifest.
#[derive(Debug, Clone)]
pub(crate) struct LayerDesc {
    pub digest: String,
    pub size: u64,
    pub media_type: String,
    pub foreign: bool,
    /// An OCI artifact's layer: kept as one file of this name, not unpacked.
    pub file: Option<String>,
    /// Its manifest entry's annotations (where an eStargz or zstd:chunked layer's TOC is:
    /// `lazy::TocRef::of`).
    pub annotations: serde_json::Value,
}

/// One item of a layer's byte stream into the unpacker.
enum Chunk {
    Data(Bytes),
    /// The stream ended and verified.
    Done,
    Fail(String),
}

/// The unpacker's side of a layer stream: an error unless the stream ended with `Done`.
struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<Chunk>,
    cur: Bytes,
    done: bool,
}

impl std::io::Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.cur.is_empty() {
            if self.done {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(Chunk::Data(b)) => self.cur = b,
                Some(Chunk::Done) => self.done = true,
                Some(Chunk::Fail(m)) => return Err(std::io::Error::other(m)),
                None => return Err(std::io::Error::other("the download was cancelled")),
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur[..n]);
        let _ = self.cur.split_to(n);
        Ok(n)
    }
}

/// What a lazy layer's completion brings to [`fetch_layer`] beyond a pull's.
pub(crate) struct Completion {
    /// The node-wide marker of containers reading lazy layers: the unpacker pauses while it
    /// is fresh.
    pub gate: PathBuf,
    /// The start of the blob its reads fetched already (`len` bytes of `file`, read from
    /// there instead of asked of the registry again, and hashed with the rest as any byte).
    pub local: Option<(std::fs::File, u64)>,
}

/// A lazy layer's background completion (`lazy/helper.rs`): the blob `digest` of `size`
/// bytes fetched whole from `reg` (but what `c` has locally) and unpacked as it arrives, as a
/// pull does (its digest and diff id checked before it is committed), the names `left_out`
/// left out of its root, pausing while `c`'s gate says containers read. The store's config
/// must not be lazy.
pub(crate) async fn fetch_whole(
    store: &ImageStore,
    reg: &Arc<Registry>,
    digest: &str,
    size: u64,
    diff_id: &str,
    left_out: &'static [&'static str],
    c: Completion,
) -> Result<()> {
    let l = LayerDesc {
        digest: digest.to_string(),
        size,
        media_type: "application/vnd.oci.image.layer.v1.tar+gzip".into(),
        foreign: false,
        file: None,
        annotations: serde_json::Value::Null,
    };
    let progress = LayerProgress::detached(digest, size);
    fetch_layer(store, reg, &l, diff_id, &progress, left_out, Some(c))
        .await
        .map(|_| ())
        .map_err(|e| e.into_error(digest))
}

/// Downloads one layer and unpacks it as it arrives (the root's names `left_out` left out;
/// for a lazy layer's completion, its local start read first and the unpacker paused while
/// the lazy layers' gate marker is fresh); returns the digest of its kept blob (when blobs
/// are kept).
pub(crate) async fn fetch_layer(
    store: &ImageStore,
    reg: &Arc<Registry>,
    l: &LayerDesc,
    diff_id: &str,
    progress: &LayerProgress,
    left_out: &'static [&'static str],
    completion: Option<Completion>,
) -> std::result::Result<Option<String>, PullError> {
    let started = Instant::now();
    let ranges = super::ranged::Ranges {
        parts: store.cfg.range_parts,
        part_bytes: store.cfg.range_part_bytes,
        budget: store.range_budget.clone(),
    };
    let (gate, local) = match completion {
        Some(c) => (
            Some(c.gate),
            c.local.filter(|(_, n)| *n > 0 && *n <= l.size),
        ),
        None => (None, None),
    };
    let from = local.as_ref().map_or(0, |(_, n)| *n);
    let mut body =
        super::ranged::LayerBody::open_from(reg.clone(), &l.digest, l.size, from, ranges).await?;
    // The local start, then the registry's bytes.
    let mut local = local.map(|(f, n)| (f, 0u64, n));
    let ranged = body.ranged();
    let (tx, rx) = tokio::sync::mpsc::channel::<Chunk>(CHANNEL_DEPTH);
    let unpacker = {
        let store = store.clone();
        let diff_id = diff_id.to_string();
        let file = l.file.clone();
        tokio::task::spawn_blocking(move || {
            let reader = ChannelReader {
                rx,
                cur: Bytes::new(),
                done: false,
            };
            let reader: Box<dyn std::io::Read + Send> = match gate {
                Some(marker) => Box::new(super::lazy_dirs::Gated::new(reader, marker)),
                None => Box::new(reader),
            };
            match &file {
                Some(name) => store.put_file_layer(&diff_id, name, reader),
                None => store.unpack_layer_without(&diff_id, reader, left_out),
            }
        })
    };
    // With blobs kept, the compressed bytes are written on the way (renamed into the store
    // only once verified).
    let blob_tmp = if store.cfg.keep_layer_blobs {
        let p = store.temp_path("blob");
        Some((
            crate::state::files::create_file(&p, crate::state::files::FILE_MODE)
                .map_err(|e| PullError::Local(Error::Host(e)))?,
            p,
        ))
    } else {
        None
    };
    let mut blob_tmp = blob_tmp;
    let mut hasher = sha2::Sha256::new();
    let mut got = 0u64;
    let streamed: std::result::Result<(), String> = async {
        loop {
            let c = match local.as_mut().filter(|(_, at, n)| at < n) {
                Some((f, at, n)) => {
                    let mut b = vec![0u8; (*n - *at).min(LOCAL_READ) as usize];
                    std::os::unix::fs::FileExt::read_exact_at(f, &mut b, *at)
                        .map_err(|e| format!("layer {}: read what was fetched: {e}", l.digest))?;
                    *at += b.len() as u64;
                    Bytes::from(b)
                }
                None => match body.chunk().await {
                    Ok(Some(c)) => c,
                    Ok(None) => break,
                    Err(e) => return Err(e.to_string()),
                },
            };
            got += c.len() as u64;
            progress.received(c.len() as u64);
            if got > l.size {
                return Err(format!(
                    "layer {}: the registry sent more than the {} bytes the manifest says",
                    l.digest, l.size
                ));
            }
            hasher.update(&c);
            if let Some((f, p)) = blob_tmp.as_mut() {
                std::io::Write::write_all(f, &c)
                    .map_err(|e| format!("write {}: {e}", p.display()))?;
            }
            if tx.send(Chunk::Data(c)).await.is_err() {
                return Err("the unpacker stopped".into());
            }
        }
        if got != l.size {
            return Err(format!(
                "layer {}: the registry sent {got} of the {} bytes the manifest says",
                l.digest, l.size
            ));
        }
        let digest = format!("sha256:{}", super::unpack::hex(&hasher.clone().finalize()));
        if digest != l.digest {
            return Err(format!(
                "layer {}: the registry sent content {digest}",
                l.digest
            ));
        }
        Ok(())
    }
    .await;
    let _ = tx
        .send(match &streamed {
            Ok(()) => Chunk::Done,
            Err(m) => Chunk::Fail(m.clone()),
        })
        .await;
    drop(tx);
    let unpacked = unpacker.await.map_err(|e| {
        PullError::Local(Error::step(
            "unpack layer",
            diff_id,
            HostError::Other(e.to_string()),
        ))
    })?;
    let remove_tmp = |t: &Option<(std::fs::File, PathBuf)>| {
        if let Some((_, p)) = t {
            let _ = std::fs::remove_file(p);
        }
    };
    if let Err(m) = streamed {
        remove_tmp(&blob_tmp);
        return Err(RegistryError::Invalid(m).into());
    }
    let applied = match unpacked {
        Ok(a) => a,
        Err(e) => {
            remove_tmp(&blob_tmp);
            return Err(PullError::Local(e));
        }
    };
    let secs = started.elapsed().as_secs_f64();
    tracing::debug!(layer = %l.digest, diff_id, bytes = l.size, ranged, entries = applied.entries, unpacked_bytes = applied.bytes, seconds = secs, "layer pulled");
    match blob_tmp {
        Some((f, p)) => {
            drop(f);
            let dest = store.blob_path(&l.digest)?;
            std::fs::rename(&p, &dest)
                .map_err(|e| PullError::Local(Error::Host(HostError::io("rename", &dest, e))))?;
            Ok(Some(l.digest.clone()))
        }
        None => Ok(None),
    }
}
