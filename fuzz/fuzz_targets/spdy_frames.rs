//! SPDY/3.1 frames and zlib header blocks as a client sends them: any bytes, read frame by
//! frame, each SYN_STREAM's header block decoded with one session's codec.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sandboxd::streaming::spdy::{read_frame_blocking, HeaderCodec, SYN_STREAM};

fuzz_target!(|data: &[u8]| {
    let mut r = data;
    let mut codec = HeaderCodec::new();
    for _ in 0..64 {
        let Ok((ctrl, typ, _flags, _stream, body)) = read_frame_blocking(&mut r) else {
            return;
        };
        if ctrl && typ == SYN_STREAM && body.len() > 10 {
            let _ = codec.decode(&body[10..]);
        }
    }
});
