//! CDI (Container Device Interface): the devices kubelet names for a container — in
//! `ContainerConfig.cdi_devices` (device plugins, DRA) and in `cdi.k8s.io/*` annotations (older
//! plugins) — resolved against the spec files of the configured dirs (default `/etc/cdi`,
//! `/var/run/cdi`; a later dir wins) with the CNCF `container-device-interface` crate, and
//! applied to the container's OCI spec (device nodes with their cgroup rules, mounts, env,
//! hooks, additional gids).
//!
//! The files are read again when any of them changed (name, size or mtime), before a
//! container that asks for a device. Each file is read on its own, so one broken file costs
//! only its own devices: it is named in the error of a container that asks for one of them
//! (and in [`Registry::errors`]). Spec files are the node admin's (root-owned dirs), still
//! bounded: at most [`MAX_FILES`] files of at most [`MAX_FILE_BYTES`] each, [`MAX_DEPTH`]
//! dirs deep.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use container_device_interface::cache::Cache;
use container_device_interface::spec::read_spec;

use crate::error::Error;
use crate::model::container::ContainerConfig;

/// The annotation prefix of CDI device requests (values: comma-separated device names).
pub const ANNOTATION_PREFIX: &str = "cdi.k8s.io/";
pub const MAX_FILES: usize = 1024;
pub const MAX_FILE_BYTES: u64 = 4 << 20;
pub const MAX_DEPTH: usize = 4;
/// Devices one container may ask for.
pub const MAX_DEVICES: usize = 128;

/// What the spec dirs held when last read.
#[derive(Default)]
struct Loaded {
    /// `(path, size, mtime)` of every spec file: the files are read again when it changes.
    stamp: Vec<(PathBuf, u64, Option<SystemTime>)>,
    cache: Option<Cache>,
    /// Qualified device name → the file that defines it.
    sources: BTreeMap<String, String>,
    /// File → why it was not used (parse, validation, a name defined twice at one priority).
    errors: BTreeMap<String, String>,
}

/// The CDI devices of this node, read from `dirs`.
pub struct Registry {
    dirs: Vec<PathBuf>,
    loaded: Mutex<Loaded>,
}

impl Registry {
    pub fn new(dirs: Vec<PathBuf>) -> Registry {
        Registry {
            dirs,
            loaded: Mutex::new(Loaded::default()),
        }
    }

    /// Every resolvable device (qualified name → the file that defines it), and the spec
    /// files that could not be used (file → why), from one reading.
    pub fn listing(&self) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
        let l = self.refreshed();
        (l.sources.clone(), l.errors.clone())
    }

    /// Fails (InvalidArgument) unless every name resolves.
    pub fn check(&self, names: &[String]) -> Result<(), Error> {
        if names.is_empty() {
            return Ok(());
        }
        self.unknown(&self.refreshed(), names)
    }

    fn unknown(&self, l: &Loaded, names: &[String]) -> Result<(), Error> {
        let unknown: Vec<&String> = names
            .iter()
            .filter(|n| !l.sources.contains_key(*n))
            .collect();
        if !unknown.is_empty() {
            let mut msg = format!(
                "unresolvable CDI devices {} (spec dirs {})",
                join(&unknown),
                self.dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            if !l.errors.is_empty() {
                let broken: Vec<String> =
                    l.errors.iter().map(|(f, e)| format!("{f}: {e}")).collect();
                msg.push_str(&format!("; spec files not used: {}", broken.join("; ")));
            }
            return Err(Error::InvalidArgument(msg));
        }
        Ok(())
    }

    /// Applies the edits of `names` (in order) to `spec`; an env var a device sets replaces
    /// the container's of the same name. An unknown name fails with InvalidArgument naming it
    /// (and the files that could not be read, where it may have been); nothing is applied
    /// then.
    pub fn inject(
        &self,
        names: &[String],
        spec: &mut oci_spec::runtime::Spec,
    ) -> Result<(), Error> {
        if names.is_empty() {
            return Ok(());
        }
        let mut l = self.refreshed();
        self.unknown(&l, names)?;
        let from: Vec<String> = names
            .iter()
            .filter_map(|n| l.sources.get(n).map(|f| format!("{n} from {f}")))
            .collect();
        let cache = l.cache.as_mut().expect("devices imply a cache");
        cache
            .inject_devices(Some(spec), names.to_vec())
            .map_err(|e| Error::InvalidArgument(format!("CDI devices {}: {e}", from.join(", "))))?;
        if let Some(p) = spec.process_mut() {
            if let Some(env) = p.env().as_ref() {
                p.set_env(Some(last_wins(env)));
            }
        }
        Ok(())
    }

    /// The loaded state, read again first if any spec file changed.
    fn refreshed(&self) -> std::sync::MutexGuard<'_, Loaded> {
        let mut l = crate::state::lock(&self.loaded);
        let stamp = stamp(&self.dirs);
        if l.cache.is_none() || l.stamp != stamp {
            *l = load(&self.dirs, stamp);
            tracing::info!(
                devices = l.sources.len(),
                broken_files = l.errors.len(),
                "read CDI spec files"
            );
            for (f, e) in &l.errors {
                tracing::warn!(file = %f, error = %e, "CDI spec file not used");
            }
        }
        l
    }
}

/// `NAME=value` entries, each name once: at its first place, with its last value.
fn last_wins(env: &[String]) -> Vec<String> {
    let mut at: HashMap<&str, usize> = HashMap::new();
    let mut out: Vec<String> = Vec::with_capacity(env.len());
    for e in env {
        let name = e.split('=').next().unwrap_or("");
        match at.get(name) {
            Some(&i) => out[i] = e.clone(),
            None => {
                at.insert(name, out.len());
                out.push(e.clone());
            }
        }
    }
    out
}

fn join(names: &[&String]) -> String {
    names
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The spec files of `dirs`, in priority order (dir index), each dir's sorted by path.
fn spec_files(dirs: &[PathBuf]) -> Vec<(usize, PathBuf)> {
    fn walk(dir: &Path, depth: usize, out: &mut Vec<PathBuf>, budget: &mut usize) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        let mut entries: Vec<_> = rd.filter_map(|e| e.ok()).collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            if *budget == 0 {
                return;
            }
            let Ok(ft) = e.file_type() else { continue };
            let p = e.path();
            if ft.is_dir() && depth < MAX_DEPTH {
                walk(&p, depth + 1, out, budget);
            } else if ft.is_file() || ft.is_symlink() {
                let ext = p
                    .extension()
                    .and_then(|x| x.to_str())
                    .map(str::to_ascii_lowercase);
                if matches!(ext.as_deref(), Some("json" | "yaml")) {
                    out.push(p);
                    *budget -= 1;
                }
            }
        }
    }
    let mut budget = MAX_FILES;
    let mut out = Vec::new();
    for (i, d) in dirs.iter().enumerate() {
        let mut files = Vec::new();
        walk(d, 0, &mut files, &mut budget);
        out.extend(files.into_iter().map(|f| (i, f)));
    }
    out
}

fn stamp(dirs: &[PathBuf]) -> Vec<(PathBuf, u64, Option<SystemTime>)> {
    spec_files(dirs)
        .into_iter()
        .map(|(_, p)| {
            let m = std::fs::metadata(&p).ok();
            let size = m.as_ref().map_or(0, |m| m.len());
            let mtime = m.and_then(|m| m.modified().ok());
            (p, size, mtime)
        })
        .collect()
}

fn load(dirs: &[PathBuf], stamp: Vec<(PathBuf, u64, Option<SystemTime>)>) -> Loaded {
    let mut l = Loaded {
        stamp,
        ..Default::default()
    };
    let mut specs: HashMap<String, Vec<container_device_interface::spec::Spec>> = HashMap::new();
    let mut devices = HashMap::new();
    // Qualified name → (priority, file) of the definition in use.
    let mut defined: HashMap<String, (usize, String)> = HashMap::new();
    for (prio, path) in spec_files(dirs) {
        let file = path.display().to_string();
        match std::fs::metadata(&path) {
            Ok(m) if m.len() > MAX_FILE_BYTES => {
                l.errors
                    .insert(file, format!("larger than {MAX_FILE_BYTES} bytes"));
                continue;
            }
            Err(e) => {
                l.errors.insert(file, e.to_string());
                continue;
            }
            Ok(_) => {}
        }
        let spec = match read_spec(&path, prio as i32) {
            Ok(s) => s,
            Err(e) => {
                l.errors.insert(file, format!("{e:#}"));
                continue;
            }
        };
        for d in spec.get_devices().into_values() {
            let name = d.get_qualified_name();
            match defined.get(&name) {
                Some((p, other)) if *p == prio => {
                    l.errors.insert(
                        file.clone(),
                        format!("device {name} is also defined in {other}, at the same priority"),
                    );
                    continue;
                }
                // A later dir wins.
                _ => {}
            }
            defined.insert(name.clone(), (prio, file.clone()));
            l.sources.insert(name.clone(), file.clone());
            devices.insert(name, d);
        }
        specs.entry(spec.get_vendor()).or_default().push(spec);
    }
    l.cache = Some(Cache::new(Vec::new(), specs, devices));
    l
}

/// The CDI devices `c` asks for: `cdi_devices` first, then the annotations' (sorted by key),
/// each once. Names are checked by resolution; here only their number and size are bounded.
/// (Parsed here rather than with the crate's `parse_annotations`, which prints every name it
/// checks to stdout.)
pub fn requested(c: &ContainerConfig) -> Result<Vec<String>, Error> {
    let mut out: Vec<String> = Vec::new();
    let from_annotations = c
        .annotations
        .iter()
        .filter(|(k, _)| k.starts_with(ANNOTATION_PREFIX))
        .flat_map(|(_, v)| v.split(','))
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_string);
    for n in c.cdi_devices.iter().cloned().chain(from_annotations) {
        if n.len() > 512 {
            return Err(Error::InvalidArgument(format!(
                "CDI device name of {} bytes (at most 512)",
                n.len()
            )));
        }
        if !out.contains(&n) {
            out.push(n);
        }
        if out.len() > MAX_DEVICES {
            return Err(Error::InvalidArgument(format!(
                "more than {MAX_DEVICES} CDI devices"
            )));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, file: &str, text: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(file), text).unwrap();
    }

    fn spec_file(kind: &str, name: &str, path: &str, env: &str) -> String {
        format!(
            r#"{{"cdiVersion":"0.6.0","kind":"{kind}","devices":[{{"name":"{name}",
            "containerEdits":{{"deviceNodes":[{{"path":"{path}","type":"c","major":1,"minor":3}}],
            "env":["{env}"]}}}}]}}"#
        )
    }

    #[test]
    fn later_dirs_win_and_a_broken_file_costs_only_its_own_devices() {
        let t = std::env::temp_dir().join(format!("sandboxd-cdi-unit-{}", std::process::id()));
        let (etc, run) = (t.join("etc"), t.join("run"));
        write(
            &etc,
            "a.json",
            &spec_file("acme.com/gpu", "g0", "/dev/acme0", "WHO=etc"),
        );
        write(
            &run,
            "a.json",
            &spec_file("acme.com/gpu", "g0", "/dev/acme0", "WHO=run"),
        );
        write(&run, "b.yaml", "cdiVersion: [not a spec");
        write(&run, "c.txt", "ignored");
        let r = Registry::new(vec![etc.clone(), run.clone()]);
        let (devices, errors) = r.listing();
        assert_eq!(devices.keys().collect::<Vec<_>>(), ["acme.com/gpu=g0"]);
        assert!(errors.contains_key(&run.join("b.yaml").display().to_string()));
        let mut spec = oci_spec::runtime::Spec::default();
        r.inject(&["acme.com/gpu=g0".into()], &mut spec).unwrap();
        let env = spec.process().as_ref().unwrap().env().clone().unwrap();
        assert!(env.contains(&"WHO=run".to_string()), "{env:?}");
        assert_eq!(
            last_wins(&["A=1".into(), "B=2".into(), "A=3".into()]),
            ["A=3", "B=2"]
        );
        let devs = spec.linux().as_ref().unwrap().devices().clone().unwrap();
        assert_eq!(devs[0].path(), Path::new("/dev/acme0"));

        // Unknown names fail naming them and the file that could not be read.
        let e = r
            .inject(&["acme.com/gpu=nope".into()], &mut spec)
            .unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("acme.com/gpu=nope") && m.contains("b.yaml"),
            "{m}"
        );

        // A changed file is read again.
        std::thread::sleep(std::time::Duration::from_millis(20));
        write(
            &run,
            "b.yaml",
            &spec_file("acme.com/nic", "n1", "/dev/acme1", "N=1"),
        );
        let (devices, errors) = r.listing();
        assert!(devices.contains_key("acme.com/nic=n1"));
        assert!(errors.is_empty());
        std::fs::remove_dir_all(&t).unwrap();
    }

    #[test]
    fn requests_come_from_the_field_and_the_annotations_once_each() {
        let mut c = ContainerConfig {
            cdi_devices: vec!["a.com/x=1".into()],
            ..Default::default()
        };
        c.annotations
            .insert("cdi.k8s.io/plugin".into(), "a.com/x=1, b.com/y=2".into());
        c.annotations.insert("other".into(), "c.com/z=3".into());
        assert_eq!(requested(&c).unwrap(), ["a.com/x=1", "b.com/y=2"]);
        c.cdi_devices = (0..200).map(|i| format!("a.com/x={i}")).collect();
        assert!(requested(&c).is_err());
    }
}
