//! The image store under `<root>/images`: content-addressed blobs (sha256 verified on write; a
//! mismatching blob is rejected and not stored), unpacked layers (one overlay lowerdir per
//! diff id), and `images.json` (image id → tags, repo digests, layers, exec config). The
//! index is re-read on every call and updated under a file lock, so a local
//! `sandboxctl images import` and the daemon share it safely.
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::Digest;

use super::reference::Reference;
use super::unpack::{self, hex};
use crate::error::{Error, HostError, Result};

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
    /// `sha256:<config digest>`.
    pub id: String,
    pub repo_tags: Vec<String>,
    pub repo_digests: Vec<String>,
    /// Sum of the config and layer blob sizes.
    pub size: u64,
    /// Diff ids, bottom layer first.
    pub layers: Vec<String>,
    pub config: ExecConfig,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
struct Index {
    images: BTreeMap<String, ImageRecord>,
}

/// The store; cheap to construct, holds no state besides its path.
#[derive(Debug, Clone)]
pub struct ImageStore {
    pub dir: PathBuf,
}

/// Copies `r` to `w` while hashing it; an error unless the content is `digest`.
fn copy_verified(
    r: &mut dyn Read,
    w: &mut dyn std::io::Write,
    digest: &str,
    dest: &Path,
) -> Result<u64> {
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut size = 0u64;
    loop {
        let n = r
            .read(&mut buf)
            .map_err(|e| herr(HostError::io("read blob for", dest, e)))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        w.write_all(&buf[..n])
            .map_err(|e| herr(HostError::io("write blob for", dest, e)))?;
        size += n as u64;
    }
    let got = format!("sha256:{}", hex(&hasher.finalize()));
    if got != digest {
        return Err(bad(&format!(
            "blob content is {got}, not the expected {digest}; rejected"
        )));
    }
    Ok(size)
}

fn herr(e: HostError) -> Error {
    Error::Host(e)
}

fn bad(what: &str) -> Error {
    Error::InvalidArgument(format!("image: {what}"))
}

fn digest_hex(d: &str) -> Result<&str> {
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

impl ImageStore {
    pub fn new(dir: PathBuf) -> Result<Self> {
        for d in ["blobs/sha256", "layers", "tmp"] {
            let p = dir.join(d);
            std::fs::create_dir_all(&p).map_err(|e| herr(HostError::io("create", &p, e)))?;
        }
        Ok(ImageStore { dir })
    }

    /// Where a blob is (or would be) stored.
    pub fn blob_path(&self, digest: &str) -> Result<PathBuf> {
        Ok(self.dir.join("blobs/sha256").join(digest_hex(digest)?))
    }

    /// The unpacked dir of a layer (an overlay lowerdir).
    pub fn layer_dir(&self, diff_id: &str) -> Result<PathBuf> {
        Ok(self.dir.join("layers").join(digest_hex(diff_id)?))
    }

    /// Stores a blob read from `r`, verifying it against `digest`; returns its size.
    pub fn put_blob(&self, digest: &str, r: &mut dyn Read) -> Result<u64> {
        let dest = self.blob_path(digest)?;
        if dest.exists() {
            return Ok(std::fs::metadata(&dest).map(|m| m.len()).unwrap_or(0));
        }
        let tmp = self
            .dir
            .join("tmp")
            .join(format!("blob-{}", crate::validate::new_id()));
        let result = (|| {
            let mut f = File::create(&tmp).map_err(|e| herr(HostError::io("create", &tmp, e)))?;
            let size = copy_verified(r, &mut f, digest, &dest)?;
            f.sync_all()
                .map_err(|e| herr(HostError::io("fsync", &tmp, e)))?;
            std::fs::rename(&tmp, &dest).map_err(|e| herr(HostError::io("rename", &dest, e)))?;
            Ok(size)
        })();
        let _ = std::fs::remove_file(&tmp);
        result
    }

    /// Moves a downloaded blob file (under this store's dir) into the store once it matches
    /// `digest`, without a second copy; returns its size. The file is gone afterwards.
    pub fn adopt_blob(&self, digest: &str, file: &Path) -> Result<u64> {
        let dest = self.blob_path(digest)?;
        let result = (|| {
            let mut f = File::open(file).map_err(|e| herr(HostError::io("open", file, e)))?;
            let size = copy_verified(&mut f, &mut std::io::sink(), digest, &dest)?;
            f.sync_all()
                .map_err(|e| herr(HostError::io("fsync", file, e)))?;
            std::fs::rename(file, &dest).map_err(|e| herr(HostError::io("rename", &dest, e)))?;
            Ok(size)
        })();
        let _ = std::fs::remove_file(file);
        result
    }

    /// Runs `f` on the index under an exclusive lock and saves it.
    fn with_index<T>(&self, f: impl FnOnce(&mut Index) -> Result<T>) -> Result<T> {
        let lock_path = self.dir.join("images.lock");
        let lock =
            File::create(&lock_path).map_err(|e| herr(HostError::io("create", &lock_path, e)))?;
        // SAFETY: flock on an fd we own; released when `lock` is dropped.
        unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
        let path = self.dir.join("images.json");
        let mut index: Index = crate::state::read_json(&path)
            .map_err(herr)?
            .unwrap_or_default();
        let r = f(&mut index)?;
        crate::state::write_json_atomic(&path, &index).map_err(herr)?;
        Ok(r)
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

    /// Finds an image by id, id prefix (≥ 12 hex), repo tag or repo digest.
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
        let full = Reference::parse(name).ok()?.full();
        images
            .into_values()
            .find(|i| i.repo_tags.contains(&full) || i.repo_digests.contains(&full))
    }

    /// Removes an image (by any name [`get`] accepts) and the blobs and layers no other image
    /// uses. `in_use` says whether a container still uses an image id.
    pub fn remove(&self, name: &str, in_use: impl Fn(&str) -> bool) -> Result<bool> {
        let Some(img) = self.get(name) else {
            return Ok(false);
        };
        if in_use(&img.id) {
            return Err(Error::InvalidArgument(format!(
                "image {name} ({}) is used by a container; remove the container first",
                img.id
            )));
        }
        let (keep_layers, keep_blobs) = self.with_index(|ix| {
            ix.images.remove(&img.id);
            let layers: Vec<String> = ix.images.values().flat_map(|i| i.layers.clone()).collect();
            let blobs: Vec<String> = ix.images.keys().cloned().collect();
            Ok((layers, blobs))
        })?;
        for l in &img.layers {
            if !keep_layers.contains(l) {
                let d = self.layer_dir(l)?;
                let _ = std::fs::remove_dir_all(d);
            }
        }
        if !keep_blobs.contains(&img.id) {
            let _ = std::fs::remove_file(self.blob_path(&img.id)?);
        }
        Ok(true)
    }

    /// Bytes and inodes used by the store.
    pub fn usage(&self) -> (u64, u64) {
        crate::state::disk_usage(&self.dir)
    }

    /// Imports an OCI image layout dir, an `oci-archive` tar or a `docker-archive` tar.
    /// `name` tags the image when the archive names none. Returns the imported images.
    pub fn import(&self, path: &Path, name: Option<&str>) -> Result<Vec<ImageRecord>> {
        let meta = std::fs::metadata(path).map_err(|e| herr(HostError::io("open", path, e)))?;
        if meta.is_dir() {
            return self.import_oci_layout(path, name);
        }
        let tmp = self
            .dir
            .join("tmp")
            .join(format!("import-{}", crate::validate::new_id()));
        std::fs::create_dir_all(&tmp).map_err(|e| herr(HostError::io("create", &tmp, e)))?;
        let result = (|| {
            let f = File::open(path).map_err(|e| herr(HostError::io("open", path, e)))?;
            unpack::apply(Box::new(f), &tmp).map_err(herr)?;
            if tmp.join("oci-layout").exists() {
                self.import_oci_layout(&tmp, name)
            } else if tmp.join("manifest.json").exists() {
                self.import_docker_archive(&tmp, name)
            } else {
                Err(bad(&format!(
                    "{} is neither an OCI archive nor a docker archive",
                    path.display()
                )))
            }
        })();
        let _ = std::fs::remove_dir_all(&tmp);
        result
    }

    fn import_oci_layout(&self, dir: &Path, name: Option<&str>) -> Result<Vec<ImageRecord>> {
        let read = |p: &Path| std::fs::read(p).map_err(|e| herr(HostError::io("read", p, e)));
        let index: Value = serde_json::from_slice(&read(&dir.join("index.json"))?)
            .map_err(|e| bad(&format!("index.json: {e}")))?;
        let layout_blob = |digest: &str| -> Result<PathBuf> {
            Ok(dir.join("blobs/sha256").join(digest_hex(digest)?))
        };
        let mut out = Vec::new();
        for desc in index["manifests"].as_array().cloned().unwrap_or_default() {
            let mut desc = desc;
            // A nested index (multi-platform): pick linux/amd64.
            if desc["mediaType"]
                .as_str()
                .is_some_and(|m| m.contains("index") || m.contains("manifest.list"))
            {
                let d = desc["digest"].as_str().unwrap_or("");
                let nested: Value = serde_json::from_slice(&read(&layout_blob(d)?)?)
                    .map_err(|e| bad(&format!("{d}: {e}")))?;
                let pick = nested["manifests"].as_array().and_then(|ms| {
                    ms.iter()
                        .find(|m| {
                            m["platform"]["os"] == "linux"
                                && m["platform"]["architecture"] == "amd64"
                        })
                        .cloned()
                });
                let Some(mut p) = pick else { continue };
                p["annotations"] = desc["annotations"].clone();
                desc = p;
            }
            let mdigest = desc["digest"].as_str().unwrap_or("").to_string();
            let manifest_bytes = read(&layout_blob(&mdigest)?)?;
            self.put_blob(&mdigest, &mut &manifest_bytes[..])?;
            let manifest: Value = serde_json::from_slice(&manifest_bytes)
                .map_err(|e| bad(&format!("manifest: {e}")))?;
            let cdigest = manifest["config"]["digest"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let config_bytes = read(&layout_blob(&cdigest)?)?;
            let mut size = self.put_blob(&cdigest, &mut &config_bytes[..])?;
            let mut layer_blobs = Vec::new();
            for l in manifest["layers"].as_array().cloned().unwrap_or_default() {
                let d = l["digest"].as_str().unwrap_or("").to_string();
                let mut f = File::open(layout_blob(&d)?)
                    .map_err(|e| herr(HostError::io("open", dir, e)))?;
                size += self.put_blob(&d, &mut f)?;
                layer_blobs.push(self.blob_path(&d)?);
            }
            let ann = &desc["annotations"];
            let tag = ann["io.containerd.image.name"]
                .as_str()
                .or(ann["org.opencontainers.image.ref.name"]
                    .as_str()
                    .filter(|r| r.contains('/') || r.contains(':')))
                .map(str::to_string)
                .or(name.map(str::to_string));
            let rec = self.register(
                &config_bytes,
                &cdigest,
                &layer_blobs,
                size,
                tag.as_deref(),
                Some(&mdigest),
            )?;
            out.push(rec);
        }
        if out.is_empty() {
            return Err(bad("the layout holds no linux/amd64 image"));
        }
        Ok(out)
    }

    fn import_docker_archive(&self, dir: &Path, name: Option<&str>) -> Result<Vec<ImageRecord>> {
        let read = |p: &Path| std::fs::read(p).map_err(|e| herr(HostError::io("read", p, e)));
        let manifest: Value = serde_json::from_slice(&read(&dir.join("manifest.json"))?)
            .map_err(|e| bad(&format!("manifest.json: {e}")))?;
        let inside = |rel: &str| -> Result<PathBuf> {
            let p = Path::new(rel);
            if p.is_absolute()
                || p.components()
                    .any(|c| matches!(c, std::path::Component::ParentDir))
            {
                return Err(bad(&format!("archive path {rel:?} escapes the archive")));
            }
            Ok(dir.join(p))
        };
        let mut out = Vec::new();
        for entry in manifest.as_array().cloned().unwrap_or_default() {
            let config_bytes = read(&inside(entry["Config"].as_str().unwrap_or(""))?)?;
            let cdigest = format!("sha256:{}", hex(&sha2::Sha256::digest(&config_bytes)));
            let mut size = self.put_blob(&cdigest, &mut &config_bytes[..])?;
            let mut layer_blobs = Vec::new();
            for l in entry["Layers"].as_array().cloned().unwrap_or_default() {
                let p = inside(l.as_str().unwrap_or(""))?;
                let mut f = File::open(&p).map_err(|e| herr(HostError::io("open", &p, e)))?;
                let mut h = sha2::Sha256::new();
                std::io::copy(&mut f, &mut h).map_err(|e| herr(HostError::io("read", &p, e)))?;
                let d = format!("sha256:{}", hex(&h.finalize()));
                let mut f = File::open(&p).map_err(|e| herr(HostError::io("open", &p, e)))?;
                size += self.put_blob(&d, &mut f)?;
                layer_blobs.push(self.blob_path(&d)?);
            }
            let tags: Vec<String> = entry["RepoTags"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .filter_map(|t| t.as_str().map(str::to_string))
                .collect();
            let mut rec = None;
            for t in tags
                .iter()
                .map(|s| Some(s.as_str()))
                .chain(tags.is_empty().then_some(name))
            {
                rec = Some(self.register(&config_bytes, &cdigest, &layer_blobs, size, t, None)?);
            }
            out.extend(rec);
        }
        Ok(out)
    }

    /// Unpacks the layers (checking each against the config's diff ids) and records the image.
    pub(crate) fn register(
        &self,
        config_bytes: &[u8],
        config_digest: &str,
        layer_blobs: &[PathBuf],
        size: u64,
        tag: Option<&str>,
        manifest_digest: Option<&str>,
    ) -> Result<ImageRecord> {
        let config: Value =
            serde_json::from_slice(config_bytes).map_err(|e| bad(&format!("config: {e}")))?;
        let diff_ids: Vec<String> = config["rootfs"]["diff_ids"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter_map(|d| d.as_str().map(str::to_string))
            .collect();
        if diff_ids.len() != layer_blobs.len() {
            return Err(bad(&format!(
                "config lists {} layers, the manifest {}",
                diff_ids.len(),
                layer_blobs.len()
            )));
        }
        for (diff_id, blob) in diff_ids.iter().zip(layer_blobs) {
            let dest = self.layer_dir(diff_id)?;
            if dest.exists() {
                continue;
            }
            let tmp = self
                .dir
                .join("tmp")
                .join(format!("layer-{}", crate::validate::new_id()));
            std::fs::create_dir_all(&tmp).map_err(|e| herr(HostError::io("create", &tmp, e)))?;
            let f = File::open(blob).map_err(|e| herr(HostError::io("open", blob, e)))?;
            let applied = unpack::apply_layer(Box::new(f), &tmp);
            match applied {
                Ok((_, got)) if &got == diff_id => {
                    std::fs::rename(&tmp, &dest)
                        .map_err(|e| herr(HostError::io("rename", &dest, e)))?;
                }
                Ok((_, got)) => {
                    let _ = std::fs::remove_dir_all(&tmp);
                    return Err(bad(&format!(
                        "layer content is {got}, the config says {diff_id}"
                    )));
                }
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&tmp);
                    return Err(herr(e));
                }
            }
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
        let exec = ExecConfig {
            entrypoint: strings(&c["Entrypoint"]),
            cmd: strings(&c["Cmd"]),
            env: strings(&c["Env"]),
            working_dir: c["WorkingDir"].as_str().unwrap_or("").to_string(),
            user: c["User"].as_str().unwrap_or("").to_string(),
            stop_signal: c["StopSignal"].as_str().unwrap_or("").to_string(),
        };
        let tag = tag.map(Reference::parse).transpose()?;
        let id = config_digest.to_string();
        self.with_index(|ix| {
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
            rec.size = size;
            rec.layers = diff_ids.clone();
            rec.config = exec.clone();
            if let Some(t) = &tag {
                if t.tag.is_some() && !rec.repo_tags.contains(&t.full()) {
                    rec.repo_tags.push(t.full());
                }
                if let Some(m) = manifest_digest {
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
