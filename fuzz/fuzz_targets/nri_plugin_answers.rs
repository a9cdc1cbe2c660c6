//! What an NRI plugin sends: the multiplexed socket's frames (any bytes, read through both
//! logical connections until the trunk ends) and its CreateContainer answers (adjustments
//! applied to a spec as two plugins' would be).
#![no_main]
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        sandboxd::nri::fuzz_adjustment(rest);
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (mut peer, ours) = tokio::io::duplex(1 << 16);
        let mut t = sandboxd_nri_api::mux::split(ours);
        let input = rest.to_vec();
        let feed = async move {
            let _ = peer.write_all(&input).await;
            drop(peer);
        };
        let drain = async {
            let mut a = Vec::new();
            let mut b = Vec::new();
            let _ = tokio::join!(
                t.plugin_service.read_to_end(&mut a),
                t.runtime_service.read_to_end(&mut b)
            );
        };
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
            tokio::join!(feed, drain)
        })
        .await;
        t.task.abort();
    });
});
