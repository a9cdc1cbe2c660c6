//! The service manager's readiness protocol (`sd_notify(3)`): `READY=1` once the CRI socket
//! serves, `STOPPING=1` when shutdown begins, `STATUS=` lines between, as containerd and CRI-O
//! send under `Type=notify`.
//!
//! The socket is taken from `NOTIFY_SOCKET` once, at start-up, and the variable removed before
//! any thread starts: every child inherits the daemon's environment, and runc reads
//! `NOTIFY_SOCKET` as a request to proxy the service manager's socket into the container and
//! wait for the container's own `READY=1`. (The OCI runtime calls also drop it themselves,
//! for embedders of the library; this covers every other child. Hence no crate that reads
//! the variable at each call.)

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::OnceLock;

static SOCKET: OnceLock<Option<SocketAddr>> = OnceLock::new();

/// Takes `NOTIFY_SOCKET` out of the environment and keeps its address for [`notify`]. Call
/// before any thread starts (the environment is process-wide); later calls change nothing.
/// An address that is neither a path nor `@abstract` is ignored with a warning.
pub fn take_from_env() {
    let Some(v) = std::env::var_os("NOTIFY_SOCKET") else {
        let _ = SOCKET.set(None);
        return;
    };
    std::env::remove_var("NOTIFY_SOCKET");
    let addr = address(v.as_encoded_bytes());
    if addr.is_none() {
        eprintln!(
            "sandboxd: NOTIFY_SOCKET {v:?} is not a socket address; readiness is not reported"
        );
    }
    let _ = SOCKET.set(addr);
}

fn address(v: &[u8]) -> Option<SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    match v {
        [b'@', name @ ..] => SocketAddr::from_abstract_name(name).ok(),
        [b'/', ..] => {
            use std::os::unix::ffi::OsStrExt;
            SocketAddr::from_pathname(std::ffi::OsStr::from_bytes(v)).ok()
        }
        _ => None,
    }
}

/// Sends `state` (newline-separated `KEY=value` lines) to the service manager, if one asked
/// for it. A failure is logged, never fatal: the service manager's timeout reports it.
pub fn notify(state: &str) {
    let Some(Some(addr)) = SOCKET.get() else {
        return;
    };
    let sent = UnixDatagram::unbound().and_then(|s| s.send_to_addr(state.as_bytes(), addr));
    if let Err(e) = sent {
        tracing::warn!(error = %e, state, "cannot notify the service manager");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        use std::os::linux::net::SocketAddrExt;
        let a = address(b"/run/systemd/notify").unwrap();
        assert_eq!(
            a.as_pathname().unwrap(),
            std::path::Path::new("/run/systemd/notify")
        );
        let a = address(b"@/org/freedesktop/systemd1/notify/1").unwrap();
        assert_eq!(
            a.as_abstract_name().unwrap(),
            b"/org/freedesktop/systemd1/notify/1"
        );
        assert!(address(b"relative/path").is_none());
        assert!(address(b"").is_none());
    }
}
