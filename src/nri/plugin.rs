//! One connected NRI plugin: its socket split into the two services, registration, the
//! configuration exchange, and every request with the plugin's time limit. A plugin that
//! breaks the protocol, disconnects or misses a deadline is closed (and, if the daemon
//! started it, killed); one that answers with an error status refuses the operation.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandboxd_nri_api::ttrpc;
use sandboxd_nri_api::ttrpc::asynchronous::transport::{Listener, Socket};
use sandboxd_nri_api::{api, mux, PluginClient};
use tokio::sync::oneshot;

/// What a plugin's request came to, other than an answer.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The plugin answered with an error status: the operation fails with its message.
    Refused(String),
    /// The plugin is gone or misbehaved (deadline, protocol, disconnect): it was closed,
    /// and the operation goes on without it.
    Dropped(String),
    /// The plugin does not serve this call (a plugin subscribed to every event need not
    /// validate): as if it had not subscribed.
    Unimplemented,
}

/// A registered plugin.
pub(crate) struct Plugin {
    /// `NN-name`, how logs and errors name it.
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) idx: String,
    /// The events it subscribed to (`1 << (event - 1)` bits).
    pub(crate) events: i32,
    client: PluginClient,
    timeout: Duration,
    closed: AtomicBool,
    /// Carries the socket; aborted on close.
    trunk: Mutex<Option<tokio::task::JoinHandle<std::io::Result<()>>>>,
    /// The runtime service's server (kept for as long as the plugin is).
    server: Mutex<Option<ttrpc::asynchronous::Server>>,
    /// The process the daemon started for it (pre-installed plugins).
    pub(crate) child: Mutex<Option<std::process::Child>>,
}

impl Plugin {
    pub(crate) fn subscribed(&self, event: api::Event) -> bool {
        self.events & sandboxd_nri_api::event_bit(event) != 0
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Closed, or its connection ended (noticed here before any request fails on it).
    pub(crate) fn is_gone(&self) -> bool {
        self.is_closed()
            || crate::state::lock(&self.trunk)
                .as_ref()
                .is_none_or(|t| t.is_finished())
    }

    /// Closes the connection (and kills a plugin the daemon started); idempotent.
    pub(crate) fn close(&self, why: &str) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::warn!(plugin = %self.id, reason = why, "NRI plugin closed");
        if let Some(t) = crate::state::lock(&self.trunk).take() {
            t.abort();
        }
        crate::state::lock(&self.server).take();
        kill_child(&mut crate::state::lock(&self.child));
    }

    /// One request with the plugin's time limit (sent along, so the plugin's handler has
    /// the same deadline).
    pub(crate) async fn request<T, F, Fut>(&self, what: &str, call: F) -> Result<T, Failure>
    where
        F: FnOnce(PluginClient, ttrpc::context::Context) -> Fut,
        Fut: std::future::Future<Output = ttrpc::Result<T>>,
    {
        self.request_within(self.timeout, what, call).await
    }

    /// One request with the time limit `limit` (Synchronize is part of joining, and has the
    /// registration's limit, as in NRI's reference runtime).
    pub(crate) async fn request_within<T, F, Fut>(
        &self,
        limit: std::time::Duration,
        what: &str,
        call: F,
    ) -> Result<T, Failure>
    where
        F: FnOnce(PluginClient, ttrpc::context::Context) -> Fut,
        Fut: std::future::Future<Output = ttrpc::Result<T>>,
    {
        if self.is_closed() {
            return Err(Failure::Dropped("closed".into()));
        }
        use tracing::Instrument;
        let ctx = ttrpc::context::with_duration(limit);
        let span = tracing::info_span!("nri", plugin = %self.id, request = what);
        let answer = tokio::time::timeout(limit, call(self.client.clone(), ctx))
            .instrument(span)
            .await;
        match answer {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(ttrpc::Error::RpcStatus(s)))
                if s.code == ttrpc::Code::UNIMPLEMENTED as i32
                    || s.code == ttrpc::Code::NOT_FOUND as i32 =>
            {
                Err(Failure::Unimplemented)
            }
            Ok(Err(ttrpc::Error::RpcStatus(s)))
                if s.code != ttrpc::Code::DEADLINE_EXCEEDED as i32
                    && s.code != ttrpc::Code::UNAVAILABLE as i32 =>
            {
                Err(Failure::Refused(format!(
                    "NRI plugin {} refused {what}: {}",
                    self.id, s.message
                )))
            }
            Ok(Err(e)) => {
                let why = format!("{what}: {e}");
                self.close(&why);
                Err(Failure::Dropped(why))
            }
            Err(_) => {
                let why = format!("{what}: no answer within {limit:?}");
                self.close(&why);
                Err(Failure::Dropped(why))
            }
        }
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        if let Some(t) = crate::state::lock(&self.trunk).take() {
            t.abort();
        }
        kill_child(&mut crate::state::lock(&self.child));
    }
}

fn kill_child(child: &mut Option<std::process::Child>) {
    if let Some(mut c) = child.take() {
        let _ = c.kill();
        // Reaped off the caller's path: a plugin stuck in D state must not hold anyone.
        std::thread::spawn(move || {
            let _ = c.wait();
        });
    }
}

/// What the runtime service learns from the plugin: its registration, then its requests.
struct RuntimeService {
    registered: Mutex<Option<oneshot::Sender<api::RegisterPluginRequest>>>,
    /// Set once the plugin is registered: unsolicited updates go to the domain.
    updates: Arc<dyn super::Updates>,
    plugin: std::sync::OnceLock<String>,
    /// The plugin, once it is one: its updates stop being applied when it is gone.
    this: std::sync::OnceLock<std::sync::Weak<Plugin>>,
    /// One UpdateContainers of this plugin is applied at a time; one more arriving meanwhile
    /// is refused at once (its decoded request dropped, not queued).
    applying: tokio::sync::Semaphore,
}

/// UpdateContainers applied at once over all plugins: what decoded requests may hold in
/// memory is a few messages, whatever many plugins send.
static APPLYING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

#[sandboxd_nri_api::async_trait]
impl sandboxd_nri_api::RuntimeService for RuntimeService {
    async fn register_plugin(
        &self,
        _ctx: &ttrpc::asynchronous::TtrpcContext,
        req: api::RegisterPluginRequest,
    ) -> ttrpc::Result<api::Empty> {
        if let Err(e) = check_name(&req.plugin_name).and_then(|()| check_index(&req.plugin_idx)) {
            return Err(status(ttrpc::Code::INVALID_ARGUMENT, e));
        }
        match crate::state::lock(&self.registered).take() {
            Some(tx) => {
                let _ = tx.send(req);
                Ok(api::Empty {})
            }
            None => Err(status(
                ttrpc::Code::FAILED_PRECONDITION,
                "already registered".into(),
            )),
        }
    }

    async fn update_containers(
        &self,
        _ctx: &ttrpc::asynchronous::TtrpcContext,
        req: api::UpdateContainersRequest,
    ) -> ttrpc::Result<api::UpdateContainersResponse> {
        let Some(plugin) = self.plugin.get().cloned() else {
            return Err(status(
                ttrpc::Code::FAILED_PRECONDITION,
                "not registered".into(),
            ));
        };
        if req.update.len() + req.evict.len() > super::MAX_UPDATES {
            return Err(status(
                ttrpc::Code::RESOURCE_EXHAUSTED,
                format!("at most {} updates at once", super::MAX_UPDATES),
            ));
        }
        let busy = || {
            status(
                ttrpc::Code::RESOURCE_EXHAUSTED,
                "an earlier UpdateContainers is still being applied: send the next one after its answer".into(),
            )
        };
        let (Ok(_mine), Ok(_all)) = (self.applying.try_acquire(), APPLYING.try_acquire()) else {
            return Err(busy());
        };
        let updates = self.updates.clone();
        let this = self.this.get().cloned().unwrap_or_default();
        // The domain's calls block (cgroup writes, the runtime's update): off the executor.
        // A plugin that goes meanwhile has the rest of its request dropped.
        let failed = tokio::task::spawn_blocking(move || {
            let gone = || this.upgrade().is_none_or(|p| p.is_gone());
            updates.apply(&plugin, &req.update, &req.evict, &gone)
        })
        .await
        .unwrap_or_default();
        Ok(api::UpdateContainersResponse { failed })
    }
}

fn status(code: ttrpc::Code, msg: String) -> ttrpc::Error {
    ttrpc::Error::RpcStatus(ttrpc::get_status(code, msg))
}

/// A plugin name: non-empty, `[A-Za-z0-9_.+-]` (the protocol's rule), at most 64 bytes.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.+-".contains(&b))
    {
        return Err(format!("invalid NRI plugin name {name:?}"));
    }
    Ok(())
}

/// A plugin index: exactly two digits.
pub(crate) fn check_index(idx: &str) -> Result<(), String> {
    if idx.len() != 2 || !idx.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("invalid NRI plugin index {idx:?} (two digits)"));
    }
    Ok(())
}

/// How a plugin came: by the socket, or started by the daemon (name and index from its
/// file name, its configuration from its file).
pub(crate) struct Origin {
    pub(crate) launched: Option<(String, String, String)>,
    pub(crate) child: Option<std::process::Child>,
}

/// Registers and configures the plugin at the other end of `socket`; the caller then
/// synchronizes it and adds it to the plugins.
pub(crate) async fn connect(
    socket: tokio::net::UnixStream,
    origin: Origin,
    cfg: &crate::config::NriConfig,
    updates: Arc<dyn super::Updates>,
) -> Result<Arc<Plugin>, String> {
    let trunk = mux::split(socket);
    let (tx, rx) = oneshot::channel();
    let service = Arc::new(RuntimeService {
        registered: Mutex::new(Some(tx)),
        updates,
        plugin: std::sync::OnceLock::new(),
        this: std::sync::OnceLock::new(),
        applying: tokio::sync::Semaphore::new(1),
    });
    let one = futures_util::stream::iter([Ok::<_, std::io::Error>(trunk.runtime_service)]);
    let mut server = ttrpc::asynchronous::Server::new()
        .register_service(sandboxd_nri_api::create_runtime(service.clone()))
        .add_listener(Listener::new(one));
    let mut child = origin.child;
    let fail = |child: &mut Option<std::process::Child>, t: &tokio::task::JoinHandle<_>, e| {
        t.abort();
        kill_child(child);
        Err(e)
    };
    if let Err(e) = server.start().await {
        return fail(
            &mut child,
            &trunk.task,
            format!("serve the runtime service: {e}"),
        );
    }
    let client = PluginClient::new(ttrpc::asynchronous::Client::new(Socket::new(
        trunk.plugin_service,
    )));
    let reg = match tokio::time::timeout(cfg.plugin_registration_timeout, rx).await {
        Ok(Ok(reg)) => reg,
        Ok(Err(_)) => return fail(&mut child, &trunk.task, "gone before registering".into()),
        Err(_) => {
            return fail(
                &mut child,
                &trunk.task,
                format!(
                    "did not register within {:?}",
                    cfg.plugin_registration_timeout
                ),
            )
        }
    };
    let (name, idx, config) = match origin.launched {
        Some(l) => l,
        None => (reg.plugin_name, reg.plugin_idx, String::new()),
    };
    let id = format!("{idx}-{name}");
    let mut plugin = Plugin {
        id: id.clone(),
        name,
        idx,
        events: 0,
        client,
        timeout: cfg.plugin_request_timeout,
        closed: AtomicBool::new(false),
        trunk: Mutex::new(Some(trunk.task)),
        server: Mutex::new(Some(server)),
        child: Mutex::new(child),
    };
    let req = api::ConfigureRequest {
        config,
        runtime_name: "sandboxd".into(),
        runtime_version: env!("CARGO_PKG_VERSION").into(),
        registration_timeout: cfg.plugin_registration_timeout.as_millis() as i64,
        request_timeout: cfg.plugin_request_timeout.as_millis() as i64,
        nri_version: String::new(),
    };
    let reply = plugin
        .request(
            "Configure",
            |c, ctx| async move { c.configure(ctx, &req).await },
        )
        .await
        .map_err(|f| match f {
            Failure::Refused(m) | Failure::Dropped(m) => m,
            Failure::Unimplemented => format!("plugin {id} does not serve Configure"),
        })?;
    let events = if reply.events == 0 {
        sandboxd_nri_api::VALID_EVENTS
    } else {
        reply.events
    };
    if events & !sandboxd_nri_api::VALID_EVENTS != 0 {
        plugin.close("subscribed to unknown events");
        return Err(format!(
            "plugin {id} subscribed to unknown events {events:#x}"
        ));
    }
    plugin.events = events;
    let _ = service.plugin.set(id);
    let plugin = Arc::new(plugin);
    let _ = service.this.set(Arc::downgrade(&plugin));
    Ok(plugin)
}
