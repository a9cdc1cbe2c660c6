//! Connecting a tonic client to a CRI endpoint on a unix socket (ours or any other runtime's).
//! The integration tests' harness (`tests/common/daemon.rs`) compiles this file too, so it uses
//! nothing else of sandboxctl.

use std::path::PathBuf;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint, Uri};

/// Connects to `unix:///path` (or a bare path), with a per-request `timeout`.
pub async fn connect(endpoint: &str, timeout: Duration) -> Result<Channel, String> {
    let path = PathBuf::from(endpoint.strip_prefix("unix://").unwrap_or(endpoint));
    if !path.is_absolute() {
        return Err(format!(
            "endpoint {endpoint:?} must be unix:///absolute/path"
        ));
    }
    Endpoint::try_from("http://[::]:50051")
        .map_err(|e| e.to_string())?
        .timeout(timeout)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .map_err(|e| format!("cannot connect to {endpoint}: {e}"))
}
