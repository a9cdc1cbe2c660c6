//! The console socket of a container with a terminal: during `runtime create` the runtime
//! connects to it and sends the pty master (SCM_RIGHTS), which then carries the container's
//! output and its attach clients' input.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::Duration;

/// The console socket and the master received on it.
pub struct Console {
    /// `None`: the container has no terminal.
    listener: Option<UnixListener>,
    path: Option<PathBuf>,
    master: Option<OwnedFd>,
}

impl Console {
    /// `listener`: non-blocking, bound at `path`.
    pub fn new(listener: Option<UnixListener>, path: Option<PathBuf>) -> Console {
        Console {
            listener,
            path,
            master: None,
        }
    }

    /// The listener while it still waits for the runtime (to poll for its connection).
    pub fn waiting_fd(&self) -> Option<RawFd> {
        match (&self.listener, &self.master) {
            (Some(l), None) => Some(l.as_raw_fd()),
            _ => None,
        }
    }

    /// Takes the master if the runtime has connected. An error: it connected and sent none.
    pub fn try_accept(&mut self) -> std::io::Result<()> {
        if let (Some(l), None) = (&self.listener, &self.master) {
            if let Ok((s, _)) = l.accept() {
                self.master = Some(recv_master(&s)?);
            }
        }
        Ok(())
    }

    /// Stops listening (the socket file is removed) and returns the master, if one came.
    /// `Err`: the container should have a terminal and did not get one.
    pub fn finish(mut self) -> Result<Option<OwnedFd>, ()> {
        // A connection that came as create exited.
        let _ = self.try_accept();
        if let Some(p) = &self.path {
            let _ = std::fs::remove_file(p);
        }
        match (&self.listener, self.master) {
            (Some(_), None) => Err(()),
            (_, master) => Ok(master),
        }
    }
}

/// Receives the master the runtime sends on an accepted console connection.
fn recv_master(s: &UnixStream) -> std::io::Result<OwnedFd> {
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    sandboxd_shim_common::fd::recv_fd(s)?
        .ok_or_else(|| std::io::Error::other("no fd in the console message"))
}
