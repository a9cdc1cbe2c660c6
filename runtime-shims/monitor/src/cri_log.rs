//! The CRI log writer: the container's stdout and stderr as CRI log entries,
//! `TIMESTAMP STREAM TAG CONTENT\n` (tag `F` for a full line, `P` for a part of a line longer
//! than [`MAX_LINE`], and for a last line the stream ended without a newline).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use sandboxd_shim_common::time::timestamp;

/// Longest log entry; longer lines are split into partial (`P`) entries.
const MAX_LINE: usize = 16 * 1024;

/// The CRI log file; write errors are dropped so a full disk never blocks the container.
pub struct LogFile {
    path: Option<PathBuf>,
    file: Option<File>,
}

impl LogFile {
    pub fn open(path: Option<PathBuf>) -> LogFile {
        let mut l = LogFile { path, file: None };
        let _ = l.reopen();
        l
    }

    /// Opens the log file again (creating it: kubelet renamed the old one away). On failure
    /// the old file is kept, so no output is lost, and the error says why.
    pub fn reopen(&mut self) -> Result<(), String> {
        let Some(p) = self.path.as_ref() else {
            return Ok(()); // no log: nothing to reopen
        };
        match OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o640)
            .custom_flags(libc::O_CLOEXEC)
            .open(p)
        {
            Ok(f) => {
                self.file = Some(f);
                Ok(())
            }
            Err(e) => Err(format!("open {}: {e}", p.display())),
        }
    }

    fn entry(&mut self, stream: &str, tag: char, content: &[u8]) {
        if let Some(f) = self.file.as_mut() {
            let mut line = Vec::with_capacity(content.len() + 48);
            line.extend_from_slice(timestamp().as_bytes());
            line.push(b' ');
            line.extend_from_slice(stream.as_bytes());
            line.push(b' ');
            line.push(tag as u8);
            line.push(b' ');
            line.extend_from_slice(content);
            line.push(b'\n');
            let _ = f.write_all(&line);
        }
    }
}

/// One output stream of the container with its pending partial line.
pub struct Stream {
    name: &'static str,
    fd: OwnedFd,
    buf: Vec<u8>,
    /// Bytes read since the attach clients were last served.
    fresh: Vec<u8>,
    closed: bool,
}

impl Stream {
    pub fn new(name: &'static str, fd: OwnedFd) -> Stream {
        Stream {
            name,
            fd,
            buf: Vec::new(),
            fresh: Vec::new(),
            closed: false,
        }
    }

    /// The fd to poll for input; -1 (ignored by poll) once the stream reached its end.
    pub fn poll_fd(&self) -> RawFd {
        if self.closed {
            -1
        } else {
            self.fd.as_raw_fd()
        }
    }

    /// The stream reached its end (or failed).
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// What was read since the last call, for the attach clients (see `tee`).
    pub fn take_fresh(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.fresh)
    }

    /// Reads what is there into the log; `tee`: also keep it for the attach clients.
    pub fn read_into(&mut self, log: &mut LogFile, tee: bool) {
        let mut chunk = [0u8; 8192];
        loop {
            // SAFETY: reading into an owned stack buffer of the given length.
            let n =
                unsafe { libc::read(self.fd.as_raw_fd(), chunk.as_mut_ptr().cast(), chunk.len()) };
            if n == 0 {
                self.closed = true;
                return;
            }
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::WouldBlock
                    && e.kind() != std::io::ErrorKind::Interrupted
                {
                    self.closed = true;
                }
                return;
            }
            self.buf.extend_from_slice(&chunk[..n as usize]);
            if tee {
                self.fresh.extend_from_slice(&chunk[..n as usize]);
            }
            for (tag, content) in split_entries(&mut self.buf) {
                log.entry(self.name, tag, &content);
            }
        }
    }

    pub fn finish(&mut self, log: &mut LogFile, tee: bool) {
        if !self.closed {
            self.read_into(log, tee);
        }
        // A last line without its newline is a partial entry, as the peers write it: a
        // reader (kubelet) then knows no newline was there.
        if !self.buf.is_empty() {
            let rest = std::mem::take(&mut self.buf);
            log.entry(self.name, 'P', &rest);
        }
    }
}

/// Takes the complete entries out of `buf`: full lines (`F`, without the newline) and, for a
/// line longer than [`MAX_LINE`], partial chunks (`P`). What remains is an unfinished line.
fn split_entries(buf: &mut Vec<u8>) -> Vec<(char, Vec<u8>)> {
    let mut out = Vec::new();
    let mut start = 0;
    loop {
        let rest = &buf[start..];
        match rest.iter().position(|&b| b == b'\n') {
            Some(nl) if nl <= MAX_LINE => {
                out.push(('F', rest[..nl].to_vec()));
                start += nl + 1;
            }
            _ if rest.len() >= MAX_LINE => {
                out.push(('P', rest[..MAX_LINE].to_vec()));
                start += MAX_LINE;
            }
            _ => break,
        }
    }
    buf.drain(..start);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_lines_and_partials() {
        let mut b = b"one\ntwo\nthr".to_vec();
        let e = split_entries(&mut b);
        assert_eq!(e, vec![('F', b"one".to_vec()), ('F', b"two".to_vec())]);
        assert_eq!(b, b"thr");
        let mut long = vec![b'x'; MAX_LINE + 10];
        long.push(b'\n');
        let e = split_entries(&mut long);
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].0, 'P');
        assert_eq!(e[0].1.len(), MAX_LINE);
        assert_eq!(e[1], ('F', vec![b'x'; 10]));
        assert!(long.is_empty());
    }
}
