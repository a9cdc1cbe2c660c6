//! Server state: the sandbox and container registries, name reservations and the id index
//! (in memory, behind short critical sections), plus atomic persistence of records on disk.

mod ids;
mod names;
mod persist;

pub use ids::IdIndex;
pub use names::NameReservations;
pub use persist::{
    disk_usage, read_json, record_dirs, remove_record_dir, sync_wait, write_json_atomic,
};
