//! The launcher: the process the daemon starts. It forks the monitor, records the monitor's
//! pid, and only then lets it leave the launcher's process group (which the daemon kills
//! past its time limit): at every moment one of the two finds it. It then relays the
//! monitor's report: the container's pid on stdout and exit 0, or the error on stderr and
//! exit 1.

use std::fs::File;
use std::io::{Read, Write};

use sandboxd_shim_common::cli::MonitorArgs;
use sandboxd_shim_common::fd::pipe;
use sandboxd_shim_common::files::write_pid;

use crate::detach::Report;
use crate::die;

/// Forks the monitor and reports for it; never returns.
pub fn run(args: &MonitorArgs) -> ! {
    let (report_r, report_w) = pipe().unwrap_or_else(|e| die(&format!("sync pipe: {e}")));
    let (go_r, go_w) = pipe().unwrap_or_else(|e| die(&format!("sync pipe: {e}")));
    // SAFETY: the monitor is single-threaded here, so the child may run any code after fork.
    match unsafe { libc::fork() } {
        -1 => die(&format!("fork: {}", std::io::Error::last_os_error())),
        0 => {
            drop((report_r, go_w));
            // Leave our parent's process group (which the daemon kills past its time limit)
            // only once our pid is on record: at every moment one of the two finds us.
            let mut b = [0u8; 1];
            if !matches!(File::from(go_r).read(&mut b), Ok(1)) {
                std::process::exit(1);
            }
            let code = crate::supervise::run(args, Report::new(File::from(report_w)));
            std::process::exit(code);
        }
        child => {
            drop((report_w, go_r));
            if let Err(e) = write_pid(&args.monitor_pid_file, child) {
                die(&format!("write {}: {e}", args.monitor_pid_file.display()));
            }
            let _ = File::from(go_w).write_all(b"1");
            let mut msg = String::new();
            let _ = File::from(report_r).read_to_string(&mut msg);
            if let Some(pid) = msg.strip_prefix("ok ") {
                println!("{}", pid.trim());
                std::process::exit(0);
            }
            let msg = msg
                .strip_prefix("err ")
                .unwrap_or("monitor died before reporting");
            eprintln!("{}", msg.trim());
            std::process::exit(1);
        }
    }
}
