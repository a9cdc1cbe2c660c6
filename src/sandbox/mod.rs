//! Pod sandbox lifecycle: RunPodSandbox (`run.rs`), StopPodSandbox (`stop.rs`),
//! RemovePodSandbox (`remove.rs`), UpdatePodSandboxResources (`update.rs`), restore after a
//! restart (`restore.rs`), the infra process's liveness (`infra.rs`). The record is
//! written before each resource is acquired and after each step, so a crash at any point
//! leaves enough on disk to finish or roll back.

pub(crate) mod infra;
pub(crate) mod network;
pub(crate) mod remove;
pub(crate) mod restore;
pub(crate) mod run;
pub(crate) mod status;
pub(crate) mod stop;
pub(crate) mod update;

pub use crate::model::sandbox::*;

#[cfg(test)]
mod tests;
