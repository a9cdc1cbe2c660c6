//! The NRI socket multiplexer: one stream socket carries two logical connections, each a byte
//! stream of ttrpc messages cut into frames of `[conn id: u32 BE][length: u32 BE][payload]`.
//! Connection 1 carries the `Plugin` service (the plugin serves it), connection 2 the
//! `Runtime` service (the runtime serves it). There is no handshake, no close frame and no
//! keepalive: both ends simply use the two ids, and closing the socket ends both.
//!
//! Bounded: a frame longer than the protocol allows ends the trunk, a payload is copied
//! through in pieces (never held whole), and each logical connection buffers at most
//! [`CONN_BUFFER`] bytes before the socket is no longer read.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::task::JoinHandle;

/// The connection of the `Plugin` service (the runtime calls, the plugin serves).
pub const PLUGIN_SERVICE_CONN: u32 = 1;
/// The connection of the `Runtime` service (the plugin calls, the runtime serves).
pub const RUNTIME_SERVICE_CONN: u32 = 2;
/// The longest frame payload the protocol allows: a ttrpc header and its largest message.
pub const MAX_PAYLOAD: usize = 10 + (4 << 20);
/// Frames we send carry at most this much: Go peers read through 4 KiB buffers.
pub const FRAME: usize = 4096;
/// What one logical connection buffers in each direction.
pub const CONN_BUFFER: usize = 64 << 10;

/// The two logical connections of a trunk, and the task that carries them (aborting it, or
/// dropping [`Trunk`], closes the socket and both connections).
pub struct Trunk {
    /// Connection 1: the `Plugin` service.
    pub plugin_service: DuplexStream,
    /// Connection 2: the `Runtime` service.
    pub runtime_service: DuplexStream,
    /// Ends when the socket or either local end does (with the error that ended it).
    pub task: JoinHandle<io::Result<()>>,
}

/// Splits `socket` into its two logical connections. Must be called in a Tokio runtime.
pub fn split<S>(socket: S) -> Trunk
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (plugin_user, plugin_mux) = tokio::io::duplex(CONN_BUFFER);
    let (runtime_user, runtime_mux) = tokio::io::duplex(CONN_BUFFER);
    let task = tokio::spawn(carry(socket, plugin_mux, runtime_mux));
    Trunk {
        plugin_service: plugin_user,
        runtime_service: runtime_user,
        task,
    }
}

async fn carry<S>(socket: S, plugin: DuplexStream, runtime: DuplexStream) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut rd, wr) = tokio::io::split(socket);
    let (mut p_rd, mut p_wr) = tokio::io::split(plugin);
    let (mut r_rd, mut r_wr) = tokio::io::split(runtime);
    let wr = tokio::sync::Mutex::new(wr);
    let inbound = async {
        let mut hdr = [0u8; 8];
        let mut buf = vec![0u8; FRAME];
        loop {
            rd.read_exact(&mut hdr).await?;
            let id = u32::from_be_bytes(hdr[..4].try_into().expect("4 bytes"));
            let mut left = u32::from_be_bytes(hdr[4..].try_into().expect("4 bytes")) as usize;
            if left > MAX_PAYLOAD {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("NRI frame of {left} bytes on connection {id}"),
                ));
            }
            while left > 0 {
                let n = rd.read(&mut buf[..left.min(FRAME)]).await?;
                if n == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                left -= n;
                // Frames of a connection nobody opened are dropped, as the peers do.
                match id {
                    PLUGIN_SERVICE_CONN => p_wr.write_all(&buf[..n]).await?,
                    RUNTIME_SERVICE_CONN => r_wr.write_all(&buf[..n]).await?,
                    _ => {}
                }
            }
        }
    };
    let result = tokio::select! {
        r = inbound => r,
        r = outbound(PLUGIN_SERVICE_CONN, &mut p_rd, &wr) => r,
        r = outbound(RUNTIME_SERVICE_CONN, &mut r_rd, &wr) => r,
    };
    let _ = wr.lock().await.shutdown().await;
    result
}

/// Sends what the local end of connection `id` writes, in frames of at most [`FRAME`] bytes.
async fn outbound<R, W>(id: u32, local: &mut R, wr: &tokio::sync::Mutex<W>) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut frame = vec![0u8; 8 + FRAME];
    frame[..4].copy_from_slice(&id.to_be_bytes());
    loop {
        let n = local.read(&mut frame[8..]).await?;
        if n == 0 {
            return Ok(());
        }
        frame[4..8].copy_from_slice(&(n as u32).to_be_bytes());
        wr.lock().await.write_all(&frame[..8 + n]).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_carry_each_connection_and_big_writes_are_cut() {
        let (a, b) = tokio::io::duplex(1 << 20);
        let mut left = split(a);
        let mut right = split(b);
        let big = vec![7u8; 3 * FRAME + 5];
        left.plugin_service.write_all(&big).await.unwrap();
        left.runtime_service.write_all(b"hello").await.unwrap();
        let mut got = vec![0u8; big.len()];
        right.plugin_service.read_exact(&mut got).await.unwrap();
        assert_eq!(got, big);
        let mut hello = [0u8; 5];
        right.runtime_service.read_exact(&mut hello).await.unwrap();
        assert_eq!(&hello, b"hello");
        left.task.abort();
        // The far side sees the socket end: both its connections reach EOF.
        let mut rest = Vec::new();
        right.plugin_service.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
    }

    #[tokio::test]
    async fn an_oversized_frame_ends_the_trunk() {
        let (mut a, b) = tokio::io::duplex(1 << 20);
        let right = split(b);
        let mut hdr = PLUGIN_SERVICE_CONN.to_be_bytes().to_vec();
        hdr.extend_from_slice(&((MAX_PAYLOAD + 1) as u32).to_be_bytes());
        a.write_all(&hdr).await.unwrap();
        let err = right.task.await.unwrap().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }
}
