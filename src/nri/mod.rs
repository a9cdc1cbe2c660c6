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
    fn apply(
        &self,
        plugin: &str,
        update: &[api::ContainerUpdate],
        evict: &[api::ContainerEviction],
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
}

/// The NRI adaptation of one runtime.
pub(crate) struct Nri {
    shared: Arc<Shared>,
    tokio: Option<tokio::runtime::Runtime>,
}

impl Drop for Nri {
    fn drop(&mut self) {
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
            let listener = launch::listen(&shared.cfg.socket_path)?;
            t.spawn(join::accept(shared, listener));
        }
        Ok(())
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
        let t = self.tokio.as_ref()?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        t.spawn(async move {
            let _ = tx.send(f.await);
        });
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
            c.map(convert::container),
            blocking,
        )
    }

    /// RunPodSandbox: the pod is hidden while the plugins see it; an error of one fails the
    /// creation (the caller tears it down).
    pub(crate) fn run_pod_sandbox(&self, r: &SandboxRecord, cfg: &Config) -> Result<()> {
        if !self.active() {
            return Ok(());
        }
        let _hidden = Hidden::new(&self.shared, &r.id);
        self.event(Event::RunPodSandbox, r, None, cfg, true)
            .map_err(|m| Error::FailedPrecondition(format!("sandbox {}: {m}", r.id)))
    }

    pub(crate) fn stop_pod_sandbox(&self, r: &SandboxRecord, cfg: &Config) {
        let _ = self.event(Event::StopPodSandbox, r, None, cfg, false);
    }

    pub(crate) fn remove_pod_sandbox(&self, r: &SandboxRecord, cfg: &Config) {
        let _ = self.event(Event::RemovePodSandbox, r, None, cfg, false);
    }

    /// CreateContainer: each subscribed plugin in turn sees the container as the spec
    /// stands and may adjust it; the adjustments are applied to `spec` (CDI devices through
    /// `inject`), and what plugins ask of other containers is applied after. The container
    /// is hidden meanwhile. Conflicts and plugins' errors fail the creation.
    pub(crate) fn create_container(
        &self,
        sb: &SandboxRecord,
        c: &ContainerRecord,
        cfg: &Config,
        spec: &mut oci_spec::runtime::Spec,
        inject: &dyn Fn(&[String], &mut oci_spec::runtime::Spec) -> Result<()>,
    ) -> Result<()> {
        if !self.active() {
            return Ok(());
        }
        let _hidden = Hidden::new(&self.shared, &c.id);
        let fail = |m: String| Error::FailedPrecondition(format!("container {}: {m}", c.id));
        let pod = convert::pod(sb, cfg);
        let shared = self.shared.clone();
        // The read side is held across all plugins' calls: no plugin joins halfway.
        let guard = self
            .block_on(async move { shared.sync.clone().read_owned().await })
            .ok_or_else(|| fail("NRI is shutting down".into()))?;
        let mut owners = adjust::Owners::default();
        let mut updates = Vec::new();
        let mut evictions = Vec::new();
        // What validators see: the container as it came, every adjustment merged, and who
        // was asked.
        let original = convert::creating(
            c,
            &serde_json::to_value(&*spec).map_err(|e| fail(e.to_string()))?,
        );
        let mut merged = api::ContainerAdjustment::default();
        let mut consulted = Vec::new();
        for p in ordered(&self.shared) {
            if !p.subscribed(Event::CreateContainer) {
                continue;
            }
            let mut json = serde_json::to_value(&*spec).map_err(|e| fail(e.to_string()))?;
            let req = api::CreateContainerRequest {
                pod: Some(pod.clone()),
                container: Some(convert::creating(c, &json)),
            };
            let asked = self.ask(&p, "CreateContainer", move |cl, ctx| async move {
                cl.create_container(ctx, &req).await
            });
            let Some(reply) = asked.map_err(fail)? else {
                continue;
            };
            if reply.update.iter().any(|u| u.container_id == c.id) {
                return Err(fail(format!(
                    "NRI plugin {} asked to update the container it is creating",
                    p.id
                )));
            }
            updates.extend(reply.update);
            evictions.extend(reply.evict);
            consulted.push(api::PluginInstance {
                name: p.name.clone(),
                index: p.idx.clone(),
            });
            if let Some(a) = &reply.adjust {
                adjust::merge_into(&mut merged, a);
                let cdi = adjust::apply(&mut json, a, &p.id, &mut owners)
                    .map_err(|m| fail(format!("adjustment by NRI plugin {}: {m}", p.id)))?;
                *spec = serde_json::from_value(json)
                    .map_err(|e| fail(format!("adjustment by NRI plugin {}: {e}", p.id)))?;
                inject(&cdi, spec)?;
            }
        }
        // Validators (policy plugins) may refuse the result as a whole.
        for p in ordered(&self.shared) {
            if !p.subscribed(Event::ValidateContainerAdjustment) {
                continue;
            }
            let req = api::ValidateContainerAdjustmentRequest {
                pod: Some(pod.clone()),
                container: Some(original.clone()),
                adjust: Some(merged.clone()),
                update: updates.clone(),
                owners: None,
                plugins: consulted.clone(),
            };
            let asked = self.ask(
                &p,
                "ValidateContainerAdjustment",
                move |cl, ctx| async move { cl.validate_container_adjustment(ctx, &req).await },
            );
            if let Some(r) = asked.map_err(fail)? {
                if r.reject {
                    return Err(fail(format!(
                        "NRI validator {} rejected the plugins' adjustments: {}",
                        p.id, r.reason
                    )));
                }
            }
        }
        drop(guard);
        prune(&self.shared);
        self.apply_updates("CreateContainer", &updates, &evictions);
        Ok(())
    }

    fn apply_updates(
        &self,
        what: &str,
        updates: &[api::ContainerUpdate],
        evict: &[api::ContainerEviction],
    ) {
        if updates.is_empty() && evict.is_empty() {
            return;
        }
        if let Some(u) = self.shared.updates.get() {
            for f in u.apply(what, updates, evict) {
                tracing::warn!(container_id = %f.container_id, from = what, "NRI plugin's container update failed");
            }
        }
    }

    pub(crate) fn post_create_container(
        &self,
        sb: &SandboxRecord,
        c: &ContainerRecord,
        cfg: &Config,
    ) {
        let _ = self.event(Event::PostCreateContainer, sb, Some(c), cfg, false);
    }

    /// StartContainer: a plugin's error fails the start.
    pub(crate) fn start_container(
        &self,
        sb: &SandboxRecord,
        c: &ContainerRecord,
        cfg: &Config,
    ) -> Result<()> {
        self.event(Event::StartContainer, sb, Some(c), cfg, true)
            .map_err(|m| Error::FailedPrecondition(format!("container {}: {m}", c.id)))
    }

    pub(crate) fn post_start_container(
        &self,
        sb: &SandboxRecord,
        c: &ContainerRecord,
        cfg: &Config,
    ) {
        let _ = self.event(Event::PostStartContainer, sb, Some(c), cfg, false);
    }

    /// UpdateContainer: plugins may change the resources asked for (the last plugin's word
    /// for this container wins) and update others. Returns the resources to apply.
    pub(crate) fn update_container(
        &self,
        sb: &SandboxRecord,
        c: &ContainerRecord,
        cfg: &Config,
        resources: &crate::model::resources::Resources,
    ) -> Result<crate::model::resources::Resources> {
        if !self.active() {
            return Ok(resources.clone());
        }
        let fail = |m: String| Error::FailedPrecondition(format!("container {}: {m}", c.id));
        let pod = convert::pod(sb, cfg);
        let ctr = convert::container(c);
        let mut want = resources.clone();
        let shared = self.shared.clone();
        let (mut updates, mut evictions) = (Vec::new(), Vec::new());
        let guard = self
            .block_on(async move { shared.sync.clone().read_owned().await })
            .ok_or_else(|| fail("NRI is shutting down".into()))?;
        for p in ordered(&self.shared) {
            if !p.subscribed(Event::UpdateContainer) {
                continue;
            }
            let req = api::UpdateContainerRequest {
                pod: Some(pod.clone()),
                container: Some(ctr.clone()),
                linux_resources: Some(convert::resources(&want)),
            };
            let asked = self.ask(&p, "UpdateContainer", move |cl, ctx| async move {
                cl.update_container(ctx, &req).await
            });
            let Some(reply) = asked.map_err(fail)? else {
                continue;
            };
            for u in reply.update {
                if u.container_id == c.id {
                    if let Some(r) = u.linux.as_ref().and_then(|l| l.resources.as_ref()) {
                        want = convert::update_resources(&want, r)
                            .map_err(|m| fail(format!("update by NRI plugin {}: {m}", p.id)))?;
                    }
                } else {
                    updates.push(u);
                }
            }
            evictions.extend(reply.evict);
        }
        drop(guard);
        prune(&self.shared);
        self.apply_updates("UpdateContainer", &updates, &evictions);
        Ok(want)
    }

    pub(crate) fn post_update_container(
        &self,
        sb: &SandboxRecord,
        c: &ContainerRecord,
        cfg: &Config,
    ) {
        let _ = self.event(Event::PostUpdateContainer, sb, Some(c), cfg, false);
    }

    /// StopContainer: sent once per container, whether it was stopped or exited by itself;
    /// plugins may update other containers (their freed resources).
    pub(crate) fn stop_container(&self, sb: &SandboxRecord, c: &ContainerRecord, cfg: &Config) {
        if !self.active() || !crate::state::lock(&self.shared.stopped).insert(c.id.clone()) {
            return;
        }
        let pod = convert::pod(sb, cfg);
        let ctr = convert::container(c);
        let shared = self.shared.clone();
        let updates = self
            .block_on(async move {
                let _g = shared.sync.read().await;
                let mut updates = Vec::new();
                for p in ordered(&shared) {
                    if !p.subscribed(Event::StopContainer) {
                        continue;
                    }
                    let req = api::StopContainerRequest {
                        pod: Some(pod.clone()),
                        container: Some(ctr.clone()),
                    };
                    match p
                        .request("StopContainer", |cl, ctx| async move {
                            cl.stop_container(ctx, &req).await
                        })
                        .await
                    {
                        Ok(r) => updates.extend(r.update),
                        Err(Failure::Refused(m)) => {
                            tracing::warn!(plugin = %p.id, error = %m, "NRI plugin failed StopContainer")
                        }
                        Err(Failure::Dropped(_) | Failure::Unimplemented) => {}
                    }
                }
                updates
            })
            .unwrap_or_default();
        prune(&self.shared);
        self.apply_updates("StopContainer", &updates, &[]);
    }

    /// RemoveContainer (StopContainer first if it never went out).
    pub(crate) fn remove_container(&self, sb: &SandboxRecord, c: &ContainerRecord, cfg: &Config) {
        if !self.active() {
            return;
        }
        self.stop_container(sb, c, cfg);
        let _ = self.event(Event::RemoveContainer, sb, Some(c), cfg, false);
        crate::state::lock(&self.shared.stopped).remove(&c.id);
    }

    /// UpdatePodSandbox (pod resize): told, then PostUpdatePodSandbox.
    pub(crate) fn update_pod_sandbox(&self, sb: &SandboxRecord, cfg: &Config) -> Result<()> {
        if !self.active() {
            return Ok(());
        }
        let pod = convert::pod(sb, cfg);
        let shared = self.shared.clone();
        let pod2 = pod.clone();
        let r = self
            .block_on(async move {
                let _g = shared.sync.read().await;
                for p in ordered(&shared) {
                    if !p.subscribed(Event::UpdatePodSandbox) {
                        continue;
                    }
                    let req = api::UpdatePodSandboxRequest {
                        pod: Some(pod2.clone()),
                        overhead_linux_resources: pod2
                            .linux
                            .as_ref()
                            .and_then(|l| l.pod_overhead.clone()),
                        linux_resources: pod2.linux.as_ref().and_then(|l| l.pod_resources.clone()),
                    };
                    if let Err(Failure::Refused(m)) = p
                        .request("UpdatePodSandbox", |cl, ctx| async move {
                            cl.update_pod_sandbox(ctx, &req).await
                        })
                        .await
                    {
                        return Err(m);
                    }
                }
                Ok(())
            })
            .unwrap_or(Ok(()));
        prune(&self.shared);
        r.map_err(|m| Error::FailedPrecondition(format!("sandbox {}: {m}", sb.id)))?;
        let _ = self.notify(Event::PostUpdatePodSandbox, pod, None, false);
        Ok(())
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

/// An id left out of List and Status while it lives.
struct Hidden<'a> {
    shared: &'a Shared,
    id: String,
}

impl<'a> Hidden<'a> {
    fn new(shared: &'a Shared, id: &str) -> Self {
        crate::state::lock(&shared.hidden).insert(id.to_string());
        Hidden {
            shared,
            id: id.to_string(),
        }
    }
}

impl Drop for Hidden<'_> {
    fn drop(&mut self) {
        crate::state::lock(&self.shared.hidden).remove(&self.id);
    }
}
