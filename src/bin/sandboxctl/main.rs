//! sandboxctl: a small CRI v1 client for any CRI endpoint (sandboxd, containerd, CRI-O). Pod
//! and container config files use the JSON shape crictl accepts. `sandboxctl bench` drives pod lifecycles
//! through the socket and reports per-RPC latency, so runtimes can be compared like for like.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod containers;
mod streams;

use clap::{Parser, Subcommand, ValueEnum};
use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

#[derive(Parser, Debug)]
#[command(
    name = "sandboxctl",
    version,
    about = "CRI v1 client (pods, containers, images) and lifecycle benchmark"
)]
struct Cli {
    /// CRI endpoint, `unix:///path/to.sock`.
    #[arg(
        long,
        short = 'r',
        env = "CONTAINER_RUNTIME_ENDPOINT",
        default_value = "unix:///run/sandboxd/sandboxd.sock"
    )]
    endpoint: String,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 240)]
    timeout: u64,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
    /// A markdown table row (bench only; other commands print tables).
    Markdown,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Runtime name and versions.
    Version,
    /// Runtime status and conditions (verbose).
    Info,
    /// Run a pod sandbox from a crictl-style JSON config.
    Runp {
        config: PathBuf,
        /// Runtime handler.
        #[arg(long)]
        runtime: Option<String>,
    },
    /// Stop pod sandboxes (ids or unique prefixes).
    Stopp { ids: Vec<String> },
    /// Remove pod sandboxes (ids or unique prefixes).
    Rmp { ids: Vec<String> },
    /// List pod sandboxes.
    Pods {
        /// Id prefix.
        #[arg(long)]
        id: Option<String>,
        /// ready or notready.
        #[arg(long)]
        state: Option<String>,
        /// Label selector key=value (repeatable).
        #[arg(long)]
        label: Vec<String>,
        /// Only print ids.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Pod sandbox status (verbose).
    Inspectp { id: String },
    /// Create a container in a pod: POD-ID CONTAINER.json POD.json (as crictl create).
    Create {
        pod: String,
        config: PathBuf,
        pod_config: PathBuf,
    },
    /// Start created containers.
    Start { ids: Vec<String> },
    /// Stop containers: stop signal, `--timeout` seconds, then SIGKILL.
    Stop {
        ids: Vec<String>,
        #[arg(long, short = 't', default_value_t = 10)]
        timeout: i64,
    },
    /// Remove containers (stopping them first).
    Rm { ids: Vec<String> },
    /// List containers (running ones unless --all).
    Ps {
        #[arg(long, short)]
        all: bool,
        /// Only this pod's (id prefix).
        #[arg(long, short)]
        pod: Option<String>,
        #[arg(long, short)]
        quiet: bool,
    },
    /// Container status (verbose).
    Inspect { id: String },
    /// Print a container's log; `-f` follows it until the container exits.
    Logs {
        id: String,
        #[arg(long, short)]
        follow: bool,
    },
    /// Run a command in a running container: ExecSync, or with -i/-t an interactive session
    /// over the streaming server (SPDY). Exits with the command's exit code.
    Exec {
        id: String,
        /// Seconds before the command is killed (0 = no limit; ExecSync only).
        #[arg(long, default_value_t = 0)]
        timeout: i64,
        /// Pass stdin to the command.
        #[arg(long, short)]
        interactive: bool,
        /// Allocate a terminal.
        #[arg(long, short)]
        tty: bool,
        #[arg(trailing_var_arg = true, required = true)]
        cmd: Vec<String>,
    },
    /// Attach to a running container's own stdio (until it exits or ^C); -i passes stdin,
    /// -t for a container created with a terminal.
    Attach {
        id: String,
        #[arg(long, short)]
        interactive: bool,
        #[arg(long, short)]
        tty: bool,
    },
    /// Forward local ports to a pod: `port-forward POD [ADDR:]LOCAL:REMOTE…` (runs until
    /// interrupted).
    PortForward {
        pod: String,
        #[arg(required = true)]
        ports: Vec<String>,
    },
    /// CPU and memory of running containers (ListContainerStats).
    Stats {
        /// Only this pod's (id or unique prefix).
        #[arg(long, short)]
        pod: Option<String>,
    },
    /// Pull an image from its registry (PullImage).
    Pull {
        image: String,
        /// Registry credentials `user[:password]`.
        #[arg(long)]
        creds: Option<String>,
        /// A registry (bearer) token.
        #[arg(long)]
        registry_token: Option<String>,
    },
    /// Images: list (default), import FILE, inspect, rm.
    Images {
        #[command(subcommand)]
        cmd: Option<containers::ImagesCmd>,
    },
    /// Drive N pod lifecycles (Run → Status → Stop → Remove) with concurrency C.
    Bench {
        #[arg(long, short = 'n', default_value_t = 50)]
        pods: usize,
        #[arg(long, short = 'c', default_value_t = 1)]
        concurrency: usize,
        /// Share one PID namespace per pod (needs an infra process).
        #[arg(long)]
        share_pid: bool,
        /// Runtime handler.
        #[arg(long, default_value = "")]
        runtime: String,
        /// Netns dir to audit for leaks.
        #[arg(long, default_value = "/var/run/netns")]
        netns_dir: PathBuf,
        /// A label for the table (e.g. the runtime's name).
        #[arg(long, default_value = "")]
        label: String,
        /// Also create, start, stop and remove K containers in every pod.
        #[arg(long, default_value_t = 0)]
        containers: usize,
        /// The image of those containers (must be present: pull or import it first).
        #[arg(long, default_value = "localhost/sandboxd-bench/busybox:latest")]
        image: String,
    },
}

async fn connect(endpoint: &str, timeout: Duration) -> Result<Channel, String> {
    sandboxd::cri::client::connect(endpoint, timeout).await
}

fn client(ch: &Channel) -> RuntimeServiceClient<Channel> {
    RuntimeServiceClient::new(ch.clone())
        .max_decoding_message_size(16 << 20)
        .max_encoding_message_size(16 << 20)
}

fn grpc_err(rpc: &str, s: tonic::Status) -> String {
    format!("{rpc}: {:?}: {}", s.code(), s.message())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli).await {
        eprintln!("sandboxctl: {e}");
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> Result<(), String> {
    if let Cmd::Images {
        cmd: Some(containers::ImagesCmd::Import { file, name, root }),
    } = &cli.command
    {
        return containers::import(file, name.as_deref(), root);
    }
    let ch = connect(&cli.endpoint, Duration::from_secs(cli.timeout)).await?;
    let mut c = client(&ch);
    let json = cli.output == Output::Json;
    match cli.command {
        Cmd::Version => {
            let v = c
                .version(cri::VersionRequest {
                    version: "v1".into(),
                })
                .await
                .map_err(|s| grpc_err("Version", s))?
                .into_inner();
            if json {
                println!("{}", serde_json::to_string_pretty(&v).unwrap());
            } else {
                println!(
                    "Version:  {}\nRuntimeName:  {}\nRuntimeVersion:  {}\nRuntimeApiVersion:  {}",
                    v.version, v.runtime_name, v.runtime_version, v.runtime_api_version
                );
            }
        }
        Cmd::Info => {
            let s = c
                .status(cri::StatusRequest { verbose: true })
                .await
                .map_err(|s| grpc_err("Status", s))?
                .into_inner();
            println!("{}", serde_json::to_string_pretty(&s).unwrap());
        }
        Cmd::Runp { config, runtime } => {
            let cfg = load_pod_config(&config)?;
            let r = c
                .run_pod_sandbox(cri::RunPodSandboxRequest {
                    config: Some(cfg),
                    runtime_handler: runtime.unwrap_or_default(),
                })
                .await
                .map_err(|s| grpc_err("RunPodSandbox", s))?
                .into_inner();
            println!("{}", r.pod_sandbox_id);
        }
        Cmd::Stopp { ids } => {
            for id in ids {
                let id = resolve(&mut c, &id).await?;
                c.stop_pod_sandbox(cri::StopPodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                })
                .await
                .map_err(|s| grpc_err("StopPodSandbox", s))?;
                println!("Stopped sandbox {id}");
            }
        }
        Cmd::Rmp { ids } => {
            for id in ids {
                let id = resolve(&mut c, &id).await?;
                c.remove_pod_sandbox(cri::RemovePodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                })
                .await
                .map_err(|s| grpc_err("RemovePodSandbox", s))?;
                println!("Removed sandbox {id}");
            }
        }
        Cmd::Pods {
            id,
            state,
            label,
            quiet,
        } => {
            let state = match state.as_deref() {
                None => None,
                Some("ready") => Some(cri::PodSandboxStateValue {
                    state: cri::PodSandboxState::SandboxReady as i32,
                }),
                Some("notready") => Some(cri::PodSandboxStateValue {
                    state: cri::PodSandboxState::SandboxNotready as i32,
                }),
                Some(s) => return Err(format!("--state {s:?}: expected ready or notready")),
            };
            let mut label_selector = HashMap::new();
            for l in label {
                let (k, v) = l
                    .split_once('=')
                    .ok_or_else(|| format!("--label {l:?}: expected key=value"))?;
                label_selector.insert(k.to_string(), v.to_string());
            }
            let items = c
                .list_pod_sandbox(cri::ListPodSandboxRequest {
                    filter: Some(cri::PodSandboxFilter {
                        id: String::new(),
                        state,
                        label_selector,
                    }),
                })
                .await
                .map_err(|s| grpc_err("ListPodSandbox", s))?
                .into_inner()
                .items;
            let items: Vec<_> = items
                .into_iter()
                .filter(|p| id.as_ref().is_none_or(|i| p.id.starts_with(i.as_str())))
                .collect();
            if json {
                print_list("items", &items);
            } else if quiet {
                items.iter().for_each(|p| println!("{}", p.id));
            } else {
                println!(
                    "{:<13}  {:<20}  {:<10}  {:<24}  {:<16}  {:<7}  RUNTIME",
                    "POD ID", "CREATED", "STATE", "NAME", "NAMESPACE", "ATTEMPT"
                );
                for p in items {
                    let m = p.metadata.unwrap_or_default();
                    let state = if p.state == cri::PodSandboxState::SandboxReady as i32 {
                        "Ready"
                    } else {
                        "NotReady"
                    };
                    println!(
                        "{:<13}  {:<20}  {:<10}  {:<24}  {:<16}  {:<7}  {}",
                        short(&p.id),
                        ago(p.created_at),
                        state,
                        m.name,
                        m.namespace,
                        m.attempt,
                        if p.runtime_handler.is_empty() {
                            "(default)"
                        } else {
                            &p.runtime_handler
                        }
                    );
                }
            }
        }
        Cmd::Inspectp { id } => {
            let id = resolve(&mut c, &id).await?;
            let s = c
                .pod_sandbox_status(cri::PodSandboxStatusRequest {
                    pod_sandbox_id: id,
                    verbose: true,
                })
                .await
                .map_err(|s| grpc_err("PodSandboxStatus", s))?
                .into_inner();
            println!("{}", containers::pretty_verbose(&s));
        }
        Cmd::Create {
            pod,
            config,
            pod_config,
        } => {
            let pod = resolve(&mut c, &pod).await?;
            let r = c
                .create_container(cri::CreateContainerRequest {
                    pod_sandbox_id: pod,
                    config: Some(load_container_config(&config)?),
                    sandbox_config: Some(load_pod_config(&pod_config)?),
                })
                .await
                .map_err(|s| grpc_err("CreateContainer", s))?
                .into_inner();
            println!("{}", r.container_id);
        }
        Cmd::Start { ids } => {
            for id in ids {
                let id = containers::resolve_container(&mut c, &id).await?;
                c.start_container(cri::StartContainerRequest {
                    container_id: id.clone(),
                })
                .await
                .map_err(|s| grpc_err("StartContainer", s))?;
                println!("{id}");
            }
        }
        Cmd::Stop { ids, timeout } => {
            for id in ids {
                let id = containers::resolve_container(&mut c, &id).await?;
                c.stop_container(cri::StopContainerRequest {
                    container_id: id.clone(),
                    timeout,
                })
                .await
                .map_err(|s| grpc_err("StopContainer", s))?;
                println!("{id}");
            }
        }
        Cmd::Rm { ids } => {
            for id in ids {
                let id = containers::resolve_container(&mut c, &id).await?;
                c.remove_container(cri::RemoveContainerRequest {
                    container_id: id.clone(),
                })
                .await
                .map_err(|s| grpc_err("RemoveContainer", s))?;
                println!("{id}");
            }
        }
        Cmd::Ps { all, pod, quiet } => {
            let pod = match pod {
                Some(p) => Some(resolve(&mut c, &p).await?),
                None => None,
            };
            containers::ps(&mut c, all, pod, quiet, json).await?;
        }
        Cmd::Inspect { id } => {
            let id = containers::resolve_container(&mut c, &id).await?;
            let s = c
                .container_status(cri::ContainerStatusRequest {
                    container_id: id,
                    verbose: true,
                })
                .await
                .map_err(|s| grpc_err("ContainerStatus", s))?
                .into_inner();
            println!("{}", containers::pretty_verbose(&s));
        }
        Cmd::Logs { id, follow } => {
            let id = containers::resolve_container(&mut c, &id).await?;
            containers::logs(&mut c, &id, follow).await?;
        }
        Cmd::Exec {
            id,
            timeout,
            interactive,
            tty,
            cmd,
        } if interactive || tty => {
            let _ = timeout;
            let id = containers::resolve_container(&mut c, &id).await?;
            let url = c
                .exec(cri::ExecRequest {
                    container_id: id,
                    cmd,
                    tty,
                    stdin: interactive,
                    stdout: true,
                    stderr: !tty,
                })
                .await
                .map_err(|s| grpc_err("Exec", s))?
                .into_inner()
                .url;
            run_session(url, interactive, tty).await?;
        }
        Cmd::Attach {
            id,
            interactive,
            tty,
        } => {
            let id = containers::resolve_container(&mut c, &id).await?;
            let url = c
                .attach(cri::AttachRequest {
                    container_id: id,
                    stdin: interactive,
                    tty,
                    stdout: true,
                    stderr: !tty,
                })
                .await
                .map_err(|s| grpc_err("Attach", s))?
                .into_inner()
                .url;
            run_session(url, interactive, tty).await?;
        }
        Cmd::PortForward { pod, ports } => {
            let pod = resolve(&mut c, &pod).await?;
            let mut pairs = Vec::new();
            for p in &ports {
                let (local, remote) = p
                    .rsplit_once(':')
                    .ok_or_else(|| format!("{p:?}: expected [ADDR:]LOCAL:REMOTE"))?;
                let remote: u16 = remote
                    .parse()
                    .map_err(|_| format!("{p:?}: bad remote port"))?;
                let local = if local.contains(':') {
                    local.to_string()
                } else {
                    format!("127.0.0.1:{local}")
                };
                pairs.push((local, remote));
            }
            let url = c
                .port_forward(cri::PortForwardRequest {
                    pod_sandbox_id: pod,
                    port: pairs.iter().map(|(_, r)| i32::from(*r)).collect(),
                })
                .await
                .map_err(|s| grpc_err("PortForward", s))?
                .into_inner()
                .url;
            tokio::task::spawn_blocking(move || streams::port_forward(&url, &pairs))
                .await
                .map_err(|e| e.to_string())??;
        }
        Cmd::Exec {
            id, timeout, cmd, ..
        } => {
            let id = containers::resolve_container(&mut c, &id).await?;
            let r = c
                .exec_sync(cri::ExecSyncRequest {
                    container_id: id,
                    cmd,
                    timeout,
                })
                .await
                .map_err(|s| grpc_err("ExecSync", s))?
                .into_inner();
            use std::io::Write;
            let _ = std::io::stdout().write_all(&r.stdout);
            let _ = std::io::stderr().write_all(&r.stderr);
            let _ = std::io::stdout().flush();
            if r.exit_code != 0 {
                std::process::exit(r.exit_code);
            }
        }
        Cmd::Stats { pod } => {
            let pod = match pod {
                Some(p) => resolve(&mut c, &p).await?,
                None => String::new(),
            };
            let stats = c
                .list_container_stats(cri::ListContainerStatsRequest {
                    filter: Some(cri::ContainerStatsFilter {
                        pod_sandbox_id: pod,
                        ..Default::default()
                    }),
                })
                .await
                .map_err(|s| grpc_err("ListContainerStats", s))?
                .into_inner()
                .stats;
            if json {
                print_list("stats", &stats);
            } else {
                println!(
                    "{:<13}  {:<20}  {:>14}  {:>12}",
                    "CONTAINER", "NAME", "CPU (s)", "MEM (MiB)"
                );
                for s in stats {
                    let a = s.attributes.unwrap_or_default();
                    let cpu = s
                        .cpu
                        .and_then(|c| c.usage_core_nano_seconds)
                        .map_or(0.0, |v| v.value as f64 / 1e9);
                    let mem = s
                        .memory
                        .and_then(|m| m.working_set_bytes)
                        .map_or(0.0, |v| v.value as f64 / 1048576.0);
                    println!(
                        "{:<13}  {:<20}  {:>14.3}  {:>12.1}",
                        short(&a.id),
                        a.metadata.unwrap_or_default().name,
                        cpu,
                        mem
                    );
                }
            }
        }
        Cmd::Pull {
            image,
            creds,
            registry_token,
        } => {
            let (username, password) = match creds.as_deref().map(|c| c.split_once(':')) {
                None => (String::new(), String::new()),
                Some(Some((u, p))) => (u.to_string(), p.to_string()),
                Some(None) => (creds.clone().unwrap_or_default(), String::new()),
            };
            let auth =
                (!username.is_empty() || registry_token.is_some()).then(|| cri::AuthConfig {
                    username,
                    password,
                    registry_token: registry_token.unwrap_or_default(),
                    ..Default::default()
                });
            let r = containers::images_client(&ch)
                .pull_image(cri::PullImageRequest {
                    image: Some(cri::ImageSpec {
                        image: image.clone(),
                        ..Default::default()
                    }),
                    auth,
                    sandbox_config: None,
                })
                .await
                .map_err(|s| grpc_err("PullImage", s))?
                .into_inner();
            println!("Image is up to date for {}", r.image_ref);
        }
        Cmd::Images { cmd } => {
            containers::images(
                &ch,
                cmd.unwrap_or(containers::ImagesCmd::List { quiet: false }),
                json,
            )
            .await?;
        }
        Cmd::Bench {
            pods,
            concurrency,
            share_pid,
            runtime,
            netns_dir,
            label,
            containers,
            image,
        } => {
            bench::run(
                ch,
                bench::Params {
                    pods,
                    conc: concurrency.max(1),
                    share_pid,
                    runtime,
                    containers,
                    image,
                },
                &netns_dir,
                &label,
                cli.output,
            )
            .await?;
        }
    }
    Ok(())
}

/// Resolves an id prefix against ListPodSandbox, as crictl does; an id that matches nothing is
/// passed on unchanged (stop/remove of an unknown id is success per CRI).
async fn resolve(c: &mut RuntimeServiceClient<Channel>, prefix: &str) -> Result<String, String> {
    let items = c
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .map_err(|s| grpc_err("ListPodSandbox", s))?
        .into_inner()
        .items;
    pick(items.into_iter().map(|p| p.id), prefix, "pods")
}

/// Runs an exec or attach session on its streaming URL; exits with the command's non-zero code.
async fn run_session(url: String, stdin: bool, tty: bool) -> Result<(), String> {
    let code = tokio::task::spawn_blocking(move || streams::exec(&url, stdin, tty))
        .await
        .map_err(|e| e.to_string())??;
    if code != 0 {
        std::process::exit(code);
    }
    Ok(())
}

/// The one id of `ids` starting with `prefix`; `prefix` itself when none does; an error naming
/// `kind` when several do.
pub(crate) fn pick(
    ids: impl IntoIterator<Item = String>,
    prefix: &str,
    kind: &str,
) -> Result<String, String> {
    let hits: Vec<String> = ids
        .into_iter()
        .filter(|id| id.starts_with(prefix))
        .collect();
    match hits.as_slice() {
        [] => Ok(prefix.to_string()),
        [one] => Ok(one.clone()),
        _ => Err(format!(
            "id prefix {prefix:?} is ambiguous ({} {kind})",
            hits.len()
        )),
    }
}

/// Largest config file read.
const MAX_CONFIG_FILE: u64 = 1 << 20;

fn read_config(path: &Path) -> Result<Vec<u8>, String> {
    sandboxd::untrusted_fs::read_file(path, MAX_CONFIG_FILE).map_err(|e| e.to_string())
}

fn load_pod_config(path: &Path) -> Result<cri::PodSandboxConfig, String> {
    sandboxd::cri::crictl_json::pod_config(&read_config(path)?)
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn load_container_config(path: &Path) -> Result<cri::ContainerConfig, String> {
    sandboxd::cri::crictl_json::container_config(&read_config(path)?)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The first 13 characters of an id, as tables show it.
fn short(id: &str) -> &str {
    &id[..13.min(id.len())]
}

/// `{"<key>": [items]}` as pretty JSON (crictl's `-o json` shape).
fn print_list<T: serde::Serialize>(key: &str, items: &T) {
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::json!({ key: items })).unwrap()
    );
}

fn ago(created_ns: i64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0);
    let s = (now - created_ns).max(0) / 1_000_000_000;
    match s {
        0..=59 => format!("{s} seconds ago"),
        60..=3599 => format!("{} minutes ago", s / 60),
        3600..=86399 => format!("{} hours ago", s / 3600),
        _ => format!("{} days ago", s / 86400),
    }
}

mod bench {
    //! The CRI lifecycle benchmark: N pods, concurrency C, per-RPC percentiles, pods/s, and a
    //! leak audit of what the host shows afterwards.

    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Default)]
    struct Lat {
        run: Vec<f64>,
        status: Vec<f64>,
        stop: Vec<f64>,
        remove: Vec<f64>,
        create_c: Vec<f64>,
        start_c: Vec<f64>,
        stop_c: Vec<f64>,
        remove_c: Vec<f64>,
    }

    /// What one benchmark run does.
    #[derive(Clone)]
    pub struct Params {
        pub pods: usize,
        pub conc: usize,
        pub share_pid: bool,
        pub runtime: String,
        /// Containers per pod (0 = pods only).
        pub containers: usize,
        pub image: String,
    }

    fn pct(v: &mut [f64], p: f64) -> f64 {
        if v.is_empty() {
            return 0.0;
        }
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[((p / 100.0) * (v.len() - 1) as f64).round() as usize]
    }

    fn netns_count(dir: &Path) -> usize {
        std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
    }

    fn shm_mounts() -> usize {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                let mp = l.split(' ').nth(4).unwrap_or("");
                mp.ends_with("/shm") && l.contains(" - tmpfs ") && !mp.starts_with("/dev/")
            })
            .count()
    }

    pub async fn run(
        ch: Channel,
        p: Params,
        netns_dir: &Path,
        label: &str,
        output: Output,
    ) -> Result<(), String> {
        let (pods, conc, share_pid, k) = (p.pods, p.conc, p.share_pid, p.containers);
        let run_id = format!(
            "{:x}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
                & 0xffff_ffff
        );
        let (ns_before, shm_before) = (netns_count(netns_dir), shm_mounts());
        let lat = Arc::new(Mutex::new(Lat::default()));
        let errors = Arc::new(Mutex::new(Vec::<String>::new()));
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..conc {
            let (ch, lat, errors, next, run_id, p) = (
                ch.clone(),
                lat.clone(),
                errors.clone(),
                next.clone(),
                run_id.clone(),
                p.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut c = client(&ch);
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= pods {
                        return;
                    }
                    if let Err(e) = one(&mut c, &run_id, i, &p, &lat).await {
                        errors.lock().unwrap().push(e);
                    }
                }
            }));
        }
        for t in tasks {
            t.await.map_err(|e| e.to_string())?;
        }
        let wall = t0.elapsed().as_secs_f64();
        let mut c = client(&ch);
        let mut sel = HashMap::new();
        sel.insert("sandboxctl-bench".to_string(), run_id.clone());
        let left_pods = c
            .list_pod_sandbox(cri::ListPodSandboxRequest {
                filter: Some(cri::PodSandboxFilter {
                    label_selector: sel.clone(),
                    ..Default::default()
                }),
            })
            .await
            .map_err(|s| grpc_err("ListPodSandbox", s))?
            .into_inner()
            .items
            .len();
        let left_containers = c
            .list_containers(cri::ListContainersRequest {
                filter: Some(cri::ContainerFilter {
                    label_selector: sel,
                    ..Default::default()
                }),
            })
            .await
            .map_err(|s| grpc_err("ListContainers", s))?
            .into_inner()
            .containers
            .len();
        let left = left_pods + left_containers;
        // Give asynchronous teardown (another runtime's netns cleanup) a moment before the audit.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (ns_after, shm_after) = (netns_count(netns_dir), shm_mounts());
        let errors = errors.lock().unwrap().clone();
        let l = std::mem::take(&mut *lat.lock().unwrap());
        let mut rows = Vec::new();
        let mut phases = vec![
            ("RunPodSandbox", l.run),
            ("PodSandboxStatus", l.status),
            ("StopPodSandbox", l.stop),
            ("RemovePodSandbox", l.remove),
        ];
        if k > 0 {
            phases.extend([
                ("CreateContainer", l.create_c),
                ("StartContainer", l.start_c),
                ("StopContainer", l.stop_c),
                ("RemoveContainer", l.remove_c),
            ]);
        }
        for (name, mut v) in phases {
            let v = &mut v;
            rows.push(serde_json::json!({
                "rpc": name, "count": v.len(),
                "p50_ms": pct(v, 50.0), "p90_ms": pct(v, 90.0), "p99_ms": pct(v, 99.0), "max_ms": pct(v, 100.0),
            }));
        }
        let ok = pods - errors.len();
        let report = serde_json::json!({
            "label": label, "pods": pods, "completed": ok, "concurrency": conc, "share_pid": share_pid,
            "runtime_handler": p.runtime, "containers_per_pod": k, "image": p.image, "wall_s": wall, "pods_per_s": ok as f64 / wall,
            "rpcs": rows, "errors": errors.iter().take(5).collect::<Vec<_>>(), "error_count": errors.len(),
            "leaks": { "sandboxes_listed": left_pods, "containers_listed": left_containers, "netns_files": ns_after as i64 - ns_before as i64, "shm_mounts": shm_after as i64 - shm_before as i64 },
        });
        if output == Output::Json {
            println!("{}", serde_json::to_string(&report).unwrap());
        } else if output == Output::Markdown {
            let cell = |r: &serde_json::Value| {
                format!(
                    "{:.1}/{:.1}/{:.1}/{:.1}",
                    r["p50_ms"].as_f64().unwrap(),
                    r["p90_ms"].as_f64().unwrap(),
                    r["p99_ms"].as_f64().unwrap(),
                    r["max_ms"].as_f64().unwrap()
                )
            };
            if k > 0 {
                // Containers row: Run, the four container RPCs, Stop, Remove.
                println!(
                    "| {label} | {} | {conc} | {pods} | {k} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {left}/{:+}/{:+} |",
                    if share_pid { "shared PID (infra)" } else { "default" },
                    ok as f64 / wall,
                    cell(&rows[0]),
                    cell(&rows[4]),
                    cell(&rows[5]),
                    cell(&rows[6]),
                    cell(&rows[7]),
                    cell(&rows[2]),
                    cell(&rows[3]),
                    ns_after as i64 - ns_before as i64,
                    shm_after as i64 - shm_before as i64,
                );
            } else {
                println!(
                "| {label} | {} | {conc} | {pods} | {:.1} | {} | {} | {} | {} | {left}/{:+}/{:+} |",
                if share_pid {
                    "shared PID (infra)"
                } else {
                    "default"
                },
                ok as f64 / wall,
                cell(&rows[0]),
                cell(&rows[1]),
                cell(&rows[2]),
                cell(&rows[3]),
                ns_after as i64 - ns_before as i64,
                shm_after as i64 - shm_before as i64,
            );
            }
        } else {
            println!("{label} pods={pods} concurrency={conc} share_pid={share_pid}: {:.1} pods/s ({ok} completed, {} errors) in {wall:.2}s", ok as f64 / wall, errors.len());
            println!(
                "{:<18} {:>8} {:>8} {:>8} {:>8}",
                "RPC", "p50 ms", "p90 ms", "p99 ms", "max ms"
            );
            for r in &rows {
                println!(
                    "{:<18} {:>8.1} {:>8.1} {:>8.1} {:>8.1}",
                    r["rpc"].as_str().unwrap(),
                    r["p50_ms"].as_f64().unwrap(),
                    r["p90_ms"].as_f64().unwrap(),
                    r["p99_ms"].as_f64().unwrap(),
                    r["max_ms"].as_f64().unwrap()
                );
            }
            println!(
                "leaks: {left_pods} sandboxes and {left_containers} containers listed, {:+} netns files, {:+} shm mounts",
                ns_after as i64 - ns_before as i64,
                shm_after as i64 - shm_before as i64
            );
            for e in errors.iter().take(5) {
                println!("error: {e}");
            }
        }
        if left > 0 || !errors.is_empty() {
            return Err(format!(
                "{} errors, {left_pods} sandboxes and {left_containers} containers left",
                errors.len()
            ));
        }
        Ok(())
    }

    async fn one(
        c: &mut RuntimeServiceClient<Channel>,
        run_id: &str,
        i: usize,
        p: &Params,
        lat: &Mutex<Lat>,
    ) -> Result<(), String> {
        let (share_pid, runtime) = (p.share_pid, p.runtime.as_str());
        let mut labels = HashMap::new();
        labels.insert("sandboxctl-bench".to_string(), run_id.to_string());
        let mode = if share_pid {
            cri::NamespaceMode::Pod
        } else {
            cri::NamespaceMode::Container
        } as i32;
        let config = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: format!("bench-{run_id}-{i}"),
                namespace: "bench".into(),
                uid: format!("{run_id}-{i}"),
                attempt: 0,
            }),
            hostname: format!("bench-{i}"),
            log_directory: String::new(),
            labels,
            linux: Some(cri::LinuxPodSandboxConfig {
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(cri::NamespaceOption {
                        network: cri::NamespaceMode::Pod as i32,
                        pid: mode,
                        ipc: cri::NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let t = Instant::now();
        let id = c
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: runtime.into(),
            })
            .await
            .map_err(|s| grpc_err("RunPodSandbox", s))?
            .into_inner()
            .pod_sandbox_id;
        let run = t.elapsed().as_secs_f64() * 1000.0;
        let t = Instant::now();
        c.pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: id.clone(),
            verbose: false,
        })
        .await
        .map_err(|s| grpc_err("PodSandboxStatus", s))?;
        let status = t.elapsed().as_secs_f64() * 1000.0;
        let mut ctr_lat = Lat::default();
        let mut ids = Vec::new();
        for j in 0..p.containers {
            let mut labels = HashMap::new();
            labels.insert("sandboxctl-bench".to_string(), run_id.to_string());
            let cc = cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: format!("c{j}"),
                    attempt: 0,
                }),
                image: Some(cri::ImageSpec {
                    image: p.image.clone(),
                    ..Default::default()
                }),
                command: vec!["sleep".into(), "3600".into()],
                labels,
                ..Default::default()
            };
            let t = Instant::now();
            let cid = c
                .create_container(cri::CreateContainerRequest {
                    pod_sandbox_id: id.clone(),
                    config: Some(cc),
                    sandbox_config: Some(config.clone()),
                })
                .await
                .map_err(|s| grpc_err("CreateContainer", s))?
                .into_inner()
                .container_id;
            ctr_lat.create_c.push(t.elapsed().as_secs_f64() * 1000.0);
            let t = Instant::now();
            c.start_container(cri::StartContainerRequest {
                container_id: cid.clone(),
            })
            .await
            .map_err(|s| grpc_err("StartContainer", s))?;
            ctr_lat.start_c.push(t.elapsed().as_secs_f64() * 1000.0);
            ids.push(cid);
        }
        for cid in ids {
            let t = Instant::now();
            c.stop_container(cri::StopContainerRequest {
                container_id: cid.clone(),
                timeout: 0,
            })
            .await
            .map_err(|s| grpc_err("StopContainer", s))?;
            ctr_lat.stop_c.push(t.elapsed().as_secs_f64() * 1000.0);
            let t = Instant::now();
            c.remove_container(cri::RemoveContainerRequest { container_id: cid })
                .await
                .map_err(|s| grpc_err("RemoveContainer", s))?;
            ctr_lat.remove_c.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let t = Instant::now();
        c.stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: id.clone(),
        })
        .await
        .map_err(|s| grpc_err("StopPodSandbox", s))?;
        let stop = t.elapsed().as_secs_f64() * 1000.0;
        let t = Instant::now();
        c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id })
            .await
            .map_err(|s| grpc_err("RemovePodSandbox", s))?;
        let remove = t.elapsed().as_secs_f64() * 1000.0;
        let mut l = lat.lock().unwrap();
        l.run.push(run);
        l.status.push(status);
        l.stop.push(stop);
        l.remove.push(remove);
        l.create_c.extend(ctr_lat.create_c);
        l.start_c.extend(ctr_lat.start_c);
        l.stop_c.extend(ctr_lat.stop_c);
        l.remove_c.extend(ctr_lat.remove_c);
        Ok(())
    }
}
