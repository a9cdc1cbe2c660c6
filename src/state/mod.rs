//! Server state: the sandbox and container registries, name reservations and the id index
//! (in memory, behind short critical sections), plus atomic persistence of records on disk.

pub mod files;
mod ids;
mod latch;
mod names;
mod persist;
mod quarantine;
pub mod registry;

pub use ids::{short_hash, IdIndex};
pub use latch::Latch;
pub use names::NameReservations;
pub use persist::{
    disk_usage, list_dir, read_json, read_record, record_dirs, sync_dir, sync_filesystem,
    write_atomic, write_json_atomic,
};
pub use quarantine::Quarantine;
pub use registry::{lock, monotonic_ms, Entry, Record, Registry};

/// Now, in Unix nanoseconds (the unit of every CRI timestamp).
pub fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}
