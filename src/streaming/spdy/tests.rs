//! Unit tests of the SPDY codec and frames.
use super::*;
use flate2::{Compress, Compression, FlushCompress};

#[test]
fn dictionary_is_the_spdy3_one() {
    assert_eq!(DICTIONARY.len(), 1423);
    // adler32, the zlib DICTID of the dictionary.
    let (mut a, mut b) = (1u32, 0u32);
    for &x in DICTIONARY {
        a = (a + x as u32) % 65521;
        b = (b + a) % 65521;
    }
    assert_eq!((b << 16) | a, 0xe3c6_a7c2);
    assert!(DICTIONARY.ends_with(b",enq=0."));
}

#[test]
fn decodes_a_go_client_header_block() {
    // The first SYN_STREAM header block a Go spdystream client sends for
    // `streamtype: error` (zlib with FDICT and the dictionary's id).
    let block: Vec<u8> = (0..30)
        .map(|i| {
            u8::from_str_radix(
                &"78f9e3c6a7c202a62346703a2b294a4dcc851625aca9a08006000000ffff"[i * 2..i * 2 + 2],
                16,
            )
            .unwrap()
        })
        .collect();
    let mut c = HeaderCodec::new();
    assert_eq!(
        c.decode(&block).unwrap(),
        vec![("streamtype".to_string(), "error".to_string())]
    );
}

#[test]
fn garbage_after_the_stream_does_not_spin() {
    // Found by the fuzzer: a finished zlib stream followed by more bytes made the decoder
    // loop forever without progress.
    let mut c = Compress::new(Compression::default(), true);
    c.set_dictionary(DICTIONARY).unwrap();
    let mut block = Vec::with_capacity(256);
    c.compress_vec(&[0, 0, 0, 0], &mut block, FlushCompress::Finish)
        .unwrap();
    block.extend_from_slice(b"trailing garbage");
    let t = std::time::Instant::now();
    let r = HeaderCodec::new().decode(&block);
    assert!(t.elapsed() < std::time::Duration::from_secs(1));
    assert!(r.is_err(), "{r:?}");
}

#[test]
fn header_blocks_round_trip_across_frames() {
    let mut a = HeaderCodec::new();
    let mut b = HeaderCodec::new();
    for i in 0..5 {
        let v = format!("value-{i}");
        let block = a.encode(&[("streamType", "data"), ("port", &v)]);
        assert!(block.ends_with(&[0, 0, 0xff, 0xff]), "not sync-flushed");
        assert_eq!(
            b.decode(&block).unwrap(),
            vec![
                ("streamtype".to_string(), "data".to_string()),
                ("port".to_string(), v)
            ]
        );
    }
}
