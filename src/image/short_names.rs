//! Short names (`busybox`, `team/app:1`: no registry host) resolved as CRI-O resolves them
//! from containers-registries.conf v2 (`registries_conf.rs` reads the files): an `[aliases]`
//! entry for the name is its one candidate; else each of `unqualified-search-registries` in
//! turn is one; `short-name-mode` is checked but, as in CRI-O (which sets `disabled`), a
//! daemon cannot prompt, so it changes nothing. Where the files set no search registries,
//! the name means `docker.io[/library]/…`, as with containerd and kubelet's own reading; an
//! explicitly empty list (`unqualified-search-registries = []`) refuses short names, as
//! CRI-O does without search registries. Pulls try the candidates in order; lookups
//! (ImageStatus, RemoveImage, CreateContainer, image volumes) take the first stored one.

use std::path::PathBuf;

use super::reference::Reference;
use crate::config::RegistryFilesConfig;
use crate::error::Error;

/// The registries.conf files short names are resolved from (none: docker.io, as containerd).
#[derive(Debug, Clone, Default)]
pub struct ShortNameFiles {
    pub registries_conf: Option<PathBuf>,
    pub registries_conf_d: Option<PathBuf>,
}

impl From<&RegistryFilesConfig> for ShortNameFiles {
    fn from(f: &RegistryFilesConfig) -> Self {
        ShortNameFiles {
            registries_conf: f.registries_conf.clone(),
            registries_conf_d: f.registries_conf_d.clone(),
        }
    }
}

/// Whether `name` names no registry: its first component is no host (no `.`, no `:`, not
/// `localhost`), or it has a single component.
pub fn is_short(name: &str) -> bool {
    let name = name.split('@').next().unwrap_or(name);
    match name.split_once('/') {
        Some((first, _)) => !(first.contains(['.', ':']) || first == "localhost"),
        None => true,
    }
}

/// `name` split into its repository and the `:tag` / `@digest` written after it.
fn split(name: &str) -> (&str, &str) {
    let end = name.find('@').unwrap_or(name.len());
    let last_slash = name[..end].rfind('/').map_or(0, |i| i + 1);
    let end = name[last_slash..end]
        .find(':')
        .map_or(end, |i| last_slash + i);
    name.split_at(end)
}

/// Whether `[aliases]` may say `name = target`: `name` a short name without tag or digest;
/// `target` (empty: the alias removed) a repository with its registry, without tag or digest.
pub(super) fn check_alias(name: &str, target: &str) -> Result<(), String> {
    if !is_short(name) || !split(name).1.is_empty() || Reference::parse(name).is_err() {
        return Err("the alias must be a short name without tag or digest".into());
    }
    if !target.is_empty()
        && (is_short(target) || !split(target).1.is_empty() || Reference::parse(target).is_err())
    {
        return Err("the value must name its registry, without tag or digest".into());
    }
    Ok(())
}

/// Every reference `name` may mean, in the order they are tried. A name with its registry
/// is itself; a short name resolves by the files (module comment).
pub fn candidates(name: &str, files: &ShortNameFiles) -> Result<Vec<Reference>, Error> {
    let parsed = Reference::parse(name)?;
    if !is_short(name) {
        return Ok(vec![parsed]);
    }
    let conf = super::registries_conf::short_names(
        files.registries_conf.as_deref(),
        files.registries_conf_d.as_deref(),
    )?;
    let (repo, suffix) = split(name);
    if let Some((target, source)) = conf.aliases.get(repo) {
        let r = Reference::parse(&format!("{target}{suffix}")).map_err(|e| {
            Error::Config(format!(
                "{}: [aliases] {repo:?} = {target:?}: {e}",
                source.display()
            ))
        })?;
        tracing::debug!(image = name, resolved = %r.full(), file = %source.display(), "short name: alias");
        return Ok(vec![r]);
    }
    match conf.search {
        None => Ok(vec![parsed]),
        Some((search, source)) if search.is_empty() => Err(Error::InvalidArgument(format!(
            "image {name:?} is a short name: it has no alias and {} sets unqualified-search-registries = []; name its registry",
            source.display()
        ))),
        Some((search, source)) => search
            .iter()
            .map(|host| {
                Reference::parse(&format!("{host}/{name}")).map_err(|e| {
                    Error::Config(format!(
                        "{}: unqualified-search-registries {host:?} with {name:?}: {e}",
                        source.display()
                    ))
                })
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_and_tells_short_names() {
        assert!(is_short("busybox"));
        assert!(is_short("team/app:1"));
        assert!(is_short("busybox@sha256:00"));
        assert!(!is_short("quay.io/x"));
        assert!(!is_short("localhost/x"));
        assert!(!is_short("host:5000/x"));
        assert_eq!(split("team/app:1"), ("team/app", ":1"));
        assert_eq!(split("app@sha256:ab"), ("app", "@sha256:ab"));
        assert_eq!(split("app:1@sha256:ab"), ("app", ":1@sha256:ab"));
        assert_eq!(split("app"), ("app", ""));
        assert!(check_alias("centos", "quay.io/centos/centos").is_ok());
        assert!(check_alias("centos", "").is_ok());
        for (n, t) in [
            ("quay.io/x", "quay.io/x"),
            ("x:1", "quay.io/x"),
            ("x", "x"),
            ("x", "quay.io/x:1"),
            ("x", "quay.io/x@sha256:00"),
            ("X", "quay.io/x"),
        ] {
            assert!(check_alias(n, t).is_err(), "{n} = {t}");
        }
    }

    #[test]
    fn resolves_as_cri_o_with_docker_io_when_unset() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("registries.conf");
        let d = t.path().join("registries.conf.d");
        std::fs::create_dir(&d).unwrap();
        let files = ShortNameFiles {
            registries_conf: Some(f.clone()),
            registries_conf_d: Some(d.clone()),
        };
        let c = |name: &str| {
            candidates(name, &files).map(|v| v.iter().map(|r| r.full()).collect::<Vec<_>>())
        };
        // No files: containerd's docker.io.
        assert_eq!(c("busybox").unwrap(), ["docker.io/library/busybox:latest"]);
        std::fs::write(
            &f,
            "unqualified-search-registries = [\"registry.example:5000\", \"docker.io\"]\nshort-name-mode = \"enforcing\"\n[aliases]\n\"centos\" = \"quay.io/centos/centos\"\n\"gone\" = \"quay.io/gone\"\n",
        )
        .unwrap();
        std::fs::write(
            d.join("50-more.conf"),
            "[aliases]\n\"team/app\" = \"registry.example:5000/moved/app\"\n\"gone\" = \"\"\n",
        )
        .unwrap();
        assert_eq!(c("centos").unwrap(), ["quay.io/centos/centos:latest"]);
        assert_eq!(
            c("team/app:1").unwrap(),
            ["registry.example:5000/moved/app:1"]
        );
        let digest = format!("centos@sha256:{}", "a".repeat(64));
        assert_eq!(
            c(&digest).unwrap(),
            [format!("quay.io/centos/centos@sha256:{}", "a".repeat(64))]
        );
        // Removed by the drop-in: the search registries, in order.
        assert_eq!(
            c("gone").unwrap(),
            [
                "registry.example:5000/gone:latest",
                "docker.io/library/gone:latest"
            ]
        );
        // Names with their registry are themselves.
        assert_eq!(c("quay.io/x").unwrap(), ["quay.io/x:latest"]);
        // A drop-in's list replaces the file's; an empty one refuses short names.
        std::fs::write(
            d.join("60-none.conf"),
            "unqualified-search-registries = []\n",
        )
        .unwrap();
        let e = c("other").unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("60-none.conf"),
            "{e}"
        );
        assert_eq!(c("centos").unwrap(), ["quay.io/centos/centos:latest"]);
        // Refusals name the file and the entry.
        for (text, says) in [
            ("short-name-mode = \"ask\"\n", "short-name-mode"),
            (
                "unqualified-search-registries = [\"https://x\"]\n",
                "not host",
            ),
            ("[aliases]\n\"x:1\" = \"quay.io/x\"\n", "short name"),
            ("[aliases]\n\"x\" = \"x\"\n", "registry"),
        ] {
            std::fs::write(d.join("70-bad.conf"), text).unwrap();
            let e = c("busybox").unwrap_err().to_string();
            assert!(e.contains(says) && e.contains("70-bad.conf"), "{text}: {e}");
        }
    }
}
