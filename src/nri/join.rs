//! A plugin joining: accepted on the socket (or started from the plugin dir), registered and
//! configured (`plugin.rs`), then synchronized with every pod and container under the sync
//! lock's write side — events wait meanwhile, so nothing created during the sync is missed —
//! and only then added to the plugins events go to.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use sandboxd_nri_api::api;

use super::plugin::{self, Failure};
use super::Shared;

/// Accepts external plugins until the runtime ends.
pub(super) async fn accept(shared: Arc<Shared>, listener: tokio::net::UnixListener) {
    loop {
        let Ok((sock, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        };
        if shared.active.load(Ordering::Acquire) >= shared.cfg.max_plugins {
            tracing::warn!(
                max = shared.cfg.max_plugins,
                "NRI plugin refused: too many plugins"
            );
            continue;
        }
        tokio::spawn(join(
            shared.clone(),
            sock,
            plugin::Origin {
                launched: None,
                child: None,
            },
        ));
    }
}

/// Registers, configures and synchronizes a plugin, then adds it to the list.
pub(super) async fn join(
    shared: Arc<Shared>,
    sock: tokio::net::UnixStream,
    origin: plugin::Origin,
) {
    let Some(updates) = shared.updates.get().cloned() else {
        return;
    };
    // Counted from now: events dispatched meanwhile wait for the sync below rather than
    // skipping NRI altogether.
    shared.active.fetch_add(1, Ordering::AcqRel);
    let p = match plugin::connect(sock, origin, &shared.cfg, updates.clone()).await {
        Ok(p) => p,
        Err(e) => {
            shared.active.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!(error = %e, "NRI plugin not registered");
            return;
        }
    };
    let _w = shared.sync.write().await;
    let u = updates.clone();
    let (pods, containers) = tokio::task::spawn_blocking(move || u.snapshot())
        .await
        .unwrap_or_default();
    // In chunks under the protocol's message limit, `more` on all but the last; a plugin
    // must echo it on each (else it does not handle split syncs and is dropped).
    let chunks = sync_chunks(pods, containers);
    let last = chunks.len() - 1;
    let mut result = Err(Failure::Dropped("no reply".into()));
    for (i, (pods, containers)) in chunks.into_iter().enumerate() {
        let more = i < last;
        let req = api::SynchronizeRequest {
            pods,
            containers,
            more,
        };
        result = p
            .request_within(
                shared.cfg.plugin_registration_timeout,
                "Synchronize",
                |c, ctx| async move { c.synchronize(ctx, &req).await },
            )
            .await;
        if let Ok(r) = &result {
            if more && (!r.more || !r.update.is_empty()) {
                result = Err(Failure::Dropped(
                    "the plugin does not handle a Synchronize in parts".into(),
                ));
            }
        }
        if result.is_err() {
            break;
        }
    }
    match result {
        Ok(r) => {
            let id = p.id.clone();
            // A plugin of the same name and index still listed is one that restarted faster
            // than a failed write could tell us: the newcomer takes its place (as NRI's
            // reference runtime does), the old connection is closed.
            let replaced = {
                let mut l = crate::state::lock(&shared.plugins);
                let old: Vec<_> = l.iter().filter(|o| o.id == p.id).cloned().collect();
                l.retain(|o| o.id != p.id);
                l.push(p.clone());
                l.sort_by(|a, b| (&a.idx, &a.name).cmp(&(&b.idx, &b.name)));
                old
            };
            // Each was counted while listed (closed ones too, until pruned).
            for old in replaced {
                old.close("replaced by a plugin of the same name and index that reconnected");
                shared.active.fetch_sub(1, Ordering::AcqRel);
            }
            drop(_w);
            tracing::info!(plugin = %id, events = format!("{:#x}", p.events), "NRI plugin registered");
            if !r.update.is_empty() {
                let (u, this) = (updates.clone(), Arc::downgrade(&p));
                let _ = tokio::task::spawn_blocking(move || {
                    let gone = || this.upgrade().is_none_or(|p| p.is_gone());
                    u.apply(&id, &r.update, &[], &gone)
                })
                .await;
            }
        }
        Err(Failure::Unimplemented) => {
            p.close("it does not serve Synchronize");
            shared.active.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!(plugin = %p.id, "NRI plugin does not serve Synchronize");
        }
        Err(Failure::Refused(m) | Failure::Dropped(m)) => {
            p.close(&m);
            shared.active.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!(plugin = %p.id, error = %m, "NRI plugin failed to synchronize");
        }
    }
}

/// What one Synchronize message carries at most (the protocol's limit is 4 MiB).
const SYNC_CHUNK_BYTES: usize = 3 << 20;

/// Pods and containers in parts of at most [`SYNC_CHUNK_BYTES`] encoded (always one part).
fn sync_chunks(
    pods: Vec<api::PodSandbox>,
    containers: Vec<api::Container>,
) -> Vec<(Vec<api::PodSandbox>, Vec<api::Container>)> {
    use sandboxd_nri_api::prost::Message;
    let mut out = vec![(Vec::new(), Vec::new())];
    let mut size = 0;
    // The part an item of `n` encoded bytes goes into (a new one when the last is full).
    let mut part = |out: &mut Vec<(Vec<_>, Vec<_>)>, n: usize| {
        if size + n > SYNC_CHUNK_BYTES && size > 0 {
            out.push((Vec::new(), Vec::new()));
            size = 0;
        }
        size += n;
        out.len() - 1
    };
    for p in pods {
        let i = part(&mut out, p.encoded_len() + 8);
        out[i].0.push(p);
    }
    for c in containers {
        let i = part(&mut out, c.encoded_len() + 8);
        out[i].1.push(c);
    }
    out
}
