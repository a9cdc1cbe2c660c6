//! `ImageService`: pulls, lists, status, removal and the image filesystem's use.

use crate::api::v1 as cri;
use crate::api::v1::image_service_server::ImageService;
use tonic::{Request, Response, Status};

use super::{client_deadline, codes, image, list_streams, verbose_info, CriService};

#[tonic::async_trait]
impl ImageService for CriService {
    async fn list_images(
        &self,
        req: Request<cri::ListImagesRequest>,
    ) -> Result<Response<cri::ListImagesResponse>, Status> {
        let want = req
            .into_inner()
            .filter
            .and_then(|f| f.image)
            .map(|i| i.image)
            .filter(|i| !i.is_empty());
        let images = self
            .blocking("ListImages", "", move |rt| {
                Ok(match want {
                    Some(name) => rt.images().get(&name).into_iter().collect(),
                    None => rt.images().list(),
                })
            })
            .await?;
        Ok(Response::new(cri::ListImagesResponse {
            images: images.iter().map(image::image_to_cri).collect(),
        }))
    }

    async fn image_status(
        &self,
        req: Request<cri::ImageStatusRequest>,
    ) -> Result<Response<cri::ImageStatusResponse>, Status> {
        let req = req.into_inner();
        let name = req.image.map(|i| i.image).unwrap_or_default();
        let n = name.clone();
        let verbose = req.verbose;
        let (img, pulling) = self
            .blocking("ImageStatus", &name, move |rt| {
                // A pull in flight shows its per-layer progress (what `sandboxctl pull` draws).
                let pulling = verbose.then(|| rt.images().pulling(&n)).flatten();
                Ok((rt.images().get(&n), pulling))
            })
            .await?;
        // An unknown image is an empty answer, not an error (kubelet then pulls it).
        let mut info = verbose_info(verbose, img.as_ref());
        if let Some(p) = pulling {
            info.insert(
                "pullProgress".to_string(),
                serde_json::to_string(&p).unwrap_or_default(),
            );
        }
        Ok(Response::new(cri::ImageStatusResponse {
            image: img.as_ref().map(image::image_to_cri),
            info,
        }))
    }

    async fn pull_image(
        &self,
        req: Request<cri::PullImageRequest>,
    ) -> Result<Response<cri::PullImageResponse>, Status> {
        let deadline = client_deadline(&req);
        let req = req.into_inner();
        let name = req.image.map(|i| i.image).unwrap_or_default();
        let auth = image::auth(req.auth.as_ref()).map_err(|e| codes::status_of(&e))?;
        let n = name.clone();
        // Raised when this call's future is dropped (the client cancelled, or its deadline
        // below passed): a pull every caller has left is cancelled.
        let caller = crate::image::PullCaller::default();
        let _gone = RaiseOnDrop(caller.clone());
        let pull = self.blocking("PullImage", &name, move |rt| {
            rt.pull_image_for(&n, &auth, caller)
        });
        // The client's deadline answers DeadlineExceeded (tonic's own timeout layer would
        // answer Cancelled); a pull another caller still waits for goes on.
        let img = match deadline {
            Some(d) => tokio::time::timeout(d, pull).await.map_err(|_| {
                Status::deadline_exceeded(format!(
                    "PullImage {name}: not done within the client's deadline ({d:?}); cancelled unless another caller waits for it (layers already unpacked are kept)"
                ))
            })??,
            None => pull.await?,
        };
        tracing::info!(image = %name, image_id = %img.id, "PullImage done");
        Ok(Response::new(cri::PullImageResponse { image_ref: img.id }))
    }

    async fn remove_image(
        &self,
        req: Request<cri::RemoveImageRequest>,
    ) -> Result<Response<cri::RemoveImageResponse>, Status> {
        let name = req.into_inner().image.map(|i| i.image).unwrap_or_default();
        let n = name.clone();
        self.call("RemoveImage", &name, move |rt| rt.remove_image(&n))
            .await?;
        Ok(Response::new(cri::RemoveImageResponse {}))
    }

    async fn image_fs_info(
        &self,
        _: Request<cri::ImageFsInfoRequest>,
    ) -> Result<Response<cri::ImageFsInfoResponse>, Status> {
        let (usage, mountpoint, containers) = self
            .blocking("ImageFsInfo", "", |rt| {
                Ok((
                    rt.images().usage(),
                    rt.images().dir.clone(),
                    rt.container_filesystem(),
                ))
            })
            .await?;
        let now = crate::state::now_nanos();
        let fs = |mountpoint: &std::path::Path, (bytes, inodes): (u64, u64)| cri::FilesystemUsage {
            timestamp: now,
            fs_id: Some(cri::FilesystemIdentifier {
                mountpoint: mountpoint.to_string_lossy().into_owned(),
            }),
            used_bytes: Some(cri::UInt64Value { value: bytes }),
            inodes_used: Some(cri::UInt64Value { value: inodes }),
        };
        Ok(Response::new(cri::ImageFsInfoResponse {
            image_filesystems: vec![fs(&mountpoint, usage)],
            // Writable layers on a filesystem of their own (KEP-4191's split image fs).
            container_filesystems: containers
                .map(|(path, bytes, inodes)| fs(&path, (bytes, inodes)))
                .into_iter()
                .collect(),
        }))
    }

    type StreamImagesStream = list_streams::Chunks<cri::StreamImagesResponse>;

    async fn stream_images(
        &self,
        req: Request<cri::StreamImagesRequest>,
    ) -> Result<Response<Self::StreamImagesStream>, Status> {
        let filter = req.into_inner().filter;
        let images = self
            .list_images(Request::new(cri::ListImagesRequest { filter }))
            .await?
            .into_inner()
            .images;
        Ok(Response::new(list_streams::chunked(images, |images| {
            cri::StreamImagesResponse { images }
        })))
    }
}

/// Raises a pull caller's flag when the RPC's future is dropped.
struct RaiseOnDrop(crate::image::PullCaller);

impl Drop for RaiseOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}
