//! The CRI v1 wire schema (`runtime.v1`), generated at build time from
//! `proto/runtime/v1/api.proto`: messages, the `RuntimeService` and `ImageService` servers and
//! their clients. The schema is cri-api v1.36's, with the 1.37 alpha additions the daemon
//! serves (`Mount.mount_options`, `RuntimeFeatures.mount_options`, the `SIGNAL_*` names).

/// Package `runtime.v1`.
#[allow(clippy::all, missing_docs, rustdoc::all)]
pub mod v1 {
    tonic::include_proto!("runtime.v1");
}
