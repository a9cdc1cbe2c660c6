//! The image verbs of [`Runtime`]: pulls (shared by callers asking for the
//! same image with the same credentials), removal, and the layers containers still use.

use std::sync::Arc;

use super::{PullCell, Runtime};
use crate::error::{Error, Result};
use crate::image;
use crate::state::lock;

impl Runtime {
    /// The image store.
    pub fn images(&self) -> &image::ImageStore {
        &self.images
    }

    /// PullImage: fetches `image` from its registry (mirrors first) into the store. Callers
    /// pulling the same reference at the same time share one download.
    pub fn pull_image(&self, image: &str, auth: &image::Auth) -> Result<image::ImageRecord> {
        self.pull_image_for(image, auth, image::PullCaller::default())
    }

    /// [`Runtime::pull_image`] for a caller that may go away (a CRI client whose call was
    /// cancelled or timed out): once every caller of a shared pull has raised its flag, the
    /// pull is cancelled within a second — its transfers dropped, its partial layers removed.
    /// Layers already unpacked are kept, so a retry goes on from them.
    pub fn pull_image_for(
        &self,
        image: &str,
        auth: &image::Auth,
        caller: image::PullCaller,
    ) -> Result<image::ImageRecord> {
        // Only requests for the same image with the same credentials share a download.
        // (A short name by what it resolves to: `busybox` and `docker.io/busybox` share.)
        let candidates = image::short_names::candidates(image, &self.images.short_names)?;
        let names: Vec<String> = candidates.iter().map(|r| r.full()).collect();
        let key = format!("{} {}", names.join(","), auth.share_key());
        let cell = {
            let mut pulls = lock(&self.pulls);
            let cell = pulls
                .entry(key.clone())
                .or_insert_with(|| {
                    Arc::new(PullCell {
                        result: Default::default(),
                        callers: Default::default(),
                    })
                })
                .clone();
            lock(&cell.callers).push(caller);
            cell
        };
        let out = cell.result.get_or_init(|| {
            let _span = tracing::info_span!("pull", image).entered();
            let started = std::time::Instant::now();
            let pull = async {
                let _slot = self
                    .pull_slots
                    .acquire()
                    .await
                    .map_err(|e| Error::Host(crate::error::HostError::Other(e.to_string())))?;
                image::pull::pull(
                    &self.images,
                    image,
                    &candidates,
                    auth,
                    &self.cfg.registries,
                    &self.cfg.registry_files,
                    std::time::Duration::from_secs(self.cfg.image_pull_progress_timeout),
                )
                .await
            };
            let fut = async {
                tokio::select! {
                    r = pull => r,
                    () = self.abandoned(&key, &cell) => {
                        tracing::info!(image, "every caller of the pull went away: cancelled");
                        Err(Error::DeadlineExceeded(format!(
                            "pull of {image}: every caller went away; cancelled"
                        )))
                    }
                }
            };
            let r = match tokio::runtime::Handle::try_current() {
                Ok(h) => h.block_on(fut),
                Err(_) => tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .map_err(|e| Error::Host(crate::error::HostError::Other(e.to_string())))
                    .and_then(|rt| rt.block_on(fut)),
            };
            self.metrics.observe_pull(
                r.as_ref()
                    .ok()
                    .map(|(_, bytes)| (*bytes, started.elapsed())),
            );
            r.map(|(rec, _)| rec)
        });
        {
            let mut pulls = lock(&self.pulls);
            if pulls.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                pulls.remove(&key);
            }
        }
        match out {
            Ok(r) => Ok(r.clone()),
            Err(e) => Err(e.duplicate()),
        }
    }

    /// Returns once every caller of `cell` has gone, having taken the cell out of the pulls in
    /// flight (under their lock, so a caller arriving now starts a pull of its own rather than
    /// joining the one being cancelled).
    async fn abandoned(&self, key: &str, cell: &Arc<PullCell>) {
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            let mut pulls = lock(&self.pulls);
            let gone = lock(&cell.callers)
                .iter()
                .all(|c| c.load(std::sync::atomic::Ordering::SeqCst));
            if gone {
                if pulls.get(key).is_some_and(|c| Arc::ptr_eq(c, cell)) {
                    pulls.remove(key);
                }
                return;
            }
        }
    }

    /// RemoveImage: removes the image with all its tags; its layers stay while containers
    /// use them and are collected after. An unknown image is success.
    pub fn remove_image(&self, name: &str) -> Result<()> {
        let in_use = self.layers_in_use();
        self.images.remove(name, &in_use)?;
        Ok(())
    }

    /// The layers containers use (records made before containers recorded their layers
    /// count with their image's layers).
    pub(crate) fn layers_in_use(&self) -> std::collections::HashSet<String> {
        let entries: Vec<_> = lock(&self.registry).containers.values().cloned().collect();
        let mut out = std::collections::HashSet::new();
        for e in entries {
            let r = lock(&e.record).clone();
            if r.layers.is_empty() {
                if let Some(img) = self.images.get(&r.image_id) {
                    out.extend(img.layers);
                }
            }
            out.extend(r.layers);
        }
        out
    }
}
