//! Image commands: `pull`, and `images` (list, inspect, remove over CRI; `import` into a local
//! store directly, since the CRI has no import call).

use std::path::Path;

use sandboxd::api::v1 as cri;
use sandboxd::api::v1::image_service_client::ImageServiceClient;
use tonic::transport::Channel;

use crate::cli::ImagesCmd;
use crate::grpc_err;
use crate::output::{pretty_verbose, print_list, short};

fn images_client(ch: &Channel) -> ImageServiceClient<Channel> {
    ImageServiceClient::new(ch.clone())
        .max_decoding_message_size(16 << 20)
        .max_encoding_message_size(16 << 20)
}

/// `images import` needs no daemon: it writes the store under the state root (the store's
/// index is locked, so a running daemon sees the image on its next call).
/// Converts the one image of OCI layout `dir` to eStargz (or zstd:chunked) layers, in place:
/// new layer blobs, config (diff ids) and manifest (layer annotations), the index pointing at
/// it. Prints each layer's old and new digest with its TOC digest.
pub fn estargz(
    dir: &Path,
    prefetch: &[String],
    zstd_chunked: bool,
    chunk_size: u64,
) -> Result<(), String> {
    use sandboxd::image::estargz::{self, WriteOptions};
    use sandboxd::image::zstd_chunked as zc;
    use std::io::Read;
    let blob = |d: &str| -> Result<std::path::PathBuf, String> {
        let hex = d
            .strip_prefix("sha256:")
            .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| format!("digest {d:?}"))?;
        Ok(dir.join("blobs/sha256").join(hex))
    };
    let read_json = |p: &Path| -> Result<serde_json::Value, String> {
        let b = std::fs::read(p).map_err(|e| format!("read {}: {e}", p.display()))?;
        serde_json::from_slice(&b).map_err(|e| format!("{}: {e}", p.display()))
    };
    let put = |bytes: &[u8]| -> Result<(String, u64), String> {
        let d = sandboxd::image::store::sha256_of(bytes);
        std::fs::write(blob(&d)?, bytes).map_err(|e| format!("write blob {d}: {e}"))?;
        Ok((d, bytes.len() as u64))
    };
    let index_path = dir.join("index.json");
    let mut index = read_json(&index_path)?;
    let entries = index["manifests"]
        .as_array()
        .filter(|m| m.len() == 1)
        .ok_or("the layout's index.json must name exactly one manifest")?;
    let mdigest = entries[0]["digest"].as_str().unwrap_or("").to_string();
    let mut manifest = read_json(&blob(&mdigest)?)?;
    if manifest["layers"].as_array().is_none() {
        return Err(format!("{mdigest} is no image manifest"));
    }
    let cdigest = manifest["config"]["digest"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let mut config = read_json(&blob(&cdigest)?)?;
    let opts = WriteOptions {
        chunk_size,
        prefetch: prefetch.to_vec(),
    };
    let layers = manifest["layers"].as_array().cloned().unwrap_or_default();
    let mut new_layers = Vec::new();
    for (i, l) in layers.iter().enumerate() {
        let d = l["digest"].as_str().unwrap_or("");
        let f = std::fs::File::open(blob(d)?).map_err(|e| format!("layer {d}: {e}"))?;
        let mut tar = Vec::new();
        sandboxd::image::unpack::decompress(Box::new(f))
            .map_err(|e| format!("layer {d}: {e}"))?
            .read_to_end(&mut tar)
            .map_err(|e| format!("layer {d}: {e}"))?;
        let mut out = Vec::new();
        let failed = |e: std::io::Error| format!("layer {d}: {e}");
        let (layer, diff_id) = if zstd_chunked {
            let w = zc::write(&tar, &mut out, chunk_size).map_err(failed)?;
            let annotations: serde_json::Map<String, serde_json::Value> = w
                .annotations
                .iter()
                .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
                .collect();
            println!(
                "{d} -> {} (toc {})",
                w.digest,
                annotations[zc::MANIFEST_CHECKSUM_ANNOTATION]
            );
            let l = serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar+zstd",
                "digest": w.digest,
                "size": w.size,
                "annotations": annotations,
            });
            (l, w.diff_id)
        } else {
            let w = estargz::write(&tar, &mut out, &opts).map_err(failed)?;
            println!("{d} -> {} (toc {})", w.digest, w.toc_digest);
            let l = serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": w.digest,
                "size": w.size,
                "annotations": {
                    estargz::TOC_DIGEST_ANNOTATION: w.toc_digest,
                    estargz::UNCOMPRESSED_SIZE_ANNOTATION: w.uncompressed_size.to_string(),
                },
            });
            (l, w.diff_id)
        };
        put(&out)?;
        config["rootfs"]["diff_ids"][i] = serde_json::json!(diff_id);
        new_layers.push(layer);
    }
    let (cd, cs) = put(&serde_json::to_vec(&config).map_err(|e| e.to_string())?)?;
    manifest["config"]["digest"] = serde_json::json!(cd);
    manifest["config"]["size"] = serde_json::json!(cs);
    manifest["layers"] = serde_json::Value::Array(new_layers);
    let (md, ms) = put(&serde_json::to_vec(&manifest).map_err(|e| e.to_string())?)?;
    index["manifests"][0]["digest"] = serde_json::json!(md);
    index["manifests"][0]["size"] = serde_json::json!(ms);
    index["manifests"][0]["mediaType"] =
        serde_json::json!("application/vnd.oci.image.manifest.v1+json");
    std::fs::write(
        &index_path,
        serde_json::to_vec(&index).map_err(|e| e.to_string())?,
    )
    .map_err(|e| format!("write {}: {e}", index_path.display()))?;
    println!("manifest {md}");
    Ok(())
}

pub fn import(file: &Path, name: Option<&str>, root: &Path) -> Result<(), String> {
    let store = sandboxd::image::ImageStore::new(root.join("images")).map_err(|e| e.to_string())?;
    for img in store.import(file, name).map_err(|e| e.to_string())? {
        println!(
            "Imported {} {}",
            img.id,
            img.repo_tags.first().map(String::as_str).unwrap_or("")
        );
    }
    Ok(())
}

pub async fn images(ch: &Channel, cmd: ImagesCmd, json: bool) -> Result<(), String> {
    let mut c = images_client(ch);
    match cmd {
        ImagesCmd::Import { .. } | ImagesCmd::Estargz { .. } => {
            unreachable!("handled without a connection")
        }
        ImagesCmd::List { quiet } => {
            let images = c
                .list_images(cri::ListImagesRequest { filter: None })
                .await
                .map_err(|s| grpc_err("ListImages", s))?
                .into_inner()
                .images;
            if json {
                print_list("images", &images);
            } else if quiet {
                images.iter().for_each(|i| println!("{}", i.id));
            } else {
                println!("{:<50}  {:<13}  SIZE", "IMAGE", "IMAGE ID");
                for i in images {
                    let id = i.id.trim_start_matches("sha256:");
                    let names = if i.repo_tags.is_empty() {
                        vec!["<none>".to_string()]
                    } else {
                        i.repo_tags.clone()
                    };
                    for n in names {
                        println!("{:<50}  {:<13}  {:.1}MB", n, short(id), i.size as f64 / 1e6);
                    }
                }
            }
        }
        ImagesCmd::Inspect { image } => {
            let r = c
                .image_status(cri::ImageStatusRequest {
                    image: Some(cri::ImageSpec {
                        image: image.clone(),
                        ..Default::default()
                    }),
                    verbose: true,
                })
                .await
                .map_err(|s| grpc_err("ImageStatus", s))?
                .into_inner();
            if r.image.is_none() {
                return Err(format!("no such image: {image}"));
            }
            println!("{}", pretty_verbose(&r));
        }
        ImagesCmd::Rm { images } => {
            for image in images {
                c.remove_image(cri::RemoveImageRequest {
                    image: Some(cri::ImageSpec {
                        image: image.clone(),
                        ..Default::default()
                    }),
                })
                .await
                .map_err(|s| grpc_err("RemoveImage", s))?;
                println!("Deleted: {image}");
            }
        }
    }
    Ok(())
}

/// PullImage, with registry credentials `user[:password]` or a registry token.
pub async fn pull(
    ch: &Channel,
    image: String,
    creds: Option<String>,
    registry_token: Option<String>,
) -> Result<(), String> {
    let (username, password) = match creds.as_deref().map(|c| c.split_once(':')) {
        None => (String::new(), String::new()),
        Some(Some((u, p))) => (u.to_string(), p.to_string()),
        Some(None) => (creds.clone().unwrap_or_default(), String::new()),
    };
    let auth = (!username.is_empty() || registry_token.is_some()).then(|| cri::AuthConfig {
        username,
        password,
        registry_token: registry_token.unwrap_or_default(),
        ..Default::default()
    });
    let spec = cri::ImageSpec {
        image: image.clone(),
        ..Default::default()
    };
    let mut pulling = images_client(ch);
    let call = pulling.pull_image(cri::PullImageRequest {
        image: Some(spec.clone()),
        auth,
        sandbox_config: None,
    });
    tokio::pin!(call);
    // On a terminal, per-layer bars follow the daemon's pull while the call runs.
    let mut bars = std::io::IsTerminal::is_terminal(&std::io::stderr())
        .then(|| crate::progress::Bars::new(&image));
    let mut status = images_client(ch);
    let r = loop {
        tokio::select! {
            r = &mut call => break r,
            _ = tokio::time::sleep(crate::progress::POLL), if bars.is_some() => {
                let s = status
                    .image_status(cri::ImageStatusRequest { image: Some(spec.clone()), verbose: true })
                    .await;
                let progress = s.ok().and_then(|s| {
                    serde_json::from_str(s.get_ref().info.get("pullProgress")?).ok()
                });
                if let (Some(b), Some(p)) = (bars.as_mut(), progress) {
                    b.update(&p);
                }
            }
        }
    };
    if let Some(b) = bars {
        b.finish(r.is_ok());
    }
    let r = r.map_err(|s| grpc_err("PullImage", s))?.into_inner();
    println!("Image is up to date for {}", r.image_ref);
    Ok(())
}
