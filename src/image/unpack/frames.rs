//! Decompressed streams of several members: a gzip file may be several members one after
//! the other (flate2's `MultiGzDecoder` reads them all), and a zstd stream several frames,
//! with skippable frames between them (zstd:chunked layers carry their table of contents in
//! one). ruzstd's `StreamingDecoder` reads one frame; [`ZstdFrames`] goes on to the next.

use std::io::{BufReader, Chain, Cursor, Read};

use ruzstd::decoding::{FrameDecoder, StreamingDecoder};

/// The input of one frame: its magic number (read to tell data frames from skippable ones),
/// then the rest of the stream.
type FrameInput<R> = Chain<Cursor<Vec<u8>>, BufReader<R>>;

/// Every zstd frame of a stream, decoded one after another; skippable frames are skipped.
pub struct ZstdFrames<R: Read> {
    /// The frame being decoded; `None` once the input ended after a whole frame.
    frame: Option<StreamingDecoder<FrameInput<R>, FrameDecoder>>,
}

fn invalid(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("zstd: {e}"))
}

/// Starts the next data frame of `src` with `dec`, skipping skippable frames; `None` at the
/// end of the input.
fn next_frame<R: Read>(
    mut src: BufReader<R>,
    dec: FrameDecoder,
) -> std::io::Result<Option<StreamingDecoder<FrameInput<R>, FrameDecoder>>> {
    loop {
        let mut magic = [0u8; 4];
        let mut n = 0;
        while n < 4 {
            match src.read(&mut magic[n..])? {
                0 if n == 0 => return Ok(None),
                0 => return Err(invalid("the input ends inside a frame's magic number")),
                k => n += k,
            }
        }
        // 0x184D2A50..=0x184D2A5F, little-endian: a skippable frame, its length next.
        if magic[0] & 0xf0 == 0x50 && magic[1..] == [0x2a, 0x4d, 0x18] {
            let mut len = [0u8; 4];
            src.read_exact(&mut len)
                .map_err(|_| invalid("the input ends inside a skippable frame's header"))?;
            let length = u64::from(u32::from_le_bytes(len));
            let skipped = std::io::copy(&mut (&mut src).take(length), &mut std::io::sink())?;
            if skipped != length {
                return Err(invalid("the input ends inside a skippable frame"));
            }
            continue;
        }
        let input = Cursor::new(magic.to_vec()).chain(src);
        return StreamingDecoder::new_with_decoder(input, dec)
            .map(Some)
            .map_err(invalid);
    }
}

impl<R: Read> ZstdFrames<R> {
    /// Reads the first frame's header (an error if `src` is not zstd).
    pub fn new(src: R) -> std::io::Result<Self> {
        let frame = next_frame(BufReader::with_capacity(64 << 10, src), FrameDecoder::new())?;
        match frame {
            Some(f) => Ok(ZstdFrames { frame: Some(f) }),
            None => Err(invalid("no frame")),
        }
    }
}

impl<R: Read> Read for ZstdFrames<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while let Some(f) = self.frame.as_mut() {
            let n = f.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            if let Some((input, dec)) = self.frame.take().map(StreamingDecoder::into_parts) {
                let (_, src) = input.into_inner();
                self.frame = next_frame(src, dec)?;
            }
        }
        Ok(0)
    }
}
