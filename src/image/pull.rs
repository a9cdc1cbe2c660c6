//! PullImage: the configured mirrors first, then the registry itself (HTTPS; plain HTTP only
//! for registries configured `insecure` and loopback ones, as Docker does; `endpoints.rs`
//! says which configuration decides). Credentials go only to the registry they were given
//! for (the request's `server_address`, else the image's registry), never to a mirror; a
//! request without any takes the global auth file's entry for each endpoint's host. The
//! manifest (an index resolved to this platform) and config are fetched with size bounds
//! and verified; then the layers this store does not have yet
//! are downloaded concurrently (bounded), each streamed once through its size and digest
//! check, decompression and unpacking (no second pass, no temp copy), and committed only once
//! both its digest and its diff id verified. Foreign layer URLs are never fetched. Each pull
//! reports what it has received so far (`progress.rs`) and logs its bytes, time and rate.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::Value;

use super::endpoints::{creds, endpoints, Auth, Endpoint};
use super::fetch::{fetch_layer, LayerDesc, PullError};
use super::in_flight::Claim;
use super::policy::Verdict;
use super::progress::{LayerProgress, LayerState, PullProgress};
use super::reference::Reference;
use super::registry::{Creds, Registry, RegistryError};
use super::store::{parse_config, ImageStore, NewImage, MAX_DOCUMENT};
use super::ImageRecord;
use crate::config::{RegistryConfig, RegistryFilesConfig};
use crate::error::{Error, HostError, Result};

/// Pulls `image` into `store`, tagging it with the normalized reference: `candidates`, what
/// it resolves to (`short_names::candidates`, read once by the caller), in turn until one is
/// pulled. A pull that makes no
/// progress for `progress_timeout` (zero: no limit) is cancelled: the transfers are dropped,
/// the unpackers see their input end and clean up, and the error says why.
pub async fn pull(
    store: &ImageStore,
    image: &str,
    candidates: &[Reference],
    auth: &Auth,
    registries: &BTreeMap<String, RegistryConfig>,
    files: &RegistryFilesConfig,
    progress_timeout: Duration,
) -> Result<(ImageRecord, u64)> {
    let pull = Pull {
        store,
        auth,
        registries,
        files,
        progress_timeout,
    };
    if candidates.len() == 1 {
        return pull.reference(&candidates[0], image).await;
    }
    let mut last = None;
    let mut tried = Vec::new();
    for r in candidates {
        let name = r.full();
        match pull.reference(r, &name).await {
            Ok(done) => {
                tracing::info!(image, resolved = %name, "short name pulled from a search registry");
                return Ok(done);
            }
            Err(e) => {
                tracing::warn!(image, candidate = %name, error = %e, "short name: candidate failed");
                tried.push(format!("{name}: {e}"));
                last = Some(e);
            }
        }
    }
    Err(combined(image, last, &tried))
}

/// The error of trying several places in turn: the last one's code (the registry's own
/// answer, which reaches kubelet), a message listing every try.
fn combined(image: &str, last: Option<Error>, tried: &[String]) -> Error {
    let all = tried.join("; ");
    match last {
        Some(Error::NotFound { kind, .. }) => Error::NotFound {
            kind,
            id: format!("{image}: {all}"),
        },
        Some(Error::Unauthenticated(_)) => Error::Unauthenticated(all),
        Some(Error::PermissionDenied(_)) => Error::PermissionDenied(all),
        _ => Error::step("pull image", image, HostError::Other(all)),
    }
}

/// What every candidate of one pull is pulled with.
struct Pull<'a> {
    store: &'a ImageStore,
    auth: &'a Auth,
    registries: &'a BTreeMap<String, RegistryConfig>,
    files: &'a RegistryFilesConfig,
    progress_timeout: Duration,
}

impl Pull<'_> {
    /// Pulls reference `r` (`image` names it in errors) from its endpoints.
    async fn reference(&self, r: &Reference, image: &str) -> Result<(ImageRecord, u64)> {
        let eps = endpoints(r, self.registries, self.files)?;
        let started = Instant::now();
        let tracked = self.store.pulls.begin(&r.full());
        let work = pull_endpoints(
            self.store,
            &tracked.progress,
            r,
            image,
            self.auth,
            self.files,
            eps,
            started,
        );
        let limit = self.progress_timeout;
        if limit.is_zero() {
            return work.await;
        }
        tokio::select! {
            r = work => r,
            () = stalled(&tracked.progress, limit) => {
                tracing::warn!(image = %r.full(), seconds = limit.as_secs(), "pull made no progress: cancelled");
                Err(Error::DeadlineExceeded(format!(
                    "pull of {image}: no progress for {} s (image_pull_progress_timeout); cancelled",
                    limit.as_secs()
                )))
            }
        }
    }
}

/// Returns once `progress` has not moved for `limit`.
async fn stalled(progress: &PullProgress, limit: Duration) {
    let tick = (limit / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let mut last = progress.fingerprint();
    let mut since = Instant::now();
    loop {
        tokio::time::sleep(tick).await;
        let now = progress.fingerprint();
        if now != last {
            last = now;
            since = Instant::now();
        } else if since.elapsed() >= limit {
            return;
        }
    }
}

/// Tries each endpoint in turn (mirrors first).
#[allow(clippy::too_many_arguments)] // the pull's parts, each used once
async fn pull_endpoints(
    store: &ImageStore,
    progress: &PullProgress,
    r: &Reference,
    image: &str,
    auth: &Auth,
    files: &RegistryFilesConfig,
    eps: Vec<Endpoint>,
    started: Instant,
) -> Result<(ImageRecord, u64)> {
    // The signature policy first: a refused image is not asked of any registry.
    let verdict = match super::policy::load(files.signature_policy.as_deref())? {
        None => None,
        Some(p) => match p.verdict(r) {
            Verdict::Accept => None,
            Verdict::Refuse(m) => return Err(Error::PermissionDenied(m)),
            v @ Verdict::Verify { .. } => Some(v),
        },
    };
    let mut last: Option<Error> = None;
    let mut tried = Vec::new();
    for ep in eps {
        let host = ep.url();
        let creds = creds(auth, files, &ep, r)?;
        match pull_from(store, progress, r, &ep, creds, verdict.as_ref()).await {
            Ok((rec, bytes)) => {
                let secs = started.elapsed().as_secs_f64();
                tracing::info!(
                    image = %r.full(),
                    image_id = %rec.id,
                    endpoint = %host,
                    bytes,
                    seconds = secs,
                    mb_per_s = bytes as f64 / 1e6 / secs.max(1e-9),
                    "image pulled"
                );
                return Ok((rec, bytes));
            }
            Err(e) => {
                tracing::warn!(image = %r.full(), endpoint = %host, error = %e, "pull from endpoint failed");
                tried.push(format!("{host}: {e}"));
                // Our own limits and a bad image are not the endpoint's fault: stop.
                if matches!(e, PullError::Local(_)) {
                    return Err(e.into_error(image));
                }
                last = Some(e.into_error(image));
            }
        }
    }
    // The registry's own answer decides the code; the message lists every endpoint.
    Err(combined(image, last, &tried))
}

/// The manifest for this platform: resolves an index to its linux/<arch> entry.
async fn resolve(
    reg: &Registry,
    r: &Reference,
) -> std::result::Result<(Value, String, Option<String>), PullError> {
    let reference = r
        .digest
        .clone()
        .unwrap_or_else(|| r.tag.clone().unwrap_or_else(|| "latest".into()));
    let (body, media, digest) = reg.manifest(&reference, MAX_DOCUMENT as usize).await?;
    let v: Value = serde_json::from_slice(&body)
        .map_err(|e| RegistryError::Invalid(format!("manifest {digest}: {e}")))?;
    let is_index =
        media.contains("index") || media.contains("manifest.list") || v["manifests"].is_array();
    if !is_index {
        return Ok((v, digest, None));
    }
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        a => a,
    };
    let pick = v["manifests"]
        .as_array()
        .and_then(|ms| {
            ms.iter()
                .find(|m| m["platform"]["os"] == "linux" && m["platform"]["architecture"] == arch)
        })
        .and_then(|m| m["digest"].as_str())
        .map(str::to_string)
        .ok_or_else(|| {
            RegistryError::NotFound(format!("{}: no linux/{arch} image in its index", r.full()))
        })?;
    let (body, _, mdigest) = reg.manifest(&pick, MAX_DOCUMENT as usize).await?;
    let m: Value = serde_json::from_slice(&body)
        .map_err(|e| RegistryError::Invalid(format!("manifest {mdigest}: {e}")))?;
    if m["manifests"].is_array() {
        return Err(RegistryError::Invalid(format!("{pick}: an index inside an index")).into());
    }
    Ok((m, mdigest, Some(digest)))
}

async fn pull_from(
    store: &ImageStore,
    progress: &PullProgress,
    r: &Reference,
    ep: &Endpoint,
    creds: Option<Creds>,
    verdict: Option<&Verdict>,
) -> std::result::Result<(ImageRecord, u64), PullError> {
    let reg = Arc::new(Registry::new(ep, creds)?);
    let (manifest, manifest_digest, list_digest) = resolve(&reg, r).await?;
    // Signatures are of what the reference names (an index's digest for a multi-platform
    // image), from the endpoint that serves it, checked before any layer is fetched.
    if let Some(Verdict::Verify {
        reqs,
        scope,
        source,
    }) = verdict
    {
        let top = list_digest.as_deref().unwrap_or(&manifest_digest);
        let found = super::policy::fetch(&reg, top).await?;
        super::policy::check(reqs, &found, r, top, scope, source).map_err(RegistryError::Denied)?;
    }
    let config_digest = manifest["config"]["digest"]
        .as_str()
        .ok_or_else(|| RegistryError::Invalid("the manifest names no config".into()))?
        .to_string();
    super::store::digest_hex(&config_digest)?;
    let config_type = manifest["config"]["mediaType"].as_str().unwrap_or("");
    let artifact = manifest["artifactType"].is_string()
        || (!config_type.is_empty() && !super::artifact::IMAGE_CONFIGS.contains(&config_type));
    let mut layers = Vec::new();
    for l in manifest["layers"].as_array().cloned().unwrap_or_default() {
        let digest = l["digest"].as_str().unwrap_or("").to_string();
        super::store::digest_hex(&digest)?;
        let media_type = l["mediaType"].as_str().unwrap_or("").to_string();
        layers.push(LayerDesc {
            size: l["size"]
                .as_u64()
                .ok_or_else(|| RegistryError::Invalid(format!("layer {digest} has no size")))?,
            foreign: media_type.contains("foreign") || media_type.contains("nondistributable"),
            file: artifact.then(|| super::artifact::file_name(&l, &digest)),
            annotations: l["annotations"].clone(),
            digest,
            media_type,
        });
    }
    let config_bytes = reg
        .blob_bytes(&config_digest, MAX_DOCUMENT as usize)
        .await?;
    // An artifact's config says nothing we run; its layers are keyed by digest and file name.
    let parsed = match artifact {
        true => super::store::ParsedConfig {
            diff_ids: layers
                .iter()
                .map(|l| super::artifact::layer_key(&l.digest, l.file.as_deref().unwrap_or("")))
                .collect(),
            exec: Default::default(),
        },
        false => parse_config(&config_bytes)?,
    };
    if parsed.diff_ids.len() != layers.len() {
        return Err(PullError::Local(Error::InvalidArgument(format!(
            "image: config lists {} layers, the manifest {}",
            parsed.diff_ids.len(),
            layers.len()
        ))));
    }
    // Keep what this pull relies on from being collected until the image is recorded.
    let mut pins = store.pin(parsed.diff_ids.iter().map(String::as_str));
    pins.add(&config_digest);
    pins.add(&manifest_digest);
    let mut size = store.put_blob(&config_digest, &mut &config_bytes[..], MAX_DOCUMENT)?;
    let manifest_bytes = serde_json::to_vec(&manifest).unwrap_or_default();
    let mut blobs = vec![config_digest.clone()];
    if super::store::sha256_of(&manifest_bytes) == manifest_digest {
        store.put_blob(&manifest_digest, &mut &manifest_bytes[..], MAX_DOCUMENT)?;
        blobs.push(manifest_digest.clone());
    }
    size += layers.iter().map(|l| l.size).sum::<u64>();
    let present: Vec<bool> = parsed
        .diff_ids
        .iter()
        .map(|d| store.has_content(d, artifact))
        .collect();
    let trackers = progress.set_layers(
        layers
            .iter()
            .zip(&present)
            .map(|(l, p)| (l.digest.clone(), l.size, *p)),
    );
    let missing: Vec<(LayerDesc, String, Arc<LayerProgress>)> = layers
        .iter()
        .cloned()
        .zip(parsed.diff_ids.iter().cloned())
        .zip(trackers)
        .zip(present)
        .filter(|(_, present)| !present)
        .map(|(((l, d), t), _)| (l, d, t))
        .collect();
    if let Some(l) = missing.iter().find(|(l, _, _)| l.foreign) {
        return Err(PullError::Local(Error::InvalidArgument(format!(
            "image {}: layer {} is a foreign layer ({}); its URLs are never fetched",
            r.full(),
            l.0.digest,
            l.0.media_type
        ))));
    }
    // The compressed sizes alone must fit in what is free above the reserve.
    let need: u64 = missing.iter().map(|(l, _, _)| l.size).sum();
    if let Some(free) = super::unpack::free_bytes(&store.dir) {
        if free < need.saturating_add(store.cfg.min_free_bytes) {
            return Err(PullError::Local(Error::ResourceExhausted(format!(
                "pull of {}: {need} bytes of layers do not fit in the {free} bytes free in {} (reserve {})",
                r.full(),
                store.dir.display(),
                store.cfg.min_free_bytes
            ))));
        }
    }
    let downloaded: u64 = missing.iter().map(|(l, _, _)| l.size).sum();
    let results: Vec<std::result::Result<Option<String>, PullError>> =
        futures_util::stream::iter(missing.into_iter().map(|(l, diff_id, t)| {
            let reg = &reg;
            async move {
                t.set(LayerState::Downloading);
                let r = fetch_once(store, reg, &l, &diff_id, &t).await;
                t.set(if r.is_ok() {
                    LayerState::Done
                } else {
                    LayerState::Failed
                });
                r
            }
        }))
        .buffer_unordered(store.cfg.max_concurrent_downloads.max(1))
        .collect()
        .await;
    for r in results {
        if let Some(kept) = r? {
            pins.add(&kept);
            blobs.push(kept);
        }
    }
    // Artifacts commonly share one empty config: theirs is no identity.
    let id = match artifact {
        true => manifest_digest.clone(),
        false => config_digest.clone(),
    };
    let repo_digest = list_digest.unwrap_or(manifest_digest);
    let rec = store.register(NewImage {
        id: &id,
        parsed,
        size,
        blobs,
        tag: Some(&r.full()),
        manifest_digest: Some(&repo_digest),
        artifact,
    })?;
    drop(pins);
    Ok((rec, downloaded))
}

/// Fetches a layer unless another pull is fetching it: then waits for that one, and fetches
/// it only if the layer is still missing when it ends (it failed or was cancelled).
async fn fetch_once(
    store: &ImageStore,
    reg: &Arc<Registry>,
    l: &LayerDesc,
    diff_id: &str,
    progress: &Arc<LayerProgress>,
) -> std::result::Result<Option<String>, PullError> {
    loop {
        if store.has_content(diff_id, l.file.is_some()) {
            // Committed by another pull: its kept blob counts for this image only if it is
            // this manifest's blob (the same layer may come compressed another way).
            let kept =
                store.cfg.keep_layer_blobs && store.blob_path(&l.digest).is_ok_and(|p| p.is_file());
            return Ok(kept.then(|| l.digest.clone()));
        }
        match store.in_flight.claim(diff_id, progress) {
            Claim::Mine(claimed) => {
                let r = match lazily(store, reg, l, diff_id).await {
                    Ok(true) => Ok(None),
                    Ok(false) => fetch_layer(store, reg, l, diff_id, progress, &[], None).await,
                    Err(e) => Err(e.into()),
                };
                drop(claimed);
                return r;
            }
            Claim::Theirs(w) => {
                tracing::debug!(layer = %l.digest, diff_id, "layer fetched by another pull: waiting for it");
                super::in_flight::wait(w, progress).await;
            }
        }
    }
}

/// Mounts an eStargz or zstd:chunked layer lazily where `[images] lazy_pull` says so
/// (`lazy/`); whether it did (false: pull it whole).
async fn lazily(
    store: &ImageStore,
    reg: &Arc<Registry>,
    l: &LayerDesc,
    diff_id: &str,
) -> Result<bool> {
    if !store.cfg.lazy_pull || l.file.is_some() {
        return Ok(false);
    }
    let Some(toc) = super::lazy::TocRef::of(&l.media_type, &l.annotations) else {
        return Ok(false);
    };
    match super::lazy::mount(store, reg, &l.digest, l.size, diff_id, &toc).await? {
        super::lazy::Mounted::Yes => Ok(true),
        super::lazy::Mounted::No(why) => {
            tracing::info!(layer = %l.digest, diff_id, why, "lazy-capable layer not lazy: pulled whole");
            Ok(false)
        }
    }
}
