//! A layer's bytes, in order: one GET, or — for a large layer, where the registry answers
//! range requests with 206 — parts fetched in parallel, as containerd 2.1's multipart fetch.
//! The part being read streams; up to `range_parts - 1` parts after it are fetched at once
//! into memory, each only under permits of the store-wide budget (`range_buffer_bytes`,
//! taken without waiting), so however many pulls run, the parts held ahead never pass it. A
//! registry that ignores `Range` (200) is read as the one stream it sends.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use reqwest::StatusCode;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::registry::{Registry, RegistryError};
use super::store::RANGE_PERMIT_BYTES as PERMIT_BYTES;

/// What a part fetched ahead holds until it is read: its bytes and their budget permits.
type Ahead = tokio::task::JoinHandle<Result<(Bytes, OwnedSemaphorePermit), RegistryError>>;

/// Bytes handed on at a time from a part fetched ahead (slices of it, not copies).
const SLICE: usize = 256 << 10;

/// How a pull fetches a large layer (from `[images]`).
#[derive(Debug, Clone)]
pub struct Ranges {
    /// Parts fetched at once (the one read and those ahead of it); 1 = no range requests.
    pub parts: usize,
    /// Bytes per part; layers under two parts are fetched whole.
    pub part_bytes: u64,
    /// The store-wide budget for parts held ahead, in permits of [`PERMIT_BYTES`].
    pub budget: Arc<Semaphore>,
}

/// A layer being read.
pub struct LayerBody {
    reg: Arc<Registry>,
    digest: String,
    size: u64,
    ranges: Ranges,
    /// The part that streams now, the bytes it must bring, and those it brought.
    current: Option<(reqwest::Response, u64, u64)>,
    /// Where the first part not yet asked for begins.
    next: u64,
    /// Whether the registry answers range requests.
    ranged: bool,
    ahead: VecDeque<Ahead>,
    /// What is left of the part from `ahead` being handed on.
    pending: Bytes,
    _pending_permit: Option<OwnedSemaphorePermit>,
}

impl Drop for LayerBody {
    fn drop(&mut self) {
        for h in &self.ahead {
            h.abort();
        }
    }
}

fn invalid(m: String) -> RegistryError {
    RegistryError::Invalid(m)
}

/// One part, `start..=end`, of layer `digest` of `size` bytes: a 206 whose `Content-Range`
/// is the one asked for.
async fn part(
    reg: &Registry,
    digest: &str,
    start: u64,
    end: u64,
    size: u64,
) -> Result<reqwest::Response, RegistryError> {
    let resp = reg.blob_range(digest, start, end).await?;
    if resp.status() != StatusCode::PARTIAL_CONTENT {
        return Err(invalid(format!(
            "layer {digest}: the registry answered a range request with {} after answering 206",
            resp.status()
        )));
    }
    check_range(&resp, digest, start, end, size)?;
    Ok(resp)
}

/// Checks a 206's `Content-Range` against the range asked for and the layer's size (also a
/// lazy layer's range requests, `lazy/`).
pub(super) fn check_range(
    resp: &reqwest::Response,
    digest: &str,
    start: u64,
    end: u64,
    size: u64,
) -> Result<(), RegistryError> {
    let want = format!("bytes {start}-{end}/{size}");
    let got = resp
        .headers()
        .get(reqwest::header::CONTENT_RANGE)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if got != want {
        return Err(invalid(format!(
            "layer {digest}: asked for {want}, the registry sent the range {got:?}"
        )));
    }
    Ok(())
}

impl LayerBody {
    /// Starts reading layer `digest` of `size` bytes from byte `from`, 0 for a pull (the bytes before it
    /// are the caller's already: a lazy layer's completion has what its reads fetched). From
    /// a byte past the first the registry must answer range requests; from the end on there
    /// is nothing to fetch.
    pub async fn open_from(
        reg: Arc<Registry>,
        digest: &str,
        size: u64,
        from: u64,
        ranges: Ranges,
    ) -> Result<LayerBody, RegistryError> {
        let mut body = LayerBody {
            reg,
            digest: digest.to_string(),
            size,
            ranges,
            current: None,
            next: size,
            ranged: false,
            ahead: VecDeque::new(),
            pending: Bytes::new(),
            _pending_permit: None,
        };
        // (A part of a few bytes would be a request per few bytes: 64 KiB at least.)
        body.ranges.part_bytes = body.ranges.part_bytes.max(PERMIT_BYTES);
        let part = body.ranges.part_bytes;
        if from >= size {
            return Ok(body);
        }
        if from > 0 {
            let end = match body.ranges.parts > 1 {
                true => from.saturating_add(part - 1).min(size - 1),
                false => size - 1,
            };
            let resp = body.reg.blob_range(digest, from, end).await?;
            if resp.status() != StatusCode::PARTIAL_CONTENT {
                return Err(invalid(format!(
                    "layer {digest}: asked for bytes {from}-{end}, the registry answered {}",
                    resp.status()
                )));
            }
            check_range(&resp, digest, from, end, size)?;
            body.ranged = body.ranges.parts > 1;
            body.next = end + 1;
            body.current = Some((resp, end - from + 1, 0));
            return Ok(body);
        }
        if body.ranges.parts > 1 && size >= part.saturating_mul(2) {
            let resp = body.reg.blob_range(digest, 0, part - 1).await?;
            if resp.status() == StatusCode::PARTIAL_CONTENT {
                check_range(&resp, digest, 0, part - 1, size)?;
                body.ranged = true;
                body.next = part;
                body.current = Some((resp, part, 0));
                return Ok(body);
            }
            body.current = Some((resp, size, 0));
        } else {
            body.current = Some((body.reg.blob(digest).await?, size, 0));
        }
        if let Some((resp, _, _)) = &body.current {
            if resp.content_length().is_some_and(|n| n != size) {
                return Err(invalid(format!(
                    "layer {digest}: the registry sends {} bytes, the manifest says {size}",
                    resp.content_length().unwrap_or(0)
                )));
            }
        }
        Ok(body)
    }

    /// Whether the registry answered range requests (the layer comes in parts).
    pub fn ranged(&self) -> bool {
        self.ranged
    }

    /// Asks for the parts after the current one, as far as `parts` and the budget allow.
    fn fetch_ahead(&mut self) {
        while self.ranged && self.next < self.size && self.ahead.len() + 1 < self.ranges.parts {
            let len = self.ranges.part_bytes.min(self.size - self.next);
            let permits = len.div_ceil(PERMIT_BYTES).min(u64::from(u32::MAX)) as u32;
            let Ok(permit) = self.ranges.budget.clone().try_acquire_many_owned(permits) else {
                return;
            };
            let (start, end) = (self.next, self.next + len - 1);
            let (reg, digest, size) = (self.reg.clone(), self.digest.clone(), self.size);
            self.ahead.push_back(tokio::spawn(async move {
                let mut resp = part(&reg, &digest, start, end, size).await?;
                // Exactly the part's bytes, in one buffer of its size (no regrowth).
                let what = format!("layer {digest} bytes {start}-{end}");
                let mut b = bytes::BytesMut::with_capacity(len as usize);
                while let Some(c) = resp
                    .chunk()
                    .await
                    .map_err(|e| RegistryError::Transport(format!("{what}: {e}")))?
                {
                    if (b.len() + c.len()) as u64 > len {
                        return Err(invalid(format!("{what}: the registry sent more")));
                    }
                    b.extend_from_slice(&c);
                }
                if b.len() as u64 != len {
                    return Err(invalid(format!(
                        "{what}: the registry sent {} bytes",
                        b.len()
                    )));
                }
                Ok((b.freeze(), permit))
            }));
            self.next = end + 1;
        }
    }

    /// The next bytes of the layer; `None` at its end.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, RegistryError> {
        loop {
            if !self.pending.is_empty() {
                let n = self.pending.len().min(SLICE);
                return Ok(Some(self.pending.split_to(n)));
            }
            self._pending_permit = None;
            self.fetch_ahead();
            if let Some((resp, want, got)) = self.current.as_mut() {
                let c = resp
                    .chunk()
                    .await
                    .map_err(|e| RegistryError::Transport(format!("layer {}: {e}", self.digest)))?;
                match c {
                    Some(c) => {
                        *got += c.len() as u64;
                        if *got > *want {
                            return Err(invalid(format!(
                                "layer {}: the registry sent more than the {want} bytes asked for",
                                self.digest
                            )));
                        }
                        return Ok(Some(c));
                    }
                    None if *got != *want => {
                        return Err(invalid(format!(
                            "layer {}: the registry sent {got} of the {want} bytes asked for",
                            self.digest
                        )))
                    }
                    None => self.current = None,
                }
                continue;
            }
            if let Some(h) = self.ahead.pop_front() {
                let (b, permit) = h.await.map_err(|e| {
                    RegistryError::Transport(format!("layer {}: part fetch: {e}", self.digest))
                })??;
                self.pending = b;
                self._pending_permit = Some(permit);
                continue;
            }
            if self.next < self.size {
                // No budget to fetch ahead: the next part streams.
                let len = self.ranges.part_bytes.min(self.size - self.next);
                let (start, end) = (self.next, self.next + len - 1);
                let resp = part(&self.reg, &self.digest, start, end, self.size).await?;
                self.current = Some((resp, len, 0));
                self.next = end + 1;
                continue;
            }
            return Ok(None);
        }
    }
}
