//! The CRI v1 wire schema (`runtime.v1`), generated at build time from
//! `proto/runtime/v1/api.proto`: messages, the `RuntimeService` and `ImageService` servers and
//! their clients. The schema is cri-api v1.36's, with the 1.37 alpha additions the daemon
//! serves (`Mount.mount_options`, `RuntimeFeatures.mount_options`, the `SIGNAL_*` names).

/// Package `runtime.v1`.
#[allow(clippy::all, missing_docs, rustdoc::all)]
pub mod v1 {
    tonic::include_proto!("runtime.v1");
}

/// Package `sandboxd.v1`: the daemon's own admin API (`proto/sandboxd/v1/admin.proto`),
/// served on the CRI socket beside it; `sandboxctl doctor` is its client.
#[allow(clippy::all, missing_docs, rustdoc::all)]
pub mod admin {
    tonic::include_proto!("sandboxd.v1");
}
