//! The streaming list RPCs (KEP-5825, CRI v1.36): the same answer as the List call with the
//! same filter, cut into messages of at most [`CHUNK_ITEMS`] objects and about
//! [`CHUNK_BYTES`] each, made one at a time as the client reads (no message is built ahead of
//! a slow reader, and none past gRPC's default 4 MiB limit).

use std::pin::Pin;

use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::CriService;
use crate::api::v1 as cri;
use crate::api::v1::runtime_service_server::RuntimeService;

/// Objects in one streamed message, at most.
pub const CHUNK_ITEMS: usize = 512;
/// Encoded bytes in one streamed message, about (one object may pass it alone).
pub const CHUNK_BYTES: usize = 1 << 20;

/// A server stream of list chunks.
pub type Chunks<R> = Pin<Box<dyn Stream<Item = Result<R, Status>> + Send>>;

/// `items` as a stream of `wrap`ped chunks, cut lazily as the stream is polled.
pub fn chunked<T, R>(items: Vec<T>, wrap: fn(Vec<T>) -> R) -> Chunks<R>
where
    T: prost::Message + Send + 'static,
    R: Send + 'static,
{
    let mut it = items.into_iter().peekable();
    let chunks = std::iter::from_fn(move || {
        it.peek()?;
        let (mut chunk, mut bytes) = (Vec::new(), 0usize);
        while chunk.len() < CHUNK_ITEMS && bytes < CHUNK_BYTES {
            let Some(t) = it.next() else { break };
            bytes += t.encoded_len();
            chunk.push(t);
        }
        Some(Ok(wrap(chunk)))
    });
    Box::pin(tokio_stream::iter(chunks))
}

/// The List calls' answers, streamed: each RPC asks its List call with the same filter.
impl CriService {
    pub(super) async fn stream_pods(
        &self,
        filter: Option<cri::PodSandboxFilter>,
    ) -> Result<Response<Chunks<cri::StreamPodSandboxesResponse>>, Status> {
        let req = Request::new(cri::ListPodSandboxRequest { filter });
        let items = self.list_pod_sandbox(req).await?.into_inner().items;
        Ok(Response::new(chunked(items, |pod_sandboxes| {
            cri::StreamPodSandboxesResponse { pod_sandboxes }
        })))
    }

    pub(super) async fn stream_containers_of(
        &self,
        filter: Option<cri::ContainerFilter>,
    ) -> Result<Response<Chunks<cri::StreamContainersResponse>>, Status> {
        let req = Request::new(cri::ListContainersRequest { filter });
        let items = self.list_containers(req).await?.into_inner().containers;
        Ok(Response::new(chunked(items, |containers| {
            cri::StreamContainersResponse { containers }
        })))
    }

    pub(super) async fn stream_container_stats_of(
        &self,
        filter: Option<cri::ContainerStatsFilter>,
    ) -> Result<Response<Chunks<cri::StreamContainerStatsResponse>>, Status> {
        let req = Request::new(cri::ListContainerStatsRequest { filter });
        let items = self.list_container_stats(req).await?.into_inner().stats;
        Ok(Response::new(chunked(items, |container_stats| {
            cri::StreamContainerStatsResponse { container_stats }
        })))
    }

    pub(super) async fn stream_pod_stats_of(
        &self,
        filter: Option<cri::PodSandboxStatsFilter>,
    ) -> Result<Response<Chunks<cri::StreamPodSandboxStatsResponse>>, Status> {
        let req = Request::new(cri::ListPodSandboxStatsRequest { filter });
        let items = self.list_pod_sandbox_stats(req).await?.into_inner().stats;
        Ok(Response::new(chunked(items, |pod_sandbox_stats| {
            cri::StreamPodSandboxStatsResponse { pod_sandbox_stats }
        })))
    }

    pub(super) async fn stream_pod_metrics(
        &self,
    ) -> Result<Response<Chunks<cri::StreamPodSandboxMetricsResponse>>, Status> {
        let req = Request::new(cri::ListPodSandboxMetricsRequest {});
        let items = self
            .list_pod_sandbox_metrics(req)
            .await?
            .into_inner()
            .pod_metrics;
        Ok(Response::new(chunked(items, |pod_sandbox_metrics| {
            cri::StreamPodSandboxMetricsResponse {
                pod_sandbox_metrics,
            }
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    #[test]
    fn cuts_by_count_and_by_bytes_and_keeps_order() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let small: Vec<cri::Image> = (0..1200)
            .map(|i| cri::Image {
                id: format!("{i}"),
                ..Default::default()
            })
            .collect();
        let got: Vec<Vec<String>> = rt.block_on(
            chunked(small, |images| cri::StreamImagesResponse { images })
                .map(|r| r.unwrap().images.into_iter().map(|i| i.id).collect())
                .collect(),
        );
        assert_eq!(
            got.iter().map(Vec::len).collect::<Vec<_>>(),
            [512, 512, 176]
        );
        let flat: Vec<String> = got.into_iter().flatten().collect();
        assert_eq!(flat, (0..1200).map(|i| i.to_string()).collect::<Vec<_>>());

        let big: Vec<cri::Image> = (0..10)
            .map(|i| cri::Image {
                id: format!("{i}"),
                repo_tags: vec!["x".repeat(300 << 10)],
                ..Default::default()
            })
            .collect();
        let sizes: Vec<usize> = rt.block_on(
            chunked(big, |images| cri::StreamImagesResponse { images })
                .map(|r| r.unwrap().images.len())
                .collect(),
        );
        assert_eq!(sizes, [4, 4, 2]);
        let none: Vec<usize> = rt.block_on(
            chunked(Vec::<cri::Image>::new(), |images| {
                cri::StreamImagesResponse { images }
            })
            .map(|r| r.unwrap().images.len())
            .collect(),
        );
        assert!(none.is_empty());
    }
}
