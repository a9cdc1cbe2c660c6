//! The daemon's edges: its config file, the CRI unix socket (0660, private parent dir, stale
//! socket replaced, a live one refused) and serving both CRI services until a shutdown signal,
//! finishing in-flight requests and removing the socket. Pods keep running: their monitors
//! own them, and the next start restores them.

pub mod notify;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::Runtime;

/// Default socket path.
pub const DEFAULT_SOCKET: &str = "/run/sandboxd/sandboxd.sock";
/// Default config file, read if present.
pub const DEFAULT_CONFIG: &str = "/etc/sandboxd/sandboxd.toml";
/// Largest gRPC message accepted (kubelet's own limit is 16 MiB).
pub const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// The daemon's config file: its own keys plus every core [`Config`] key at the top level.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct DaemonConfig {
    /// The CRI unix socket to serve on (default [`DEFAULT_SOCKET`]).
    pub socket: PathBuf,
    /// tracing filter, e.g. `info` or `sandboxd=debug`.
    pub log_level: String,
    /// `text` or `json`.
    pub log_format: String,
    /// Where to serve the daemon's own metrics (Prometheus text format, `GET /metrics`),
    /// e.g. `127.0.0.1:9090`; unset (the default): not served.
    pub metrics_address: Option<std::net::SocketAddr>,
    /// Serve the metrics on an address that is not loopback. Off by default: pods reach the
    /// node's addresses (their bridge's gateway among them), so a wildcard or node address
    /// would show every tenant the node's pods, RPCs and orphans.
    pub metrics_allow_remote: bool,
    /// Spans exported over OTLP/gRPC (`[tracing] endpoint`); off by default.
    pub tracing: crate::telemetry::TracingConfig,
    /// The core runtime's settings, as top-level keys of the same file.
    #[serde(flatten)]
    pub runtime: Config,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            socket: PathBuf::from(DEFAULT_SOCKET),
            log_level: "info".into(),
            log_format: "text".into(),
            metrics_address: None,
            metrics_allow_remote: false,
            tracing: Default::default(),
            runtime: Config::default(),
        }
    }
}

impl DaemonConfig {
    /// Reads a TOML file; unknown keys are an error naming them.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))?;
        let mut cfg: DaemonConfig =
            toml::from_str(&text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        // Handler tables add to the built-in handlers (as CRI-O's drop-in runtime tables
        // do); a table named like a built-in one replaces that one.
        for (name, h) in Config::default().runtimes {
            cfg.runtime.runtimes.entry(name).or_insert(h);
        }
        // flatten swallows unknown keys: compare with the keys a full config renders.
        let given: toml::Table = toml::from_str(&text).unwrap_or_default();
        let known: toml::Table =
            toml::from_str(&DaemonConfig::default().to_toml()).unwrap_or_default();
        if let Some(k) = given
            .keys()
            .find(|k| !known.contains_key(*k) && !OPTIONAL_KEYS.contains(&k.as_str()))
        {
            return Err(Error::Config(format!(
                "{}: unknown key {k:?}",
                path.display()
            )));
        }
        if let Err(Error::Config(m)) = cfg.tracing.check() {
            return Err(Error::Config(format!("{}: {m}", path.display())));
        }
        Ok(cfg)
    }

    /// The config as TOML: every key with its value (unset optional keys left out).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render config: {e}\n"))
    }
}

/// Keys that are valid but absent from a rendered default (their default is unset).
const OPTIONAL_KEYS: &[&str] = &[
    "monitor_path",
    "pause_path",
    "metrics_address",
    "container_storage_root",
];

/// Binds the metrics listener (before the daemon says it is ready, so a taken port fails the
/// start with a clear error).
/// An address that is not loopback is refused unless `allow_remote`
/// (`metrics_allow_remote`).
pub fn bind_metrics(
    addr: std::net::SocketAddr,
    allow_remote: bool,
) -> Result<std::net::TcpListener> {
    if !addr.ip().is_loopback() && !allow_remote {
        return Err(Error::Config(format!(
            "metrics_address {addr}: not a loopback address; pods can reach the node's addresses, \
             so the daemon's metrics would be every tenant's to read (set metrics_allow_remote = \
             true to serve them there anyway, behind a firewall)"
        )));
    }
    let l = std::net::TcpListener::bind(addr)
        .map_err(|e| Error::Config(format!("metrics_address {addr}: cannot listen: {e}")))?;
    l.set_nonblocking(true)
        .map_err(|e| Error::Config(format!("metrics_address {addr}: {e}")))?;
    Ok(l)
}

/// Raises the soft limit on open files to the hard limit (as containerd's and CRI-O's units
/// do), so that the streaming server's share of descriptors (a quarter) leaves the CRI
/// socket, runtime calls and CNI plugins plenty.
pub fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::warn!(error = %e, soft, hard, "cannot raise the open file limit");
            }
        }
    }
}

/// Creates the listening socket: parent dir 0700 (created if missing), a stale socket file
/// replaced, a live one (another daemon answers) refused, the socket made 0660.
pub fn bind_socket(path: &Path) -> Result<std::os::unix::net::UnixListener> {
    let parent = path
        .parent()
        .ok_or_else(|| Error::Config(format!("socket path {} has no parent", path.display())))?;
    if !parent.exists() {
        std::fs::create_dir_all(parent)
            .map_err(|e| Error::Config(format!("cannot create {}: {e}", parent.display())))?;
        std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| Error::Config(format!("cannot chmod {}: {e}", parent.display())))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) => {
            use std::os::unix::fs::FileTypeExt;
            if !m.file_type().is_socket() {
                return Err(Error::Config(format!(
                    "{} exists and is not a socket; refusing to replace it",
                    path.display()
                )));
            }
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(Error::Config(format!(
                    "another daemon is already listening on {}",
                    path.display()
                )));
            }
            tracing::info!(socket = %path.display(), "replacing stale socket");
            std::fs::remove_file(path).map_err(|e| {
                Error::Config(format!("cannot remove stale {}: {e}", path.display()))
            })?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(Error::Config(format!(
                "cannot inspect {}: {e}",
                path.display()
            )))
        }
    }
    let l = std::os::unix::net::UnixListener::bind(path)
        .map_err(|e| Error::Config(format!("cannot listen on {}: {e}", path.display())))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .map_err(|e| Error::Config(format!("cannot chmod {}: {e}", path.display())))?;
    Ok(l)
}

/// [`serve`] on `tokio`, returning when it does. The daemon calls this rather than polling
/// the future itself: whoever polls it compiles the whole gRPC stack (tonic, hyper, h2, the
/// generated services), and here that happens once, in this crate, not again in the binary
/// at the end of a fresh build.
#[inline(never)]
pub fn serve_blocking(
    tokio: &tokio::runtime::Runtime,
    rt: Arc<Runtime>,
    listener: std::os::unix::net::UnixListener,
    socket: PathBuf,
    metrics: Option<std::net::TcpListener>,
    shutdown: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
) -> Result<()> {
    tokio.block_on(serve(rt, listener, socket, metrics, shutdown))
}

/// Serves RuntimeService and ImageService on `listener` (and the daemon's metrics on
/// `metrics`, if given) until `shutdown` resolves, then finishes in-flight requests and
/// removes the socket file.
pub async fn serve(
    rt: Arc<Runtime>,
    listener: std::os::unix::net::UnixListener,
    socket: PathBuf,
    metrics: Option<std::net::TcpListener>,
    // Boxed, not generic: the whole gRPC stack is compiled once, in this crate, rather than
    // again in every binary that calls this (half a minute of a fresh build).
    shutdown: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
) -> Result<()> {
    use crate::api::v1::image_service_server::ImageServiceServer;
    use crate::api::v1::runtime_service_server::RuntimeServiceServer;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::Config(format!("socket: {e}")))?;
    let listener = tokio::net::UnixListener::from_std(listener)
        .map_err(|e| Error::Config(format!("socket: {e}")))?;
    let streaming =
        crate::streaming::StreamingServer::start(rt.clone(), rt.config().streaming.clone()).await?;
    // Exits are learned as they happen (GetContainerEvents); event streams end at shutdown,
    // which would otherwise wait for them forever.
    rt.watch_exits()?;
    // Each handler's trial container, in the background: done before kubelet's first
    // Status in practice, never waited for by a request.
    rt.probe_handlers();
    // NRI plugins: a socket another runtime serves, or a bad plugin dir, costs the plugins,
    // not the node's CRI.
    if let Err(e) = rt.start_nri() {
        tracing::error!(error = %e, "NRI not started");
    }
    let audit = tokio::spawn(periodic_audit(rt.clone()));
    let events = rt.events.clone();
    let (stop_metrics, metrics_stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        shutdown.await;
        notify::notify(
            "STOPPING=1\nSTATUS=stopping: finishing requests in flight; pods keep running",
        );
        events.close();
        let _ = stop_metrics.send(());
    };
    if let Some(l) = metrics {
        let l = tokio::net::TcpListener::from_std(l)
            .map_err(|e| Error::Config(format!("metrics listener: {e}")))?;
        let r = rt.clone();
        let counts = Arc::new(move || r.counts_by_state());
        tokio::spawn(crate::metrics::prom::serve(
            l,
            rt.metrics.clone(),
            counts,
            async move {
                let _ = metrics_stopped.await;
            },
        ));
    }
    let layer = crate::metrics::prom::RpcMetricsLayer(rt.metrics.clone());
    let svc = crate::cri::CriService::new(rt.clone()).with_streaming(streaming);
    // The socket is bound and listening: a connection made from here on is served.
    notify::notify(&format!(
        "READY=1\nSTATUS=serving CRI v1 on {}",
        socket.display()
    ));
    let result = tonic::transport::Server::builder()
        .layer(layer)
        .add_service(
            RuntimeServiceServer::new(svc.clone())
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE),
        )
        .add_service(crate::api::admin::admin_server::AdminServer::new(
            svc.clone(),
        ))
        .add_service(
            ImageServiceServer::new(svc)
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE),
        )
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::UnixListenerStream::new(listener),
            shutdown,
        )
        .await;
    audit.abort();
    rt.stop_nri();
    // A trial container half-made when the process exits would outlive it.
    let _ = tokio::task::spawn_blocking(move || {
        rt.stop_probe(std::time::Duration::from_secs(10));
        rt.release_cgroup_parent();
    })
    .await;
    let _ = std::fs::remove_file(&socket);
    result.map_err(|e| Error::Config(format!("gRPC server: {e}")))
}

/// The self-audit every `[audit] interval` seconds (the first one interval after start: the
/// start-up sweep has just run).
async fn periodic_audit(rt: Arc<Runtime>) {
    let cfg = rt.config().audit.clone();
    if cfg.interval == 0 {
        return;
    }
    let period = std::time::Duration::from_secs(cfg.interval);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let rt = rt.clone();
        let cfg = cfg.clone();
        let r = tokio::task::spawn_blocking(move || match cfg.fix {
            true => rt.audit_fix(std::time::Duration::from_secs(cfg.grace)),
            false => rt.audit(),
        })
        .await;
        if let Ok(r) = r {
            let orphans = r.orphans.len();
            let fixed = r
                .orphans
                .iter()
                .filter(|o| matches!(o.fixed, Some(Ok(()))))
                .count();
            match orphans {
                0 => tracing::debug!(took_ms = r.took.as_millis() as u64, "audit: no orphans"),
                _ => tracing::warn!(
                    orphans,
                    fixed,
                    took_ms = r.took.as_millis() as u64,
                    "audit: host objects no record owns (sandboxctl doctor lists them)"
                ),
            }
        }
    }
}
