//! Opening the runtime: the state root checked and made private, the namespace dirs, the
//! handlers resolved (`probe`), the infra rootfs, the image store; then the records restored
//! (containers first), and what nothing references collected.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::cni::Cni;
use crate::config::Config;
use crate::error::{self, Error, Result};
use crate::host::{self, Host};
use crate::oci::{self, OciRuntime};
use crate::runtime::{Registry, Runtime};
use crate::state::short_hash;
use crate::{
    cdi, cgroups, container, events, image, metrics, nri, probe, process, sandbox, state, userns,
    validate,
};

impl Runtime {
    /// Opens (or creates) the state root, prepares the namespace dirs and the infra rootfs,
    /// then restores every recorded sandbox: half-created ones are rolled back, the rest are
    /// registered again with their names; unreferenced leftovers are collected.
    pub fn new(cfg: Config) -> Result<Self> {
        Self::with_host(cfg, Arc::new(host::RealHost))
    }

    /// [`Runtime::new`] with the pod lifecycle's host operations going to `host`.
    pub(crate) fn with_host(cfg: Config, host: Arc<dyn Host>) -> Result<Self> {
        let rt = Self::restored_with_host(cfg, host)?;
        rt.sweep_left_over();
        Ok(rt)
    }

    /// What the daemon serves from: the records restored and reconciled (every pod and
    /// container listed as it is), but what the last run left on the host that no record
    /// owns not yet collected. The caller runs [`Runtime::sweep_left_over`] next, on a
    /// thread of its own, while it serves (the audit waits for it); [`Runtime::new`] does
    /// both in turn. At 1,000 pods the sweep is a third of a start.
    pub fn restored(cfg: Config) -> Result<Self> {
        Self::restored_with_host(cfg, Arc::new(host::RealHost))
    }

    fn restored_with_host(cfg: Config, host: Arc<dyn Host>) -> Result<Self> {
        let t = std::time::Instant::now();
        let lap = || t.elapsed().as_millis() as u64;
        let rt = Self::open(cfg, host)?;
        let opened = lap();
        // Containers first: a sandbox rolled back on restore removes its containers, and
        // reconcile removes those whose sandbox is gone.
        container::restore::load(&rt)?;
        let loaded = lap();
        sandbox::restore::restore(&rt)?;
        let restored = lap();
        container::restore::reconcile(&rt);
        let reconciled = lap();
        tracing::info!(
            opened,
            loaded,
            restored,
            reconciled,
            "state restored (ms since the start, after each step)"
        );
        rt.events.restored();
        Ok(rt)
    }

    /// The start-up sweep: what no record references now is an orphan of the last run (a
    /// crash between a host step and the record naming it), collected by the audit's own
    /// finders in teardown order; then blobs and layers nothing references (left by older
    /// versions, or by a crash between an image's removal and its collection). Safe beside
    /// the verbs: the audit lists the host before it reads the owners, and every verb
    /// registers its id before it touches the host. An audit asked meanwhile waits for it.
    pub fn sweep_left_over(&self) {
        let t = std::time::Instant::now();
        // The runtime's mount namespace's first template (thousands of unmounts at 1,000
        // pods), made beside the sweep rather than during the restore.
        if let Some(ns) = self.runtimes.values().find_map(|r| r.mount_ns.as_ref()) {
            ns.prepare();
        }
        crate::audit::sweep_at_start(self);
        let swept = t.elapsed().as_millis() as u64;
        if let Err(e) = self.images.collect(&self.layers_in_use()) {
            tracing::warn!(error = %e, "cannot collect unused image content");
        }
        self.start_up_swept.set();
        tracing::info!(
            swept,
            collected = t.elapsed().as_millis() as u64,
            "start-up sweep done (ms, after each step)"
        );
    }

    fn open(mut cfg: Config, host: Arc<dyn Host>) -> Result<Self> {
        check_root(&cfg.root)?;
        let own_cgroup_parent = cfg.cgroup_parent.is_empty();
        cfg.cgroup_parent = cfg.effective_cgroup_parent();
        // Refuse an unusable pause binary before anything is created.
        let pause = Config::helper_path(&cfg.pause_path, "sandboxd-pause").filter(|p| p.is_file());
        if let Some(p) = &pause {
            if oci::spec::is_dynamic_elf(p)? {
                return Err(Error::Config(format!(
                    "{} is dynamically linked; the infra rootfs holds only this one file, so it \
                     must be static (build it with scripts/build-shims)",
                    p.display()
                )));
            }
        }
        // Nothing under the root is any other user's business: every dir 0700 from the
        // start (and made so on a root an older version left more open).
        // (The root itself stays traversable while pods in user namespaces use it: see
        // `userns::pod_root_dir`.)
        state::files::private_dir_all(&cfg.root)?;
        std::fs::set_permissions(
            &cfg.root,
            std::os::unix::fs::PermissionsExt::from_mode(userns::root_mode(&cfg.root)),
        )
        .map_err(|e| error::HostError::io("chmod", &cfg.root, e))?;
        for d in [
            "sandboxes",
            "containers",
            "images",
            "cni",
            "cni/cache",
            "cni/networks",
            "runtime",
            "attach",
            "exec",
        ] {
            let p = cfg.root.join(d);
            state::files::private_dir_all(&p)?;
            state::files::restrict_dir(&p)?;
        }
        // A dir per pod and per container, each with files made and deleted within its life:
        // spread over the filesystem's block groups (see `spread_subdirs`).
        for d in ["sandboxes", "containers"] {
            state::files::spread_subdirs(&cfg.root.join(d));
        }
        let ns_dirs: Vec<PathBuf> = cfg.namespace_dirs().into_iter().cloned().collect();
        host.make_shared_dirs(&ns_dirs)?;
        let cgroup_driver = cgroups::Driver::resolve(cfg.cgroup_driver).map_err(Error::Config)?;
        let cdi = cdi::Registry::new(cfg.cdi_spec_dirs.clone());
        let nri = nri::Nri::new(&cfg.nri)?;
        let monitor = Config::helper_path(&cfg.monitor_path, "sandboxd-monitor");
        forget_runtime_state_of_other_boots(&cfg.root.join("runtime"))?;
        let mount_ns = if cfg.runtime_mount_ns {
            let pins: Vec<&Path> = cfg.namespace_dirs().iter().map(|d| d.as_path()).collect();
            match oci::RuntimeMountNs::new(&cfg.root, &pins) {
                Ok(ns) => Some(ns),
                Err(e) => {
                    tracing::warn!(error = %e, "the OCI runtime runs in the host's mount namespace");
                    None
                }
            }
        } else {
            None
        };
        let mut runtimes = HashMap::new();
        // Each handler's family and the flags it needs on this host (probed in parallel: a
        // runtime that hangs on `--version` costs its own time limit once, not one each).
        let resolved = probe::resolve_handlers(
            &cfg.runtimes,
            Some(&cfg.root.join("runtime/host-args.json")),
        )?;
        for (name, h) in &cfg.runtimes {
            validate::name("runtime handler", name)?;
            let probe::Resolved {
                family,
                path,
                host_args,
            } = resolved[name].clone();
            runtimes.insert(
                name.clone(),
                OciRuntime {
                    name: name.clone(),
                    family,
                    path,
                    // With systemd, the runtime makes each container's scope itself.
                    args: (cgroup_driver == cgroups::Driver::Systemd)
                        .then(|| "--systemd-cgroup".to_string())
                        .into_iter()
                        .chain(host_args)
                        .chain(h.runtime_args.iter().cloned())
                        .collect(),
                    root: match &h.root {
                        Some(root) => root.clone(),
                        None => runtime_root(&cfg.root, name)?,
                    },
                    monitor: monitor
                        .as_deref()
                        .map(absolute_if_relative)
                        .unwrap_or_else(|| PathBuf::from("sandboxd-monitor")),
                    timeout: cfg.runtime_timeout,
                    mount_ns: mount_ns.clone().filter(|_| family.node_kernel()),
                },
            );
        }
        if !runtimes.contains_key(&cfg.default_runtime) {
            return Err(Error::Config(format!(
                "default runtime {:?} is not among the configured handlers {:?}",
                cfg.default_runtime,
                runtimes.keys().collect::<Vec<_>>()
            )));
        }
        let infra_rootfs = match pause {
            Some(pause) => {
                let dir = cfg.root.join("infra-rootfs");
                match oci::spec::prepare_infra_rootfs(&dir, &pause).map_err(Error::from) {
                    Ok(()) => Some(dir),
                    // A start on a full disk degrades rather than refuses: the pause binary
                    // installed before serves on (or, without one, pods that need an infra
                    // process are refused); everything else works.
                    Err(e) if e.is_no_space() => {
                        let old = dir.join("pause").is_file();
                        tracing::warn!(error = %e, keeping_installed = old, "cannot install the new pause binary: the state disk is full");
                        old.then_some(dir)
                    }
                    Err(e) => return Err(e),
                }
            }
            _ => None,
        };
        let cni = Cni {
            bin_dirs: cfg.cni_bin_dirs.clone(),
            timeout: cfg.cni_plugin_timeout,
            cache_dir: cfg.root.join("cni/cache"),
        };
        let root_tag = short_hash(&cfg.root.to_string_lossy());
        let cfg_budget = cfg.exec_sync_output_budget as usize;
        let stats_period = cfg.stats_collect_period;
        let (events_backlog, events_max) = (cfg.events_backlog, cfg.events_max_subscribers);
        let events_bytes = cfg.events_backlog_bytes;
        let mut images =
            image::ImageStore::with_config(cfg.root.join("images"), cfg.images.clone())?;
        images.short_names = (&cfg.registry_files).into();
        // What an interrupted pull or import left behind: its process is gone (or, for names
        // from before the pid was in them, older than any running one).
        images.clean_tmp(std::time::Duration::from_secs(3600));
        let pull_slots = tokio::sync::Semaphore::new(cfg.images.max_concurrent_pulls.max(1));
        Ok(Runtime {
            cfg,
            registry: Mutex::new(Registry::default()),
            cni,
            runtimes,
            images,
            pulls: Mutex::new(HashMap::new()),
            pull_slots,
            infra_rootfs,
            root_tag,
            own_cgroup_parent,
            quarantine: Mutex::new(state::Quarantine::default()),
            exec_output: process::OutputBudget::new(cfg_budget),
            exec_slots: process::ExecSlots::default(),
            events: Arc::new(
                events::Hub::new(events_backlog, events_max).with_max_bytes(events_bytes),
            ),
            metrics: Arc::new(metrics::prom::DaemonMetrics::new()),
            probe: probe::Probe::default(),
            fs_usage: metrics::FsUsageCache::new(stats_period),
            cgroup_files: crate::cgroups::UsageCache::default(),
            exit_watch: events::watch::ExitWatcher::new(),
            host,
            cgroup_driver,
            cdi,
            nri,
            start_up_swept: state::Latch::default(),
        })
    }
}

/// The state root must not be a symlink (an attacker-made link would move our writes).
fn check_root(root: &Path) -> Result<()> {
    if !root.is_absolute() {
        return Err(Error::Config(format!(
            "state root {} must be an absolute path",
            root.display()
        )));
    }
    match std::fs::symlink_metadata(root) {
        Ok(m) if m.file_type().is_symlink() => Err(Error::Config(format!(
            "state root {} is a symlink; refusing to use it",
            root.display()
        ))),
        Ok(m) if !m.is_dir() => Err(Error::Config(format!(
            "state root {} is not a directory",
            root.display()
        ))),
        _ => Ok(()),
    }
}

/// A handler's runtime root under the state root (`runtime/<name>`), made here rather than by
/// the runtime's first call so that its per-container state dirs spread like the pods' own
/// (`spread_subdirs`): runc makes and removes one in each create and delete.
fn runtime_root(state_root: &Path, name: &str) -> Result<PathBuf> {
    let root = state_root.join("runtime").join(name);
    state::files::private_dir_all(&root)?;
    state::files::spread_subdirs(&root);
    Ok(root)
}

/// The OCI runtimes' own state under the state root (`runtime/<handler>/<id>`) names the pids
/// of the boot that made it, and not every runtime checks a pid's start time before it
/// signals it (runsc's delete kills its recorded sandbox and gofer pids): after a reboot those
/// pids belong to strangers. So the dir carries the boot id it was made in, and state of
/// another boot is removed before any runtime call — every container in it died with that
/// boot (containerd and CRI-O keep this state on tmpfs for the same reason). A dir without the
/// mark (made by an older version, pods possibly running) is kept and marked.
fn forget_runtime_state_of_other_boots(dir: &Path) -> Result<()> {
    let mark = dir.join("boot_id");
    let now = crate::process::boot_id();
    match std::fs::read_to_string(&mark) {
        Ok(then) if then.trim() == now || now.is_empty() => return Ok(()),
        Ok(then) => {
            tracing::info!(dir = %dir.display(), made_in_boot = %then.trim(), "the OCI runtimes' state is from another boot: removed (its containers died with it)");
            crate::mounts::remove_record_dir(dir)
                .map_err(|e| Error::step("forget runtime state of another boot", "", e))?;
        }
        Err(_) => {}
    }
    state::files::private_dir_all(dir)?;
    state::write_atomic(&mark, format!("{now}\n").as_bytes())?;
    Ok(())
}

/// `p` made absolute against the current dir when it is a relative path with a dir in it (a
/// bare name is looked up in PATH and stays as it is).
fn absolute_if_relative(p: &Path) -> PathBuf {
    if p.is_relative() && p.components().count() > 1 {
        std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
    } else {
        p.to_path_buf()
    }
}

#[cfg(test)]
mod tests {
    use super::absolute_if_relative;
    use std::path::{Path, PathBuf};

    #[test]
    fn runtime_state_of_another_boot_is_forgotten() {
        let base = std::env::temp_dir().join(format!("sandboxd-rtboot-{}", std::process::id()));
        let dir = base.join("runtime");
        let ctr = dir.join("runsc/ab/abcdef");
        std::fs::create_dir_all(&ctr).unwrap();
        // Unmarked (an older version's, pods may run): kept and marked with this boot.
        super::forget_runtime_state_of_other_boots(&dir).unwrap();
        assert!(ctr.is_dir());
        let now = crate::process::boot_id();
        assert_eq!(
            std::fs::read_to_string(dir.join("boot_id")).unwrap().trim(),
            now
        );
        // This boot's: kept.
        super::forget_runtime_state_of_other_boots(&dir).unwrap();
        assert!(ctr.is_dir());
        // Another boot's: gone, and marked anew.
        std::fs::write(dir.join("boot_id"), "another-boot\n").unwrap();
        super::forget_runtime_state_of_other_boots(&dir).unwrap();
        assert!(!ctr.exists() && !dir.join("runsc").exists());
        assert_eq!(
            std::fs::read_to_string(dir.join("boot_id")).unwrap().trim(),
            now
        );
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn runtime_paths_do_not_depend_on_the_working_dir() {
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(
            absolute_if_relative(Path::new("./bin/runc")),
            cwd.join("bin/runc")
        );
        assert_eq!(
            absolute_if_relative(Path::new("runc")),
            PathBuf::from("runc")
        );
        assert_eq!(
            absolute_if_relative(Path::new("/usr/sbin/runc")),
            PathBuf::from("/usr/sbin/runc")
        );
    }
}
