//! What a lazy layer's reads fetched: a sparse copy of the blob under the layer's dir, filled
//! in 1 MiB blocks by range requests as reads need them, each block fetched once however many
//! readers want it (the others wait for it), every request bounded in time and retried twice.
//! Chunks are read from it by offset, decompressed and checked against their TOC digest; the
//! decompressed chunks last read are kept within a byte budget. (The background completion
//! streams the whole blob into the store instead, `helper.rs`: it writes nothing here.)

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use sha2::Digest;

use super::super::estargz::{Chunk, Format};
use super::super::registry::Registry;

/// The unit of fetching.
pub const BLOCK: u64 = 1 << 20;
/// Decompressed chunks kept for the reads that follow.
const CACHE_BYTES: u64 = 32 << 20;
/// Attempts per range request.
const ATTEMPTS: u32 = 3;
/// Bytes per request of the prefetch.
const PREFETCH_RUN: u64 = 8 << 20;

pub struct Blob {
    file: File,
    /// How its chunks are compressed.
    format: Format,
    pub size: u64,
    pub digest: String,
    present: Vec<AtomicU64>,
    /// Blocks being fetched.
    inflight: Mutex<HashSet<u64>>,
    landed: Condvar,
    reg: Registry,
    rt: tokio::runtime::Handle,
    timeout: Duration,
    /// Bytes fetched so far.
    pub fetched: AtomicU64,
    cache: Mutex<Cache>,
    chunk_loaded: Condvar,
}

#[derive(Default)]
struct Cache {
    map: HashMap<(u64, u64), Arc<Vec<u8>>>,
    /// Chunks being decompressed and checked now.
    loading: HashSet<(u64, u64)>,
    order: VecDeque<(u64, u64)>,
    bytes: u64,
}

impl Blob {
    pub fn new(
        file: File,
        format: Format,
        size: u64,
        digest: String,
        reg: Registry,
        rt: tokio::runtime::Handle,
        timeout: Duration,
    ) -> std::io::Result<Blob> {
        file.set_len(size)?;
        let blocks = size.div_ceil(BLOCK);
        Ok(Blob {
            file,
            format,
            size,
            digest,
            present: (0..blocks.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            inflight: Mutex::default(),
            landed: Condvar::new(),
            reg,
            rt,
            timeout,
            fetched: AtomicU64::new(0),
            cache: Mutex::default(),
            chunk_loaded: Condvar::new(),
        })
    }

    fn has(&self, b: u64) -> bool {
        self.present[(b / 64) as usize].load(Ordering::Acquire) & (1 << (b % 64)) != 0
    }

    fn set(&self, b: u64, on: bool) {
        let w = &self.present[(b / 64) as usize];
        if on {
            w.fetch_or(1 << (b % 64), Ordering::AcqRel);
        } else {
            w.fetch_and(!(1 << (b % 64)), Ordering::AcqRel);
        }
    }

    /// The blob's start that is here (whole blocks from the first, as far as they go) and a
    /// handle on the file holding it: what a completion need not fetch again. None when the
    /// first block is missing.
    pub fn present_start(&self) -> Option<(File, u64)> {
        let blocks = self.size.div_ceil(BLOCK);
        let n = (0..blocks).take_while(|b| self.has(*b)).count() as u64;
        let len = (n * BLOCK).min(self.size);
        (len > 0)
            .then(|| self.file.try_clone().ok().map(|f| (f, len)))
            .flatten()
    }

    /// Makes bytes `start..end` present: fetches the missing blocks nobody is fetching (in
    /// runs of contiguous blocks), waits for those somebody is.
    fn ensure(&self, start: u64, end: u64) -> Result<(), String> {
        let end = end.min(self.size);
        if start >= end {
            return Ok(());
        }
        let (b0, b1) = (start / BLOCK, (end - 1) / BLOCK);
        let deadline = Instant::now() + self.timeout * (ATTEMPTS + 1);
        loop {
            let mut mine = Vec::new();
            let mut theirs = false;
            {
                let mut inf = crate::state::lock(&self.inflight);
                for b in b0..=b1 {
                    if self.has(b) {
                        continue;
                    }
                    if inf.contains(&b) {
                        theirs = true;
                    } else {
                        inf.insert(b);
                        mine.push(b);
                    }
                }
            }
            if mine.is_empty() && !theirs {
                return Ok(());
            }
            if !mine.is_empty() {
                let r = self.fetch_blocks(&mine);
                let mut inf = crate::state::lock(&self.inflight);
                for b in &mine {
                    inf.remove(b);
                }
                drop(inf);
                self.landed.notify_all();
                r?;
                continue;
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "bytes {start}-{end} of layer {}: still being fetched after {} s",
                    self.digest,
                    (self.timeout * (ATTEMPTS + 1)).as_secs()
                ));
            }
            let inf = crate::state::lock(&self.inflight);
            let _ = self.landed.wait_timeout(inf, Duration::from_millis(200));
        }
    }

    /// Fetches `blocks` (ascending, claimed by the caller) in runs of contiguous ones.
    fn fetch_blocks(&self, blocks: &[u64]) -> Result<(), String> {
        let mut i = 0;
        while i < blocks.len() {
            let mut j = i + 1;
            while j < blocks.len() && blocks[j] == blocks[j - 1] + 1 {
                j += 1;
            }
            let start = blocks[i] * BLOCK;
            let end = ((blocks[j - 1] + 1) * BLOCK).min(self.size);
            self.fetch(start, end)?;
            for b in &blocks[i..j] {
                self.set(*b, true);
            }
            i = j;
        }
        Ok(())
    }

    /// One range into the file, retried.
    fn fetch(&self, start: u64, end: u64) -> Result<(), String> {
        let mut last = String::new();
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(200 << attempt));
            }
            let r = self.rt.block_on(async {
                tokio::time::timeout(
                    self.timeout,
                    super::fetch_range(&self.reg, &self.digest, self.size, start, end),
                )
                .await
            });
            match r {
                Ok(Ok(Some(b))) => {
                    self.file
                        .write_all_at(&b, start)
                        .map_err(|e| format!("layer {}: write the blob cache: {e}", self.digest))?;
                    self.fetched.fetch_add(b.len() as u64, Ordering::Relaxed);
                    return Ok(());
                }
                Ok(Ok(None)) => {
                    last = "the registry stopped answering range requests".into();
                }
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => {
                    last = format!(
                        "no answer within {} s (lazy_fetch_timeout_seconds)",
                        self.timeout.as_secs()
                    )
                }
            }
        }
        Err(format!(
            "layer {}: bytes {start}-{end}: {last} ({ATTEMPTS} attempts)",
            self.digest
        ))
    }

    /// Fetches `start..end` (the prefetch landmark's files) in runs of [`PREFETCH_RUN`] by
    /// `workers` threads at once, as reads would.
    pub fn prefetch(&self, start: u64, end: u64, workers: usize) -> Result<(), String> {
        let end = end.min(self.size);
        let next = AtomicU64::new(start);
        let failed = Mutex::new(None);
        std::thread::scope(|s| {
            for _ in 0..workers.max(1) {
                s.spawn(|| loop {
                    let a = next.fetch_add(PREFETCH_RUN, Ordering::Relaxed);
                    if a >= end || crate::state::lock(&failed).is_some() {
                        return;
                    }
                    if let Err(e) = self.ensure(a, (a + PREFETCH_RUN).min(end)) {
                        *crate::state::lock(&failed) = Some(e);
                    }
                });
            }
        });
        match failed.into_inner().unwrap_or_default() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Forgets the blocks of `start..end` (bytes that did not check out are fetched again).
    fn forget(&self, start: u64, end: u64) {
        for b in start / BLOCK..=(end.max(start + 1) - 1) / BLOCK {
            self.set(b, false);
        }
    }

    /// The uncompressed bytes of chunk `c`, checked against its digest: from the cache, or
    /// decompressed once however many reads want it at once (the kernel's read-ahead asks
    /// for several pieces of one chunk together).
    pub fn chunk(&self, c: &Chunk) -> Result<Arc<Vec<u8>>, String> {
        let key = (c.blob_off, c.len);
        {
            let mut cache = crate::state::lock(&self.cache);
            loop {
                if let Some(v) = cache.map.get(&key) {
                    return Ok(v.clone());
                }
                if !cache.loading.contains(&key) {
                    cache.loading.insert(key);
                    break;
                }
                cache = self
                    .chunk_loaded
                    .wait(cache)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        }
        let r = self.load_chunk(c);
        let mut cache = crate::state::lock(&self.cache);
        cache.loading.remove(&key);
        if let Ok(v) = &r {
            cache.bytes += c.len;
            cache.map.insert(key, v.clone());
            cache.order.push_back(key);
            while cache.bytes > CACHE_BYTES {
                let Some(k) = cache.order.pop_front() else {
                    break;
                };
                if let Some(old) = cache.map.remove(&k) {
                    cache.bytes -= old.len() as u64;
                }
            }
        }
        drop(cache);
        self.chunk_loaded.notify_all();
        r
    }

    fn load_chunk(&self, c: &Chunk) -> Result<Arc<Vec<u8>>, String> {
        let mut last = String::new();
        for _ in 0..2 {
            // The chunk's compressed bytes in one request where the TOC bounds them (what is
            // past a generous guess is fetched as the decoder reaches it).
            let guess = c.max_compressed.min(c.len + c.len / 8 + (64 << 10));
            self.ensure(c.blob_off, c.blob_off.saturating_add(guess))?;
            let mut r = Reader {
                blob: self,
                pos: c.blob_off,
                end: c.blob_off.saturating_add(c.max_compressed).min(self.size),
                err: None,
            };
            let read = match self.format {
                Format::Estargz => {
                    let mut out = vec![0u8; c.len as usize];
                    flate2::read::GzDecoder::new(&mut r)
                        .read_exact(&mut out)
                        .map(|()| out)
                }
                Format::ZstdChunked => super::super::zstd_chunked::read_chunk(&mut r, c.len),
            };
            if let Some(e) = r.err.take() {
                // A fetch that failed is not the bytes' fault: no second try of its own.
                return Err(e);
            }
            match read {
                Ok(out) if sha2::Sha256::digest(&out).as_slice() == c.digest => {
                    return Ok(Arc::new(out));
                }
                Ok(_) => last = "its bytes do not match the TOC's digest".into(),
                Err(e) => last = format!("it does not decompress: {e}"),
            }
            self.forget(c.blob_off, r.pos);
        }
        Err(format!(
            "layer {}: the chunk at blob offset {} ({} bytes): {last} (fetched twice)",
            self.digest, c.blob_off, c.len
        ))
    }
}

/// The blob's bytes from `pos` up to `end`, fetched as they are read.
pub struct Reader<'a> {
    blob: &'a Blob,
    pos: u64,
    end: u64,
    /// A fetch that failed (said apart from bytes that do not decompress).
    err: Option<String>,
}

impl Read for Reader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.pos >= self.end {
            return Ok(0);
        }
        let n = (buf.len() as u64)
            .min(self.end - self.pos)
            .min(BLOCK - self.pos % BLOCK) as usize;
        if let Err(e) = self.blob.ensure(self.pos, self.pos + n as u64) {
            self.err = Some(e.clone());
            return Err(std::io::Error::other(e));
        }
        let k = self.blob.file.read_at(&mut buf[..n], self.pos)?;
        self.pos += k as u64;
        Ok(k)
    }
}
