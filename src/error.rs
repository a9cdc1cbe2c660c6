//! Error types of the core library. One enum for the whole lifecycle layer; lower modules
//! return their own error (netns, mounts, cni, oci) and are wrapped here with the step that
//! failed, so a message reads `failed to tear down network for sandbox 3f2a…: bridge: DEL: …`.

use std::path::PathBuf;

/// Errors of the lower layers that touch the host (mounts, namespaces, processes, files).
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{op} {path}: {errno}")]
    Sys {
        op: &'static str,
        path: PathBuf,
        errno: nix::errno::Errno,
    },
    #[error("{0}")]
    Other(String),
}

impl HostError {
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        HostError::Io {
            op,
            path: path.into(),
            source,
        }
    }
    pub fn sys(op: &'static str, path: impl Into<PathBuf>, errno: nix::errno::Errno) -> Self {
        HostError::Sys {
            op,
            path: path.into(),
            errno,
        }
    }
}

/// The library's error, as callers (the CRI layer, tests) see it. Variants map to gRPC codes.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed; nothing was changed. The message names the field.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A name is held by another sandbox or container.
    #[error("name {name:?} is reserved for {holder}")]
    NameReserved { name: String, holder: String },
    /// No such sandbox or container (only status/lookup report this).
    #[error("{kind} {id:?} not found")]
    NotFound { kind: &'static str, id: String },
    /// An id prefix matches several objects.
    #[error("id prefix {prefix:?} is ambiguous: it matches {count} objects")]
    Ambiguous { prefix: String, count: usize },
    /// The object is not in a state that allows the request (e.g. a container in a pod that
    /// is not ready, exec in a container that is not running). Nothing was changed.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The operation did not finish within the caller's timeout.
    #[error("{0}")]
    DeadlineExceeded(String),
    /// The daemon's configuration is unusable.
    #[error("configuration: {0}")]
    Config(String),
    /// A lifecycle step failed; `step` names it, `id` names the sandbox or container.
    #[error("failed to {step} for {id}: {source}")]
    Step {
        step: &'static str,
        id: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Several best-effort teardown steps failed; all of them are listed.
    #[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Many(Vec<Error>),
    #[error(transparent)]
    Host(#[from] HostError),
}

impl Error {
    pub fn step(
        step: &'static str,
        id: &str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error::Step {
            step,
            id: id.to_string(),
            source: source.into(),
        }
    }

    /// Folds a list of errors from a best-effort teardown into one result.
    pub fn collect(mut errors: Vec<Error>) -> Result<()> {
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(Error::Many(errors)),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
