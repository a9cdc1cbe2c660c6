//! The one mapping of core errors to gRPC status codes.

use crate::error::Error;

/// Maps a core error to the gRPC status kubelet expects.
pub fn status_of(e: &Error) -> tonic::Status {
    let msg = e.to_string();
    if e.is_no_space() {
        return tonic::Status::resource_exhausted(msg);
    }
    match e {
        Error::InvalidArgument(_) | Error::Ambiguous { .. } => tonic::Status::invalid_argument(msg),
        Error::NameReserved { .. } => tonic::Status::already_exists(msg),
        Error::NotFound { .. } => tonic::Status::not_found(msg),
        Error::FailedPrecondition(_) => tonic::Status::failed_precondition(msg),
        Error::DeadlineExceeded(_) => tonic::Status::deadline_exceeded(msg),
        Error::Unauthenticated(_) => tonic::Status::unauthenticated(msg),
        Error::PermissionDenied(_) => tonic::Status::permission_denied(msg),
        Error::ResourceExhausted(_) => tonic::Status::resource_exhausted(msg),
        Error::Unimplemented(_) => tonic::Status::unimplemented(msg),
        _ => tonic::Status::internal(msg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes() {
        assert_eq!(
            status_of(&Error::InvalidArgument("x".into())).code(),
            tonic::Code::InvalidArgument
        );
        assert_eq!(
            status_of(&Error::NameReserved {
                name: "n".into(),
                holder: "h".into()
            })
            .code(),
            tonic::Code::AlreadyExists
        );
        assert_eq!(
            status_of(&Error::NotFound {
                kind: "sandbox",
                id: "i".into()
            })
            .code(),
            tonic::Code::NotFound
        );
        assert_eq!(
            status_of(&Error::Config("c".into())).code(),
            tonic::Code::Internal
        );
    }
}
