//! Importing images from files: an OCI image layout directory, an `oci-archive` tar or a
//! `docker-archive` tar. What the archive holds is read only from the archive itself: a tar is
//! scanned once, its regular members kept (small ones in memory, the rest in private temp
//! files, each hashed), its symlinks and hardlinks resolved by name inside the archive; a
//! layout directory is read below its root without following any symlink. Nothing is read
//! through the host's filesystem at a path the archive chose, sizes and entry counts are
//! bounded, and a FIFO or device cannot block us.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

use serde_json::Value;
use sha2::Digest;

use super::store::{bad, digest_hex, herr, parse_config, ImageStore, NewImage, MAX_DOCUMENT};
use super::unpack::hex;
use super::ImageRecord;
use crate::error::{HostError, Result};

/// Most members an archive may have.
const MAX_MEMBERS: usize = 100_000;
/// Members up to this size are kept in memory (within [`MAX_IN_MEMORY`] in all).
const SMALL: u64 = 1 << 20;
const MAX_IN_MEMORY: u64 = 64 << 20;
/// Symlink hops followed inside an archive.
const MAX_HOPS: usize = 8;

/// One regular member of a scanned archive.
enum Member {
    Memory(Vec<u8>),
    File {
        path: PathBuf,
        size: u64,
        digest: String,
    },
}

/// Where the image's files come from.
enum Source {
    /// An OCI layout directory, read below its root without following symlinks.
    Dir(PathBuf),
    /// A scanned tar: regular members by name, links by name → target name.
    Archive {
        members: HashMap<String, Member>,
        links: HashMap<String, String>,
    },
}

/// Normalizes an archive member name: relative, no `.` parts, no `..`.
fn clean(name: &Path) -> Option<String> {
    let mut parts = Vec::new();
    for c in name.components() {
        match c {
            Component::Normal(p) => parts.push(p.to_str()?.to_string()),
            Component::CurDir | Component::RootDir => {}
            _ => return None,
        }
    }
    (!parts.is_empty()).then(|| parts.join("/"))
}

/// Resolves a symlink target relative to the link's own directory, inside the archive.
fn resolve_link(link: &str, target: &Path) -> Option<String> {
    if target.is_absolute() {
        return clean(target);
    }
    let mut parts: Vec<&str> = link.split('/').collect();
    parts.pop();
    for c in target.components() {
        match c {
            Component::Normal(p) => parts.push(p.to_str()?),
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::CurDir => {}
            _ => return None,
        }
    }
    (!parts.is_empty()).then(|| parts.join("/"))
}

impl Source {
    /// Scans the tar at `path` once into `tmp`.
    fn scan(store: &ImageStore, path: &Path, tmp: &Path) -> Result<Source> {
        let f = crate::untrusted_fs::open_file(path, u64::MAX).map_err(|e| bad(&e.to_string()))?;
        let mut archive = tar::Archive::new(
            super::unpack::decompress(Box::new(f))
                .map_err(|e| super::store::layer_error(&path.display().to_string(), e))?,
        );
        let mut members = HashMap::new();
        let mut links = HashMap::new();
        let (mut count, mut in_memory) = (0usize, 0u64);
        let entries = archive
            .entries()
            .map_err(|e| bad(&format!("{}: {e}", path.display())))?;
        for entry in entries {
            let mut entry = entry.map_err(|e| bad(&format!("{}: {e}", path.display())))?;
            count += 1;
            if count > MAX_MEMBERS {
                return Err(bad(&format!(
                    "{} has more than {MAX_MEMBERS} members",
                    path.display()
                )));
            }
            let raw = entry
                .path()
                .map_err(|e| bad(&format!("member name: {e}")))?
                .into_owned();
            let Some(name) = clean(&raw) else { continue };
            let kind = entry.header().entry_type();
            match kind {
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    let size = entry.header().size().unwrap_or(0);
                    if size <= SMALL && in_memory + size <= MAX_IN_MEMORY {
                        let mut data = Vec::with_capacity(size as usize);
                        (&mut entry)
                            .take(SMALL + 1)
                            .read_to_end(&mut data)
                            .map_err(|e| bad(&format!("member {name}: {e}")))?;
                        in_memory += data.len() as u64;
                        members.insert(name, Member::Memory(data));
                    } else {
                        if let Some(free) = super::unpack::free_bytes(tmp) {
                            if free < size.saturating_add(store.cfg.min_free_bytes) {
                                return Err(bad(&format!(
                                    "member {name} ({size} bytes) does not fit in the {free} bytes free"
                                )));
                            }
                        }
                        let p = tmp.join(format!("m{count}"));
                        let mut out =
                            crate::state::files::create_file(&p, crate::state::files::FILE_MODE)
                                .map_err(herr)?;
                        let mut h = sha2::Sha256::new();
                        let mut buf = vec![0u8; 64 * 1024];
                        let mut n_total = 0u64;
                        loop {
                            let n = entry
                                .read(&mut buf)
                                .map_err(|e| bad(&format!("member {name}: {e}")))?;
                            if n == 0 {
                                break;
                            }
                            h.update(&buf[..n]);
                            out.write_all(&buf[..n])
                                .map_err(|e| herr(HostError::io("write", &p, e)))?;
                            n_total += n as u64;
                        }
                        members.insert(
                            name,
                            Member::File {
                                path: p,
                                size: n_total,
                                digest: format!("sha256:{}", hex(&h.finalize())),
                            },
                        );
                    }
                }
                tar::EntryType::Symlink => {
                    let target = entry
                        .link_name()
                        .ok()
                        .flatten()
                        .and_then(|t| resolve_link(&name, &t));
                    if let Some(t) = target {
                        links.insert(name, t);
                    }
                }
                tar::EntryType::Link => {
                    if let Some(t) = entry.link_name().ok().flatten().and_then(|t| clean(&t)) {
                        links.insert(name, t);
                    }
                }
                _ => {} // directories, devices, FIFOs: nothing of an image
            }
        }
        Ok(Source::Archive { members, links })
    }

    /// The member `name` (links followed inside the archive).
    fn member(&self, name: &str) -> Result<&Member> {
        let Source::Archive { members, links } = self else {
            unreachable!("member() of a directory source");
        };
        let mut n = clean(Path::new(name)).ok_or_else(|| bad(&format!("bad name {name:?}")))?;
        for _ in 0..=MAX_HOPS {
            if let Some(m) = members.get(&n) {
                return Ok(m);
            }
            match links.get(&n) {
                Some(t) => n = t.clone(),
                None => break,
            }
        }
        Err(bad(&format!("the archive has no regular file {name:?}")))
    }

    /// Reads a document (a manifest, an index, a config) of at most [`MAX_DOCUMENT`] bytes.
    fn document(&self, name: &str) -> Result<Vec<u8>> {
        match self {
            Source::Dir(root) => {
                let f = crate::untrusted_fs::open_beneath(root, Path::new(name), MAX_DOCUMENT)
                    .map_err(|e| bad(&e.to_string()))?
                    .ok_or_else(|| bad(&format!("{} has no {name}", root.display())))?;
                crate::untrusted_fs::read_capped(f, name, MAX_DOCUMENT)
                    .map_err(|e| bad(&e.to_string()))
            }
            Source::Archive { .. } => match self.member(name)? {
                Member::Memory(d) if d.len() as u64 <= MAX_DOCUMENT => Ok(d.clone()),
                _ => Err(bad(&format!("{name} is larger than {MAX_DOCUMENT} bytes"))),
            },
        }
    }

    /// Opens a (layer) file with its size; `max` bounds the size.
    fn open(&self, name: &str, max: u64) -> Result<(Box<dyn Read + Send + '_>, u64)> {
        match self {
            Source::Dir(root) => {
                let f = crate::untrusted_fs::open_beneath(root, Path::new(name), max)
                    .map_err(|e| bad(&e.to_string()))?
                    .ok_or_else(|| bad(&format!("{} has no {name}", root.display())))?;
                let size = f.metadata().map(|m| m.len()).unwrap_or(0);
                Ok((Box::new(f), size))
            }
            Source::Archive { .. } => match self.member(name)? {
                Member::Memory(d) => Ok((Box::new(&d[..]), d.len() as u64)),
                Member::File { path, size, .. } => {
                    let f = File::open(path).map_err(|e| herr(HostError::io("open", path, e)))?;
                    Ok((Box::new(f), *size))
                }
            },
        }
    }

    /// The sha256 digest of a (layer) file.
    fn digest(&self, name: &str) -> Result<String> {
        if let Source::Archive { .. } = self {
            if let Member::File { digest, .. } = self.member(name)? {
                return Ok(digest.clone());
            }
        }
        let (mut r, _) = self.open(name, u64::MAX)?;
        let mut h = sha2::Sha256::new();
        std::io::copy(&mut r, &mut h).map_err(|e| bad(&format!("{name}: {e}")))?;
        Ok(format!("sha256:{}", hex(&h.finalize())))
    }

    fn has(&self, name: &str) -> bool {
        match self {
            Source::Dir(root) => {
                crate::untrusted_fs::open_beneath(root, Path::new(name), MAX_DOCUMENT)
                    .is_ok_and(|f| f.is_some())
            }
            Source::Archive { .. } => self.member(name).is_ok(),
        }
    }
}

/// Imports an OCI image layout dir, an `oci-archive` tar or a `docker-archive` tar.
impl ImageStore {
    /// Imports an OCI image layout dir, an `oci-archive` tar or a `docker-archive` tar.
    /// `name` tags the image when the archive names none. Returns the imported images.
    pub fn import(&self, path: &Path, name: Option<&str>) -> Result<Vec<ImageRecord>> {
        import(self, path, name)
    }
}

pub fn import(store: &ImageStore, path: &Path, name: Option<&str>) -> Result<Vec<ImageRecord>> {
    let meta = std::fs::metadata(path).map_err(|e| herr(HostError::io("open", path, e)))?;
    if meta.is_dir() {
        return from_oci_layout(store, &Source::Dir(path.to_path_buf()), name);
    }
    let tmp = store.temp_dir("import")?;
    let result = (|| {
        let src = Source::scan(store, path, &tmp)?;
        if src.has("oci-layout") && src.has("index.json") {
            from_oci_layout(store, &src, name)
        } else if src.has("manifest.json") {
            from_docker_archive(store, &src, name)
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

/// A blob of a layout, by digest.
fn layout_blob(digest: &str) -> Result<String> {
    Ok(format!("blobs/sha256/{}", digest_hex(digest)?))
}

/// A document of a layout checked against its digest.
fn verified_document(src: &Source, digest: &str) -> Result<Vec<u8>> {
    let data = src.document(&layout_blob(digest)?)?;
    let got = super::store::sha256_of(&data);
    if got != digest {
        return Err(bad(&format!("{digest} holds content {got}")));
    }
    Ok(data)
}

fn from_oci_layout(
    store: &ImageStore,
    src: &Source,
    name: Option<&str>,
) -> Result<Vec<ImageRecord>> {
    let index: Value = serde_json::from_slice(&src.document("index.json")?)
        .map_err(|e| bad(&format!("index.json: {e}")))?;
    let mut out = Vec::new();
    for desc in index["manifests"].as_array().cloned().unwrap_or_default() {
        let mut desc = desc;
        // A nested index (multi-platform): pick linux/amd64.
        if desc["mediaType"]
            .as_str()
            .is_some_and(|m| m.contains("index") || m.contains("manifest.list"))
        {
            let d = desc["digest"].as_str().unwrap_or("");
            let nested: Value = serde_json::from_slice(&verified_document(src, d)?)
                .map_err(|e| bad(&format!("{d}: {e}")))?;
            let pick = nested["manifests"].as_array().and_then(|ms| {
                ms.iter()
                    .find(|m| {
                        m["platform"]["os"] == "linux" && m["platform"]["architecture"] == "amd64"
                    })
                    .cloned()
            });
            let Some(mut p) = pick else { continue };
            p["annotations"] = desc["annotations"].clone();
            desc = p;
        }
        let mdigest = desc["digest"].as_str().unwrap_or("").to_string();
        let manifest_bytes = verified_document(src, &mdigest)?;
        let manifest: Value =
            serde_json::from_slice(&manifest_bytes).map_err(|e| bad(&format!("manifest: {e}")))?;
        let cdigest = manifest["config"]["digest"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let config_bytes = verified_document(src, &cdigest)?;
        let mut layers = Vec::new();
        for l in manifest["layers"].as_array().cloned().unwrap_or_default() {
            let d = l["digest"].as_str().unwrap_or("").to_string();
            let size = l["size"].as_u64();
            layers.push((layout_blob(&d)?, Some(d), size));
        }
        let ann = &desc["annotations"];
        let tag = ann["io.containerd.image.name"]
            .as_str()
            .or(ann["org.opencontainers.image.ref.name"]
                .as_str()
                .filter(|r| r.contains('/') || r.contains(':')))
            .map(str::to_string)
            .or(name.map(str::to_string));
        let rec = add_image(
            store,
            src,
            &config_bytes,
            &cdigest,
            &layers,
            tag.as_deref(),
            Some((&mdigest, &manifest_bytes)),
        )?;
        out.push(rec);
    }
    if out.is_empty() {
        return Err(bad("the layout holds no linux/amd64 image"));
    }
    Ok(out)
}

fn from_docker_archive(
    store: &ImageStore,
    src: &Source,
    name: Option<&str>,
) -> Result<Vec<ImageRecord>> {
    let manifest: Value = serde_json::from_slice(&src.document("manifest.json")?)
        .map_err(|e| bad(&format!("manifest.json: {e}")))?;
    let mut out = Vec::new();
    for entry in manifest.as_array().cloned().unwrap_or_default() {
        let config_bytes = src.document(entry["Config"].as_str().unwrap_or(""))?;
        let cdigest = super::store::sha256_of(&config_bytes);
        let layers: Vec<(String, Option<String>, Option<u64>)> = entry["Layers"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|l| (l.as_str().unwrap_or("").to_string(), None, None))
            .collect();
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
            rec = Some(add_image(
                store,
                src,
                &config_bytes,
                &cdigest,
                &layers,
                t,
                None,
            )?);
        }
        out.extend(rec);
    }
    Ok(out)
}

/// Unpacks what is missing of one image and records it. `layers` are `(file in the source,
/// its digest if the manifest names one, its size if known)`, bottom first.
fn add_image(
    store: &ImageStore,
    src: &Source,
    config_bytes: &[u8],
    config_digest: &str,
    layers: &[(String, Option<String>, Option<u64>)],
    tag: Option<&str>,
    manifest: Option<(&str, &[u8])>,
) -> Result<ImageRecord> {
    let parsed = parse_config(config_bytes)?;
    if parsed.diff_ids.len() != layers.len() {
        return Err(bad(&format!(
            "config lists {} layers, the manifest {}",
            parsed.diff_ids.len(),
            layers.len()
        )));
    }
    let mut pins = store.pin(parsed.diff_ids.iter().map(String::as_str));
    let mut blobs = vec![config_digest.to_string()];
    pins.add(config_digest);
    let mut size = store.put_blob(config_digest, &mut &config_bytes[..], MAX_DOCUMENT)?;
    if let Some((md, mb)) = manifest {
        pins.add(md);
        store.put_blob(md, &mut &mb[..], MAX_DOCUMENT)?;
        blobs.push(md.to_string());
    }
    for ((file, digest, want_size), diff_id) in layers.iter().zip(&parsed.diff_ids) {
        let max = want_size.unwrap_or(store.cfg.max_layer_bytes);
        let (r, len) = src.open(file, max)?;
        if want_size.is_some_and(|w| w != len) {
            return Err(bad(&format!(
                "layer {file} is {len} bytes, the manifest says {}",
                want_size.unwrap_or(0)
            )));
        }
        size += len;
        if let Some(d) = digest {
            let got = src.digest(file)?;
            if &got != d {
                return Err(bad(&format!("layer {file} holds {got}, not {d}")));
            }
        }
        if !store.has_layer(diff_id) {
            store.unpack_layer(diff_id, r)?;
        }
        if store.cfg.keep_layer_blobs {
            let d = match digest {
                Some(d) => d.clone(),
                None => src.digest(file)?,
            };
            pins.add(&d);
            let (mut r, _) = src.open(file, max)?;
            store.put_blob(&d, &mut r, max)?;
            blobs.push(d);
        }
    }
    store.register(NewImage {
        artifact: false,
        id: config_digest,
        parsed,
        size,
        blobs,
        tag,
        manifest_digest: manifest.map(|(d, _)| d),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_names_and_links_stay_inside() {
        assert_eq!(clean(Path::new("./a/b")).as_deref(), Some("a/b"));
        assert_eq!(clean(Path::new("/a/b")).as_deref(), Some("a/b"));
        assert_eq!(clean(Path::new("a/../b")), None);
        assert_eq!(
            resolve_link("x/layer.tar", Path::new("../y/layer.tar")).as_deref(),
            Some("y/layer.tar")
        );
        assert_eq!(
            resolve_link("layer.tar", Path::new("../../etc/shadow")),
            None
        );
        assert_eq!(
            resolve_link("a/l", Path::new("/etc/shadow")).as_deref(),
            Some("etc/shadow")
        );
    }
}
