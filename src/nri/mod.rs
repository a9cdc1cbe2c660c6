//! NRI, the runtime's side: node plugins (resource policies, device injectors, validators)
//! connect to `[nri] socket_path` or are started from `plugin_path`, register, subscribe to
//! lifecycle events and adjust containers as they are created. The protocol's messages and
//! services come from `sandboxd-nri-api` (ttrpc over a multiplexed socket).
//!
//! The verbs call the hooks below from their own (blocking) threads; the plugins' sockets
//! and requests run on this module's own small Tokio runtime. With no plugin connected a
//! hook costs one atomic load.
//!
//! Order and consistency: plugins are called one after the other by index; a plugin joins
//! under the sync lock's write side, holding back every event until it has been sent every
//! existing pod and container (`Synchronize`), so none is missed or reported out of order.
//! Ids whose blocking hook runs (RunPodSandbox, CreateContainer) are hidden from List and
//! Status until it returns.

mod adjust;
pub(crate) mod convert;
mod hooks;
mod join;
mod launch;
mod plugin;

pub use adjust::fuzz_adjustment;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use sandboxd_nri_api::api;
use sandboxd_nri_api::api::Event;

use crate::config::{Config, NriConfig};
use crate::error::{Error, Result};
use crate::model::container::ContainerRecord;
use crate::model::sandbox::SandboxRecord;
use plugin::{Failure, Plugin};

/// The most container updates and evictions one plugin message may carry.
pub(crate) const MAX_UPDATES: usize = 1024;

/// Applies what plugins ask of other containers (updates, evictions); returns the updates
/// that failed. The runtime implements it.
pub(crate) trait Updates: Send + Sync {
    /// `gone` says whether the asking plugin went meanwhile: what is left is then dropped.
    fn apply(
        &self,
        plugin: &str,
        update: &[api::ContainerUpdate],
        evict: &[api::ContainerEviction],
        gone: &dyn Fn() -> bool,
    ) -> Vec<api::ContainerUpdate>;
    /// Every pod and container, for a joining plugin.
    fn snapshot(&self) -> (Vec<api::PodSandbox>, Vec<api::Container>);
}

/// What a connected plugin looks like from outside (sandboxctl info, tests).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PluginInfo {
    /// `NN-name`.
    pub id: String,
    /// The events it subscribed to, by name.
    pub events: Vec<String>,
    /// Whether the daemon started it (from `plugin_path`).
    pub preinstalled: bool,
}

struct Shared {
    cfg: NriConfig,
    plugins: Mutex<Vec<Arc<Plugin>>>,
    /// Plugins connected or joining: zero means every hook returns at once.
    active: AtomicUsize,
    /// Events take the read side, a joining plugin the write side.
    sync: Arc<tokio::sync::RwLock<()>>,
    /// Pods and containers whose blocking hook runs.
    hidden: Mutex<HashSet<String>>,
    /// Containers whose StopContainer event went out (it goes out once).
    stopped: Mutex<HashSet<String>>,
    updates: std::sync::OnceLock<Arc<dyn Updates>>,
    /// The socket we listen on, removed at shutdown.
    bound: Mutex<Option<launch::Bound>>,
}

/// The NRI adaptation of one runtime.
pub(crate) struct Nri {
    shared: Arc<Shared>,
    tokio: Option<tokio::runtime::Runtime>,
}

impl Drop for Nri {
    fn drop(&mut self) {
        self.stop_listening();
        // Closes every plugin's socket (and kills those we started) without waiting.
        for p in crate::state::lock(&self.shared.plugins).drain(..) {
            p.close("the runtime is shutting down");
        }
        if let Some(t) = self.tokio.take() {
            t.shutdown_background();
        }
    }
}

impl Nri {
    pub(crate) fn new(cfg: &NriConfig) -> Result<Nri> {
        let tokio = if cfg.enable {
            Some(
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .max_blocking_threads(4)
                    .thread_name("nri")
                    .enable_all()
                    .build()
                    .map_err(|e| Error::Config(format!("NRI runtime: {e}")))?,
            )
        } else {
            None
        };
        Ok(Nri {
            shared: Arc::new(Shared {
                cfg: cfg.clone(),
                plugins: Mutex::new(Vec::new()),
                active: AtomicUsize::new(0),
                sync: Arc::new(tokio::sync::RwLock::new(())),
                hidden: Mutex::new(HashSet::new()),
                stopped: Mutex::new(HashSet::new()),
                updates: std::sync::OnceLock::new(),
                bound: Mutex::new(None),
            }),
            tokio,
        })
    }

    /// Starts the pre-installed plugins and the socket (once; no-op when disabled).
    pub(crate) fn start(&self, updates: Arc<dyn Updates>) -> Result<()> {
        let Some(t) = &self.tokio else {
            return Ok(());
        };
        if self.shared.updates.set(updates).is_err() {
            return Ok(());
        }
        // The socket is registered with this runtime's reactor, whoever calls.
        let _in_runtime = t.enter();
        let shared = self.shared.clone();
        for l in launch::discover(&shared.cfg)? {
            let shared = shared.clone();
            t.spawn(async move {
                let id = l.id();
                match launch::start(l) {
                    Ok((sock, origin)) => join::join(shared, sock, origin).await,
                    Err(e) => tracing::warn!(plugin = %id, error = %e, "cannot start NRI plugin"),
                }
            });
        }
        if !shared.cfg.disable_connections {
            let (listener, bound) = launch::listen(&shared.cfg.socket_path)?;
            *crate::state::lock(&shared.bound) = Some(bound);
            t.spawn(join::accept(shared, listener));
        }
        Ok(())
    }

    /// At shutdown: the socket file (if still ours) and the dirs made for it go; connected
    /// plugins stay connected until the runtime is dropped.
    pub(crate) fn stop_listening(&self) {
        if let Some(b) = crate::state::lock(&self.shared.bound).take() {
            b.remove();
        }
    }

    /// The connected plugins, in the order they are called.
    pub(crate) fn plugins(&self) -> Vec<PluginInfo> {
        crate::state::lock(&self.shared.plugins)
            .iter()
            .filter(|p| !p.is_closed())
            .map(|p| PluginInfo {
                id: p.id.clone(),
                events: (1..15)
                    .filter_map(|e| Event::try_from(e).ok())
                    .filter(|e| p.subscribed(*e))
                    .map(|e| e.as_str_name().to_string())
                    .collect(),
                preinstalled: crate::state::lock(&p.child).is_some(),
            })
            .collect()
    }

    /// Whether `id`'s blocking hook runs (List and Status leave it out meanwhile).
    pub(crate) fn hides(&self, id: &str) -> bool {
        self.active() && crate::state::lock(&self.shared.hidden).contains(id)
    }

    pub(crate) fn active(&self) -> bool {
        self.tokio.is_some() && self.shared.active.load(Ordering::Acquire) > 0
    }

    /// Runs `f` on the NRI runtime and waits for it (from a verb's blocking thread).
    fn block_on<T: Send + 'static>(
        &self,
        f: impl std::future::Future<Output = T> + Send + 'static,
    ) -> Option<T> {
        use tracing::Instrument;
        let t = self.tokio.as_ref()?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        // In the verb's span: a plugin's request span is a step of the CRI call.
        t.spawn(
            async move {
                let _ = tx.send(f.await);
            }
            .instrument(tracing::Span::current()),
        );
        rx.recv().ok()
    }

    /// One request to one plugin, waited for from a verb's thread: its answer, `None` if the
    /// plugin was dropped (deadline, disconnect) and the operation goes on, or its refusal.
    fn ask<T, F, Fut>(
        &self,
        p: &Arc<Plugin>,
        what: &'static str,
        call: F,
    ) -> Result<Option<T>, String>
    where
        T: Send + 'static,
        F: FnOnce(sandboxd_nri_api::PluginClient, sandboxd_nri_api::ttrpc::context::Context) -> Fut
            + Send
            + 'static,
        Fut: std::future::Future<Output = sandboxd_nri_api::ttrpc::Result<T>> + Send,
    {
        let p = p.clone();
        match self.block_on(async move { p.request(what, call).await }) {
            Some(Ok(r)) => Ok(Some(r)),
            Some(Err(Failure::Refused(m))) => Err(m),
            Some(Err(Failure::Dropped(_) | Failure::Unimplemented)) | None => Ok(None),
        }
    }

    /// Sends `event` to every subscribed plugin in order. With `blocking`, a plugin's error
    /// fails the operation (and the rest are not asked); otherwise it is logged.
    fn notify(
        &self,
        event: Event,
        pod: api::PodSandbox,
        container: Option<api::Container>,
        blocking: bool,
    ) -> std::result::Result<(), String> {
        if !self.active() {
            return Ok(());
        }
        let shared = self.shared.clone();
        self.block_on(async move {
            let _g = shared.sync.read().await;
            for p in ordered(&shared) {
                if !p.subscribed(event) {
                    continue;
                }
                let req = api::StateChangeEvent {
                    event: event as i32,
                    pod: Some(pod.clone()),
                    container: container.clone(),
                };
                let name = event.as_str_name();
                match p
                    .request(name, |c, ctx| async move { c.state_change(ctx, &req).await })
                    .await
                {
                    Ok(_) | Err(Failure::Dropped(_) | Failure::Unimplemented) => {}
                    Err(Failure::Refused(m)) if blocking => return Err(m),
                    Err(Failure::Refused(m)) => {
                        tracing::warn!(plugin = %p.id, event = name, error = %m, "NRI plugin failed an event")
                    }
                }
            }
            Ok(())
        })
        .unwrap_or(Ok(()))
        .inspect(|_| prune(&self.shared))
    }

    /// [`Nri::notify`] of a pod's (and a container's) event, converted only when a plugin is
    /// connected: with none, the verbs' hot paths pay one atomic load.
    fn event(
        &self,
        event: Event,
        sb: &SandboxRecord,
        c: Option<&ContainerRecord>,
        cfg: &Config,
        blocking: bool,
    ) -> std::result::Result<(), String> {
        if !self.active() {
            return Ok(());
        }
        self.notify(
            event,
            convert::pod(sb, cfg),
            c.map(convert::created),
            blocking,
        )
    }
}

/// The open plugins, in index order (then name).
fn ordered(shared: &Shared) -> Vec<Arc<Plugin>> {
    crate::state::lock(&shared.plugins)
        .iter()
        .filter(|p| !p.is_closed())
        .cloned()
        .collect()
}

/// Drops closed plugins from the list.
fn prune(shared: &Shared) {
    let mut l = crate::state::lock(&shared.plugins);
    let before = l.len();
    l.retain(|p| !p.is_closed());
    let gone = before - l.len();
    if gone > 0 && shared.active.fetch_sub(gone, Ordering::AcqRel) == gone {
        // No plugin left: which containers' StopContainer went out no longer matters.
        crate::state::lock(&shared.stopped).clear();
    }
}
