//! The attach socket server: each client gets the container's output as it is read, and may
//! write the container's stdin and (with a terminal) set its size. The frames are those of
//! `sandboxd_shim_common::attach`. Nothing here blocks: the socket and the clients are
//! non-blocking and served from the monitor's poll loop.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use sandboxd_shim_common::attach::{self, CLOSE_STDIN, HEADER_LEN, MAX_PAYLOAD, RESIZE, STDIN};
use sandboxd_shim_common::cli::StdinMode;
use sandboxd_shim_common::fd::set_winsize;

/// Most stdin bytes held for a container that does not read them.
const MAX_STDIN_PENDING: usize = 1 << 20;
/// Most output bytes queued for a slow attach client before it is dropped.
const MAX_CLIENT_QUEUE: usize = 4 << 20;

/// The attach socket, its clients and the container's stdin they write.
pub struct Attach {
    listener: Option<UnixListener>,
    clients: Vec<Attached>,
    /// The container's stdin (its terminal's master when it has one); `None` once closed.
    stdin: Option<OwnedFd>,
    /// Input the container has not taken yet.
    stdin_pending: Vec<u8>,
    /// `once`: the first client that wrote stdin going away (or closing it) closes it.
    stdin_once: bool,
    /// Stdin is to be closed once the container has taken what is pending (input that came
    /// in the same read as the close is still delivered).
    stdin_closing: bool,
}

impl Attach {
    /// `stdin`: non-blocking, the container's stdin pipe or its terminal.
    pub fn new(
        listener: Option<UnixListener>,
        stdin: Option<OwnedFd>,
        stdin_mode: StdinMode,
    ) -> Attach {
        Attach {
            listener,
            clients: Vec::new(),
            stdin,
            stdin_pending: Vec::new(),
            stdin_once: stdin_mode == StdinMode::Once,
            stdin_closing: false,
        }
    }

    /// Someone is attached (output is then kept for the clients, not only logged).
    pub fn has_clients(&self) -> bool {
        !self.clients.is_empty()
    }

    /// Adds what to poll: the listener, the container's stdin (when input is pending), then
    /// one entry per client.
    pub fn poll_fds(&self, pfds: &mut Vec<libc::pollfd>) {
        let mut add = |fd: libc::c_int, events: libc::c_short| {
            pfds.push(libc::pollfd {
                fd,
                events,
                revents: 0,
            })
        };
        add(
            self.listener.as_ref().map_or(-1, |l| l.as_raw_fd()),
            libc::POLLIN,
        );
        add(
            match &self.stdin {
                Some(w) if !self.stdin_pending.is_empty() => w.as_raw_fd(),
                _ => -1,
            },
            libc::POLLOUT,
        );
        for c in &self.clients {
            add(
                c.sock.as_raw_fd(),
                libc::POLLIN | if c.out.is_empty() { 0 } else { libc::POLLOUT },
            );
        }
    }

    /// Serves what poll reported on the entries [`poll_fds`](Self::poll_fds) added (`pfds`
    /// starts at the first of them): new clients, their input, the container's stdin.
    /// `terminal`: the container's terminal, which resize frames apply to.
    pub fn handle(&mut self, pfds: &[libc::pollfd], terminal: Option<&OwnedFd>) {
        if pfds[0].revents != 0 {
            if let Some(l) = &self.listener {
                while let Ok((sock, _)) = l.accept() {
                    let _ = sock.set_nonblocking(true);
                    self.clients.push(Attached::new(sock));
                }
            }
        }
        let mut owner_present = self.clients.iter().any(|c| c.owns_stdin && !c.gone);
        for (k, c) in self.clients.iter_mut().enumerate() {
            let re = pfds.get(2 + k).map_or(0, |p| p.revents);
            if re & libc::POLLOUT != 0 {
                c.flush();
            }
            if re & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) == 0 {
                continue;
            }
            for (kind, payload) in c.read_frames() {
                match kind {
                    STDIN if self.stdin.is_some() && (c.owns_stdin || !owner_present) => {
                        c.owns_stdin = true;
                        owner_present = true;
                        if self.stdin_pending.len() + payload.len() <= MAX_STDIN_PENDING {
                            self.stdin_pending.extend_from_slice(&payload);
                        }
                    }
                    CLOSE_STDIN if self.stdin_once && terminal.is_none() && c.owns_stdin => {
                        self.stdin_closing = true
                    }
                    RESIZE => {
                        if let (Some(t), Some((w, h))) = (terminal, attach::parse_resize(&payload))
                        {
                            let _ = set_winsize(t, w, h);
                        }
                    }
                    _ => {}
                }
            }
        }
        // stdin_once: the first client that wrote stdin going away closes it.
        if self.stdin_once && self.clients.iter().any(|c| c.gone && c.owns_stdin) {
            self.stdin_closing = true;
        }
        self.clients.retain(|c| !c.gone);
        self.write_stdin();
    }

    /// Hands the container what input it takes now.
    fn write_stdin(&mut self) {
        match &self.stdin {
            Some(w) if !self.stdin_pending.is_empty() => {
                // SAFETY: writing from a buffer we own, of the given length.
                let n = unsafe {
                    libc::write(
                        w.as_raw_fd(),
                        self.stdin_pending.as_ptr().cast(),
                        self.stdin_pending.len(),
                    )
                };
                if n > 0 {
                    self.stdin_pending.drain(..n as usize);
                } else if n < 0
                    && std::io::Error::last_os_error().kind() != std::io::ErrorKind::WouldBlock
                {
                    self.stdin = None; // the container closed its stdin
                }
            }
            Some(_) => {}
            None => self.stdin_pending.clear(),
        }
        if self.stdin_closing && self.stdin_pending.is_empty() {
            self.stdin = None;
        }
    }

    /// Queues output of stream `kind` (`attach::STDOUT` or `STDERR`) for every client.
    pub fn serve(&mut self, kind: u8, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        for c in self.clients.iter_mut() {
            c.queue(kind, data);
        }
    }

    /// Gives the clients their last output (waiting at most a second on each), then closes
    /// them (EOF = the container exited) and removes the socket at `path`.
    pub fn close(&mut self, path: Option<&Path>) {
        for c in self.clients.iter_mut() {
            let _ = c.sock.set_nonblocking(false);
            let _ = c
                .sock
                .set_write_timeout(Some(std::time::Duration::from_secs(1)));
            c.flush();
        }
        self.clients.clear();
        if let Some(p) = path {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// One attach client.
struct Attached {
    sock: UnixStream,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    /// This client writes the container's stdin: the first one to send input holds it until
    /// it goes away; input from the others is dropped.
    owns_stdin: bool,
    gone: bool,
}

impl Attached {
    fn new(sock: UnixStream) -> Attached {
        Attached {
            sock,
            inbuf: Vec::new(),
            out: Vec::new(),
            owns_stdin: false,
            gone: false,
        }
    }

    fn queue(&mut self, kind: u8, data: &[u8]) {
        if self.gone || data.is_empty() {
            return;
        }
        if self.out.len() + data.len() > MAX_CLIENT_QUEUE {
            self.gone = true; // too slow: it would hold the container's output hostage
            return;
        }
        attach::push_frame(&mut self.out, kind, data);
        self.flush();
    }

    fn flush(&mut self) {
        while !self.out.is_empty() {
            match (&self.sock).write(&self.out) {
                Ok(0) => {
                    self.gone = true;
                    return;
                }
                Ok(n) => {
                    self.out.drain(..n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.gone = true;
                    return;
                }
            }
        }
    }

    fn read_frames(&mut self) -> Vec<(u8, Vec<u8>)> {
        let mut chunk = [0u8; 8192];
        loop {
            match (&self.sock).read(&mut chunk) {
                Ok(0) => {
                    self.gone = true;
                    break;
                }
                Ok(n) => self.inbuf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    self.gone = true;
                    break;
                }
            }
        }
        let mut out = Vec::new();
        while self.inbuf.len() >= HEADER_LEN {
            let head: [u8; HEADER_LEN] = self.inbuf[..HEADER_LEN].try_into().expect("length");
            let (kind, len) = attach::parse_header(head);
            if len > MAX_PAYLOAD {
                self.gone = true;
                break;
            }
            if self.inbuf.len() < HEADER_LEN + len {
                break;
            }
            out.push((kind, self.inbuf[HEADER_LEN..HEADER_LEN + len].to_vec()));
            self.inbuf.drain(..HEADER_LEN + len);
        }
        out
    }
}
