//! Images: references, the content store and layer unpacking. (Import, pull and the
//! ImageService arrive in steps; the infra process keeps needing no image.)

pub mod pull;
pub mod reference;
pub mod store;
pub mod unpack;

pub use pull::{Auth, RegistryConfig};
pub use store::{ExecConfig, ImageRecord, ImageStore};
