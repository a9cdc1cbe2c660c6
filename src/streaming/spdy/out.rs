//! The outbound side of a SPDY session: one writer task fed through a bounded byte budget,
//! SPDY/3.1 send-side flow control, and the set of streams the client has open.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{mpsc, watch, Notify, Semaphore};

use super::super::exec::Inbound;
use super::frame::*;
use crate::state::lock;

/// A stream the client opened: its headers, and its inbound data (closed on FIN or reset).
pub(super) struct Opened {
    pub(super) id: u32,
    pub(super) headers: HashMap<String, String>,
    pub(super) inbound: Inbound,
}

/// Send-side flow control. Our sends are always counted against the peer's windows (64 KiB
/// per stream and per session to start with, SPDY/3.1); they are held to them only once the
/// peer has shown it does flow control by sending a WINDOW_UPDATE (Go's spdystream, which
/// kubelet and kubectl use, never does; for such peers the session's byte budget is the bound).
pub(super) struct Flow {
    pub(super) active: bool,
    pub(super) initial: i64,
    pub(super) session: i64,
    pub(super) streams: HashMap<u32, i64>,
}

pub(super) struct OutShared {
    pub(super) tx: mpsc::Sender<(Vec<u8>, u32)>,
    /// Bytes of frames queued for the writer: every sender waits for room.
    pub(super) budget: Arc<Semaphore>,
    pub(super) flow: std::sync::Mutex<Flow>,
    pub(super) flow_changed: Notify,
    /// Set when the session is over (the writer failed or stalled, or the reader ended).
    pub(super) dead: Arc<watch::Sender<bool>>,
    /// Streams the client opened that are not closed yet (capped).
    pub(super) live: std::sync::Mutex<HashMap<u32, (bool, bool)>>,
}

/// Outbound side shared by tasks: frames go through one writer task in order.
#[derive(Clone)]
pub(super) struct Out(pub(super) Arc<OutShared>);

impl Out {
    /// Queues a frame; waits for room in the session's budget. False once the session is over.
    pub(super) async fn send(&self, frame: Vec<u8>) -> bool {
        let n = frame.len().min(OUT_BUDGET) as u32;
        let mut dead = self.0.dead.subscribe();
        let permit = tokio::select! {
            p = self.0.budget.acquire_many(n) => p,
            _ = dead.wait_for(|d| *d) => return false,
        };
        let Ok(p) = permit else { return false };
        p.forget();
        if self.0.tx.send((frame, n)).await.is_err() {
            self.0.budget.add_permits(n as usize);
            return false;
        }
        true
    }

    /// Sends `payload` on `stream` in frames of at most [`DATA_CHUNK`] bytes, within the
    /// peer's windows when it does flow control.
    pub(super) async fn data(&self, stream: u32, payload: &[u8]) -> bool {
        let mut rest = payload;
        while !rest.is_empty() {
            let Some(n) = self.window(stream, rest.len().min(DATA_CHUNK)).await else {
                return false;
            };
            if !self.send(data(stream, 0, &rest[..n])).await {
                return false;
            }
            rest = &rest[n..];
        }
        true
    }

    /// Takes up to `want` bytes of send window for `stream` (waiting while it is closed and
    /// the peer does flow control); `None` once the session is over.
    pub(super) async fn window(&self, stream: u32, want: usize) -> Option<usize> {
        let mut dead = self.0.dead.subscribe();
        loop {
            let changed = self.0.flow_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut f = lock(&self.0.flow);
                let initial = f.initial;
                let w = *f.streams.entry(stream).or_insert(initial);
                let open = w.min(f.session);
                if !f.active || open > 0 {
                    let take = if f.active {
                        (open as usize).min(want)
                    } else {
                        want
                    };
                    *f.streams.entry(stream).or_insert(initial) -= take as i64;
                    f.session -= take as i64;
                    return Some(take);
                }
            }
            tokio::select! {
                _ = &mut changed => {}
                _ = dead.wait_for(|d| *d) => return None,
            }
        }
    }

    /// The peer opened `delta` more bytes of window on `stream` (0 = the session).
    pub(super) fn window_update(&self, stream: u32, delta: u32) {
        let mut f = lock(&self.0.flow);
        f.active = true;
        let delta = i64::from(delta & 0x7fff_ffff);
        if stream == 0 {
            f.session = (f.session + delta).min(i64::from(i32::MAX));
        } else {
            let initial = f.initial;
            let w = f.streams.entry(stream).or_insert(initial);
            *w = (*w + delta).min(i64::from(i32::MAX));
        }
        drop(f);
        self.0.flow_changed.notify_waiters();
    }

    /// SETTINGS: a new initial window size applies to every stream's window (SPDY/3.1 §2.6.8).
    pub(super) fn settings(&self, body: &[u8]) {
        let n = be32(body, 0) as usize;
        let mut f = lock(&self.0.flow);
        for i in 0..n.min(16) {
            let at = 4 + i * 8;
            let id = be32(body, at) & 0x00ff_ffff;
            if id == 7 {
                let v = i64::from(be32(body, at + 4) & 0x7fff_ffff);
                let diff = v - f.initial;
                f.initial = v;
                for w in f.streams.values_mut() {
                    *w += diff;
                }
            }
        }
        drop(f);
        self.0.flow_changed.notify_waiters();
    }

    pub(super) async fn fin(&self, stream: u32) -> bool {
        self.closed(stream, false, true);
        self.send(data(stream, FLAG_FIN, &[])).await
    }

    pub(super) async fn rst(&self, stream: u32, status: u32) -> bool {
        self.closed(stream, true, true);
        self.send(control(
            RST_STREAM,
            0,
            &[stream.to_be_bytes(), status.to_be_bytes()].concat(),
        ))
        .await
    }

    /// Records a half-close (`by_client`) or full close of a live stream; a stream closed
    /// both ways no longer counts against the cap.
    pub(super) fn closed(&self, stream: u32, by_client: bool, by_us: bool) {
        let mut live = lock(&self.0.live);
        if let Some(e) = live.get_mut(&stream) {
            e.0 |= by_client;
            e.1 |= by_us;
            if e.0 && e.1 {
                live.remove(&stream);
                lock(&self.0.flow).streams.remove(&stream);
            }
        }
    }

    pub(super) fn is_dead(&self) -> bool {
        *self.0.dead.borrow()
    }
}

/// Most bytes of frames queued for one session's writer.
pub(super) const OUT_BUDGET: usize = 512 * 1024;
/// Most bytes of client data queued for one session's consumers.
pub(super) const IN_BUDGET: usize = 1 << 20;
/// Largest frame accepted from a client (Go clients send at most 32 KiB of data per frame).
pub(super) const MAX_FRAME_IN: usize = 1 << 20;
/// Largest data frame we send.
pub(super) const DATA_CHUNK: usize = 32 * 1024;
/// Streams a client may have open at once in one session (an exec needs five).
pub(super) const MAX_STREAMS: usize = 64;
