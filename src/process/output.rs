//! A child's output read into buffers capped per call and, across calls, by a shared
//! [`OutputBudget`]: what is beyond the caps is read and dropped, so a child never blocks on a
//! full pipe and our memory stays bounded.
#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use sandboxd_shim_common::fd::set_nonblocking;

/// Output bytes that calls running at once may keep in all (ExecSync: each call may keep up
/// to its cap, but never more than what is left of this budget, so concurrent calls cannot
/// add up to more than it). What a call cannot keep is read and dropped.
#[derive(Debug)]
pub struct OutputBudget {
    left: AtomicUsize,
}

impl OutputBudget {
    pub fn new(total: usize) -> Arc<OutputBudget> {
        Arc::new(OutputBudget {
            left: AtomicUsize::new(total),
        })
    }

    /// Takes up to `want` bytes; returns how many were taken.
    pub(super) fn take(&self, want: usize) -> usize {
        let mut cur = self.left.load(Ordering::Relaxed);
        loop {
            let n = want.min(cur);
            if n == 0 {
                return 0;
            }
            match self
                .left
                .compare_exchange_weak(cur, cur - n, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return n,
                Err(now) => cur = now,
            }
        }
    }

    pub(super) fn give(&self, n: usize) {
        self.left.fetch_add(n, Ordering::AcqRel);
    }

    /// Bytes left now.
    pub fn left(&self) -> usize {
        self.left.load(Ordering::Relaxed)
    }
}

/// One of the child's output pipes, read into a capped buffer.
pub(super) struct Sink {
    pub(super) fd: Option<OwnedFd>,
    pub(super) buf: Vec<u8>,
    cap: usize,
    pub(super) dropped: u64,
    budget: Option<Arc<OutputBudget>>,
    /// Bytes taken from the budget (given back on drop).
    held: usize,
}

impl Drop for Sink {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.give(self.held);
        }
    }
}

impl Sink {
    pub(super) fn new(fd: Option<OwnedFd>, cap: usize, budget: Option<Arc<OutputBudget>>) -> Sink {
        if let Some(f) = &fd {
            set_nonblocking(f);
        }
        Sink {
            fd,
            buf: Vec::new(),
            cap,
            dropped: 0,
            budget,
            held: 0,
        }
    }

    /// Reads what is there; closes at EOF or on error.
    pub(super) fn read(&mut self) {
        let Some(fd) = &self.fd else { return };
        let mut chunk = [0u8; 16384];
        loop {
            // SAFETY: reading into an owned stack buffer of its length, from an fd we own.
            let n = unsafe { libc::read(fd.as_raw_fd(), chunk.as_mut_ptr().cast(), chunk.len()) };
            if n > 0 {
                let n = n as usize;
                let mut room = self.cap.saturating_sub(self.buf.len()).min(n);
                if let Some(b) = &self.budget {
                    room = b.take(room);
                    self.held += room;
                }
                self.buf.extend_from_slice(&chunk[..room]);
                self.dropped += (n - room) as u64;
                continue;
            }
            if n < 0 {
                let e = std::io::Error::last_os_error();
                match e.kind() {
                    std::io::ErrorKind::WouldBlock => return,
                    std::io::ErrorKind::Interrupted => continue,
                    _ => {}
                }
            }
            self.fd = None; // EOF or error
            return;
        }
    }
}
