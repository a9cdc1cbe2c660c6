//! The image store under `<root>/images`: content-addressed blobs (sha256 verified before they
//! are kept), unpacked layers (one overlay lowerdir per diff id, shared by every image and
//! pull that has it), OCI artifacts' files (`artifacts/`, a namespace of their own: an
//! artifact's bytes never stand in for an image's layer), and `images.json` (image id → tags,
//! repo digests, layers, the blobs it holds, exec config). An image's id is its config digest;
//! an artifact's is its manifest digest (artifacts commonly share one empty config). The index is re-read on every call and updated under a file lock, so
//! a local `sandboxctl images import` and the daemon share it safely.
//!
//! Nothing is half-made: a layer is unpacked into a private temp dir and renamed into place
//! only once its diff id verified and its files are on disk (a `syncfs`: the index that
//! names it survives a power cut, so its data must too; a layer someone else committed
//! meanwhile is simply reused);
//! a blob is renamed into place only once its digest verified. Removing an image collects the
//! blobs and layers nothing references any more (no other image, no container, no pull in
//! flight).
#![allow(unsafe_code)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::Digest;

use super::reference::Reference;
use super::unpack::{self, hex};
use crate::config::StoreConfig;
use crate::error::{Error, HostError, Result};

/// Largest manifest, index or image config accepted (from a registry or an archive).
pub const MAX_DOCUMENT: u64 = 4 << 20;

/// The parts of an image config a container needs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ExecConfig {
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub env: Vec<String>,
    pub working_dir: String,
    pub user: String,
    pub stop_signal: String,
}

/// One image in the store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ImageRecord {
    /// `sha256:<config digest>` of an image; `sha256:<manifest digest>` of an artifact.
    pub id: String,
    pub repo_tags: Vec<String>,
    pub repo_digests: Vec<String>,
    /// Sum of the config and (compressed) layer sizes.
    pub size: u64,
    /// Diff ids, bottom layer first (an artifact's: the keys of its files under
    /// `artifacts/`, see [`super::artifact::layer_key`]).
    pub layers: Vec<String>,
    pub config: ExecConfig,
    /// Digests of the blobs this image holds in the store (its config, its manifest, its
    /// compressed layers when those are kept).
    pub blobs: Vec<String>,
    /// An OCI artifact, not a runnable image: each layer is one file (named by its
    /// `org.opencontainers.image.title`), kept as it came. Mountable as an image volume only.
    #[serde(default)]
    pub artifact: bool,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
struct Index {
    /// [`INDEX_FORMAT`] when written by this build (absent: 0, the same shape as 1).
    format: u32,
    images: BTreeMap<String, ImageRecord>,
}

/// The format of `images.json` this build writes. An index of a newer format (a downgrade) is
/// read but never written: a pull or removal is refused with a message naming both formats
/// rather than dropping what this build does not know.
pub const INDEX_FORMAT: u32 = 1;

/// The range-request budget's permits are this many bytes each (a semaphore counts in `u32`).
pub const RANGE_PERMIT_BYTES: u64 = 64 << 10;

/// The store; cheap to clone (clones share the pins of work in flight).
#[derive(Debug, Clone)]
pub struct ImageStore {
    pub dir: PathBuf,
    pub cfg: StoreConfig,
    /// Layers and blobs that work in flight (a pull, an import, a container being created)
    /// relies on before any record names them: collection leaves them alone.
    pins: Arc<Mutex<HashMap<String, usize>>>,
    /// The pulls in flight and what each has received (`ImageStatus` verbose shows it).
    pub pulls: Arc<super::progress::Pulls>,
    /// The layers being fetched, so that concurrent pulls fetch each once.
    pub in_flight: super::in_flight::InFlight,
    /// The budget of layer parts fetched ahead (`range_buffer_bytes`), over all pulls.
    pub range_budget: Arc<tokio::sync::Semaphore>,
    /// Where short names are resolved from (none: `docker.io`).
    pub short_names: super::short_names::ShortNameFiles,
}

/// Keeps digests pinned until dropped.
pub struct Pins {
    store: Arc<Mutex<HashMap<String, usize>>>,
    held: Vec<String>,
}

impl Pins {
    /// Pins one more digest.
    pub fn add(&mut self, digest: &str) {
        *crate::state::lock(&self.store)
            .entry(digest.to_string())
            .or_default() += 1;
        self.held.push(digest.to_string());
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        let mut m = crate::state::lock(&self.store);
        for d in &self.held {
            if let Some(n) = m.get_mut(d) {
                *n -= 1;
                if *n == 0 {
                    m.remove(d);
                }
            }
        }
    }
}

pub(crate) fn herr(e: HostError) -> Error {
    Error::Host(e)
}

pub(crate) fn bad(what: &str) -> Error {
    Error::InvalidArgument(format!("image: {what}"))
}

/// A layer that could not be applied: over this node's limits → ResourceExhausted, bad
/// content → the image is invalid, the host's own failure as it is (with `context`).
pub(crate) fn layer_error(context: &str, e: unpack::LayerError) -> Error {
    match e {
        unpack::LayerError::OverLimit(m) => Error::ResourceExhausted(format!("{context}: {m}")),
        unpack::LayerError::Host(h) => Error::step("unpack layer", context, h),
        e => bad(&format!("{context}: {e}")),
    }
}

/// The hex part of a `sha256:` digest, checked.
pub fn digest_hex(d: &str) -> Result<&str> {
    let h = d
        .strip_prefix("sha256:")
        .ok_or_else(|| bad(&format!("unsupported digest {d:?}")))?;
    if h.len() == 64
        && h.bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    {
        Ok(h)
    } else {
        Err(bad(&format!("malformed digest {d:?}")))
    }
}

/// `sha256:<hex>` of `data`.
pub fn sha256_of(data: &[u8]) -> String {
    format!("sha256:{}", hex(&sha2::Sha256::digest(data)))
}

/// The parts of a config that register needs.
pub(crate) struct ParsedConfig {
    pub diff_ids: Vec<String>,
    pub exec: ExecConfig,
}

/// Parses an image config: its diff ids and what a container needs.
pub(crate) fn parse_config(config_bytes: &[u8]) -> Result<ParsedConfig> {
    let config: Value =
        serde_json::from_slice(config_bytes).map_err(|e| bad(&format!("config: {e}")))?;
    let diff_ids: Vec<String> = config["rootfs"]["diff_ids"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|d| d.as_str().map(str::to_string))
        .collect();
    for d in &diff_ids {
        digest_hex(d)?;
    }
    let c = &config["config"];
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    Ok(ParsedConfig {
        diff_ids,
        exec: ExecConfig {
            entrypoint: strings(&c["Entrypoint"]),
            cmd: strings(&c["Cmd"]),
            env: strings(&c["Env"]),
            working_dir: c["WorkingDir"].as_str().unwrap_or("").to_string(),
            user: c["User"].as_str().unwrap_or("").to_string(),
            stop_signal: c["StopSignal"].as_str().unwrap_or("").to_string(),
        },
    })
}

/// What a new image is made of, for [`ImageStore::register`].
pub(crate) struct NewImage<'a> {
    /// The image's id: its config digest, or an artifact's manifest digest.
    pub id: &'a str,
    pub parsed: ParsedConfig,
    pub size: u64,
    pub blobs: Vec<String>,
    pub tag: Option<&'a str>,
    pub manifest_digest: Option<&'a str>,
    pub artifact: bool,
}

impl ImageStore {
    pub fn new(dir: PathBuf) -> Result<Self> {
        Self::with_config(dir, StoreConfig::default())
    }

    pub fn with_config(dir: PathBuf, cfg: StoreConfig) -> Result<Self> {
        for d in [
            "",
            "blobs",
            "blobs/sha256",
            "layers",
            "artifacts",
            "lazy",
            "tmp",
        ] {
            let p = dir.join(d);
            crate::state::files::private_dir_all(&p).map_err(herr)?;
            crate::state::files::restrict_dir(&p).map_err(herr)?;
        }
        let permits = (cfg.range_buffer_bytes / RANGE_PERMIT_BYTES)
            .min(tokio::sync::Semaphore::MAX_PERMITS as u64) as usize;
        let store = ImageStore {
            dir,
            cfg,
            pins: Arc::default(),
            pulls: Arc::default(),
            in_flight: Default::default(),
            range_budget: Arc::new(tokio::sync::Semaphore::new(permits)),
            short_names: Default::default(),
        };
        store.drop_shared_artifacts()?;
        store.drop_lost_lazy_layers()?;
        Ok(store)
    }

    /// The store as a lazy layer's server sees it (made and migrated by the daemon already):
    /// only to unpack its completed layer into.
    pub(crate) fn for_layer_server(dir: PathBuf, cfg: StoreConfig) -> Self {
        ImageStore {
            dir,
            cfg,
            pins: Arc::default(),
            pulls: Arc::default(),
            in_flight: Default::default(),
            range_budget: Arc::new(tokio::sync::Semaphore::new(1)),
            short_names: Default::default(),
        }
    }

    /// Lazy layers whose server is gone (a reboot) are removed, and the images that named
    /// one not unpacked otherwise are dropped: kubelet pulls them again.
    fn drop_lost_lazy_layers(&self) -> Result<()> {
        let lost: HashSet<String> = super::lazy_dirs::sweep_lost(&self.dir)
            .into_iter()
            .collect();
        if lost.is_empty() || !self.dir.join("images.json").exists() {
            return Ok(());
        }
        self.with_index(|ix| {
            ix.images.retain(|id, i| {
                let keep = !i.layers.iter().any(|l| lost.contains(l));
                if !keep {
                    tracing::warn!(image = %id, tags = ?i.repo_tags, "dropped an image whose lazy layer's server is gone: pull it again");
                }
                keep
            });
            Ok(())
        })
    }

    /// Stores made before artifacts had a namespace of their own kept an artifact's files in
    /// `layers/<blob digest>`, where an image's layer of that diff id would be found, and keyed
    /// the artifact by its config: such artifact records are dropped, with every image that
    /// lists one of their layer dirs, and those dirs are moved out of `layers/` (into `tmp/`,
    /// collected by age) so that nothing unverified is ever stacked as an image's layer.
    /// Kubelet pulls what it still needs again.
    fn drop_shared_artifacts(&self) -> Result<()> {
        if !self.dir.join("images.json").exists() {
            return Ok(());
        }
        let tainted = self.with_index(|ix| {
            let tainted: HashSet<String> = ix
                .images
                .values()
                .filter(|i| i.artifact && !i.layers.iter().all(|l| self.has_artifact_layer(l)))
                .flat_map(|i| i.layers.iter().cloned())
                .collect();
            ix.images.retain(|id, i| {
                let keep = !i.layers.iter().any(|l| tainted.contains(l));
                if !keep {
                    tracing::warn!(image = %id, tags = ?i.repo_tags, "dropped an image recorded by an earlier version that stored artifacts among image layers: pull it again");
                }
                keep
            });
            Ok(tainted)
        })?;
        for l in &tainted {
            let Ok(d) = self.layer_dir(l) else { continue };
            if d.is_dir() {
                let to = self
                    .dir
                    .join("tmp")
                    .join(format!("tainted-{}", digest_hex(l)?));
                if let Err(e) = std::fs::rename(&d, &to) {
                    tracing::warn!(layer = %d.display(), error = %e, "cannot move a layer dir an artifact shared out of the way");
                }
            }
        }
        Ok(())
    }

    /// Limits for unpacking one layer.
    pub fn limits(&self) -> unpack::Limits {
        unpack::Limits {
            max_bytes: self.cfg.max_layer_bytes,
            max_entries: self.cfg.max_layer_entries,
            min_free_bytes: self.cfg.min_free_bytes,
        }
    }

    /// Pins `digests` (layers or blobs) against collection until the guard is dropped.
    pub fn pin<'a>(&self, digests: impl IntoIterator<Item = &'a str>) -> Pins {
        let mut p = Pins {
            store: self.pins.clone(),
            held: Vec::new(),
        };
        for d in digests {
            p.add(d);
        }
        p
    }

    /// Where a blob is (or would be) stored.
    pub fn blob_path(&self, digest: &str) -> Result<PathBuf> {
        Ok(self.dir.join("blobs/sha256").join(digest_hex(digest)?))
    }

    /// The unpacked dir of a layer (an overlay lowerdir).
    pub fn layer_dir(&self, diff_id: &str) -> Result<PathBuf> {
        Ok(self.dir.join("layers").join(digest_hex(diff_id)?))
    }

    /// Is the layer unpacked already (by any image, any earlier pull)?
    pub fn has_layer(&self, diff_id: &str) -> bool {
        self.layer_dir(diff_id).is_ok_and(|d| d.is_dir())
    }

    /// The dir of an artifact's file (named by [`super::artifact::layer_key`]).
    pub fn artifact_dir(&self, key: &str) -> Result<PathBuf> {
        Ok(self.dir.join("artifacts").join(digest_hex(key)?))
    }

    /// Is this artifact file stored already?
    pub fn has_artifact_layer(&self, key: &str) -> bool {
        self.artifact_dir(key).is_ok_and(|d| d.is_dir())
    }

    /// A layer's dir in the namespace of its kind: an image's unpacked layer, or an
    /// artifact's file.
    pub fn content_dir(&self, key: &str, artifact: bool) -> Result<PathBuf> {
        match artifact {
            true => self.artifact_dir(key),
            false => self.layer_dir(key),
        }
    }

    /// Is this layer (of an image or of an artifact) stored already, unpacked or served
    /// lazily?
    pub fn has_content(&self, key: &str, artifact: bool) -> bool {
        self.content_dir(key, artifact).is_ok_and(|d| d.is_dir())
            || (!artifact && self.lazy_lower(key).is_some())
    }

    /// The mount of a lazy layer that is served, if any.
    fn lazy_lower(&self, diff_id: &str) -> Option<PathBuf> {
        let d = super::lazy_dirs::dir(&self.dir, digest_hex(diff_id).ok()?);
        super::lazy_dirs::is_ready(&d).then(|| super::lazy_dirs::mount_point(&d))
    }

    /// Holds the node's lazy-layer completions back for `d` when one of `layers` is still
    /// served lazily (a container of them being made, or — `replace`: its hold ends with
    /// this one — started: `lazy_dirs::hold_reads`).
    pub fn give_way(&self, layers: &[String], d: std::time::Duration, replace: bool) {
        let lazy = layers
            .iter()
            .any(|l| self.layer_dir(l).is_ok_and(|d| !d.is_dir()) && self.lazy_lower(l).is_some());
        if lazy {
            super::lazy_dirs::hold_reads(&super::lazy_dirs::reads_marker(&self.dir), d, replace);
        }
    }

    /// Where a layer is stacked from: its unpacked dir, else its lazy mount, else the
    /// unpacked dir's path (the mount then fails naming it).
    pub fn lower_dir(&self, diff_id: &str) -> Result<PathBuf> {
        let d = self.layer_dir(diff_id)?;
        if d.is_dir() {
            return Ok(d);
        }
        Ok(self.lazy_lower(diff_id).unwrap_or(d))
    }

    /// [`ImageStore::lower_dir`] of an image's layer, [`ImageStore::artifact_dir`] of an
    /// artifact's.
    pub fn mount_dir(&self, key: &str, artifact: bool) -> Result<PathBuf> {
        match artifact {
            true => self.artifact_dir(key),
            false => self.lower_dir(key),
        }
    }

    /// A fresh private dir under `tmp/` (`what-<random>`).
    pub fn temp_dir(&self, what: &str) -> Result<PathBuf> {
        let tmp = self.temp_path(what);
        crate::state::files::private_dir(&tmp).map_err(herr)?;
        Ok(tmp)
    }

    /// A new path in the store's `tmp/`: `<what>-<our pid>-<random>`, so that a sweep can
    /// tell work in flight (its process lives) from what a killed one left.
    pub(crate) fn temp_path(&self, what: &str) -> PathBuf {
        self.dir.join("tmp").join(format!(
            "{what}-{}-{}",
            std::process::id(),
            &crate::validate::new_id()[..16]
        ))
    }

    /// Stores a blob read from `r` (at most `max` bytes), verifying it against `digest`;
    /// returns its size. A blob already stored is not written again.
    pub fn put_blob(&self, digest: &str, r: &mut dyn Read, max: u64) -> Result<u64> {
        let dest = self.blob_path(digest)?;
        if let Ok(m) = std::fs::metadata(&dest) {
            return Ok(m.len());
        }
        let tmp = self.temp_path("blob");
        let result = (|| {
            let mut f = crate::state::files::create_file(&tmp, crate::state::files::FILE_MODE)
                .map_err(herr)?;
            let mut hasher = sha2::Sha256::new();
            let mut buf = vec![0u8; 64 * 1024];
            let mut size = 0u64;
            let mut r = r.take(max + 1);
            loop {
                let n = r
                    .read(&mut buf)
                    .map_err(|e| herr(HostError::io("read blob for", &dest, e)))?;
                if n == 0 {
                    break;
                }
                size += n as u64;
                if size > max {
                    return Err(bad(&format!("blob {digest} is larger than {max} bytes")));
                }
                hasher.update(&buf[..n]);
                std::io::Write::write_all(&mut f, &buf[..n])
                    .map_err(|e| herr(HostError::io("write blob for", &dest, e)))?;
            }
            let got = format!("sha256:{}", hex(&hasher.finalize()));
            if got != digest {
                return Err(bad(&format!(
                    "blob content is {got}, not the expected {digest}; rejected"
                )));
            }
            f.sync_all()
                .map_err(|e| herr(HostError::io("fsync", &tmp, e)))?;
            std::fs::rename(&tmp, &dest).map_err(|e| herr(HostError::io("rename", &dest, e)))?;
            // The name too, before the index that names the blob can be written: on ext4 the
            // index's fsync happens to commit it, which no filesystem promises.
            crate::state::sync_dir(dest.parent().unwrap_or(&self.dir)).map_err(herr)?;
            Ok(size)
        })();
        let _ = std::fs::remove_file(&tmp);
        result
    }

    /// Reads a stored blob of at most `max` bytes.
    pub fn read_blob(&self, digest: &str, max: u64) -> Result<Vec<u8>> {
        let p = self.blob_path(digest)?;
        crate::untrusted_fs::read_file(&p, max).map_err(|e| bad(&e.to_string()))
    }

    /// Unpacks the layer `raw` (plain, gzip or zstd tar) as `diff_id`: into a private temp
    /// dir within the store's limits, checked against the diff id, then renamed into place. A
    /// layer already there (unpacked meanwhile by another pull or import) is kept and this
    /// copy dropped. Returns what was unpacked.
    pub fn unpack_layer(
        &self,
        diff_id: &str,
        raw: Box<dyn Read + Send + '_>,
    ) -> Result<unpack::Applied> {
        self.unpack_layer_without(diff_id, raw, &[])
    }

    /// [`ImageStore::unpack_layer`], then the regular files named `drop` at the layer's root
    /// removed before it is committed (an eStargz layer's TOC and landmarks, which its lazy
    /// view does not show either).
    pub fn unpack_layer_without(
        &self,
        diff_id: &str,
        raw: Box<dyn Read + Send + '_>,
        drop: &[&str],
    ) -> Result<unpack::Applied> {
        let dest = self.layer_dir(diff_id)?;
        let tmp = self.temp_dir("layer")?;
        let result = (|| {
            let (applied, got) = unpack::apply_layer(raw, &tmp, &self.limits())
                .map_err(|e| layer_error(diff_id, e))?;
            if got != diff_id {
                return Err(bad(&format!(
                    "layer content is {got}, the config says {diff_id}"
                )));
            }
            for name in drop {
                let p = tmp.join(name);
                if std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_file()) {
                    std::fs::remove_file(&p).map_err(|e| herr(HostError::io("remove", &p, e)))?;
                }
            }
            // Its files' data durable before its name is: the index names the layer next.
            if self.cfg.sync_layers {
                crate::state::sync_filesystem(&tmp).map_err(herr)?;
            }
            match std::fs::rename(&tmp, &dest) {
                Ok(()) => {
                    crate::state::sync_dir(dest.parent().unwrap_or(&self.dir)).map_err(herr)?;
                    Ok(applied)
                }
                // Someone else committed the same (verified) layer first: theirs is as good.
                Err(_) if dest.is_dir() => Ok(applied),
                Err(e) => Err(herr(HostError::io("rename", &dest, e))),
            }
        })();
        if tmp.exists() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        result
    }

    /// Runs `f` on the index under an exclusive lock and saves it.
    fn with_index<T>(&self, f: impl FnOnce(&mut Index) -> Result<T>) -> Result<T> {
        let _lock = self.lock_index()?;
        let path = self.dir.join("images.json");
        let mut index: Index = crate::state::read_record(&path, INDEX_FORMAT)
            .map_err(herr)?
            .unwrap_or_default();
        index.format = INDEX_FORMAT;
        let r = f(&mut index)?;
        crate::state::write_json_atomic(&path, &index).map_err(herr)?;
        Ok(r)
    }

    /// The index lock (held until the file is dropped).
    fn lock_index(&self) -> Result<File> {
        let lock_path = self.dir.join("images.lock");
        let lock = crate::state::files::create_file(&lock_path, crate::state::files::FILE_MODE)
            .map_err(herr)?;
        loop {
            // SAFETY: flock on an fd we own; released when `lock` is dropped.
            if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(lock);
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(herr(HostError::io("lock", &lock_path, e)));
            }
        }
    }

    fn index(&self) -> Index {
        crate::state::read_json(&self.dir.join("images.json"))
            .ok()
            .flatten()
            .unwrap_or_default()
    }

    pub fn list(&self) -> Vec<ImageRecord> {
        self.index().images.into_values().collect()
    }

    /// Finds an image by id, id prefix (≥ 12 hex), repo tag or repo digest; a short name
    /// by the first of its candidates stored (`short_names.rs`), as CRI-O looks it up.
    pub fn get(&self, name: &str) -> Option<ImageRecord> {
        let images = self.index().images;
        let id = name.strip_prefix("sha256:").unwrap_or(name);
        if id.len() >= 12 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
            let hits: Vec<_> = images
                .values()
                .filter(|i| i.id[7..].starts_with(id))
                .collect();
            if hits.len() == 1 {
                return Some(hits[0].clone());
            }
        }
        if name.starts_with("sha256:") {
            return None;
        }
        let candidates = self.candidates(name)?;
        candidates.iter().find_map(|r| {
            let full = r.full();
            images
                .values()
                .find(|i| i.repo_tags.contains(&full) || i.repo_digests.contains(&full))
                .cloned()
        })
    }

    /// What `name` may mean (none if it cannot be parsed or the registry files are unusable:
    /// then nothing is found, and the pull kubelet tries next says why).
    fn candidates(&self, name: &str) -> Option<Vec<Reference>> {
        super::short_names::candidates(name, &self.short_names)
            .map_err(
                |e| tracing::debug!(image = name, error = %e, "image name resolves to nothing"),
            )
            .ok()
    }

    /// The pull of `name` in flight (its first candidate being pulled), if any.
    pub fn pulling(&self, name: &str) -> Option<super::progress::Snapshot> {
        self.candidates(name)?
            .iter()
            .find_map(|r| self.pulls.get(&r.full()))
    }

    /// Removes an image (by any name [`get`](Self::get) accepts) with all its tags, then
    /// collects what nothing references any more; `in_use` are layers containers use.
    /// An unknown image is `Ok(false)`.
    pub fn remove(&self, name: &str, in_use: &HashSet<String>) -> Result<bool> {
        let Some(img) = self.get(name) else {
            return Ok(false);
        };
        self.with_index(|ix| {
            ix.images.remove(&img.id);
            Ok(())
        })?;
        self.collect(in_use)?;
        Ok(true)
    }

    /// The layer dirs and blobs that no image, no container (`in_use`) and no work in flight
    /// references: what [`ImageStore::collect`] would delete (the self-audit lists them).
    pub fn unused(&self, in_use: &HashSet<String>) -> Result<Vec<PathBuf>> {
        let _lock = self.lock_index()?;
        Ok(self.unused_locked(in_use))
    }

    fn unused_locked(&self, in_use: &HashSet<String>) -> Vec<PathBuf> {
        let index = self.index();
        let pins = crate::state::lock(&self.pins).clone();
        let keep_layers: HashSet<&str> = index
            .images
            .values()
            .flat_map(|i| i.layers.iter().map(String::as_str))
            .chain(in_use.iter().map(String::as_str))
            .chain(pins.keys().map(String::as_str))
            .filter_map(|d| d.strip_prefix("sha256:"))
            .collect();
        let keep_blobs: HashSet<&str> = index
            .images
            .values()
            .flat_map(|i| i.blobs.iter().chain(std::iter::once(&i.id)))
            .map(String::as_str)
            .chain(pins.keys().map(String::as_str))
            .filter_map(|d| d.strip_prefix("sha256:"))
            .collect();
        let blobs = self.dir.join("blobs/sha256");
        let mut out: Vec<PathBuf> = ["layers", "artifacts", "lazy"]
            .into_iter()
            .flat_map(|d| {
                let dir = self.dir.join(d);
                crate::state::list_dir(&dir)
                    .into_iter()
                    // (`lazy/`'s dot files are its servers' markers and slots.)
                    .filter(|n| !n.starts_with('.'))
                    .filter(|n| !keep_layers.contains(n.as_str()))
                    .map(move |n| dir.join(n))
            })
            .collect();
        out.extend(
            crate::state::list_dir(&blobs)
                .into_iter()
                .filter(|n| !keep_blobs.contains(n.as_str()))
                .map(|n| blobs.join(n)),
        );
        out
    }

    /// Deletes the layers and blobs that no image, no container (`in_use`) and no work in
    /// flight references.
    pub fn collect(&self, in_use: &HashSet<String>) -> Result<(u64, u64)> {
        let _lock = self.lock_index()?;
        let (mut layers, mut blobs) = (0, 0);
        let dirs = [self.dir.join("layers"), self.dir.join("artifacts")];
        let lazy = self.dir.join("lazy");
        for p in self.unused_locked(in_use) {
            if p.parent() == Some(lazy.as_path()) {
                match super::lazy_dirs::remove(&p) {
                    Ok(()) => layers += 1,
                    Err(e) => {
                        tracing::warn!(layer = %p.display(), error = %e, "cannot remove unused lazy layer")
                    }
                }
            } else if dirs.iter().any(|d| p.parent() == Some(d.as_path())) {
                match std::fs::remove_dir_all(&p) {
                    Ok(()) => layers += 1,
                    Err(e) => {
                        tracing::warn!(layer = %p.display(), error = %e, "cannot remove unused layer")
                    }
                }
            } else if std::fs::remove_file(&p).is_ok() {
                blobs += 1;
            }
        }
        if layers + blobs > 0 {
            tracing::info!(layers, blobs, "collected unused image content");
        }
        Ok((layers, blobs))
    }

    /// Removes what interrupted pulls and imports left in `tmp/`: entries whose writing process
    /// is gone, and unnamed ones older than `age`.
    pub fn clean_tmp(&self, age: std::time::Duration) {
        for p in self.abandoned_tmp(age) {
            let _ = std::fs::remove_dir_all(&p).or_else(|_| std::fs::remove_file(&p));
        }
    }

    /// Entries of `tmp/` no pull or import is writing any more: `<what>-<pid>-<random>` whose
    /// writer is gone (a pull or an import killed mid-way), and names without a pid, from
    /// before, older than `age`.
    pub fn abandoned_tmp(&self, age: std::time::Duration) -> Vec<PathBuf> {
        let tmp = self.dir.join("tmp");
        crate::state::list_dir(&tmp)
            .into_iter()
            .filter(|name| {
                let writer_gone = name
                    .rsplit('-')
                    .nth(1)
                    .and_then(|pid| pid.parse::<i32>().ok())
                    .filter(|pid| *pid > 0)
                    .map(|pid| {
                        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
                            == Err(nix::errno::Errno::ESRCH)
                    });
                writer_gone.unwrap_or_else(|| {
                    std::fs::symlink_metadata(tmp.join(name))
                        .and_then(|m| m.modified())
                        .is_ok_and(|t| t.elapsed().unwrap_or_default() >= age)
                })
            })
            .map(|name| tmp.join(name))
            .collect()
    }

    /// Bytes and inodes used by the store.
    pub fn usage(&self) -> (u64, u64) {
        crate::state::disk_usage(&self.dir)
    }

    /// Records an image whose layers are all unpacked already.
    pub(crate) fn register(&self, n: NewImage) -> Result<ImageRecord> {
        for l in &n.parsed.diff_ids {
            if !self.has_content(l, n.artifact) {
                return Err(bad(&format!("layer {l} is not unpacked")));
            }
        }
        let tag = n.tag.map(Reference::parse).transpose()?;
        let id = n.id.to_string();
        self.with_index(|ix| {
            // An image's config digest and an artifact's manifest digest name different
            // things: bytes that are both never merge the two records.
            if ix.images.get(&id).is_some_and(|i| i.artifact != n.artifact) {
                return Err(Error::InvalidArgument(format!(
                    "{id} is stored already as {}",
                    if n.artifact {
                        "an image"
                    } else {
                        "an artifact"
                    }
                )));
            }
            if let Some(t) = &tag {
                // A tag names one image: move it.
                for other in ix.images.values_mut() {
                    other.repo_tags.retain(|x| *x != t.full());
                }
            }
            let rec = ix.images.entry(id.clone()).or_insert_with(|| ImageRecord {
                id: id.clone(),
                ..Default::default()
            });
            rec.size = n.size;
            rec.layers = n.parsed.diff_ids.clone();
            rec.config = n.parsed.exec.clone();
            rec.artifact = n.artifact;
            for b in &n.blobs {
                if !rec.blobs.contains(b) {
                    rec.blobs.push(b.clone());
                }
            }
            if let Some(t) = &tag {
                if t.tag.is_some() && !rec.repo_tags.contains(&t.full()) {
                    rec.repo_tags.push(t.full());
                }
                if let Some(m) = n.manifest_digest {
                    let d = format!("{}@{m}", t.repository());
                    if !rec.repo_digests.contains(&d) {
                        rec.repo_digests.push(d);
                    }
                }
            }
            Ok(rec.clone())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store from before artifacts had their own namespace: the artifact record, and the
    /// image that stacked the layer dir the artifact wrote, are dropped at open and the dir
    /// leaves `layers/`; an unrelated image stays.
    #[test]
    fn artifacts_stored_among_image_layers_are_dropped_at_open() {
        let dir =
            std::env::temp_dir().join(format!("sandboxd-store-{}", crate::validate::new_id()));
        let store = ImageStore::new(dir.clone()).unwrap();
        let (shared, other) = (
            format!("sha256:{}", "a".repeat(64)),
            format!("sha256:{}", "b".repeat(64)),
        );
        for l in [&shared, &other] {
            std::fs::create_dir_all(store.layer_dir(l).unwrap()).unwrap();
        }
        let rec = |id: char, layers: &[&String], artifact| ImageRecord {
            id: format!("sha256:{}", id.to_string().repeat(64)),
            layers: layers.iter().map(|s| s.to_string()).collect(),
            artifact,
            ..Default::default()
        };
        store
            .with_index(|ix| {
                for r in [
                    rec('1', &[&shared], true),
                    rec('2', &[&other, &shared], false),
                    rec('3', &[&other], false),
                ] {
                    ix.images.insert(r.id.clone(), r);
                }
                Ok(())
            })
            .unwrap();
        let store = ImageStore::new(dir.clone()).unwrap();
        let left: Vec<String> = store.list().into_iter().map(|i| i.id).collect();
        assert_eq!(left, vec![format!("sha256:{}", "3".repeat(64))]);
        assert!(!store.has_layer(&shared) && store.has_layer(&other));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
