//! Layers being fetched, across pulls. A layer that two pulls need at once (two images on one
//! base, the same layer in a gzip and a zstd image, a layer listed twice) is downloaded and
//! unpacked once, by the first to claim it; the others wait for that fetch to end, showing its
//! progress as their own, and then use the layer it committed — or, if it failed or its pull
//! was cancelled, claim the layer themselves.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::progress::LayerProgress;

type Map = HashMap<String, (watch::Receiver<()>, Arc<LayerProgress>)>;

/// The fetches in flight, by diff id.
#[derive(Clone, Debug, Default)]
pub struct InFlight(Arc<Mutex<Map>>);

/// What a pull may do about a layer it lacks.
pub enum Claim {
    /// Fetch it; the others wait until this is dropped.
    Mine(Fetch),
    /// Another pull fetches it: wait for it with [`wait`].
    Theirs(Waiter),
}

/// A claimed layer: released (waiters woken) when dropped, however the fetch ended.
pub struct Fetch {
    map: Arc<Mutex<Map>>,
    diff_id: String,
    _ends: watch::Sender<()>,
}

impl Drop for Fetch {
    fn drop(&mut self) {
        crate::state::lock(&self.map).remove(&self.diff_id);
    }
}

/// Another pull's fetch of a layer.
pub struct Waiter {
    ended: watch::Receiver<()>,
    theirs: Arc<LayerProgress>,
}

impl InFlight {
    /// Claims `diff_id` for the fetch whose progress is `progress`, unless another has it.
    pub fn claim(&self, diff_id: &str, progress: &Arc<LayerProgress>) -> Claim {
        let mut m = crate::state::lock(&self.0);
        if let Some((ended, theirs)) = m.get(diff_id) {
            return Claim::Theirs(Waiter {
                ended: ended.clone(),
                theirs: theirs.clone(),
            });
        }
        let (tx, rx) = watch::channel(());
        m.insert(diff_id.to_string(), (rx, progress.clone()));
        Claim::Mine(Fetch {
            map: self.0.clone(),
            diff_id: diff_id.to_string(),
            _ends: tx,
        })
    }
}

/// Waits until the other fetch ends, its received bytes shown as `mine`'s meanwhile (so that
/// the waiting pull is not taken for stalled).
pub async fn wait(mut w: Waiter, mine: &LayerProgress) {
    loop {
        tokio::select! {
            // Nothing is ever sent: the sender's drop is the only change.
            r = w.ended.changed() => if r.is_err() {
                mine.follow(&w.theirs);
                return;
            },
            () = tokio::time::sleep(Duration::from_millis(100)) => mine.follow(&w.theirs),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_fetch_per_layer_and_waiters_wake_when_it_ends() {
        let f = InFlight::default();
        let p = super::super::progress::LayerProgress::detached("sha256:aa", 10);
        let Claim::Mine(first) = f.claim("sha256:11", &p) else {
            panic!("the first claim is not the claimer's")
        };
        let Claim::Theirs(w) = f.claim("sha256:11", &p) else {
            panic!("a second claim of a layer in flight fetches it again")
        };
        assert!(matches!(f.claim("sha256:22", &p), Claim::Mine(_)));
        p.received(7);
        let mine = super::super::progress::LayerProgress::detached("sha256:bb", 10);
        let waiting = tokio::spawn(async move {
            wait(w, &mine).await;
            mine
        });
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(!waiting.is_finished(), "the waiter ended before the fetch");
        drop(first);
        let mine = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the waiter was not woken")
            .unwrap();
        assert_eq!(
            mine.received_bytes(),
            7,
            "the waiter did not show the fetch's bytes"
        );
        // Released: the next claim is its claimer's.
        assert!(matches!(f.claim("sha256:11", &p), Claim::Mine(_)));
    }
}
