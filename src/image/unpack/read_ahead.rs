//! Decompression on a thread of its own: the layer's decoder runs ahead of the tar reader
//! (which hashes the stream and writes the files), so a large layer's unpack costs about
//! the larger of the two instead of their sum. The hand-over is bounded: at most [`DEPTH`]
//! chunks of [`CHUNK`] bytes wait, and their buffers are reused.

use std::io::Read;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError};

/// Bytes the decoder hands over at a time (256 KiB: the tar reader writes files in pieces
/// of that size; four such buffers a layer in flight, six layers at once by default).
pub const CHUNK: usize = 256 << 10;
/// Chunks decoded but not yet read, at most.
pub const DEPTH: usize = 2;

/// What the decoder thread sends: a chunk, its error, or (an empty chunk) the end.
type Item = std::io::Result<Vec<u8>>;

/// The reading side.
pub struct ReadAhead {
    full: Receiver<Item>,
    empty: SyncSender<Vec<u8>>,
    cur: Vec<u8>,
    pos: usize,
    done: bool,
}

/// Starts reading `src` on a thread of scope `s`; the returned reader yields its bytes. The
/// thread ends at the end of `src`, at its first error (which the reader returns), or when
/// the reader is dropped.
pub fn spawn<'scope>(
    s: &'scope std::thread::Scope<'scope, '_>,
    mut src: impl Read + Send + 'scope,
) -> std::io::Result<ReadAhead> {
    let (full_tx, full) = sync_channel::<Item>(DEPTH);
    let (empty, empty_rx) = sync_channel::<Vec<u8>>(DEPTH + 2);
    let decode = move || loop {
        let mut buf = match empty_rx.try_recv() {
            Ok(b) => b,
            Err(TryRecvError::Empty) => Vec::with_capacity(CHUNK),
            Err(TryRecvError::Disconnected) => return,
        };
        buf.resize(CHUNK, 0);
        let mut n = 0;
        let item = loop {
            match src.read(&mut buf[n..]) {
                Ok(0) => break Ok(()),
                Ok(k) => {
                    n += k;
                    if n == CHUNK {
                        break Ok(());
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        buf.truncate(n);
        let end = n == 0;
        let sent = match item {
            Err(e) => full_tx.send(Err(e)).map(|_| false),
            // (An empty chunk is the end.)
            Ok(()) => full_tx.send(Ok(buf)).map(|_| !end),
        };
        if !matches!(sent, Ok(true)) {
            return;
        }
    };
    std::thread::Builder::new()
        .name("layer-decoder".into())
        .spawn_scoped(s, decode)?;
    Ok(ReadAhead {
        full,
        empty,
        cur: Vec::new(),
        pos: 0,
        done: false,
    })
}

impl Read for ReadAhead {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.pos == self.cur.len() {
            if self.done || out.is_empty() {
                return Ok(0);
            }
            let used = std::mem::take(&mut self.cur);
            if used.capacity() > 0 {
                let _ = self.empty.try_send(used);
            }
            self.pos = 0;
            match self.full.recv() {
                Ok(Ok(b)) if b.is_empty() => self.done = true,
                Ok(Ok(b)) => self.cur = b,
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(std::io::Error::other(
                        "the decompression thread ended before the stream did",
                    ))
                }
            }
        }
        let n = out.len().min(self.cur.len() - self.pos);
        out[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source that hands out `len` bytes counting up, then fails if `fail`.
    struct Counting {
        at: usize,
        len: usize,
        fail: bool,
    }

    impl Read for Counting {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.at == self.len {
                return match self.fail {
                    true => Err(std::io::Error::other("corrupt input")),
                    false => Ok(0),
                };
            }
            // Odd-sized reads, so chunks fill over several calls.
            let n = buf.len().min(self.len - self.at).min(77_777);
            for (i, b) in buf[..n].iter_mut().enumerate() {
                *b = ((self.at + i) % 251) as u8;
            }
            self.at += n;
            Ok(n)
        }
    }

    #[test]
    fn every_byte_in_order_then_the_end_or_the_error() {
        let len = 3 * CHUNK + 12_345;
        std::thread::scope(|s| {
            let mut r = spawn(
                s,
                Counting {
                    at: 0,
                    len,
                    fail: false,
                },
            )
            .unwrap();
            let mut got = Vec::new();
            r.read_to_end(&mut got).unwrap();
            assert_eq!(got.len(), len);
            assert!(got.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));
            assert_eq!(r.read(&mut [0u8; 8]).unwrap(), 0, "read past the end");
        });
        std::thread::scope(|s| {
            let mut r = spawn(
                s,
                Counting {
                    at: 0,
                    len: 1000,
                    fail: true,
                },
            )
            .unwrap();
            let e = r.read_to_end(&mut Vec::new()).unwrap_err();
            assert_eq!(e.to_string(), "corrupt input");
        });
    }

    #[test]
    fn a_reader_dropped_early_ends_the_thread() {
        // The scope returns only once the thread has ended: it must notice the reader left.
        std::thread::scope(|s| {
            let mut r = spawn(
                s,
                Counting {
                    at: 0,
                    len: usize::MAX,
                    fail: false,
                },
            )
            .unwrap();
            let mut b = [0u8; 10];
            r.read_exact(&mut b).unwrap();
            drop(r);
        });
    }
}
