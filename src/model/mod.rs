//! The request and record types of sandboxes and containers, shared by the lifecycle code
//! (`sandbox/`, `container/`), the state registries and the CRI translation. Types only: no
//! host access here, and no import of the modules that act on them (they import these).

pub mod audit;
pub mod container;
pub mod network;
pub mod resources;
pub mod sandbox;

/// A record's file in its own dir (`<dir>/state.json`).
pub const STATE_FILE: &str = "state.json";
