//! Images: references (`reference.rs`), the content store (`store.rs`), layer unpacking
//! (`unpack.rs`), imports from archives and layouts (`archive.rs`), and pulls (`pull.rs`)
//! through a bounded registry client (`registry.rs`).

pub mod archive;
pub mod pull;
pub mod reference;
pub mod registry;
pub mod store;
pub mod unpack;
mod verbs;

pub use pull::{Auth, RegistryConfig};
pub use store::{ExecConfig, ImageRecord, ImageStore, StoreConfig};
