//! Where plugins come from: the socket external plugins connect to, and the pre-installed
//! plugins in `plugin_path` (`NN-name` executables), each started with one end of a socket
//! pair as fd 3 and an environment of exactly `NRI_PLUGIN_NAME`, `NRI_PLUGIN_IDX` and
//! `NRI_PLUGIN_SOCKET=3`; its configuration is `NN-name.conf` or `name.conf` from
//! `plugin_config_path`.
//!
//! Unsafe: only the `pre_exec` that puts the plugin's socket at fd 3.
#![allow(unsafe_code)]

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use crate::config::NriConfig;
use crate::error::{Error, Result};

/// The most bytes of a plugin's configuration file passed on.
const MAX_CONFIG: u64 = 1 << 20;
/// The most pre-installed plugins started.
const MAX_PREINSTALLED: usize = 32;

/// A pre-installed plugin to start.
pub(crate) struct Launch {
    path: PathBuf,
    name: String,
    idx: String,
    config: String,
}

impl Launch {
    pub(crate) fn id(&self) -> String {
        format!("{}-{}", self.idx, self.name)
    }
}

/// The executables of `plugin_path` named `NN-name` (others are skipped with a warning),
/// with their configuration; a missing dir is none.
pub(crate) fn discover(cfg: &NriConfig) -> Result<Vec<Launch>> {
    let dir = match std::fs::read_dir(&cfg.plugin_path) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(Error::Config(format!(
                "NRI plugin_path {}: {e}",
                cfg.plugin_path.display()
            )))
        }
    };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        let Ok(md) = std::fs::metadata(e.path()) else {
            continue;
        };
        if !md.is_file() || md.permissions().mode() & 0o111 == 0 {
            continue;
        }
        let Some((idx, name)) = file.split_once('-') else {
            tracing::warn!(file, "NRI plugin not started: its name is not NN-name");
            continue;
        };
        if let Err(why) =
            super::plugin::check_index(idx).and_then(|()| super::plugin::check_name(name))
        {
            tracing::warn!(file, error = %why, "NRI plugin not started");
            continue;
        }
        if out.len() == MAX_PREINSTALLED {
            tracing::warn!(
                file,
                max = MAX_PREINSTALLED,
                "NRI plugin not started: too many"
            );
            continue;
        }
        out.push(Launch {
            path: e.path(),
            name: name.to_string(),
            idx: idx.to_string(),
            config: config(&cfg.plugin_config_path, idx, name)?,
        });
    }
    out.sort_by_key(Launch::id);
    Ok(out)
}

fn config(dir: &Path, idx: &str, name: &str) -> Result<String> {
    for f in [format!("{idx}-{name}.conf"), format!("{name}.conf")] {
        let p = dir.join(f);
        match std::fs::File::open(&p) {
            Ok(file) => {
                let mut s = String::new();
                file.take(MAX_CONFIG).read_to_string(&mut s).map_err(|e| {
                    Error::Config(format!("NRI plugin config {}: {e}", p.display()))
                })?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(Error::Config(format!(
                    "NRI plugin config {}: {e}",
                    p.display()
                )))
            }
        }
    }
    Ok(String::new())
}

/// Starts `l` with its end of a new socket pair; returns ours.
pub(crate) fn start(
    l: Launch,
) -> std::result::Result<(tokio::net::UnixStream, super::plugin::Origin), String> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(|e| e.to_string())?;
    let theirs: OwnedFd = theirs.into();
    let fd = theirs.as_raw_fd();
    let mut cmd = std::process::Command::new(&l.path);
    cmd.env_clear()
        .env("NRI_PLUGIN_NAME", &l.name)
        .env("NRI_PLUGIN_IDX", &l.idx)
        .env("NRI_PLUGIN_SOCKET", "3")
        .stdin(std::process::Stdio::null())
        .process_group(0);
    // SAFETY: between fork and exec only async-signal-safe calls (dup2, fcntl).
    unsafe {
        cmd.pre_exec(move || {
            if fd == 3 {
                let flags = libc::fcntl(3, libc::F_GETFD);
                if flags < 0 || libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| format!("{}: {e}", l.path.display()))?;
    drop(theirs);
    ours.set_nonblocking(true).map_err(|e| e.to_string())?;
    let sock = tokio::net::UnixStream::from_std(ours).map_err(|e| e.to_string())?;
    tracing::info!(plugin = %l.id(), pid = child.id(), "started NRI plugin");
    Ok((
        sock,
        super::plugin::Origin {
            launched: Some((l.name, l.idx, l.config)),
            child: Some(child),
        },
    ))
}

/// The socket external plugins connect to: its dir made 0700 (only root connects), a stale
/// socket replaced.
pub(crate) fn listen(path: &Path) -> Result<tokio::net::UnixListener> {
    let err = |e: std::io::Error| Error::Config(format!("NRI socket {}: {e}", path.display()));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(err)?;
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(Error::Config(format!(
            "NRI socket {}: another runtime serves it (set [nri] socket_path or disable_connections)",
            path.display()
        )));
    }
    let _ = std::fs::remove_file(path);
    let l = std::os::unix::net::UnixListener::bind(path).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    l.set_nonblocking(true).map_err(err)?;
    tokio::net::UnixListener::from_std(l).map_err(err)
}
