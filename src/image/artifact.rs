//! OCI artifacts that are no runnable image (KEP-4639 image volumes of a model's files): a
//! manifest with an `artifactType` or a config that is not an image config. Each layer is kept
//! as it came, verified as it streams, as the one file of its dir under `artifacts/`, named by
//! its title. That namespace is the artifacts' own: an artifact's blob that happens to be some
//! image layer's tar never stands in for that layer (`layers/` holds only what was unpacked and
//! verified as its diff id), and the same blob under two titles is two files.

use std::io::Read;

use serde_json::Value;

use super::store::{bad, herr, ImageStore};
use super::unpack;
use crate::error::{HostError, Result};

/// The config media types of runnable images; a manifest with any other (or with an
/// `artifactType`) is an OCI artifact.
pub(super) const IMAGE_CONFIGS: &[&str] = &[
    "application/vnd.oci.image.config.v1+json",
    "application/vnd.docker.container.image.v1+json",
];

/// The file name an artifact's layer is kept under: its `org.opencontainers.image.title` if
/// that is one plain path component, else its digest's hex.
pub(super) fn file_name(layer: &Value, digest: &str) -> String {
    let title = layer["annotations"]["org.opencontainers.image.title"]
        .as_str()
        .unwrap_or("");
    let plain = !title.is_empty()
        && title.len() <= 255
        && title != "."
        && title != ".."
        && !title.contains(['/', '\0']);
    match plain {
        true => title.to_string(),
        false => digest.trim_start_matches("sha256:").to_string(),
    }
}

/// The key an artifact's layer is stored and referenced by: a digest of its blob's digest and
/// its file name, in a domain of its own (it is never a diff id of any image layer).
pub(super) fn layer_key(blob_digest: &str, name: &str) -> String {
    super::store::sha256_of(format!("sandboxd artifact layer\0{blob_digest}\0{name}").as_bytes())
}

impl ImageStore {
    /// Stores an artifact's layer (`raw`, verified against its blob digest by the caller as it
    /// streams) as `artifacts/<key>` holding the one file `name`, at most the per-layer byte
    /// limit.
    pub fn put_file_layer(
        &self,
        key: &str,
        name: &str,
        raw: Box<dyn Read + '_>,
    ) -> Result<unpack::Applied> {
        let dest = self.artifact_dir(key)?;
        let tmp = self.temp_dir("layer")?;
        let result = (|| {
            let path = tmp.join(name);
            let mut f = crate::state::files::create_file(&path, 0o644).map_err(herr)?;
            let max = self.cfg.max_layer_bytes;
            let n = std::io::copy(&mut raw.take(max.saturating_add(1)), &mut f)
                .map_err(|e| herr(HostError::io("write", &path, e)))?;
            if n > max {
                return Err(bad(&format!(
                    "artifact layer {name} is over the {max}-byte layer limit"
                )));
            }
            f.sync_all()
                .map_err(|e| herr(HostError::io("sync", &path, e)))?;
            // Readable by the containers that mount it (the layer dir is 0700 like all ours).
            std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .map_err(|e| herr(HostError::io("chmod", &tmp, e)))?;
            match std::fs::rename(&tmp, &dest) {
                Ok(()) => Ok(unpack::Applied {
                    entries: 1,
                    bytes: n,
                    ..Default::default()
                }),
                Err(_) if dest.is_dir() => Ok(unpack::Applied::default()),
                Err(e) => Err(herr(HostError::io("rename", &dest, e))),
            }
        })();
        if tmp.exists() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn titles_are_one_plain_file_name() {
        let l = |t: &str| serde_json::json!({"annotations": {"org.opencontainers.image.title": t}});
        assert_eq!(file_name(&l("model.bin"), "sha256:ab"), "model.bin");
        for bad in ["", ".", "..", "a/b", "../x", "/etc/passwd"] {
            assert_eq!(file_name(&l(bad), "sha256:ab"), "ab", "{bad:?}");
        }
        assert_eq!(file_name(&serde_json::json!({}), "sha256:cd"), "cd");
    }
}
