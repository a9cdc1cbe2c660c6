//! Error types of the core library. One enum for the whole lifecycle layer; lower modules
//! return their own error (netns, mounts, cni, oci) and are wrapped here with the step that
//! failed, so a message reads `failed to tear down network for sandbox 3f2a…: bridge: DEL: …`.

use std::path::PathBuf;

/// Errors of the lower layers that touch the host (mounts, namespaces, processes, files).
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A `std::io` call on `path` failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// The operation, as a verb (`open`, `create`, `write`…).
        op: &'static str,
        /// The file or dir it acted on.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A system call (through `nix`) on `path` failed.
    #[error("{op} {path}: {errno}")]
    Sys {
        /// The operation, as a verb (`unmount`, `enter netns`, `signal monitor`…).
        op: &'static str,
        /// What it acted on (empty when no path applies).
        path: PathBuf,
        /// The errno it returned.
        errno: nix::errno::Errno,
    },
    /// A call with no path of its own (a socket, a pipe, a fork, capabilities) failed.
    #[error("{op}: {source}")]
    Call {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A worker thread could not be started or panicked.
    #[error("{what} thread: {reason}")]
    Thread {
        /// What the thread does (`namespace`, `sysctl`…).
        what: &'static str,
        /// `cannot start: …` or `panicked`.
        reason: String,
    },
    /// Something at `path` is not what the daemon may act on, so it was left alone.
    #[error("refusing to {op} {path}: {reason}")]
    Refused {
        /// What was not done.
        op: &'static str,
        /// What it would have acted on.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// `path` stayed mounted or busy through every bounded retry.
    #[error("{path} {state} after {attempts} attempts")]
    Stuck {
        /// What it acted on.
        path: PathBuf,
        /// `still mounted`, `stayed busy`…
        state: &'static str,
        /// How many tries were made.
        attempts: u32,
    },
    /// Data the daemon reads or writes is malformed (a record, a spec, a binary).
    #[error("{what}: {reason}")]
    Format {
        /// What it is (a path, `OCI spec`…).
        what: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Any other failure, as a message.
    #[error("{0}")]
    Other(String),
}

impl HostError {
    /// A [`HostError::Call`] from the last OS error.
    pub fn last(op: &'static str) -> Self {
        HostError::Call {
            op,
            source: std::io::Error::last_os_error(),
        }
    }
    /// A [`HostError::Thread`] that could not start.
    pub fn thread_start(what: &'static str, e: std::io::Error) -> Self {
        HostError::Thread {
            what,
            reason: format!("cannot start: {e}"),
        }
    }
    /// A [`HostError::Thread`] that panicked.
    pub fn thread_panicked(what: &'static str) -> Self {
        HostError::Thread {
            what,
            reason: "panicked".into(),
        }
    }
    /// A [`HostError::Format`].
    pub fn format(what: impl std::fmt::Display, reason: impl std::fmt::Display) -> Self {
        HostError::Format {
            what: what.to_string(),
            reason: reason.to_string(),
        }
    }
    /// An [`HostError::Io`]: `op` on `path` failed with `source`.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        HostError::Io {
            op,
            path: path.into(),
            source,
        }
    }
    /// A [`HostError::Sys`]: `op` on `path` failed with `errno`.
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
    NameReserved {
        /// The name asked for: `k8s_POD_…` for a pod sandbox, `k8s_<container>_…` for a
        /// container.
        name: String,
        /// The id of the sandbox or container holding it (a description instead if no
        /// registered record holds it).
        holder: String,
    },
    /// No such sandbox or container (only status/lookup report this).
    #[error("{kind} {id:?} not found")]
    NotFound {
        /// What was looked up: `sandbox`, `container` or `image`.
        kind: &'static str,
        /// The id, id prefix or image reference that matched nothing.
        id: String,
    },
    /// An id prefix matches several objects.
    #[error("id prefix {prefix:?} is ambiguous: it matches {count} objects")]
    Ambiguous {
        /// The prefix given, lowercased.
        prefix: String,
        /// How many ids it matches.
        count: usize,
    },
    /// The object is not in a state that allows the request (e.g. a container in a pod that
    /// is not ready, exec in a container that is not running). Nothing was changed.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The operation did not finish within the caller's timeout.
    #[error("{0}")]
    DeadlineExceeded(String),
    /// The caller's credentials were refused (a registry's 401).
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The caller may not do this (a registry's 403).
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// Out of space or another bounded resource (the message names which, and where).
    #[error("resource exhausted: {0}")]
    ResourceExhausted(String),
    /// The daemon's configuration is unusable.
    #[error("configuration: {0}")]
    Config(String),
    /// This host cannot do what was asked (the message says why, e.g. a failed probe).
    #[error("{0}")]
    Unimplemented(String),
    /// A lifecycle step failed; `step` names it, `id` names the sandbox or container.
    #[error("failed to {step} for {id}: {source}")]
    Step {
        /// The step, as a verb phrase (`tear down network`, `mount rootfs`…).
        step: &'static str,
        /// What it was for: a sandbox or container id (an image reference for pulls).
        id: String,
        /// Why it failed (the lower layer's error).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Several best-effort teardown steps failed; all of them are listed.
    #[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Many(Vec<Error>),
    /// A host operation failed (gRPC `Internal`, or `ResourceExhausted` when out of space).
    #[error(transparent)]
    Host(#[from] HostError),
}

impl Error {
    /// An [`Error::Step`]: `step` failed for `id` because of `source`.
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

    /// A copy of this error for another caller (pulls shared by several requests): the same
    /// variant where it carries a code, the message otherwise.
    pub fn duplicate(&self) -> Error {
        match self {
            Error::InvalidArgument(m) => Error::InvalidArgument(m.clone()),
            Error::NotFound { kind, id } => Error::NotFound {
                kind,
                id: id.clone(),
            },
            Error::FailedPrecondition(m) => Error::FailedPrecondition(m.clone()),
            Error::DeadlineExceeded(m) => Error::DeadlineExceeded(m.clone()),
            Error::Unauthenticated(m) => Error::Unauthenticated(m.clone()),
            Error::PermissionDenied(m) => Error::PermissionDenied(m.clone()),
            Error::ResourceExhausted(m) => Error::ResourceExhausted(m.clone()),
            Error::Config(m) => Error::Config(m.clone()),
            Error::Unimplemented(m) => Error::Unimplemented(m.clone()),
            e => Error::Host(HostError::Other(e.to_string())),
        }
    }

    /// Did this fail for lack of space (ENOSPC, EDQUOT) somewhere down its chain?
    pub fn is_no_space(&self) -> bool {
        fn io_no_space(e: &std::io::Error) -> bool {
            matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
        }
        fn host(h: &HostError) -> bool {
            match h {
                HostError::Io { source, .. } | HostError::Call { source, .. } => {
                    io_no_space(source)
                }
                HostError::Sys { errno, .. } => {
                    matches!(
                        *errno,
                        nix::errno::Errno::ENOSPC | nix::errno::Errno::EDQUOT
                    )
                }
                HostError::Other(m) => m.contains("No space left on device"),
                HostError::Thread { .. }
                | HostError::Refused { .. }
                | HostError::Stuck { .. }
                | HostError::Format { .. } => false,
            }
        }
        fn dynamic(e: &(dyn std::error::Error + 'static)) -> bool {
            let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
            while let Some(c) = cur {
                if let Some(h) = c.downcast_ref::<HostError>() {
                    if host(h) {
                        return true;
                    }
                }
                if let Some(i) = c.downcast_ref::<std::io::Error>() {
                    if io_no_space(i) {
                        return true;
                    }
                }
                if let Some(e) = c.downcast_ref::<Error>() {
                    if e.is_no_space() {
                        return true;
                    }
                }
                cur = c.source();
            }
            false
        }
        match self {
            Error::ResourceExhausted(_) => true,
            Error::Host(h) => host(h),
            Error::Step { source, .. } => dynamic(source.as_ref()),
            Error::Many(es) => es.iter().any(Error::is_no_space),
            _ => false,
        }
    }

    /// Folds a list of errors from a best-effort teardown into one result.
    pub fn collect(errors: Vec<Error>) -> Result<()> {
        if errors.is_empty() {
            return Ok(());
        }
        Err(Error::many(errors))
    }

    /// Several errors as one, flattened: the errors of nested lists are listed at the top,
    /// each once (one error stays itself).
    pub fn many(errors: Vec<Error>) -> Error {
        let mut flat = Vec::with_capacity(errors.len());
        for e in errors {
            match e {
                Error::Many(inner) => flat.extend(inner),
                e => flat.push(e),
            }
        }
        if flat.len() == 1 {
            return flat.remove(0);
        }
        Error::Many(flat)
    }

    /// `err`, then each error of a failed rollback `undo` named as such: one flat list.
    pub fn with_rollback(err: Error, id: &str, undo: Error) -> Error {
        let undo = match undo {
            Error::Many(es) => es,
            e => vec![e],
        };
        let mut all = vec![err];
        all.extend(undo.into_iter().map(|e| Error::step("roll back", id, e)));
        Error::many(all)
    }
}

/// The library's result type, with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_flat() {
        let inner = Error::Many(vec![
            Error::FailedPrecondition("a".into()),
            Error::FailedPrecondition("b".into()),
        ]);
        let e = Error::with_rollback(Error::InvalidArgument("x".into()), "id1", inner);
        let Error::Many(es) = &e else { panic!("{e:?}") };
        assert_eq!(es.len(), 3);
        assert!(es.iter().all(|e| !matches!(e, Error::Many(_))));
        assert_eq!(
            e.to_string(),
            "invalid argument: x; failed to roll back for id1: a; failed to roll back for id1: b"
        );
        let e = Error::many(vec![Error::Many(vec![Error::Config("c".into())])]);
        assert!(matches!(e, Error::Config(_)), "{e:?}");
        assert!(Error::collect(Vec::new()).is_ok());
    }
}
