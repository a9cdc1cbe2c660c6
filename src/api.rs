//! The CRI v1 wire schema (`runtime.v1`), generated at build time from
//! `proto/runtime/v1/api.proto`: messages, the `RuntimeService` and `ImageService` servers and
//! their clients. The schema is cri-api v1.36's, with the 1.37 alpha additions the daemon
//! serves (`Mount.mount_options`, `RuntimeFeatures.mount_options`, the `SIGNAL_*` names).

/// The CRI release whose schema the daemon serves (as `--version` says it).
pub const CRI_SCHEMA: &str = "cri-api v1.36";

/// What `sandboxd --version` and `sandboxctl --version` print after the program's name: the
/// package version, the commit it was built from (`SANDBOXD_COMMIT` at build time, exported
/// from scripts/commit by every project script that builds; "unknown" otherwise) and the CRI
/// served.
pub fn version_text(commit: Option<&str>) -> String {
    format!(
        "{} (commit {}; CRI runtime.v1, {CRI_SCHEMA})",
        env!("CARGO_PKG_VERSION"),
        commit.filter(|c| !c.is_empty()).unwrap_or("unknown")
    )
}

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
