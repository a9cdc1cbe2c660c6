//! `RuntimeService`, GetContainerEvents: a subscriber's bounded queue as a gRPC stream.

use tonic::{Request, Response, Status};

use crate::api::v1 as cri;
use crate::api::v1::runtime_service_server::RuntimeService;
use crate::cri::{codes, events, CriService};

pub(super) async fn get_container_events(
    svc: &CriService,
    _: Request<cri::GetEventsRequest>,
) -> Result<Response<<CriService as RuntimeService>::GetContainerEventsStream>, Status> {
    let sub = svc
        .rt
        .subscribe_events()
        .map_err(|e| codes::status_of(&e))?;
    tracing::debug!("event subscriber connected");
    // One event in flight to the connection; the backlog is the hub's, bounded.
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                n = sub.next() => n,
                _ = tx.closed() => break,
            };
            let item = match next {
                Ok(ev) => Ok(events::event_to_cri(&ev)),
                Err(crate::events::Ended::FellBehind { backlog }) => Err(Status::resource_exhausted(format!(
                    "this event subscriber fell {backlog} events behind and was disconnected; relist and subscribe again"
                ))),
                Err(crate::events::Ended::FellBehindBytes { bytes }) => Err(Status::resource_exhausted(format!(
                    "this event subscriber fell {bytes} bytes of events behind and was disconnected; relist and subscribe again"
                ))),
                Err(crate::events::Ended::Closed) => break,
            };
            let last = item.is_err();
            if tx.send(item).await.is_err() || last {
                break;
            }
        }
        tracing::debug!("event subscriber gone");
    });
    Ok(Response::new(Box::pin(
        tokio_stream::wrappers::ReceiverStream::new(rx),
    )))
}
