//! The NRI (Node Resource Interface) v1alpha1 protocol, as the runtime and plugins speak it:
//! the messages and the two ttrpc services generated from the project's schema file
//! (`proto/nri/v1alpha1/api.proto`) — `Plugin` (served by a plugin, called by the runtime) and
//! `Runtime` (served by the runtime, called by a plugin) — and [`mux`], which carries both
//! over the one socket a plugin and the runtime share.

#[allow(clippy::all, missing_docs)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/_include.rs"));
}

pub mod mux;

/// Messages and enums.
pub use generated::nri::pkg::api::v1alpha1 as api;
/// The `Plugin` service: its server trait and registration, and the runtime's client.
pub use generated::nri::pkg::api::v1alpha1::__ttrpc_services_plugin::{
    create_plugin, Plugin as PluginService, PluginClient,
};
/// The `Runtime` service: its server trait and registration, and a plugin's client.
pub use generated::nri::pkg::api::v1alpha1::__ttrpc_services_runtime::{
    create_runtime, Runtime as RuntimeService, RuntimeClient,
};

/// The generated server traits are `#[async_trait]` traits; implementors need the macro.
pub use async_trait::async_trait;
pub use prost;
pub use ttrpc;

/// The subscription bit of `event` in a `ConfigureResponse.events` mask.
pub fn event_bit(event: api::Event) -> i32 {
    1 << (event as i32 - 1)
}

/// Every event a plugin can subscribe to (a mask of 0 means these).
pub const VALID_EVENTS: i32 = (1 << 14) - 1;
