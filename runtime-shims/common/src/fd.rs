//! The small syscalls on descriptors that the daemon and the monitor both make.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// A pidfd for `pid` (Linux ≥ 5.3): readable once the process has exited. `None` on an
/// older kernel or when the process is gone.
pub fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1; no memory is shared.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the syscall returned a fresh fd that nothing else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Receives one fd sent with SCM_RIGHTS (how a runtime hands over a terminal's master on its
/// console socket), close-on-exec. `Ok(None)`: a message without an fd. Room is made for one
/// fd only: the kernel installs none of the extra ones a peer might send.
pub fn recv_fd(sock: &UnixStream) -> std::io::Result<Option<OwnedFd>> {
    let mut data = [0u8; 4096];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // u64s: a control buffer aligned for cmsghdr, larger than one fd's message needs.
    let mut cbuf = [0u64; 8];
    // SAFETY: CMSG_SPACE is arithmetic on its argument.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    debug_assert!(space <= std::mem::size_of_val(&cbuf));
    // SAFETY: msghdr is plain data; zeroed is a valid initial value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg points at buffers we own for the duration of the call; the control length
    // is within `cbuf`.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: CMSG_* walk the control buffer the kernel filled, within msg_controllen; an
    // SCM_RIGHTS message's data holds fds the kernel just installed in our table for us.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let fd = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>());
                return Ok(Some(OwnedFd::from_raw_fd(fd)));
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(None)
}

/// Sets the size of the terminal whose master (or slave) is `fd`.
pub fn set_winsize(fd: impl AsFd, width: u16, height: u16) -> std::io::Result<()> {
    let ws = libc::winsize {
        ws_row: height,
        ws_col: width,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from the pointer, valid for the call.
    let r = unsafe { libc::ioctl(fd.as_fd().as_raw_fd(), libc::TIOCSWINSZ, &ws) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Makes reads and writes on `fd` return `WouldBlock` instead of waiting.
pub fn set_nonblocking(fd: impl AsFd) {
    let fd = fd.as_fd().as_raw_fd();
    // SAFETY: fcntl on an fd the caller holds, with integer arguments.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
}

/// A pipe, both ends close-on-exec: (read end, write end).
pub fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two fds into the array we own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both fds are fresh and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn passes_an_fd() {
        let (a, b) = UnixStream::pair().unwrap();
        let (r, w) = pipe().unwrap();
        let fds = [w.as_raw_fd()];
        let mut iov = [std::io::IoSlice::new(b"x")];
        // SAFETY: CMSG_SPACE/CMSG_LEN are arithmetic.
        let (space, len) = unsafe {
            (
                libc::CMSG_SPACE(std::mem::size_of_val(&fds) as u32) as usize,
                libc::CMSG_LEN(std::mem::size_of_val(&fds) as u32),
            )
        };
        let mut cbuf = [0u64; 8];
        // SAFETY: a zeroed msghdr is valid; it points at buffers that outlive sendmsg, and
        // the one control message written fits in `cbuf`.
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = iov.as_mut_ptr().cast();
            msg.msg_iovlen = 1;
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = len as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fds[0]);
            assert_eq!(libc::sendmsg(a.as_raw_fd(), &msg, 0), 1);
        }
        drop(w);
        let got = recv_fd(&b).unwrap().expect("an fd");
        std::fs::File::from(got).write_all(b"hi").unwrap();
        let mut s = String::new();
        std::fs::File::from(r).read_to_string(&mut s).unwrap();
        assert_eq!(s, "hi");
        // A message without an fd.
        (&a).write_all(b"y").unwrap();
        assert!(recv_fd(&b).unwrap().is_none());
    }

    #[test]
    fn pidfd_of_self() {
        // Either a pidfd or an old kernel; never a panic.
        let _ = pidfd_open(std::process::id() as i32);
        assert!(pidfd_open(-5).is_none());
    }
}
