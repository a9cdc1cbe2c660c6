//! The frames on the monitor's attach socket, both ways `kind (1 byte) | length (u32 BE) |
//! payload`: to the client [`STDOUT`] and [`STDERR`]; from it [`STDIN`], [`CLOSE_STDIN`] and
//! [`RESIZE`]. The monitor closes the socket when the container has exited.

/// Data for the container's stdin (client → monitor).
pub const STDIN: u8 = 0;
/// The container's stdout (monitor → client).
pub const STDOUT: u8 = 1;
/// The container's stderr (monitor → client).
pub const STDERR: u8 = 2;
/// The client's stdin ended (client → monitor).
pub const CLOSE_STDIN: u8 = 3;
/// The client's terminal size, [`resize_payload`] (client → monitor).
pub const RESIZE: u8 = 4;

/// Bytes before a frame's payload.
pub const HEADER_LEN: usize = 5;
/// Longest payload the monitor accepts from a client (a longer one drops the client).
pub const MAX_PAYLOAD: usize = 1 << 20;

/// Appends one frame to `out`.
pub fn push_frame(out: &mut Vec<u8>, kind: u8, payload: &[u8]) {
    out.push(kind);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
}

/// One frame.
pub fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(HEADER_LEN + payload.len());
    push_frame(&mut f, kind, payload);
    f
}

/// A frame's kind and payload length, from its header.
pub fn parse_header(h: [u8; HEADER_LEN]) -> (u8, usize) {
    (h[0], u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize)
}

/// A [`RESIZE`] frame's payload: width, height as u16 BE.
pub fn resize_payload(width: u16, height: u16) -> [u8; 4] {
    let (w, h) = (width.to_be_bytes(), height.to_be_bytes());
    [w[0], w[1], h[0], h[1]]
}

/// Reads a [`RESIZE`] payload: `(width, height)`.
pub fn parse_resize(p: &[u8]) -> Option<(u16, u16)> {
    match p {
        [w0, w1, h0, h1] => Some((
            u16::from_be_bytes([*w0, *w1]),
            u16::from_be_bytes([*h0, *h1]),
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames() {
        let f = frame(STDERR, b"hi");
        assert_eq!(f, [2, 0, 0, 0, 2, b'h', b'i']);
        assert_eq!(parse_header(f[..5].try_into().unwrap()), (STDERR, 2));
        let p = resize_payload(300, 2);
        assert_eq!(p, [1, 44, 0, 2]);
        assert_eq!(parse_resize(&p), Some((300, 2)));
        assert_eq!(parse_resize(&p[..3]), None);
    }
}
