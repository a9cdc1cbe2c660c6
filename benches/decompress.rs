//! The decompression part of an image pull's bound (`scripts/lib/bench-images`): every blob
//! named on the command line decompressed at once, one thread each, with the decoders the
//! daemon links (zlib-rs for gzip, libzstd for zstd), the output counted and dropped. Prints
//! the wall time in ms and the decompressed bytes.
//!
//! `cargo bench --bench decompress -- BLOB...`

use std::io::Read;
use std::time::Instant;

fn decompressed_len(path: &str) -> std::io::Result<u64> {
    let mut f = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(path)?);
    let mut magic = [0u8; 4];
    f.read_exact(&mut magic)?;
    let raw = std::io::Cursor::new(magic).chain(f);
    let mut r: Box<dyn Read> = if magic[..2] == [0x1f, 0x8b] {
        Box::new(flate2::read::MultiGzDecoder::new(raw))
    } else if magic == [0x28, 0xb5, 0x2f, 0xfd] {
        Box::new(zstd::stream::read::Decoder::new(raw)?)
    } else {
        Box::new(raw)
    };
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        match r.read(&mut buf)? {
            0 => return Ok(n),
            k => n += k as u64,
        }
    }
}

fn main() {
    let files: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let started = Instant::now();
    let threads: Vec<_> = files
        .into_iter()
        .map(|f| std::thread::spawn(move || decompressed_len(&f).map_err(|e| format!("{f}: {e}"))))
        .collect();
    let mut total = 0u64;
    for t in threads {
        match t.join().expect("decoder thread") {
            Ok(n) => total += n,
            Err(e) => {
                eprintln!("decompress: {e}");
                std::process::exit(1);
            }
        }
    }
    println!("{} {total}", started.elapsed().as_millis());
}
