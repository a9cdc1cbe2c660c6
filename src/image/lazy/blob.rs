//! A lazy layer's blob: a sparse copy under the layer's dir, filled in 1 MiB blocks by range
//! requests, each block fetched once however many readers want it (the others wait for it),
//! every request bounded in time and retried twice. Chunks are read from it by offset,
//! decompressed and checked against their TOC digest; the decompressed chunks last read are
//! kept within a byte budget. `complete` fetches what is missing (the prefetch range first)
//! and checks the whole against the layer digest.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use sha2::Digest;

use super::super::estargz::Chunk;
use super::super::registry::Registry;

/// The unit of fetching.
pub const BLOCK: u64 = 1 << 20;
/// Most bytes one background request asks for.
const RUN: u64 = 4 << 20;
/// Decompressed chunks kept for the reads that follow.
const CACHE_BYTES: u64 = 32 << 20;
/// Attempts per range request.
const ATTEMPTS: u32 = 3;
/// The background fetch waits while a read had to fetch in the last this many ms.
const YIELD_MS: u64 = 150;

pub struct Blob {
    file: File,
    pub size: u64,
    pub digest: String,
    present: Vec<AtomicU64>,
    /// Blocks being fetched: by readers, and by the background (a reader never waits for
    /// the background's: it fetches such a block itself).
    inflight: Mutex<Inflight>,
    landed: Condvar,
    reg: Registry,
    rt: tokio::runtime::Handle,
    timeout: Duration,
    /// When (ms after `born`) a read last had to wait for the registry: the background
    /// fetch yields to such reads.
    last_foreground: AtomicU64,
    born: Instant,
    /// The node-wide marker of reads waiting (`images/tmp/lazy-reads`), and when this server
    /// last touched it.
    reading_marker: Option<std::path::PathBuf>,
    last_marked: AtomicU64,
    /// Bytes and requests fetched so far.
    pub fetched: AtomicU64,
    pub requests: AtomicU64,
    cache: Mutex<Cache>,
}

#[derive(Default)]
struct Inflight {
    reads: HashSet<u64>,
    background: HashSet<u64>,
}

/// Who wants bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    /// A reader of the filesystem: first, the background yields to it.
    Reader,
    /// A background fetcher: skips what anybody fetches.
    Background,
    /// The background's unpacker: waits for what anybody fetches.
    Unpacker,
}

#[derive(Default)]
struct Cache {
    map: HashMap<(u64, u64), Arc<Vec<u8>>>,
    order: VecDeque<(u64, u64)>,
    bytes: u64,
}

impl Blob {
    pub fn new(
        file: File,
        size: u64,
        digest: String,
        reg: Registry,
        rt: tokio::runtime::Handle,
        timeout: Duration,
        reading_marker: Option<std::path::PathBuf>,
    ) -> std::io::Result<Blob> {
        file.set_len(size)?;
        let blocks = size.div_ceil(BLOCK);
        Ok(Blob {
            file,
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
            last_foreground: AtomicU64::new(0),
            born: Instant::now(),
            reading_marker,
            last_marked: AtomicU64::new(0),
            fetched: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            cache: Mutex::default(),
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

    fn now_ms(&self) -> u64 {
        self.born.elapsed().as_millis() as u64 + 1
    }

    /// Makes bytes `start..end` present for `who`: fetches the missing blocks nobody is
    /// fetching (in runs of contiguous blocks), waits for those somebody is (a reader never
    /// for the background's, the background never at all).
    fn ensure_as(&self, start: u64, end: u64, who: Who) -> Result<(), String> {
        let end = end.min(self.size);
        if start >= end {
            return Ok(());
        }
        let (b0, b1) = (start / BLOCK, (end - 1) / BLOCK);
        let deadline = Instant::now() + self.timeout * (ATTEMPTS + 1);
        loop {
            let mut mine = Vec::new();
            let mut wait = false;
            {
                let mut inf = crate::state::lock(&self.inflight);
                for b in b0..=b1 {
                    if self.has(b) {
                        continue;
                    }
                    let (by_reader, by_background) =
                        (inf.reads.contains(&b), inf.background.contains(&b));
                    match who {
                        Who::Reader if by_reader => wait = true,
                        Who::Reader => {
                            inf.reads.insert(b);
                            mine.push(b);
                        }
                        Who::Background if by_reader || by_background => {}
                        Who::Unpacker if by_reader || by_background => wait = true,
                        Who::Background | Who::Unpacker => {
                            inf.background.insert(b);
                            mine.push(b);
                        }
                    }
                }
            }
            if mine.is_empty() && !wait {
                return Ok(());
            }
            if who == Who::Reader {
                self.last_foreground.store(self.now_ms(), Ordering::Relaxed);
                self.mark_reading();
            }
            if !mine.is_empty() {
                let r = self.fetch_blocks(&mine);
                let mut inf = crate::state::lock(&self.inflight);
                for b in &mine {
                    match who {
                        Who::Reader => inf.reads.remove(b),
                        _ => inf.background.remove(b),
                    };
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

    /// Tells every layer's background fetch on the node that a read waits for a registry
    /// (the node-wide marker's mtime, touched at most every 50 ms).
    fn mark_reading(&self) {
        let Some(m) = &self.reading_marker else {
            return;
        };
        let now = self.now_ms();
        if now < self.last_marked.load(Ordering::Relaxed) + 50 {
            return;
        }
        self.last_marked.store(now, Ordering::Relaxed);
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(m)
            .and_then(|f| f.set_modified(std::time::SystemTime::now()));
    }

    /// Whether a read waits for a registry, here or (by the node-wide marker) in another
    /// layer's server.
    fn reads_waiting(&self) -> bool {
        if self.now_ms() < self.last_foreground.load(Ordering::Relaxed) + YIELD_MS {
            return true;
        }
        self.reading_marker.as_ref().is_some_and(|m| {
            std::fs::metadata(m)
                .and_then(|x| x.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age < Duration::from_millis(YIELD_MS))
        })
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
            self.requests.fetch_add(1, Ordering::Relaxed);
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

    /// Forgets the blocks of `start..end` (bytes that did not check out are fetched again).
    fn forget(&self, start: u64, end: u64) {
        for b in start / BLOCK..=(end.max(start + 1) - 1) / BLOCK {
            self.set(b, false);
        }
    }

    /// The uncompressed bytes of chunk `c`, checked against its digest.
    pub fn chunk(&self, c: &Chunk) -> Result<Arc<Vec<u8>>, String> {
        let key = (c.blob_off, c.len);
        if let Some(v) = crate::state::lock(&self.cache).map.get(&key) {
            return Ok(v.clone());
        }
        let mut last = String::new();
        for _ in 0..2 {
            let mut r = Reader {
                blob: self,
                pos: c.blob_off,
                end: c.blob_off.saturating_add(c.max_compressed).min(self.size),
                err: None,
                who: Who::Reader,
            };
            let mut out = vec![0u8; c.len as usize];
            let read = flate2::read::GzDecoder::new(&mut r).read_exact(&mut out);
            if let Some(e) = r.err.take() {
                // A fetch that failed is not the bytes' fault: no second try of its own.
                return Err(e);
            }
            match read {
                Ok(()) if sha2::Sha256::digest(&out).as_slice() == c.digest => {
                    let v = Arc::new(out);
                    let mut cache = crate::state::lock(&self.cache);
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
                    return Ok(v);
                }
                Ok(()) => last = "its bytes do not match the TOC's digest".into(),
                Err(e) => last = format!("it does not decompress: {e}"),
            }
            self.forget(c.blob_off, r.pos);
        }
        Err(format!(
            "layer {}: the chunk at blob offset {} ({} bytes): {last} (fetched twice)",
            self.digest, c.blob_off, c.len
        ))
    }

    /// Fetches everything missing: `first` (the prefetch range) first, then the rest in
    /// order, by `workers` threads at once, each yielding while reads wait for the registry
    /// (a read that had to fetch in the last [`YIELD`]).
    pub fn fetch_all(&self, first: u64, workers: usize) -> Result<(), String> {
        let mut runs = Vec::new();
        let mut at = 0;
        let first = first.min(self.size);
        for (s, e) in [(0, first), (first, self.size)] {
            at = at.max(s);
            while at < e {
                let end = (at + RUN).min(e);
                runs.push((at, end));
                at = end;
            }
        }
        let next = AtomicU64::new(0);
        let failed = Mutex::new(None);
        std::thread::scope(|s| {
            for _ in 0..workers.max(1) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    let Some(&(a, b)) = runs.get(i) else { return };
                    if crate::state::lock(&failed).is_some() {
                        return;
                    }
                    while self.reads_waiting() {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    if let Err(e) = self.ensure_as(a, b, Who::Background) {
                        *crate::state::lock(&failed) = Some(e);
                        return;
                    }
                });
            }
        });
        match failed.into_inner().unwrap_or_default() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The whole blob from its start, fetched as read (beside [`Blob::fetch_all`]), its
    /// sha256 checked against the layer digest at its end: a mismatch is a read error, so
    /// an unpack of it fails rather than commits.
    pub fn verified_reader(&self) -> Verified<'_> {
        Verified {
            inner: Reader {
                blob: self,
                pos: 0,
                end: self.size,
                err: None,
                who: Who::Unpacker,
            },
            hash: sha2::Sha256::new(),
            read: 0,
        }
    }
}

/// The blob's bytes from `pos` up to `end`, fetched as they are read.
pub struct Reader<'a> {
    blob: &'a Blob,
    pos: u64,
    end: u64,
    /// A fetch that failed (said apart from bytes that do not decompress).
    err: Option<String>,
    who: Who,
}

impl Read for Reader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.pos >= self.end {
            return Ok(0);
        }
        let n = (buf.len() as u64)
            .min(self.end - self.pos)
            .min(BLOCK - self.pos % BLOCK) as usize;
        if let Err(e) = self.blob.ensure_as(self.pos, self.pos + n as u64, self.who) {
            self.err = Some(e.clone());
            return Err(std::io::Error::other(e));
        }
        let k = self.blob.file.read_at(&mut buf[..n], self.pos)?;
        self.pos += k as u64;
        Ok(k)
    }
}

/// [`Blob::verified_reader`].
pub struct Verified<'a> {
    inner: Reader<'a>,
    hash: sha2::Sha256,
    read: u64,
}

impl Read for Verified<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.read += n as u64;
        if n == 0 && !buf.is_empty() {
            let got = format!(
                "sha256:{}",
                super::super::unpack::hex(&self.hash.clone().finalize())
            );
            if self.read != self.inner.blob.size || got != self.inner.blob.digest {
                return Err(std::io::Error::other(format!(
                    "layer {}: the fetched blob is {got} ({} bytes)",
                    self.inner.blob.digest, self.read
                )));
            }
        }
        Ok(n)
    }
}
