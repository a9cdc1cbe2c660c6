//! The command line: global flags, one subcommand per CRI call group (crictl's names), and
//! `images` with its own subcommands. Parsing only; `main.rs` dispatches.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "sandboxctl",
    version,
    about = "CRI v1 client (pods, containers, images) and lifecycle benchmark"
)]
pub struct Cli {
    /// CRI endpoint, `unix:///path/to.sock`.
    #[arg(
        long,
        short = 'r',
        global = true,
        env = "CONTAINER_RUNTIME_ENDPOINT",
        default_value = "unix:///run/sandboxd/sandboxd.sock"
    )]
    pub endpoint: String,
    /// Per-request timeout in seconds. After `stop` and `exec`, `--timeout` is theirs (as
    /// with crictl); give this one before the subcommand there.
    #[arg(long, default_value_t = 240)]
    pub timeout: u64,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table, global = true)]
    pub output: Output,
    #[command(subcommand)]
    pub command: Cmd,
}

/// The command line as given, with a `--timeout` after a subcommand that has none of its own
/// moved before it: every global flag works after the subcommand too, as crictl's do (`-o`
/// and `-r` are global to clap; `--timeout` cannot be, `stop` and `exec` have their own).
pub fn global_flags_first(mut args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    // The subcommand's position (a value of a flag before it, such as `-r X`, is skipped).
    let mut at = 1;
    while at < args.len() {
        let a = args[at].to_string_lossy().into_owned();
        if !a.starts_with('-') {
            break;
        }
        let takes_value = matches!(
            a.as_str(),
            "-r" | "--endpoint" | "-o" | "--output" | "--timeout"
        );
        at += if takes_value { 2 } else { 1 };
    }
    let name = args.get(at).map(|a| a.to_string_lossy().into_owned());
    if matches!(name.as_deref(), None | Some("stop" | "exec")) {
        return args;
    }
    let mut i = at + 1;
    while i < args.len() {
        let a = args[i].to_string_lossy().into_owned();
        if a == "--" {
            break;
        }
        if a == "--timeout" && i + 1 < args.len() {
            let v = args.remove(i + 1);
            let f = args.remove(i);
            args.insert(at, v);
            args.insert(at, f);
            at += 2;
            i += 2;
        } else if a.starts_with("--timeout=") {
            let f = args.remove(i);
            args.insert(at, f);
            at += 1;
            i += 1;
        } else {
            i += 1;
        }
    }
    args
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
    /// A markdown table row (bench only; other commands print tables).
    Markdown,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Runtime name and versions (and this client's, with its commit).
    Version,
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    Completion { shell: clap_complete::Shell },
    /// Print the man page (roff) to stdout.
    #[command(hide = true)]
    Man,
    /// Runtime status and conditions (verbose).
    Info,
    /// sandboxd only: list what the daemon left on the host that no record owns (netns and
    /// namespace files, CNI caches and so IP reservations, mounts, runtime containers, dirs,
    /// half-unpacked layers), each with its owner id and age. Exits 1 while any remain.
    Doctor {
        /// Remove the orphans at least `--grace` seconds old, in teardown order.
        #[arg(long)]
        fix: bool,
        /// Seconds since an orphan last changed before `--fix` removes it.
        #[arg(long, default_value_t = 600)]
        grace: i64,
    },
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
        cmd: Option<ImagesCmd>,
    },
    /// The node-scale benchmark: many pods kept up, latencies and memory as they grow.
    Scale {
        #[command(subcommand)]
        cmd: ScaleCmd,
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

#[derive(Subcommand, Debug)]
pub enum ScaleCmd {
    /// Bring up N pods with one container each, C at a time; at each point print a markdown
    /// row: bring-up rate, RPC latencies, memory per pod.
    Up(crate::scale::Up),
    /// The list and stats latencies of the node as it is (p50/p99 ms of ListPodSandbox,
    /// ListContainers, PodSandboxStatus of the run's pods, ListContainerStats), one line.
    Lists {
        #[arg(long)]
        run: String,
        #[arg(long, default_value_t = 50)]
        samples: usize,
    },
    /// Stop and remove every pod of a run, C at a time; print `LABEL PODS PODS/S SECONDS`.
    Down {
        #[arg(long)]
        run: String,
        #[arg(long, short = 'c', default_value_t = 8)]
        concurrency: usize,
        #[arg(long, default_value = "")]
        label: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum ImagesCmd {
    /// List images.
    List {
        #[arg(long, short)]
        quiet: bool,
    },
    /// Import an OCI image layout dir, an oci-archive or a docker-archive tar into the local
    /// store of a sandboxd state root (run on the node, as root).
    Import {
        file: PathBuf,
        /// Tag for an archive that names no image.
        #[arg(long)]
        name: Option<String>,
        /// The daemon's state root.
        #[arg(long, default_value = "/var/lib/sandboxd")]
        root: PathBuf,
    },
    /// Image status (verbose).
    Inspect { image: String },
    /// Remove images.
    Rm { images: Vec<String> },
    /// Convert the image of an OCI image layout dir in place to eStargz layers (each layer
    /// with its TOC digest annotation), or with --zstd-chunked to zstd:chunked ones (each
    /// with its manifest checksum and position annotations), for lazy pulls (`[images]
    /// lazy_pull`); runs locally.
    Estargz {
        /// The OCI image layout dir (one image manifest in its index.json).
        layout: PathBuf,
        /// A file (path in the image) to put first, before the prefetch landmark (repeatable;
        /// eStargz only).
        #[arg(long)]
        prefetch: Vec<String>,
        /// zstd:chunked layers instead of eStargz (containers/storage's format).
        #[arg(long, conflicts_with = "prefetch")]
        zstd_chunked: bool,
        /// Bytes per chunk of a regular file.
        #[arg(long, default_value_t = 4 << 20)]
        chunk_size: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Cli {
        let args = line.split(' ').map(std::ffi::OsString::from).collect();
        Cli::try_parse_from(global_flags_first(args)).unwrap()
    }

    /// crictl's habit: global flags after the subcommand (issue 36: `doctor -o json` was
    /// refused).
    #[test]
    fn global_flags_work_after_the_subcommand() {
        let c = parse("sandboxctl doctor -o json");
        assert_eq!(c.output, Output::Json);
        assert!(matches!(c.command, Cmd::Doctor { .. }));
        let c = parse("sandboxctl pods -o json --timeout 7 -r unix:///x.sock");
        assert_eq!((c.output, c.timeout), (Output::Json, 7));
        assert_eq!(c.endpoint, "unix:///x.sock");
        let c = parse("sandboxctl -r unix:///y.sock ps --timeout=9 -a");
        assert_eq!((c.timeout, c.endpoint.as_str()), (9, "unix:///y.sock"));
        // stop's own --timeout stays its own.
        let c = parse("sandboxctl --timeout 5 stop --timeout 3 abc");
        assert_eq!(c.timeout, 5);
        assert!(matches!(c.command, Cmd::Stop { timeout: 3, .. }));
    }
}
