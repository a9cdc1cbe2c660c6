//! The sandboxd daemon: reads its config (TOML file + flags), sets up logging, restores the
//! core runtime from its state root and serves CRI v1 on a unix socket until SIGTERM/SIGINT.
//! `sandboxd demo` runs one pod sandbox lifecycle through the library instead.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::{Parser, Subcommand};
use sandboxd::server::{self, DaemonConfig};
use sandboxd::{InfraPolicy, PodSandboxConfig, Runtime};

#[derive(Parser, Debug)]
#[command(
    name = "sandboxd",
    version,
    about = "Kubernetes pod sandbox runtime (CRI v1)"
)]
struct Cli {
    /// Config file (TOML). Default: /etc/sandboxd/sandboxd.toml if present.
    #[arg(long, env = "SANDBOXD_CONFIG")]
    config: Option<PathBuf>,
    /// CRI socket path.
    #[arg(long, env = "SANDBOXD_SOCKET")]
    socket: Option<PathBuf>,
    /// State root.
    #[arg(long, env = "SANDBOXD_ROOT")]
    root: Option<PathBuf>,
    /// Where network namespaces are pinned.
    #[arg(long, env = "SANDBOXD_NETNS_DIR")]
    netns_dir: Option<PathBuf>,
    /// Where IPC and UTS namespaces of pods without an infra process are pinned
    /// (as `<dir>/ipcns` and `<dir>/utsns`).
    #[arg(long, env = "SANDBOXD_NS_PIN_DIR")]
    ns_pin_dir: Option<PathBuf>,
    /// CNI config dir.
    #[arg(long, env = "SANDBOXD_CNI_CONF_DIR")]
    cni_conf_dir: Option<PathBuf>,
    /// CNI plugin dirs (repeatable, or colon-separated).
    #[arg(long, env = "SANDBOXD_CNI_BIN_DIR")]
    cni_bin_dir: Vec<String>,
    /// Binary of the default runtime handler.
    #[arg(long, env = "SANDBOXD_RUNTIME")]
    runtime: Option<PathBuf>,
    /// `auto` (infra process only when needed) or `always`.
    #[arg(long, env = "SANDBOXD_INFRA")]
    infra: Option<String>,
    /// tracing filter (e.g. info, debug, sandboxd=trace).
    #[arg(long, env = "SANDBOXD_LOG_LEVEL")]
    log_level: Option<String>,
    /// Log as JSON lines.
    #[arg(long)]
    log_json: bool,
    /// Serve the daemon's metrics (Prometheus text format) at http://ADDR/metrics, e.g.
    /// 127.0.0.1:9090. Off by default.
    #[arg(long, env = "SANDBOXD_METRICS_ADDRESS")]
    metrics_address: Option<std::net::SocketAddr>,
    /// Mount eStargz layers lazily ([images] lazy_pull): containers start before the whole
    /// layer has arrived.
    #[arg(long, env = "SANDBOXD_LAZY_PULL")]
    lazy_pull: bool,
    /// Print the effective config as TOML and exit.
    #[arg(long)]
    print_default_config: bool,
    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    Completion { shell: clap_complete::Shell },
    /// Print the man page (roff) to stdout.
    #[command(hide = true)]
    Man,
    /// Serve one lazy image layer over FUSE (started by the daemon itself, its spec on stdin).
    #[command(hide = true)]
    Lazyfs {
        /// The layer's dir under the image store (`images/lazy/<diff id>`).
        #[arg(long)]
        dir: PathBuf,
    },
    /// Run, inspect, stop and remove one pod sandbox through the library, printing each step.
    Demo {
        /// Share the PID namespace, so the pod runs the pause process.
        #[arg(long)]
        infra: bool,
    },
}

fn effective_config(cli: &Cli) -> Result<DaemonConfig, sandboxd::Error> {
    let mut cfg = match &cli.config {
        Some(p) => DaemonConfig::load(p)?,
        None if std::path::Path::new(server::DEFAULT_CONFIG).exists() => {
            DaemonConfig::load(std::path::Path::new(server::DEFAULT_CONFIG))?
        }
        None => DaemonConfig::default(),
    };
    if let Some(v) = &cli.socket {
        cfg.socket = v.clone();
    }
    if cli.lazy_pull {
        cfg.runtime.images.lazy_pull = true;
    }
    if let Some(v) = cli.metrics_address {
        cfg.metrics_address = Some(v);
    }
    if let Some(v) = &cli.root {
        cfg.runtime.root = v.clone();
    }
    if let Some(v) = &cli.netns_dir {
        cfg.runtime.netns_dir = v.clone();
    }
    if let Some(v) = &cli.ns_pin_dir {
        cfg.runtime.ipcns_dir = v.join("ipcns");
        cfg.runtime.utsns_dir = v.join("utsns");
        cfg.runtime.userns_dir = v.join("userns");
    }
    if let Some(v) = &cli.cni_conf_dir {
        cfg.runtime.cni_conf_dir = v.clone();
    }
    if !cli.cni_bin_dir.is_empty() {
        cfg.runtime.cni_bin_dirs = cli
            .cni_bin_dir
            .iter()
            .flat_map(|s| s.split(':'))
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .collect();
    }
    if let Some(v) = &cli.runtime {
        let name = cfg.runtime.default_runtime.clone();
        if let Some(h) = cfg.runtime.runtimes.get_mut(&name) {
            h.path = v.clone();
        }
    }
    if let Some(v) = &cli.infra {
        cfg.runtime.infra = match v.as_str() {
            "auto" => InfraPolicy::Auto,
            "always" => InfraPolicy::Always,
            _ => {
                return Err(sandboxd::Error::Config(format!(
                    "--infra {v:?}: expected auto or always"
                )))
            }
        };
    }
    if let Some(v) = &cli.log_level {
        cfg.log_level = v.clone();
    }
    if cli.log_json {
        cfg.log_format = "json".into();
    }
    Ok(cfg)
}

/// glibc gives each thread that allocates an arena of its own (up to 8 per core), and memory
/// freed in one arena is not reused by another: with tokio's worker and blocking threads the
/// daemon's heap grew ~60 KiB per pod at 1000 pods, nearly all of it free memory spread over
/// arenas. Two arenas hold the same work (measured at 300 pods: anonymous memory 13.0 MiB
/// against 29.6, the same rates). An operator's `MALLOC_ARENA_MAX` wins.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets an allocator parameter; called before any thread starts.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}

fn main() {
    limit_malloc_arenas();
    // Before any thread: the variable must not reach runc (see server::notify).
    server::notify::take_from_env();
    let cli = {
        use clap::FromArgMatches;
        let m = cli_command().get_matches();
        Cli::from_arg_matches(&m).unwrap_or_else(|e| e.exit())
    };
    match &cli.command {
        Some(Cmd::Completion { shell }) => {
            clap_complete::generate(
                *shell,
                &mut cli_command(),
                "sandboxd",
                &mut std::io::stdout(),
            );
            return;
        }
        Some(Cmd::Man) => {
            if let Err(e) = clap_mangen::Man::new(cli_command()).render(&mut std::io::stdout()) {
                fail(&format!("man page: {e}"));
            }
            return;
        }
        Some(Cmd::Lazyfs { dir }) => {
            let filter = std::env::var("SANDBOXD_LOG_LEVEL").unwrap_or_else(|_| "info".into());
            tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_writer(std::io::stderr)
                .with_ansi(false)
                .init();
            std::process::exit(sandboxd::image::lazy::helper::main(dir));
        }
        _ => {}
    }
    let cfg = match effective_config(&cli) {
        Ok(c) => c,
        Err(e) => fail(&e.to_string()),
    };
    if cli.print_default_config {
        print!("{}", cfg.to_toml());
        return;
    }
    let exporter = match init_logging(&cfg) {
        Ok(e) => e,
        Err(e) => fail(&e.to_string()),
    };
    let result = match cli.command {
        Some(Cmd::Demo { infra }) => demo(cfg, infra),
        Some(Cmd::Completion { .. } | Cmd::Man | Cmd::Lazyfs { .. }) => Ok(()),
        None => daemon(cfg),
    };
    // The spans of the last calls, sent before the exit.
    drop(exporter);
    if let Err(e) = result {
        fail(&e.to_string());
    }
}

/// The command line with the version text the build carries.
fn cli_command() -> clap::Command {
    use clap::CommandFactory;
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    Cli::command().version(
        VERSION
            .get_or_init(|| sandboxd::api::version_text(option_env!("SANDBOXD_COMMIT")))
            .as_str(),
    )
}

fn fail(msg: &str) -> ! {
    eprintln!("sandboxd: {msg}");
    std::process::exit(1)
}

/// Whether stderr is the journal's stream (systemd sets `JOURNAL_STREAM` to its `dev:inode`
/// for a service whose output goes to the journal; a child that inherits the variable but not
/// the stream does not match).
fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(v) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    v.to_str() == Some(&format!("{}:{}", meta.dev(), meta.ino()))
}

/// Logs to journald (under systemd) or stderr, and spans to the OTLP collector when
/// `[tracing] endpoint` is set; the exporter returned flushes its queue when dropped.
fn init_logging(
    cfg: &DaemonConfig,
) -> Result<Option<sandboxd::telemetry::Exporter>, sandboxd::Error> {
    use tracing_subscriber::filter::{filter_fn, FilterExt};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{Layer, Registry};
    let filter = tracing_subscriber::EnvFilter::try_new(&cfg.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // The request spans are the exporter's: a log line names its call by its `cri` span.
    let logs_filter = filter.and(filter_fn(|m| {
        m.target() != sandboxd::telemetry::REQUEST_TARGET
    }));
    let logs: Box<dyn Layer<Registry> + Send + Sync> = match log_layer(cfg) {
        Some(j) => j,
        None => {
            use std::io::IsTerminal;
            let b = tracing_subscriber::fmt::layer()
                .with_ansi(std::io::stderr().is_terminal())
                .with_writer(std::io::stderr);
            match cfg.log_format == "json" {
                true => Box::new(b.json()),
                false => Box::new(b),
            }
        }
    };
    let base = tracing_subscriber::registry().with(logs.with_filter(logs_filter));
    // Spans and events of the daemon's own code at info and above, whatever the log level.
    let ours =
        filter_fn(|m| m.target().starts_with("sandboxd") && *m.level() <= tracing::Level::INFO);
    match sandboxd::telemetry::layer(&cfg.tracing)? {
        Some((otel, exporter)) => {
            base.with(otel.with_filter(ours)).init();
            Ok(Some(exporter))
        }
        None => {
            base.init();
            Ok(None)
        }
    }
}

/// Under systemd, to journald with each field its own (SANDBOX_ID=…, CONTAINER_ID=…:
/// `journalctl -u sandboxd SANDBOX_ID=<id>`), unless JSON lines were asked for.
fn log_layer(
    cfg: &DaemonConfig,
) -> Option<Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>> {
    if cfg.log_format == "json" || !stderr_is_journal() {
        return None;
    }
    match tracing_journald::layer() {
        Ok(j) => Some(Box::new(
            j.with_field_prefix(None)
                .with_syslog_identifier("sandboxd".into()),
        )),
        Err(e) => {
            eprintln!("sandboxd: journald: {e}; logging to stderr");
            None
        }
    }
}

fn daemon(cfg: DaemonConfig) -> Result<(), sandboxd::Error> {
    let socket = cfg.socket.clone();
    let started = Instant::now();
    server::raise_fd_limit();
    let rt = Arc::new(Runtime::restored(cfg.runtime.clone())?);
    let listener = server::bind_socket(&socket)?;
    // What the last run left on the host is collected while the socket serves, at the
    // lowest priority: the node's first calls after a restart go first.
    let sweeper = Arc::clone(&rt);
    std::thread::Builder::new()
        .name("start-up-sweep".into())
        .spawn(move || {
            sandboxd::process::priority::lower_this_thread(false);
            sweeper.sweep_left_over()
        })
        .map_err(|e| sandboxd::Error::Config(format!("cannot start the start-up sweep: {e}")))?;
    let metrics = cfg
        .metrics_address
        .map(|a| server::bind_metrics(a, cfg.metrics_allow_remote))
        .transpose()?;
    tracing::info!(
        socket = %socket.display(),
        metrics = ?cfg.metrics_address,
        root = %cfg.runtime.root.display(),
        restored = rt.list_pod_sandboxes(&Default::default()).len(),
        ms = started.elapsed().as_millis() as u64,
        "sandboxd ready"
    );
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| sandboxd::Error::Config(format!("tokio: {e}")))?;
    server::serve_blocking(
        &tokio,
        rt,
        listener,
        socket,
        metrics,
        Box::pin(shutdown_signal()),
    )?;
    tracing::info!("sandboxd stopped; pods keep running");
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
}

fn demo(cfg: DaemonConfig, infra: bool) -> Result<(), sandboxd::Error> {
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1000.0;
    let t = Instant::now();
    let rt = Runtime::new(cfg.runtime)?;
    println!("runtime opened (state restored) in {:.1} ms", ms(t));
    let uid = sandboxd::validate::new_id()[..12].to_string();
    let pod = PodSandboxConfig::new("demo", "default", &uid, infra);
    let net = rt
        .network()
        .map_err(|e| sandboxd::Error::Config(e.to_string()))?;
    println!("network: {} (from {})", net.name, net.source);
    let t = Instant::now();
    let id = rt.run_pod_sandbox(&pod)?;
    println!("run     {:>8.1} ms  sandbox {id}", ms(t));
    let t = Instant::now();
    let st = rt.pod_sandbox_status(&id)?;
    println!(
        "status  {:>8.1} ms  state {:?}, infra {:?}",
        ms(t),
        st.state,
        st.infra_mode
    );
    if let Some(p) = &st.netns_path {
        println!("        netns {}", p.display());
    }
    println!("        ips   {}", st.ips.join(", "));
    if let Some(pid) = st.infra_pid {
        println!("        infra pid {pid}");
    }
    let t = Instant::now();
    rt.stop_pod_sandbox(&id)?;
    println!("stop    {:>8.1} ms", ms(t));
    let t = Instant::now();
    rt.remove_pod_sandbox(&id)?;
    println!("remove  {:>8.1} ms", ms(t));
    Ok(())
}
