//! The request and record types of sandboxes and containers, shared by the lifecycle code
//! (`sandbox/`, `container/`), the state registries and the CRI translation. Types only: no
//! host access here.

pub mod container;
pub mod resources;
pub mod sandbox;
