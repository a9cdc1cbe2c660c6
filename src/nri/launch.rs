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

/// The socket file we bound, and the dirs we made for it: removed at shutdown if they are
/// still ours (another daemon may have replaced the socket meanwhile).
#[derive(Debug)]
pub(crate) struct Bound {
    path: PathBuf,
    dev_ino: (u64, u64),
    /// Made by us, deepest first.
    made: Vec<PathBuf>,
}

impl Bound {
    /// Removes the socket if it is still the one we bound, then the dirs we made if empty.
    pub(crate) fn remove(&self) {
        use std::os::unix::fs::MetadataExt;
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.dev_ino) {
            if let Err(e) = std::fs::remove_file(&self.path) {
                tracing::warn!(socket = %self.path.display(), error = %e, "cannot remove the NRI socket");
            }
        }
        for d in &self.made {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// The socket external plugins connect to, a stale socket replaced. Only root may connect:
/// the dirs it lacks are made 0700; a dir that exists keeps its mode and owner (it is the
/// host's, `/run` say), and is refused when others could write in it (they could replace
/// the socket with their own).
pub(crate) fn listen(path: &Path) -> Result<(tokio::net::UnixListener, Bound)> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let err = |e: std::io::Error| Error::Config(format!("NRI socket {}: {e}", path.display()));
    let mut made = Vec::new();
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        let missing: Vec<&Path> = dir
            .ancestors()
            .take_while(|a| !a.as_os_str().is_empty() && std::fs::symlink_metadata(a).is_err())
            .collect();
        for d in missing.iter().rev() {
            match std::fs::DirBuilder::new().mode(0o700).create(d) {
                Ok(()) => made.insert(0, d.to_path_buf()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(err(e)),
            }
        }
        let m = std::fs::metadata(dir).map_err(err)?;
        if !m.is_dir() {
            return Err(Error::Config(format!(
                "NRI socket {}: {} is no directory",
                path.display(),
                dir.display()
            )));
        }
        if m.uid() != 0 || m.mode() & 0o022 != 0 {
            return Err(Error::Config(format!(
                "NRI socket {}: its dir {} (mode {:o}, owner uid {}) is writable by others than root, who could replace the socket; name a socket_path in a root-only dir",
                path.display(),
                dir.display(),
                m.mode() & 0o7777,
                m.uid()
            )));
        }
    }
    let bound = (|| {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(Error::Config(format!(
                "NRI socket {}: another runtime serves it (set [nri] socket_path or disable_connections)",
                path.display()
            )));
        }
        // Bound under a temporary name, made 0600, then renamed into place: the socket never
        // shows at `path` with the umask's mode (a test saw 0755 between bind and chmod).
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let l = std::os::unix::net::UnixListener::bind(&tmp).map_err(err)?;
        let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = placed {
            let _ = std::fs::remove_file(&tmp);
            return Err(err(e));
        }
        l.set_nonblocking(true).map_err(err)?;
        let m = std::fs::symlink_metadata(path).map_err(err)?;
        let l = tokio::net::UnixListener::from_std(l).map_err(err)?;
        Ok((l, (m.dev(), m.ino())))
    })();
    match bound {
        Ok((l, dev_ino)) => Ok((
            l,
            Bound {
                path: path.to_path_buf(),
                dev_ino,
                made,
            },
        )),
        Err(e) => {
            for d in &made {
                let _ = std::fs::remove_dir(d);
            }
            Err(e)
        }
    }
}
