//! Images: references (`reference.rs`), the content store (`store.rs`), layer unpacking
//! (`unpack.rs`), imports from archives and layouts (`archive.rs`), and pulls (`pull.rs`,
//! which registry and credentials in `endpoints.rs`, from `[registries]` or the files the
//! peers read: `hosts_toml.rs`, `registries_conf.rs`, `auth_file.rs`) through a bounded registry client
//! (`registry.rs`), large layers by parallel range requests (`ranged.rs`), one fetch per
//! layer across concurrent pulls (`in_flight.rs`), with their progress (`progress.rs`);
//! short names resolved as CRI-O does (`short_names.rs`);
//! OCI artifacts that are no runnable image (`artifact.rs`); lazy layers (`lazy/`) of eStargz
//! (`estargz.rs`) and zstd:chunked (`zstd_chunked.rs`) blobs.

#[doc(hidden)]
pub mod archive;
mod artifact;
mod auth_file;
mod endpoints;
#[doc(hidden)]
pub mod estargz;
mod fetch;
mod hosts_toml;
#[doc(hidden)]
pub mod in_flight;
#[doc(hidden)]
pub mod lazy;
mod lazy_dirs;
#[doc(hidden)]
pub mod policy;
#[doc(hidden)]
pub mod progress;
#[doc(hidden)]
pub mod pull;
mod ranged;
#[doc(hidden)]
pub mod reference;
mod registries_conf;
#[doc(hidden)]
pub mod registry;
#[doc(hidden)]
pub mod short_names;
#[doc(hidden)]
pub mod store;
#[doc(hidden)]
pub mod unpack;
#[doc(hidden)]
pub mod zstd_chunked;

/// The image settings of the config file (defined with the rest of it).
pub use crate::config::{RegistryConfig, RegistryFilesConfig, StoreConfig};
pub use endpoints::{plan as plan_pull, Auth};
pub use store::{ExecConfig, ImageRecord, ImageStore};

/// One caller's flag in a shared pull: raised when the caller stops waiting (see
/// `Runtime::pull_image_for`).
pub type PullCaller = std::sync::Arc<std::sync::atomic::AtomicBool>;
