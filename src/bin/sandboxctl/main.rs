//! sandboxctl: a small CRI v1 client for any CRI endpoint (sandboxd, containerd, CRI-O). Pod
//! and container config files use the JSON shape crictl accepts. `sandboxctl bench` drives pod lifecycles
//! through the socket and reports per-RPC latency, so runtimes can be compared like for like.
//!
//! `cli.rs` parses; this file connects and hands each command to its group's module.

use std::time::Duration;

mod bench;
mod cli;
mod client;
mod config;
mod containers;
mod doctor;
mod ids;
mod images;
mod info;
mod output;
mod pods;
mod progress;
mod scale;
mod streams;

use sandboxd::api::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

use cli::{Cli, Cmd, ImagesCmd, Output, ScaleCmd};

/// The RuntimeService client every command uses.
type Runtime = RuntimeServiceClient<Channel>;

fn runtime_client(ch: &Channel) -> Runtime {
    RuntimeServiceClient::new(ch.clone())
        .max_decoding_message_size(16 << 20)
        .max_encoding_message_size(16 << 20)
}

fn grpc_err(rpc: &str, s: tonic::Status) -> String {
    format!("{rpc}: {:?}: {}", s.code(), s.message())
}

/// This build's version text (package, commit, CRI schema).
fn version_text() -> &'static str {
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VERSION.get_or_init(|| sandboxd::api::version_text(option_env!("SANDBOXD_COMMIT")))
}

/// The command line with the version text the build carries.
fn cli_command() -> clap::Command {
    use clap::CommandFactory;
    Cli::command().version(version_text())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let cli = {
        use clap::FromArgMatches;
        let m =
            cli_command().get_matches_from(cli::global_flags_first(std::env::args_os().collect()));
        Cli::from_arg_matches(&m).unwrap_or_else(|e| e.exit())
    };
    if let Err(e) = run(cli).await {
        eprintln!("sandboxctl: {e}");
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> Result<(), String> {
    match &cli.command {
        Cmd::Completion { shell } => {
            clap_complete::generate(
                *shell,
                &mut cli_command(),
                "sandboxctl",
                &mut std::io::stdout(),
            );
            return Ok(());
        }
        Cmd::Man => {
            return clap_mangen::Man::new(cli_command())
                .render(&mut std::io::stdout())
                .map_err(|e| format!("man page: {e}"));
        }
        _ => {}
    }
    if let Cmd::Images {
        cmd: Some(ImagesCmd::Import { file, name, root }),
    } = &cli.command
    {
        return images::import(file, name.as_deref(), root);
    }
    if let Cmd::Images {
        cmd:
            Some(ImagesCmd::Estargz {
                layout,
                prefetch,
                zstd_chunked,
                chunk_size,
            }),
    } = &cli.command
    {
        return images::estargz(layout, prefetch, *zstd_chunked, *chunk_size);
    }
    let ch = client::connect(&cli.endpoint, Duration::from_secs(cli.timeout)).await?;
    let mut c = runtime_client(&ch);
    let json = cli.output == Output::Json;
    match cli.command {
        Cmd::Version => info::version(&mut c, json).await,
        Cmd::Completion { .. } | Cmd::Man => Ok(()),
        Cmd::Info => info::info(&mut c).await,
        Cmd::Doctor { fix, grace } => doctor::run(&ch, fix, grace, json).await,
        Cmd::Runp { config, runtime } => pods::run(&mut c, &config, runtime).await,
        Cmd::Stopp { ids } => pods::stop(&mut c, ids).await,
        Cmd::Rmp { ids } => pods::remove(&mut c, ids).await,
        Cmd::Pods {
            id,
            state,
            label,
            quiet,
        } => pods::list(&mut c, id, state, label, quiet, json).await,
        Cmd::Inspectp { id } => pods::inspect(&mut c, &id).await,
        Cmd::Create {
            pod,
            config,
            pod_config,
        } => containers::create(&mut c, &pod, &config, &pod_config).await,
        Cmd::Start { ids } => containers::start(&mut c, ids).await,
        Cmd::Stop { ids, timeout } => containers::stop(&mut c, ids, timeout).await,
        Cmd::Rm { ids } => containers::remove(&mut c, ids).await,
        Cmd::Ps { all, pod, quiet } => {
            let pod = match pod {
                Some(p) => Some(ids::pod(&mut c, &p).await?),
                None => None,
            };
            containers::ps(&mut c, all, pod, quiet, json).await
        }
        Cmd::Inspect { id } => containers::inspect(&mut c, &id).await,
        Cmd::Logs { id, follow } => {
            let id = ids::container(&mut c, &id).await?;
            containers::logs(&mut c, &id, follow).await
        }
        Cmd::Exec {
            id,
            interactive,
            tty,
            cmd,
            ..
        } if interactive || tty => streams::exec(&mut c, &id, cmd, interactive, tty).await,
        Cmd::Exec {
            id, timeout, cmd, ..
        } => containers::exec_sync(&mut c, &id, cmd, timeout).await,
        Cmd::Attach {
            id,
            interactive,
            tty,
        } => streams::attach(&mut c, &id, interactive, tty).await,
        Cmd::PortForward { pod, ports } => streams::port_forward(&mut c, &pod, &ports).await,
        Cmd::Stats { pod } => containers::stats(&mut c, pod, json).await,
        Cmd::Pull {
            image,
            creds,
            registry_token,
        } => images::pull(&ch, image, creds, registry_token).await,
        Cmd::Images { cmd } => {
            images::images(&ch, cmd.unwrap_or(ImagesCmd::List { quiet: false }), json).await
        }
        Cmd::Scale {
            cmd: ScaleCmd::Up(mut up),
        } => {
            up.samples = up.samples.max(1);
            scale::up(ch, up).await
        }
        Cmd::Scale {
            cmd: ScaleCmd::Lists { run, samples },
        } => scale::lists_now(ch, &run, samples).await,
        Cmd::Scale {
            cmd:
                ScaleCmd::Down {
                    run,
                    concurrency,
                    label,
                },
        } => scale::down(ch, &run, concurrency, &label).await,
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
            .await
        }
    }
}
