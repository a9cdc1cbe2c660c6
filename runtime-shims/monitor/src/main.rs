//! `sandboxd-monitor`: the per-container monitor (conmon's role). The daemon starts one per
//! container; it detaches (new session, the daemon's child exits once `runtime create` is
//! done), becomes child subreaper, runs `RUNTIME create`, owns the container's stdout and
//! stderr and writes them to the CRI log format, reaps the container and writes its exit
//! status atomically to the exit file. The daemon learns everything from files, so
//! containers and their monitors outlive a daemon restart.
//!
//! The command line, the exit file and the attach frames are defined once, for the daemon
//! too, in `sandboxd-shim-common` (`cli`, `exit`, `attach`). On success the invoked process
//! prints the container pid and exits 0; on failure it prints the runtime's own error message
//! on stderr and exits 1 (2 for a bad command line).
//!
//! `sandboxd-monitor exec …` is a second, non-detaching mode for exec sessions with a
//! terminal: see [`exec`].
//!
//! SIGUSR1 reopens the log file (log rotation); SIGTERM, SIGINT and SIGHUP to the monitor are
//! ignored: it lives as long as its container.
//!
//! Modules, in the order a container meets them: [`launch`] (fork, the monitor's pid on
//! record), [`detach`] (the monitor leaves the daemon, reports back), [`supervise`] (the monitor's life and its poll loop), [`create`]
//! (`runtime create`), [`terminal`] (the console socket), [`cri_log`] (the CRI log writer),
//! [`attach`] (the attach socket server), [`oom`] (OOM kills seen while it runs), [`reaper`]
//! (reaping, the exit; its timestamps from `sandboxd_shim_common::time`).

mod attach;
mod create;
mod cri_log;
mod detach;
mod exec;
mod launch;
mod oom;
mod reaper;
mod supervise;
mod terminal;

use sandboxd_shim_common::cli::{self, MonitorArgs, Parsed};

fn main() {
    let mut argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.first().map(String::as_str) == Some(cli::EXEC) {
        argv.remove(0);
        exec::run(argv);
    }
    let args = match MonitorArgs::parse(argv) {
        Ok(Parsed::Monitor(a)) => a,
        Ok(Parsed::Version) => {
            println!("sandboxd-monitor {}", env!("CARGO_PKG_VERSION"));
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("sandboxd-monitor: {e}");
            std::process::exit(2);
        }
    };
    launch::run(&args)
}

fn die(msg: &str) -> ! {
    eprintln!("sandboxd-monitor: {msg}");
    std::process::exit(1)
}
