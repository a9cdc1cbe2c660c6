//! `sandboxctl pull`'s per-layer progress bars on a terminal. PullImage is unary, so while it
//! runs the bars follow `ImageStatus` with `verbose`, whose `info["pullProgress"]` lists the
//! daemon's pull in flight layer by layer (as `ctr pull` follows containerd's active ingests).

use std::collections::HashMap;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use sandboxd::image::progress::{LayerState, Snapshot};

/// How often the bars ask the daemon.
pub const POLL: Duration = Duration::from_millis(150);

/// The bars of one pull.
pub struct Bars {
    multi: MultiProgress,
    resolving: ProgressBar,
    layers: HashMap<String, ProgressBar>,
}

fn bytes_style() -> ProgressStyle {
    ProgressStyle::with_template(
        "{prefix:.bold} [{bar:30}] {bytes:>10}/{total_bytes:<10} {bytes_per_sec:>12} {msg}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ")
}

impl Bars {
    /// Bars drawn on stderr (nothing is drawn when it is not a terminal).
    pub fn new(image: &str) -> Bars {
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(8));
        let resolving = multi.add(ProgressBar::new_spinner());
        resolving.set_message(format!("resolving {image}"));
        Bars {
            multi,
            resolving,
            layers: HashMap::new(),
        }
    }

    /// Follows the daemon's latest report of this pull.
    pub fn update(&mut self, s: &Snapshot) {
        if !s.layers.is_empty() && !self.resolving.is_finished() {
            self.resolving.finish_and_clear();
        }
        self.resolving.tick();
        for l in &s.layers {
            let bar = self.layers.entry(l.digest.clone()).or_insert_with(|| {
                let b = self.multi.add(ProgressBar::new(l.size));
                b.set_style(bytes_style());
                b.set_prefix(short_digest(&l.digest).to_string());
                b
            });
            if bar.is_finished() {
                continue;
            }
            bar.set_position(l.received);
            match l.state {
                LayerState::Waiting => bar.set_message("waiting"),
                LayerState::Downloading => bar.set_message("downloading"),
                LayerState::Done => {
                    bar.set_position(l.size);
                    bar.finish_with_message("done");
                }
                LayerState::Present => {
                    bar.set_position(l.size);
                    bar.finish_with_message("already present");
                }
                LayerState::Failed => bar.abandon_with_message("failed"),
            }
        }
    }

    /// The pull ended: bars still running stop where they are.
    pub fn finish(self, ok: bool) {
        self.resolving.finish_and_clear();
        for b in self.layers.values().filter(|b| !b.is_finished()) {
            if ok {
                b.set_position(b.length().unwrap_or(0));
                b.finish_with_message("done");
            } else {
                b.abandon();
            }
        }
    }
}

fn short_digest(d: &str) -> &str {
    let hex = d.split_once(':').map(|(_, h)| h).unwrap_or(d);
    hex.get(..12).unwrap_or(hex)
}
