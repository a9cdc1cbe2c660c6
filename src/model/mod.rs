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

/// The format of the sandbox and container records this build writes (their `format` field;
/// records written before formats were numbered read as 0, the same shape as 1). A build reads
/// every format up to its own; a record of a newer format (a downgrade) is not read but
/// quarantined with a message naming both formats, since fields this build does not know
/// would be dropped by its next write. Bump it with any change an older build would misread.
pub const RECORD_FORMAT: u32 = 1;
