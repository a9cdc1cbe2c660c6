//! What the pulls in flight have done so far: for each image being pulled, its layers with the
//! bytes received of each. A pull registers itself for its lifetime (the guard forgets it);
//! `ImageStatus` with `verbose` shows it under `info["pullProgress"]`, which is how
//! `sandboxctl pull` draws its per-layer bars while the unary `PullImage` runs — the way
//! `ctr pull` polls containerd's active ingests.
//!
//! Bounded: one entry per pull in flight (pulls of one image with the same credentials share
//! one download), one per layer of a manifest that already passed the document-size limit.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;

/// A layer's state in a pull.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayerState {
    /// Not yet started (the downloads are bounded).
    Waiting,
    /// Bytes are arriving.
    Downloading,
    /// Downloaded, verified and unpacked.
    Done,
    /// Already in the store: nothing to fetch.
    Present,
    /// This layer's download or unpack failed.
    Failed,
}

impl LayerState {
    fn from_u8(v: u8) -> LayerState {
        match v {
            1 => LayerState::Downloading,
            2 => LayerState::Done,
            3 => LayerState::Present,
            4 => LayerState::Failed,
            _ => LayerState::Waiting,
        }
    }
}

/// One layer of a pull in flight.
#[derive(Debug)]
pub struct LayerProgress {
    digest: String,
    size: u64,
    received: AtomicU64,
    state: AtomicU8,
}

impl LayerProgress {
    /// `n` more bytes arrived.
    pub fn received(&self, n: u64) {
        self.received.fetch_add(n, Ordering::Relaxed);
    }

    /// The layer moved on.
    pub fn set(&self, s: LayerState) {
        self.state.store(s as u8, Ordering::Relaxed);
    }

    /// Shows what `other` (another pull's fetch of the same layer) has received as this one's.
    pub fn follow(&self, other: &LayerProgress) {
        self.received
            .store(other.received.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// The bytes received so far.
    #[cfg(test)]
    pub fn received_bytes(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// A tracker of its own, in no pull's list (a lazy layer's background completion; tests).
    pub fn detached(digest: &str, size: u64) -> Arc<LayerProgress> {
        Arc::new(LayerProgress {
            digest: digest.to_string(),
            size,
            received: AtomicU64::new(0),
            state: AtomicU8::new(LayerState::Waiting as u8),
        })
    }
}

/// One pull in flight.
#[derive(Debug)]
pub struct PullProgress {
    image: String,
    started: Instant,
    layers: Mutex<Vec<Arc<LayerProgress>>>,
}

impl PullProgress {
    /// The manifest is known: its layers, by digest and compressed size; `present` tells which
    /// are already in the store. Returns each layer's tracker, in manifest order.
    pub fn set_layers(
        &self,
        layers: impl IntoIterator<Item = (String, u64, bool)>,
    ) -> Vec<Arc<LayerProgress>> {
        let v: Vec<Arc<LayerProgress>> = layers
            .into_iter()
            .map(|(digest, size, present)| {
                Arc::new(LayerProgress {
                    digest,
                    size,
                    received: AtomicU64::new(0),
                    state: AtomicU8::new(if present {
                        LayerState::Present as u8
                    } else {
                        LayerState::Waiting as u8
                    }),
                })
            })
            .collect();
        *crate::state::lock(&self.layers) = v.clone();
        v
    }

    /// Changes whenever the pull moves: the manifest resolved, bytes arrived, a layer's
    /// state changed.
    pub fn fingerprint(&self) -> (usize, u64, u64) {
        let layers = crate::state::lock(&self.layers);
        let received = layers
            .iter()
            .map(|l| l.received.load(Ordering::Relaxed))
            .sum();
        let states = layers
            .iter()
            .map(|l| l.state.load(Ordering::Relaxed) as u64)
            .sum();
        (layers.len(), received, states)
    }

    /// What a client sees.
    pub fn snapshot(&self) -> Snapshot {
        let layers = crate::state::lock(&self.layers)
            .iter()
            .map(|l| LayerSnapshot {
                digest: l.digest.clone(),
                size: l.size,
                received: l.received.load(Ordering::Relaxed).min(l.size),
                state: LayerState::from_u8(l.state.load(Ordering::Relaxed)),
            })
            .collect();
        Snapshot {
            image: self.image.clone(),
            elapsed_ms: self.started.elapsed().as_millis() as u64,
            layers,
        }
    }
}

/// A pull's progress as `ImageStatus` reports it (JSON under `info["pullProgress"]`).
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    /// The image's full reference.
    pub image: String,
    /// Since the pull began.
    pub elapsed_ms: u64,
    /// Empty until the manifest is resolved.
    pub layers: Vec<LayerSnapshot>,
}

/// One layer in a [`Snapshot`].
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct LayerSnapshot {
    /// The compressed blob's digest.
    pub digest: String,
    /// Its size in bytes, from the manifest.
    pub size: u64,
    /// Bytes received so far.
    pub received: u64,
    /// Where it stands.
    pub state: LayerState,
}

/// The pulls in flight, by full image reference.
#[derive(Debug, Default)]
pub struct Pulls {
    by_image: Mutex<HashMap<String, Arc<PullProgress>>>,
}

/// Keeps a pull listed until dropped.
pub struct Tracked<'a> {
    pulls: &'a Pulls,
    /// This pull's progress.
    pub progress: Arc<PullProgress>,
}

impl Drop for Tracked<'_> {
    fn drop(&mut self) {
        let mut m = crate::state::lock(&self.pulls.by_image);
        if m.get(&self.progress.image)
            .is_some_and(|p| Arc::ptr_eq(p, &self.progress))
        {
            m.remove(&self.progress.image);
        }
    }
}

impl Pulls {
    /// A pull of `image` (its full reference) begins; the latest pull of an image is the one
    /// shown.
    pub fn begin(&self, image: &str) -> Tracked<'_> {
        let progress = Arc::new(PullProgress {
            image: image.to_string(),
            started: Instant::now(),
            layers: Mutex::new(Vec::new()),
        });
        crate::state::lock(&self.by_image).insert(image.to_string(), progress.clone());
        Tracked {
            pulls: self,
            progress,
        }
    }

    /// The pull of `image` (its full reference) in flight, if any.
    pub fn get(&self, image: &str) -> Option<Snapshot> {
        let p = crate::state::lock(&self.by_image).get(image).cloned();
        p.map(|p| p.snapshot())
    }

    /// How many pulls are in flight.
    pub fn len(&self) -> usize {
        crate::state::lock(&self.by_image).len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pull_is_listed_while_it_runs_with_each_layer() {
        let pulls = Pulls::default();
        {
            let t = pulls.begin("docker.io/library/a:1");
            assert!(pulls
                .get("docker.io/library/a:1")
                .unwrap()
                .layers
                .is_empty());
            let ls = t
                .progress
                .set_layers([("sha256:1".into(), 10, false), ("sha256:2".into(), 5, true)]);
            ls[0].set(LayerState::Downloading);
            ls[0].received(4);
            let s = pulls.get("docker.io/library/a:1").unwrap();
            assert_eq!(s.layers[0].received, 4);
            assert_eq!(s.layers[0].state, LayerState::Downloading);
            assert_eq!(s.layers[1].state, LayerState::Present);
            // A registry that lies about sizes never shows more than the manifest's size.
            ls[0].received(100);
            assert_eq!(
                pulls.get("docker.io/library/a:1").unwrap().layers[0].received,
                10
            );
        }
        assert!(pulls.get("docker.io/library/a:1").is_none());
        assert!(pulls.is_empty());
    }

    #[test]
    fn an_older_pull_ending_leaves_the_newer_one_listed() {
        let pulls = Pulls::default();
        let old = pulls.begin("x");
        let new = pulls.begin("x");
        drop(old);
        assert!(pulls.get("x").is_some());
        drop(new);
        assert!(pulls.get("x").is_none());
    }
}
